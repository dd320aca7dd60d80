"""README, "Using a fused model without onnxfuse": a fused model in a plain onnxruntime session with nothing but
register_custom_ops_library on the stable path `onnxfuse build --print-path` prints, against the unfused model; and
the README's C++ program, compiled against the onnxruntime headers and linked to the wheel's libonnxruntime."""
from __future__ import annotations

import importlib
import pathlib
import re
import shutil
import subprocess

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from onnxfuse import cli, fuse

ROOT = pathlib.Path(__file__).resolve().parents[1]
kbuild = importlib.import_module("onnxfuse.kernels.build")


@pytest.fixture(scope="module")
def models(tmp_path_factory, exported):
    src = exported("llama", num_hidden_layers=1)
    out = tmp_path_factory.mktemp("plain") / "llama.fused.onnx"
    fuse.fuse(src, out, force=True)
    ops = {n.op_type for n in onnx.load(str(out), load_external_data=False).graph.node if n.domain == "onnxfuse"}
    assert ops, "nothing fused"
    return src, out


@pytest.fixture(scope="module")
def stable_library() -> str:
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["build", "--print-path"]) == 0
    path = out.getvalue().strip()
    assert "/stable/" in path or "ONNXFUSE_LIBRARY" in __import__("os").environ, path
    return path


def _snippet(lang: str) -> str:
    blocks = re.findall(rf"```{lang}\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    section = ((ROOT / "README.md").read_text().split("## Using a fused model without onnxfuse", 1)[1]
               .split("\n## ", 1)[0])
    found = [b for b in blocks if b in section]
    assert len(found) == 1, f"one {lang} block expected in the README section"
    return found[0]


def _feeds(sess) -> dict:
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        feeds[i.name] = (rng.integers(0, 256, shape).astype(np.int64) if i.type == "tensor(int64)"
                         else rng.standard_normal(shape).astype(np.float32))
    return feeds


def test_readme_python_snippet_in_plain_onnxruntime(models, stable_library):
    """The README's Python lines, run as written (library_path and feeds filled in), against the unfused model."""
    unfused, fused = models
    plain = ort.InferenceSession(str(unfused), providers=["CPUExecutionProvider"])
    feeds = _feeds(plain)
    code = _snippet("python").replace('"model.fused.onnx"', repr(str(fused)))
    scope = {"library_path": stable_library, "feeds": feeds}
    exec(compile(code, "README.md", "exec"), scope)
    assert scope["so"].get_session_config_entry  # a plain SessionOptions
    got = scope["outputs"][0]
    want = plain.run(None, feeds)[0]
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-4
    # the library ran the fused nodes: without it onnxruntime would have inlined the function bodies, so check the
    # session's profile names the onnxfuse op
    so = ort.SessionOptions()
    so.register_custom_ops_library(stable_library)
    so.enable_profiling = True
    so.profile_file_prefix = str(fused.parent / "plain")
    sess = ort.InferenceSession(str(fused), so, providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    assert '"op_name" : "SwiGLU"' in pathlib.Path(sess.end_profiling()).read_text()


def _ort_runtime_lib() -> pathlib.Path | None:
    capi = pathlib.Path(ort.__file__).parent / "capi"
    libs = sorted(capi.glob("libonnxruntime.so*"))
    return libs[0] if libs else None


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_readme_cpp_program(models, stable_library, tmp_path):
    """The README's C++ program compiles against the onnxruntime 1.21 headers, links to the wheel's runtime, loads
    the library with RegisterCustomOpsLibrary and gives the sums Python gives on the same zero inputs."""
    try:
        include, _ = kbuild.find_ort_headers(fetch=False)
    except kbuild.BuildError:
        pytest.skip("no onnxruntime headers here ('onnxfuse build' fetches them)")
    lib = _ort_runtime_lib()
    if lib is None:
        pytest.skip("this onnxruntime wheel has no libonnxruntime.so")
    _, fused = models
    src = tmp_path / "app.cc"
    src.write_text(_snippet("cpp"))
    app = tmp_path / "app"
    libdir = tmp_path / "lib"  # the wheel ships libonnxruntime.so.<version>; its SONAME is libonnxruntime.so.1
    libdir.mkdir()
    (libdir / "libonnxruntime.so.1").symlink_to(lib)
    (libdir / "libonnxruntime.so").symlink_to(lib)
    cc = subprocess.run(["g++", "-std=c++17", "-O1", str(src), f"-I{include}", f"-L{libdir}", "-lonnxruntime",
                         f"-Wl,-rpath,{libdir}", "-o", str(app)], capture_output=True, text=True)
    assert cc.returncode == 0, cc.stderr[-3000:]
    run = subprocess.run([str(app), str(fused), stable_library], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    name, count, total = run.stdout.split()
    so = ort.SessionOptions()
    so.register_custom_ops_library(stable_library)
    sess = ort.InferenceSession(str(fused), so, providers=["CPUExecutionProvider"])
    zeros = {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape],
                              np.int64 if i.type == "tensor(int64)" else np.float32) for i in sess.get_inputs()}
    y = sess.run(None, zeros)[0]
    assert name == sess.get_outputs()[0].name and int(count) == y.size
    assert float(total) == pytest.approx(float(y.astype(np.float64).sum()), rel=1e-4, abs=1e-3)


def test_library_exports_register_custom_ops(stable_library):
    if shutil.which("nm") is None:
        pytest.skip("needs nm")
    out = subprocess.run(["nm", "-D", "--defined-only", stable_library], capture_output=True, text=True).stdout
    assert sorted(ln.split()[-1] for ln in out.splitlines() if ln.strip()) == [
        "RegisterCustomOps", "onnxfuse_build_info", "onnxfuse_host_info"]
