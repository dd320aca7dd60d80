"""The CLI's contract: every command has help, -q and --json, and exit codes 0 ok / 1 goal or check failed /
2 bad input."""
from __future__ import annotations

import json

import pytest

from onnxfuse import cli

COMMANDS = [["export", "llama"], ["export", "dlrm"], ["fuse"], ["verify"], ["run"], ["build"], ["cache"], ["doctor"],
            ["bench"], ["view"], ["info"], ["serve"], ["triton-repo"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_quiet_and_json(command, capsys):
    assert cli.main(command + ["--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: onnxfuse " + " ".join(command))
    assert "-q, --quiet" in text and "--json" in text


@pytest.mark.parametrize("command", [c for c in COMMANDS if c[0] in ("export", "fuse", "run", "bench", "view")],
                         ids=" ".join)
def test_commands_that_write_files_take_dash_o(command, capsys):
    cli.main(command + ["--help"])
    assert " -o " in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["no-such-command"], ["export"], ["export", "llama", "--dtype", "fp64"], ["fuse"], ["verify"],
    ["run", "/nonexistent.onnx"], ["view", "/nonexistent.onnx", "--no-browser"],
    ["bench", "no-such-case", "--device", "cpu"], ["build", "--backends", "fortran"],
    ["serve", "/nonexistent.onnx"], ["triton-repo", "/nonexistent.onnx", "-o", "/tmp/onnxfuse-no-repo"],
])
def test_bad_input_exits_2_with_one_line(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1 and "error" in err


def test_no_command_prints_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert "usage: onnxfuse" in capsys.readouterr().out


def test_info_json(capsys):
    assert cli.main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["versions"]["onnx"] and "CPUExecutionProvider" in data["providers"] and "kernels" in data


def test_doctor_options_choose_what_is_checked(capsys):
    """`onnxfuse doctor` takes what run_doctor can choose (the old `python -m onnxfuse.doctor` options and
    more): providers, backends, ops, dtypes, modes, the library, and -v (each row as it finishes)."""
    argv = ["doctor", "--providers", "cpu", "--backends", "cpu", "--ops", "LinearRelu", "--dtypes", "float",
            "--modes", "plain"]
    assert cli.main(argv + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and {(r["op"], r["provider"], r["backend"], r["dtype"], r["mode"]) for r in rows} == \
        {("LinearRelu", "cpu", "cpu", "float", "plain")}
    assert cli.main(argv + ["-v"]) == 0
    out = capsys.readouterr().out
    assert out.count("PASS  LinearRelu") == len(rows) and f"{len(rows)} passed, 0 failed" in out
    assert cli.main(["doctor", "--lib", "/nonexistent/libonnxfuse_ops.so"]) == 2
    assert "--lib" in capsys.readouterr().err
    assert cli.main(["doctor", "--ops", "NoSuchOp"]) == 2
    assert "unknown op(s) NoSuchOp" in capsys.readouterr().err
