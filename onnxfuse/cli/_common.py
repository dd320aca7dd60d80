"""What the command modules share: the parser class whose errors are one line, the console, the output and
session flags, and the argument types."""
from __future__ import annotations

import argparse
import pathlib

from ..argtypes import (choice_list, layer_sizes as _sizes, name_list as _names,  # noqa: F401
                        positive_int as _positive)
from ..schema import BACKENDS

DEFAULT_OUT = pathlib.Path("models")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        self.exit(2, f"onnxfuse: error: {message} (see '{self.prog} --help')\n")


def _console(quiet: bool = False):
    from .._term import console
    return console(quiet)



def _add_output_flags(p, json_help: str, quiet_help: str = "print nothing but errors") -> None:
    """-q and --json, which every command takes (issue contract: consistent flags)."""
    p.add_argument("-q", "--quiet", action="store_true", help=quiet_help)
    p.add_argument("--json", action="store_true", help=json_help)


def _add_session_args(p) -> None:
    """Flags of the commands that run a model in onnxruntime (verify, run)."""
    p.add_argument("--provider", choices=["cpu", "cuda"], default="cpu", help="execution provider (default cpu)")
    p.add_argument("--require-library", action="store_true",
                   help="fail (exit 2) instead of falling back to the function bodies when the kernel library "
                        "is unavailable")
    p.add_argument("--backend", choices=BACKENDS,
                   help="run every onnxfuse node with this kernel family (sets the nodes' backend attribute on an "
                        "in-memory copy; default: what the model says)")

