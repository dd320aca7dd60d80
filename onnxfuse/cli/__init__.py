"""The `onnxfuse` command line: each command parses, calls the Python API, prints.

Exit codes: 0 ok, 1 a verification or benchmark goal failed, 2 bad input (one line on stderr naming the fix).
"""
from __future__ import annotations

import argparse
import sys
import warnings

from .. import __version__
from ..errors import OnnxfuseError
from ..genai import command as genai_command
from . import export as _export_cmds, kernels as _kernel_cmds, model as _model_cmds, serve as _serve_cmds
from ._common import _Parser


def build_parser() -> argparse.ArgumentParser:
    """The one parser of every command: each command module registers its own."""
    p = _Parser(prog="onnxfuse", description="Export PyTorch models to ONNX, fuse subgraphs into onnxfuse custom ops, "
                "and run them in onnxruntime with CPU, CUDA and Triton kernels.")
    p.add_argument("--version", action="version", version=f"onnxfuse {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    _export_cmds.register(sub, _Parser)
    _model_cmds.register(sub)
    _kernel_cmds.register(sub)
    _serve_cmds.register(sub)
    from .. import bench, view
    bench.register(sub, _Parser)
    genai_command.register(sub)
    view.register(sub)
    _remember_parsers(p)
    return p


def _remember_parsers(parser) -> None:
    """Give every command's parser a default `_parser` naming itself, so that errors found after parsing (an
    unrecognized argument) point at that command's help, not at 'onnxfuse --help'."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(_parser=sub)
                _remember_parsers(sub)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings the user should see: one line on stderr, no source location."""
    print(f"onnxfuse: warning: {str(message).splitlines()[0] if str(message) else category.__name__}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help (0) and argparse's errors (2): return the code, as for every other path
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        from ..kernels import announcements
        quiet = bool(getattr(args, "quiet", False) or getattr(args, "json", False))
        with warnings.catch_warnings(), announcements(not quiet):  # no first-use build notice with -q/--json
            if getattr(args, "quiet", False):
                warnings.simplefilter("ignore")
            else:
                from ..runtime import LibraryUnavailableWarning
                warnings.filterwarnings("always", category=LibraryUnavailableWarning)
            warnings.showwarning = _show_warning
            return args.func(args)
    except OnnxfuseError as e:
        print(f"onnxfuse: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("onnxfuse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
