"""Models over 2 GiB: weights in '<model>.onnx.data' on export and fuse (asked for, or automatic past the protobuf
limit), round-tripped by verify. Small models stand in for big ones: external data is forced, or the size
threshold is lowered so the automatic path (and fuse's streaming writer) is taken."""
from __future__ import annotations

import pathlib
import shutil

import onnx
import pytest
from onnx.external_data_helper import uses_external_data

from onnxfuse import cli, export, fuse, onnxio, soundness, verify, zoo


def _locations(path: pathlib.Path) -> set[str]:
    m = onnx.load(str(path), load_external_data=False)
    return {e.value for t in m.graph.initializer if uses_external_data(t)
            for e in t.external_data if e.key == "location"}


def _assert_external(path: pathlib.Path) -> None:
    data = path.with_name(path.name + ".data")
    assert data.is_file(), data
    assert _locations(path) == {data.name}, _locations(path)  # its own weights file, never another model's
    assert path.stat().st_size < data.stat().st_size, (path.stat().st_size, data.stat().st_size)
    m = onnx.load(str(path), load_external_data=False)
    inline = [t.name for t in m.graph.initializer if not uses_external_data(t) and len(t.raw_data) > 1024]
    assert not inline, inline  # the .onnx keeps only the graph and scalars: every real weight is in the .data


def _assert_inline(path: pathlib.Path) -> None:
    assert not path.with_name(path.name + ".data").exists()
    assert not _locations(path)


@pytest.fixture(scope="module")
def ext_llama(tmp_path_factory) -> pathlib.Path:
    d = tmp_path_factory.mktemp("external")
    spec = zoo.LlamaSpec.from_preset("tiny", num_hidden_layers=2, vocab_size=2048)
    res = export.export("llama", spec, d / "llama.onnx", external_data=True)
    return res.path


def test_export_and_fuse_with_external_data_verify(ext_llama, tmp_path):
    _assert_external(ext_llama)
    assert export.read_recipe(onnx.load(str(ext_llama), load_external_data=False))["kind"] == "llama"
    assert verify.verify(ext_llama).passed
    out = tmp_path / "fused.onnx"
    res = fuse.fuse(ext_llama, out, external_data=True)
    assert sorted(m.op for m in res.matches) == ["Embedding"] + ["RotaryEmbedding"] * 4 + ["SwiGLU"] * 2
    _assert_external(out)
    m = onnx.load(str(out))  # loads the weights too: the checker sees a complete model
    soundness.check_model(m)
    assert {f.name for f in m.functions} == {"SwiGLU", "RotaryEmbedding", "Embedding"}
    assert any(p.key == fuse.REPORT_KEY for p in m.metadata_props)
    res = verify.verify(out)
    assert res.passed and res.fused_nodes == 7 and res.library


def test_fused_external_model_is_self_contained(ext_llama, tmp_path):
    """The fused model carries its own weights file: moved elsewhere without its source, it still verifies."""
    fuse.fuse(ext_llama, tmp_path / "f.onnx")  # automatic: the source has external data, so does the output
    _assert_external(tmp_path / "f.onnx")
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    for name in ("f.onnx", "f.onnx.data"):
        shutil.move(tmp_path / name, moved / name)
    assert verify.verify(moved / "f.onnx").passed


def test_fuse_in_place_with_external_data(ext_llama, tmp_path):
    src = tmp_path / ext_llama.name  # the same name: the model's locations name its data file
    shutil.copy(ext_llama, src)
    shutil.copy(ext_llama.with_name(ext_llama.name + ".data"), tmp_path / (ext_llama.name + ".data"))
    assert cli.main(["fuse", str(src), "-o", str(src), "--force", "-q"]) == 0
    _assert_external(src)
    assert verify.verify(src).fused_nodes == 7  # 2 SwiGLU, 4 RotaryEmbedding, the token Embedding
    assert verify.verify(src).passed
    assert not list(tmp_path.glob(".onnxfuse-*"))


def test_fuse_external_source_to_inline_output(ext_llama, tmp_path):
    fuse.fuse(ext_llama, tmp_path / "f.onnx", external_data=False)
    _assert_inline(tmp_path / "f.onnx")
    assert verify.verify(tmp_path / "f.onnx").passed


def test_automatic_external_data_past_the_threshold(tmp_path, monkeypatch):
    """Past onnxio.EXTERNAL_DATA_THRESHOLD (1.8 GB; lowered here) export and fuse go external by themselves, and
    fuse takes its streaming writer (_save_large) for a source whose weights are inline."""
    spec = zoo.LlamaSpec.from_preset("tiny", mlp_only=True)
    small = export.export("llama", spec, tmp_path / "inline.onnx").path
    _assert_inline(small)
    monkeypatch.setattr(onnxio, "EXTERNAL_DATA_THRESHOLD", 10_000)
    calls = []
    real = fuse._save_large
    monkeypatch.setattr(fuse, "_save_large", lambda *a, **k: (calls.append(a[1]), real(*a, **k))[1])
    assert not fuse._fits_in_memory(small)
    fuse.fuse(small, tmp_path / "fused.onnx")
    assert calls == [tmp_path / "fused.onnx"]
    _assert_external(tmp_path / "fused.onnx")
    assert verify.verify(tmp_path / "fused.onnx").passed
    big = export.export("llama", spec, tmp_path / "auto.onnx").path
    _assert_external(big)
    assert verify.verify(big).passed


def test_save_large_without_threshold_tricks(ext_llama, tmp_path, monkeypatch):
    """_save_large chosen because the model does not fit a proto (as a 13 GB one would not)."""
    monkeypatch.setattr(fuse, "_fits_in_memory", lambda src: False)
    res = fuse.fuse(ext_llama, tmp_path / "f.onnx")
    assert res.model is None and res.output == str(tmp_path / "f.onnx")
    _assert_external(tmp_path / "f.onnx")
    assert verify.verify(tmp_path / "f.onnx").passed


def test_onnxio_save_external_and_atomic(tmp_path):
    spec = zoo.DlrmSpec.from_preset("small")
    path = export.export("dlrm", spec, tmp_path / "d.onnx").path
    m = onnx.load(str(path))
    onnxio.save(m, tmp_path / "e.onnx", external_data=True)
    _assert_external(tmp_path / "e.onnx")
    assert verify.verify(tmp_path / "e.onnx").passed
    assert not list(tmp_path.glob(".onnxfuse-*"))


def test_cli_external_data_flags(tmp_path):
    out = tmp_path / "m.onnx"
    assert cli.main(["export", "dlrm", "--preset", "small", "--external-data", "-o", str(out), "-q"]) == 0
    _assert_external(out)
    assert cli.main(["fuse", str(out), "-o", str(tmp_path / "f.onnx"), "--external-data", "-q"]) == 0
    _assert_external(tmp_path / "f.onnx")
    assert cli.main(["verify", str(tmp_path / "f.onnx"), "-q"]) == 0
