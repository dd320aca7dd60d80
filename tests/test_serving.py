"""onnxfuse serve / triton-repo (issue 32): the model's signature and config.pbtxt (parsed with tritonclient's
ModelConfig message), the Python-backend model's batching against single runs, and a real Triton server (the binary
PyTriton ships) answering a fused DLRM correctly, refusing malformed requests while it keeps serving, and leaving no
process behind."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest

from onnxfuse import cli, export, fuse, kernels, onnxio, runtime, zoo
from onnxfuse.errors import OnnxfuseError
from onnxfuse.serving import repository, triton_model

SPEC = zoo.DlrmSpec.from_preset("small")


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    """onnxfuse's DLRM (small tables), dynamic batch, and its fused form."""
    d = tmp_path_factory.mktemp("dlrm")
    export.export("dlrm", SPEC, d / "dlrm.onnx", dynamic=True)
    fuse.fuse(d / "dlrm.onnx", d / "dlrm.fused.onnx")
    return d


def _needs_server() -> None:
    """Skip without PyTriton's server (found, not imported: the server needs none of PyTriton's Python client) or
    tritonclient's HTTP client."""
    if importlib.util.find_spec("pytriton") is None:
        pytest.skip("needs nvidia-pytriton (its tritonserver binary)")
    pytest.importorskip("tritonclient.http")


def _parse(text: str):
    text_format = pytest.importorskip("google.protobuf.text_format")
    mc = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    return text_format.Parse(text, mc.ModelConfig())


def test_signature_of_a_dynamic_dlrm_batches_on_axis_0(dlrm):
    sig = repository.signature(onnx.load(str(dlrm / "dlrm.fused.onnx")))
    assert sig.batched, sig.why_not_batched
    assert [(t.name, t.data_type, t.dims[1:]) for t in sig.inputs] == \
        [("dense", "TYPE_FP32", [13]), ("sparse", "TYPE_INT64", [26])]
    assert [(t.name, t.data_type) for t in sig.outputs] == [("probability", "TYPE_FP32")]


def test_a_static_export_and_bags_are_served_without_batching(tmp_path):
    export.export("dlrm", SPEC, tmp_path / "static.onnx")  # batch fixed at export
    sig = repository.signature(onnx.load(str(tmp_path / "static.onnx")))
    assert not sig.batched and "fixed first dims" in sig.why_not_batched
    from onnxfuse import upstream_dlrm as U
    m = U.OriginalDLRM(4, [5, 7], [13, 8, 4], [U.top_width(4, 2, "dot"), 1]).eval()
    U.export_torchscript(m, U.make_batch([5, 7], 3, [1, 2]), tmp_path / "bags.onnx")
    sig = repository.signature(onnx.load(str(tmp_path / "bags.onnx")))
    assert not sig.batched and "do not share one batch axis" in sig.why_not_batched
    cfg = _parse(repository.config_text("bags", sig, backend="python", max_batch=64, delay_us=100, instances=1,
                                        provider="cpu"))
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    assert [list(i.dims) for i in cfg.input] == [[-1, 13], [2, -1], [2, -1]]  # the whole shape, unbatched


def test_triton_repo_for_the_onnxruntime_backend(dlrm, tmp_path):
    """config.pbtxt parses as Triton's ModelConfig, names the library copied beside the model (under --mount),
    batches dynamically; the CUDA form has the GPU instance group and the CUDA accelerator."""
    lib = kernels.library_path()
    out = tmp_path / "repo"
    assert cli.main(["triton-repo", str(dlrm / "dlrm.fused.onnx"), "-o", str(out), "--name", "dlrm",
                     "--instances", "2", "--mount", "/models", "--lib", str(lib), "-q"]) == 0
    cfg = _parse((out / "dlrm" / "config.pbtxt").read_text())
    assert (cfg.platform, cfg.backend, cfg.max_batch_size) == ("onnxruntime_onnx", "onnxruntime", 64)
    assert list(cfg.model_operations.op_library_filename) == ["/models/dlrm/libonnxfuse_ops.so"]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 100
    assert cfg.instance_group[0].count == 2 and cfg.instance_group[0].kind == cfg.instance_group[0].KIND_CPU
    assert (out / "dlrm" / "libonnxfuse_ops.so").read_bytes() == lib.read_bytes()
    copied = onnx.load(str(out / "dlrm" / "1" / "model.onnx"))
    assert copied.graph == onnxio.load(str(dlrm / "dlrm.fused.onnx")).graph
    assert cli.main(["triton-repo", str(dlrm / "dlrm.fused.onnx"), "-o", str(out), "--name", "dlrm", "-q"]) == 2
    sig = repository.signature(copied)
    cfg = _parse(repository.config_text("g", sig, backend="onnxruntime", max_batch=8, delay_us=50, instances=1,
                                        provider="cuda", library="/m/g/libonnxfuse_ops.so", cuda_graph=True))
    assert cfg.instance_group[0].kind == cfg.instance_group[0].KIND_GPU
    accel = cfg.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accel.name == "cuda" and dict(accel.parameters) == {"enable_cuda_graph": "1"}


def test_bad_names_and_missing_models_are_refused(dlrm, tmp_path):
    with pytest.raises(OnnxfuseError, match="model name"):
        repository.write_repository(dlrm / "dlrm.fused.onnx", tmp_path, name="a/b", backend="python")
    with pytest.raises(OnnxfuseError, match="no such model"):
        repository.write_repository(tmp_path / "none.onnx", tmp_path, name="x", backend="python")
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_python_model_batches_requests_like_single_runs(dlrm):
    """run_batch concatenates the requests on axis 0, runs once and splits: each request gets what it alone gets."""
    sess = runtime.session(str(dlrm / "dlrm.fused.onnx"), "cpu")
    reqs = [{k: v.numpy() for k, v in zoo.criteo_batch(SPEC, b, i).items()} for i, b in enumerate((1, 3, 2))]
    got = triton_model.run_batch(sess, ["dense", "sparse"], ["probability"], reqs)
    for feeds, out in zip(reqs, got):
        np.testing.assert_allclose(out[0], sess.run(["probability"], feeds)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_cuda_runner_through_iobinding_answers_like_session_run(dlrm):
    """On the CUDA provider the Python model runs through IOBinding (CudaRunner): the same outputs as session.run,
    batched requests each equal to its run alone."""
    sess = runtime.session(str(dlrm / "dlrm.fused.onnx"), "cuda")
    runner = triton_model.open_runner(str(dlrm / "dlrm.fused.onnx"), "cuda")
    assert isinstance(runner, triton_model.CudaRunner)
    reqs = [{k: v.numpy() for k, v in zoo.criteo_batch(SPEC, b, i).items()} for i, b in enumerate((1, 7, 64))]
    for feeds in reqs:
        np.testing.assert_allclose(runner.run(["probability"], feeds)[0], sess.run(["probability"], feeds)[0],
                                   rtol=1e-5, atol=1e-6)
    got = triton_model.run_batch(runner, ["dense", "sparse"], ["probability"], reqs)
    for feeds, out in zip(reqs, got):  # the batched GEMM may take another algorithm (TF32 on fp32)
        np.testing.assert_allclose(out[0], sess.run(["probability"], feeds)[0], rtol=2e-3, atol=2e-4)


# ------------------------------------------------------------------------------------------------ a real server
def _leftovers(marker: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in ps if marker in line and "ps -eo" not in line]


def _infer(url: str, model: str, feeds: dict):
    import tritonclient.http as th
    inputs = []
    for name, value in feeds.items():
        i = th.InferInput(name, list(value.shape), {np.float32: "FP32", np.int64: "INT64"}[value.dtype.type])
        i.set_data_from_numpy(value)
        inputs.append(i)
    return th.InferenceServerClient(url).infer(model, inputs).as_numpy("probability")


def test_server_answers_refuses_bad_requests_and_stops_clean(dlrm, tmp_path):
    _needs_server()
    from tritonclient.utils import InferenceServerException

    from onnxfuse.serving import server
    repository.write_repository(dlrm / "dlrm.fused.onnx", tmp_path / "repo", name="dlrm", backend="python",
                                instances=2)
    ref = runtime.session(str(dlrm / "dlrm.fused.onnx"), "cpu")
    srv = server.TritonServer(tmp_path / "repo")
    with srv:
        for b, seed in ((1, 0), (5, 1), (64, 2)):
            feeds = {k: v.numpy() for k, v in zoo.criteo_batch(SPEC, b, seed).items()}
            np.testing.assert_allclose(_infer(srv.url, "dlrm", feeds), ref.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
        good = {k: v.numpy() for k, v in zoo.criteo_batch(SPEC, 2, 3).items()}
        for bad in ({"dense": good["dense"].astype(np.int64), "sparse": good["sparse"]},     # wrong dtype
                    {"dense": good["dense"][:, :12].copy(), "sparse": good["sparse"]},        # wrong shape
                    {"dense": good["dense"]}):                                                # missing input
            with pytest.raises(InferenceServerException):
                _infer(srv.url, "dlrm", bad)
        np.testing.assert_allclose(_infer(srv.url, "dlrm", good), ref.run(None, good)[0], rtol=1e-5, atol=1e-6)
        import urllib.request
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics").read().decode()
        assert 'nv_inference_request_success{model="dlrm",version="1"} 4' in metrics
        pids = [srv.proc.pid]
    assert srv.proc.poll() is not None and srv.workspace is None
    time.sleep(0.5)
    assert not _leftovers(str(tmp_path / "repo")), _leftovers(str(tmp_path / "repo"))
    assert all(not os.path.exists(f"/proc/{p}") or "zombie" in open(f"/proc/{p}/status").read().lower()
               for p in pids)


@pytest.mark.gpu
def test_server_on_the_cuda_provider_answers_like_a_direct_run(tmp_path):
    """A KIND_GPU Python-backend model on the CUDA provider: the fused DLRM (fused for cuda) answers like a direct
    onnxruntime CUDA run, and the dynamic batcher runs concurrent requests together."""
    _needs_server()
    from concurrent.futures import ThreadPoolExecutor

    from onnxfuse.serving import server
    export.export("dlrm", SPEC, tmp_path / "dlrm.onnx", dynamic=True)
    fuse.fuse(tmp_path / "dlrm.onnx", tmp_path / "dlrm.fused.onnx", provider="cuda")
    repository.write_repository(tmp_path / "dlrm.fused.onnx", tmp_path / "repo", name="dlrm", backend="python",
                                provider="cuda", delay_us=2000)
    assert "KIND_GPU" in (tmp_path / "repo" / "dlrm" / "config.pbtxt").read_text()
    ref = runtime.session(str(tmp_path / "dlrm.fused.onnx"), "cuda")
    reqs = [{k: v.numpy() for k, v in zoo.criteo_batch(SPEC, 1 + i % 4, i).items()} for i in range(32)]
    with server.TritonServer(tmp_path / "repo") as srv:
        with ThreadPoolExecutor(16) as pool:
            got = list(pool.map(lambda f: _infer(srv.url, "dlrm", f), reqs))
        for feeds, out in zip(reqs, got):
            np.testing.assert_allclose(out, ref.run(None, feeds)[0], rtol=2e-3, atol=2e-4)
        import tritonclient.http as th
        stats = th.InferenceServerClient(srv.url).get_inference_statistics("dlrm")["model_stats"][0]
        assert int(stats["inference_count"]) == sum(len(f["dense"]) for f in reqs)
        assert int(stats["execution_count"]) < len(reqs)  # some requests ran together


def test_serve_command_prints_endpoints_and_stops_on_sigint(dlrm):
    _needs_server()
    from onnxfuse.serving import server
    port = server.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "onnxfuse", "serve", str(dlrm / "dlrm.fused.onnx"), "--port",
                             str(port), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = json.loads(proc.stdout.readline())
        assert info["http"] == f"http://127.0.0.1:{port}" and info["model"] == "dlrm_fused"
        assert info["batching"].startswith("dynamic batching up to 64")
        feeds = {k: v.numpy() for k, v in zoo.criteo_batch(SPEC, 3, 7).items()}
        ref = runtime.session(str(dlrm / "dlrm.fused.onnx"), "cpu").run(None, feeds)[0]
        np.testing.assert_allclose(_infer(f"127.0.0.1:{port}", "dlrm_fused", feeds), ref, rtol=1e-5, atol=1e-6)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)
    assert not _leftovers(f"--http-port={port}")
