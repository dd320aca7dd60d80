"""Bad input: every row of the README's "Bad input" table is a test here.

Each case goes through `onnxfuse.cli.main([...])`: a one-line error on stderr that names the fix, a non-zero exit
code (2 for bad input), and no partial output file (nor a leftover temporary folder) beside the target.
"""
from __future__ import annotations

import pathlib
import re

import numpy as np
import onnx
import pytest

from onnxfuse import cli, fuse


def _err_line(capsys) -> str:
    """The one error line; the stage lines a command printed before it failed (`onnxfuse verify [2/3] ...`) are
    progress, not part of the error, and must all come first."""
    err = capsys.readouterr().err.strip()
    lines = err.splitlines()
    progress = [ln for ln in lines if re.match(r"onnxfuse \w+ \[\d/\d\] ", ln)]
    assert lines[:len(progress)] == progress, err
    lines = lines[len(progress):]
    assert len(lines) == 1, err
    return lines[0]


def _no_leftovers(folder: pathlib.Path, *names: str) -> None:
    for n in names:
        assert not (folder / n).exists(), n
        assert not (folder / (n + ".data")).exists(), n
    assert not list(folder.glob(".onnxfuse-*")), list(folder.glob(".onnxfuse-*"))


@pytest.fixture(scope="module")
def dlrm_model(tmp_path_factory):
    """A tiny exported DLRM and its fused twin (module-scoped: made once)."""
    from onnxfuse import export, zoo
    d = tmp_path_factory.mktemp("bad-input-models")
    export.export("dlrm", zoo.DlrmSpec.from_preset("small"), d / "dlrm.onnx", force=True)
    fuse.fuse(d / "dlrm.onnx", d / "dlrm.fused.onnx")
    return d / "dlrm.onnx", d / "dlrm.fused.onnx"


# ------------------------------------------------------------------------------------------------ unreadable files

@pytest.mark.parametrize("command", ["fuse", "run", "verify"])
def test_missing_file(tmp_path, capsys, command):
    argv = [command, str(tmp_path / "missing.onnx")] + (["-o", str(tmp_path / "out.onnx")] if command == "fuse" else [])
    assert cli.main(argv) == 2
    assert "no such file; give the path of an .onnx model" in _err_line(capsys)
    _no_leftovers(tmp_path, "out.onnx")


def test_empty_file(tmp_path, capsys):
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert cli.main(["fuse", str(tmp_path / "empty.onnx"), "-o", str(tmp_path / "out.onnx")]) == 2
    assert "empty file; re-export the model with 'onnxfuse export'" in _err_line(capsys)
    _no_leftovers(tmp_path, "out.onnx")


@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("command", ["fuse", "run"])
def test_truncated_file(dlrm_model, tmp_path, capsys, fraction, command):
    data = dlrm_model[0].read_bytes()
    bad = tmp_path / "truncated.onnx"
    bad.write_bytes(data[:int(len(data) * fraction)])
    argv = [command, str(bad), "-o", str(tmp_path / ("out.onnx" if command == "fuse" else "out.npz"))]
    assert cli.main(argv) == 2
    line = _err_line(capsys)
    assert "not a readable ONNX model" in line and "re-export it with 'onnxfuse export'" in line
    _no_leftovers(tmp_path, "out.onnx", "out.npz")


def test_not_an_onnx_file(tmp_path, capsys):
    bad = tmp_path / "notes.onnx"
    bad.write_text("hello, this is a text file and not a model\n")
    assert cli.main(["run", str(bad)]) == 2
    assert "not a readable ONNX model" in _err_line(capsys)


def test_directory_instead_of_file(tmp_path, capsys):
    assert cli.main(["verify", str(tmp_path)]) == 2
    assert "is a directory" in _err_line(capsys)


@pytest.mark.parametrize("command", ["run", "verify"])
def test_ir_version_too_new(dlrm_model, tmp_path, capsys, command):
    m = onnx.load(str(dlrm_model[0]))
    m.ir_version = 14
    onnx.save(m, str(tmp_path / "ir14.onnx"))
    assert cli.main([command, str(tmp_path / "ir14.onnx")]) == 2
    line = _err_line(capsys)
    assert "IR version 14, newer than onnxruntime" in line and "re-export it with 'onnxfuse export'" in line


def test_opset_too_new(dlrm_model, tmp_path, capsys):
    m = onnx.load(str(dlrm_model[0]))
    next(o for o in m.opset_import if o.domain in ("", "ai.onnx")).version = 99
    onnx.save(m, str(tmp_path / "op99.onnx"))
    assert cli.main(["run", str(tmp_path / "op99.onnx")]) == 2
    line = _err_line(capsys)
    assert "opset 99 is newer than it supports" in line and "re-export it with 'onnxfuse export'" in line


# ------------------------------------------------------------------------------------------------ fused models

def test_already_fused_says_so_and_writes_nothing(dlrm_model, tmp_path, capsys):
    assert cli.main(["fuse", str(dlrm_model[1]), "-o", str(tmp_path / "again.onnx")]) == 0
    out = capsys.readouterr().out
    assert "is already fused" in out and "nothing written" in out
    _no_leftovers(tmp_path, "again.onnx")


def test_fused_model_without_library_falls_back_with_warning(dlrm_model, tmp_path, capsys, monkeypatch):
    src, fused = dlrm_model
    assert cli.main(["run", str(src), "-o", str(tmp_path / "ref.npz"), "-q"]) == 0
    monkeypatch.setenv("ONNXFUSE_LIBRARY", "/nonexistent/libonnxfuse_ops.so")
    assert cli.main(["run", str(fused), "-o", str(tmp_path / "out.npz")]) == 0
    line = _err_line(capsys)
    assert line.startswith("onnxfuse: warning:") and "'onnxfuse build'" in line and "function bodies" in line
    with np.load(tmp_path / "ref.npz") as a, np.load(tmp_path / "out.npz") as b:
        np.testing.assert_allclose(b["probability"], a["probability"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("command", ["run", "verify"])
def test_fused_model_library_required_but_unavailable(dlrm_model, tmp_path, capsys, monkeypatch, command):
    monkeypatch.setenv("ONNXFUSE_LIBRARY", "/nonexistent/libonnxfuse_ops.so")
    argv = [command, str(dlrm_model[1]), "--require-library"]
    if command == "run":
        argv += ["-o", str(tmp_path / "out.npz")]
    assert cli.main(argv) == 2
    line = _err_line(capsys)
    assert "kernel library is unavailable" in line and "run 'onnxfuse build'" in line
    _no_leftovers(tmp_path, "out.npz")


# ------------------------------------------------------------------------------------------------ wrong inputs

def _npz(path, **arrays):
    np.savez(path, **arrays)
    return str(path)


@pytest.mark.parametrize("case,needle", [
    ("names", "inputs do not match the model: missing ['sparse'], unexpected ['ids']"),
    ("shape", "has shape [32, 12], the model wants [32, 13]; re-export with --batch/--seq or --dynamic"),
    ("rank", "has shape [32], the model wants [32, 13]; give an array of that rank"),
    ("dtype", "has dtype float64, the model wants float32; convert it"),
])
def test_run_wrong_inputs(dlrm_model, tmp_path, capsys, case, needle):
    dense = np.zeros((32, 13), np.float32)
    sparse = np.zeros((32, 26), np.int64)
    arrays = {"names": dict(dense=dense, ids=sparse), "shape": dict(dense=dense[:, :12], sparse=sparse),
              "rank": dict(dense=dense[:, 0], sparse=sparse),
              "dtype": dict(dense=dense.astype(np.float64), sparse=sparse)}
    inputs = _npz(tmp_path / "in.npz", **arrays[case])
    assert cli.main(["run", str(dlrm_model[0]), "--inputs", inputs, "-o", str(tmp_path / "out.npz")]) == 2
    assert needle in _err_line(capsys)
    _no_leftovers(tmp_path, "out.npz")


@pytest.mark.parametrize("case,needle", [
    ("names", "inputs do not match the model"),
    ("dtype", "has dtype float64, the model wants float32; convert it"),
])
def test_verify_wrong_inputs_from_module_factory(dlrm_model, tmp_path, capsys, case, needle):
    factory = tmp_path / "factory.py"
    factory.write_text(f'''
import torch
from onnxfuse import zoo

def make():
    spec = zoo.DlrmSpec.from_preset("small")
    module = zoo.build_module("dlrm", spec, 0, "fp32")
    inputs = zoo.make_inputs("dlrm", spec, 0, "fp32")
    if {case!r} == "names":
        inputs = {{"x": inputs["dense"], "sparse": inputs["sparse"]}}
    else:
        inputs["dense"] = inputs["dense"].double()
    return module, inputs
''')
    assert cli.main(["verify", str(dlrm_model[0]), "--module", f"{factory}:make"]) == 2
    assert needle in _err_line(capsys)


# ------------------------------------------------------------------------------------------------ bf16 on the CPU

@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    from onnxfuse import export, zoo
    path = tmp_path_factory.mktemp("bf16") / "dlrm-bf16.onnx"
    export.export("dlrm", zoo.DlrmSpec.from_preset("small"), path, dtype="bf16", force=True)
    return path


def test_verify_bf16_on_cpu_names_the_fix(bf16_model, capsys):
    assert cli.main(["verify", str(bf16_model), "--provider", "cpu"]) == 2
    line = _err_line(capsys)
    assert "bf16" in line and "--provider cuda" in line and "--dtype fp16/fp32" in line


def test_run_bf16_on_cpu_names_the_fix(bf16_model, tmp_path, capsys):
    assert cli.main(["run", str(bf16_model), "-o", str(tmp_path / "out.npz")]) == 2
    line = _err_line(capsys)
    assert "no bfloat16 kernel" in line and "--provider cuda" in line and "--dtype fp16/fp32" in line
    _no_leftovers(tmp_path, "out.npz")


# ------------------------------------------------------------------------------------------------ output paths

@pytest.mark.parametrize("command", ["export", "fuse", "run"])
def test_existing_output_needs_force(dlrm_model, tmp_path, capsys, command):
    target = tmp_path / ("out.npz" if command == "run" else "out.onnx")
    target.write_bytes(b"precious")
    argv = {"export": ["export", "dlrm", "--preset", "small"], "fuse": ["fuse", str(dlrm_model[0])],
            "run": ["run", str(dlrm_model[0])]}[command] + ["-o", str(target)]
    assert cli.main(argv) == 2
    assert "already exists; pass --force to overwrite it" in _err_line(capsys)
    assert target.read_bytes() == b"precious"
    assert not list(tmp_path.glob(".onnxfuse-*"))
    if command == "fuse":  # and with --force it is overwritten
        assert cli.main(argv + ["--force", "-q"]) == 0
        assert onnx.load(str(target)).graph.node


@pytest.mark.parametrize("where,needle", [
    ("readonly", "output directory is not writable; choose another path with -o"),
    ("missing", "output directory does not exist"),
    ("file", "is not a directory; choose another output path with -o"),
])
@pytest.mark.parametrize("command", ["export", "fuse"])
def test_unwritable_output(dlrm_model, tmp_path, capsys, where, needle, command):
    (tmp_path / "a-file").write_text("x")
    # /proc refuses new files even for root (a chmod'ed folder would not stop root)
    target = {"readonly": pathlib.Path("/proc/onnxfuse-out.onnx"), "missing": tmp_path / "no-such-dir" / "out.onnx",
              "file": tmp_path / "a-file" / "out.onnx"}[where]
    argv = (["export", "dlrm", "--preset", "small"] if command == "export" else ["fuse", str(dlrm_model[0])])
    assert cli.main(argv + ["-o", str(target)]) == 2
    assert needle in _err_line(capsys)
    assert not target.exists()
    _no_leftovers(tmp_path, "out.onnx")
