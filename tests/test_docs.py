"""Every `onnxfuse ...` command in the README, docs/, the Makefile and the CI scripts runs through the real parser:
commands shown as typed (console lines, shell lines) parse completely; synopses and inline mentions name only
options that their command has. A renamed or removed flag (the walkthrough's old `bench --case`) fails here."""
from __future__ import annotations

import argparse
import contextlib
import io
import pathlib
import re
import shlex

import pytest

from onnxfuse import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPTS = [ROOT / "Makefile", ROOT / ".ci" / "run", ROOT / ".ci" / "wheel-check"]


def _commands() -> list[tuple[str, str, bool]]:
    """(where, command line from 'onnxfuse' on, complete?) for every command in the docs and scripts."""
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"^\$ (onnxfuse .*)$", text, flags=re.M):  # console blocks: typed as shown
            found.append((f"{path.name}: {m.group(1)}", m.group(1), True))
        for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S):
            for line in block.splitlines():
                line = line.split("#")[0].strip()
                if line.startswith("onnxfuse "):
                    found.append((f"{path.name}: {line}", line, True))
        for m in re.finditer(r"`(onnxfuse [^`]*)`", text):  # inline: synopses and mentions
            found.append((f"{path.name}: {m.group(1)}", m.group(1).replace("\\|", "|"), False))
    for path in SCRIPTS:
        for line in path.read_text().splitlines():
            for m in re.finditer(r"(?:\$\(BIN\)/|\"\$bin/)onnxfuse\"?", line):
                rest = re.split(r"\|\||\)\"|;", line[m.end():])[0]
                cmd = ("onnxfuse" + rest).replace("$(MODEL)", "models/m").strip()
                if cmd == "onnxfuse":  # `test -x $(BIN)/onnxfuse`: the path, not a command
                    continue
                found.append((f"{path.name}: {cmd}", cmd, True))
    return found


COMMANDS = _commands()


def _subparsers(parser) -> dict:
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices
    return {}


def _command_parser(words: list[str]):
    """The parser of the (sub)command the words name, and how many words named it."""
    parser, used = cli.build_parser(), 0
    while used < len(words) and words[used] in _subparsers(parser):
        parser = _subparsers(parser)[words[used]]
        used += 1
    return parser, used


def test_the_docs_have_commands():
    assert len([c for c in COMMANDS if c[2]]) >= 10 and len(COMMANDS) >= 40


@pytest.mark.parametrize("where,command,complete", COMMANDS, ids=[c[0][:90] for c in COMMANDS])
def test_command_runs_through_the_parser(where, command, complete):
    words = shlex.split(command)[1:]
    parser, used = _command_parser(words)
    assert used > 0 or not words or words[0].startswith("-"), f"{where}: no such command {words[:1]}"
    options = {s for a in parser._actions for s in a.option_strings}
    flags = [w for w in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", " ".join(words[used:]))]
    unknown = [f for f in flags if f not in options]
    assert not unknown, f"{where}: {' '.join(words[:used])} has no option {unknown}"
    if complete:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                args, extra = cli.build_parser().parse_known_args(words)
            except SystemExit as e:
                pytest.fail(f"{where}: the parser refused it ({err.getvalue().strip()}, exit {e.code})")
        assert not extra, f"{where}: unrecognized {extra}"
        assert getattr(args, "func", None), f"{where}: not a runnable command"
