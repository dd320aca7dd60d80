"""GPU tests (marker `gpu`): skipped on machines without an NVIDIA GPU and onnxruntime-gpu (CI), run on the device.

    pytest -m gpu tests/test_gpu.py        # ONNXFUSE_LIBRARY=<prebuilt .so> to use a library built elsewhere
"""
from __future__ import annotations


import numpy as np
import onnx
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _cuda_first():
    import torch  # noqa: F401  (loads the CUDA libraries onnxruntime's CUDA EP links against)
    import onnxruntime as ort
    ort.preload_dlls()


def test_doctor_every_op_backend_dtype_and_mode_on_cuda():
    """Every op x {cuda, triton} x {fp32, fp16, bf16} against PyTorch: plain, on a user stream, under CUDA graphs."""
    from onnxfuse.kernels import doctor
    rows = doctor.run_doctor(providers=("cuda",), backends=("cuda", "triton"))
    assert rows
    bad = [doctor.format_row(r) for r in rows if r["status"] != "PASS"]
    assert not bad, "\n".join(bad)
    assert {r["mode"] for r in rows} == set(doctor.ALL_MODES)


@pytest.mark.parametrize("kind,overrides,dtype", [
    ("llama", dict(num_hidden_layers=2), "fp16"),
    ("llama", dict(lora_rank=8), "fp32"),
    ("llama", dict(num_hidden_layers=1), "bf16"),
    ("dlrm", dict(), "fp16"),
    ("dlrm", dict(lora_rank=4), "fp32"),
])
@pytest.mark.parametrize("backend", ["cuda", "triton", "auto"])
def test_fused_models_verify_on_the_cuda_ep(tmp_path, kind, overrides, dtype, backend):
    from onnxfuse import export, fuse, verify, zoo
    spec = (zoo.LlamaSpec.from_preset("tiny", **overrides) if kind == "llama"
            else zoo.DlrmSpec.from_preset("small", **overrides))
    export.export(kind, spec, tmp_path / "m.onnx", dtype=dtype)
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", backend=backend)  # the nodes' backend attribute
    assert res.matches
    out = verify.verify(tmp_path / "f.onnx", provider="cuda", library=True)
    assert out.passed, out.outputs


@pytest.mark.parametrize("factory", ["llama_fp16", "phi3_fp16", "gemma_fp16", "gemma2", "mistral_gelu_fp16",
                                     "mistral_quick_gelu_fp16", "mistral_relu", "mistral_sigmoid_fp16"])
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_gated_mlps_verify_on_the_cuda_ep(tmp_path, factory, backend):
    """Issue 15: transformers' gated MLPs (SwiGLU, Phi-3's merged gate_up, GeGLU, the other gate activations),
    exported with torch.onnx.export, fused in two stages, verified against the module on the CUDA EP per backend."""
    import importlib.util
    import pathlib

    from onnxfuse import export, fuse, verify
    spec = importlib.util.spec_from_file_location("hf_mlps", pathlib.Path(__file__).parent / "data" / "hf_mlps.py")
    hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf)
    module, inputs = getattr(hf, factory)()
    export._torch_export(module, inputs, tmp_path / "m.onnx", "dynamo", ["x"], ["y"], None)
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", backend=backend)
    assert [m.op for m in res.matches] == ["SwiGLU"]
    out = verify.verify(tmp_path / "f.onnx", module=module, inputs=inputs, provider="cuda", library=True)
    assert out.passed, out.outputs


def test_gated_mlp_bench_cases_run_on_the_gpu(tmp_path):
    from onnxfuse import bench
    res = bench.run(["llama-mlp", "geglu-mlp", "phi3-mlp"],
                    bench.Options(device="cuda", quick=True, runs=10, warmup=2, compile=False, cache_dir=tmp_path,
                                  sizes=[64]))
    for case in res["cases"]:
        assert case["models"]["fused_ops"] == {"SwiGLU": 1}, case["case"]
        for name in ("ort-unfused", "fused-triton", "fused-cuda", "fused-auto"):
            assert case["variants"][name].get("median_ms", 0) > 0, (case["case"], name, case["variants"][name])
            if name.startswith("fused"):
                assert (case["variants"][name].get("rel_err") or 1.0) < 1e-2, (case["case"], name)
    assert all(c["ratios"].get("fused_vs_llama_mlp") for c in res["cases"] if c["case"] != "llama-mlp")


def test_fused_model_under_cuda_graph_replays_new_inputs(tmp_path):
    """enable_cuda_graph: capture, then replay with new values in the same input buffers."""
    import onnxruntime as ort

    from onnxfuse import export, fuse, runtime, zoo
    spec = zoo.DlrmSpec.from_preset("small")
    export.export("dlrm", spec, tmp_path / "m.onnx", dtype="fp16")
    fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx")
    feeds = [{k: v.numpy() for k, v in zoo.criteo_batch(spec, spec.batch, seed, "fp16").items()} for seed in (1, 2)]
    plain = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True)
    refs = [plain.run(None, f)[0] for f in feeds]
    sess = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True, cuda_graph=True)
    vals = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in feeds[0].items()}
    out = ort.OrtValue.ortvalue_from_shape_and_type(list(refs[0].shape), refs[0].dtype, "cuda", 0)
    io = sess.io_binding()
    for k, v in vals.items():
        io.bind_ortvalue_input(k, v)
    io.bind_ortvalue_output(sess.get_outputs()[0].name, out)
    for _ in range(3):
        sess.run_with_iobinding(io)
    np.testing.assert_allclose(out.numpy(), refs[0], rtol=1e-3, atol=1e-3)
    for k, v in vals.items():
        v.update_inplace(feeds[1][k])
    sess.run_with_iobinding(io)
    np.testing.assert_allclose(out.numpy(), refs[1], rtol=1e-3, atol=1e-3)
    assert not np.allclose(refs[0], refs[1])


def test_bench_runs_on_the_gpu(tmp_path):
    from onnxfuse import bench
    res = bench.run(["dlrm-bottom"], bench.Options(device="cuda", quick=True, runs=10, warmup=2, compile=False,
                                                   cache_dir=tmp_path))
    variants = res["cases"][0]["variants"]
    for name in ("ort-unfused", "fused-triton", "fused-cuda", "fused-auto"):
        assert variants[name].get("median_ms", 0) > 0, (name, variants[name])


@pytest.mark.parametrize("stack_mode", ["fused", "layers"])
def test_mlp_stack_modes_from_the_node_attribute(stack_mode):
    """stack_mode=fused (one Triton kernel) and =layers (a launch per layer), forced per node, against PyTorch."""
    from onnxfuse.kernels import doctor
    shapes = {"MLPStack": [(m, (13, 512, 256, 64, 16), "relu.relu.relu.relu") for m in (1, 333, 20000)]
              + [(2048, (367, 512, 256, 1), "relu.relu.sigmoid")]}
    rows = doctor.run_doctor(providers=("cuda",), backends=("triton",), ops=["MLPStack"], shapes=shapes,
                             modes=("plain", "cuda_graph"), node_attrs={"stack_mode": stack_mode})
    bad = [doctor.format_row(r) for r in rows if r["status"] != "PASS"]
    assert rows and not bad, "\n".join(bad)


def test_default_library_refuses_experiment_knobs():
    """A default library has no variant cubins: a node asking for one fails at session creation, naming the fix."""
    import onnxruntime as ort

    from onnxfuse import kernels
    from onnxfuse.kernels import doctor
    lib = kernels.library_path(provider="cuda")
    if kernels.build_info(lib).get("experiments"):
        pytest.skip("this library was built with --experiments")
    model = doctor.make_model("LinearRelu", "float16", doctor.input_shapes("LinearRelu", 16, 64, 64, 0), "triton",
                              extra_attrs={"small_cfg": 1})
    so = kernels.session_options(path=lib)
    with pytest.raises(Exception, match="built without experiments.*onnxfuse build --experiments"):
        ort.InferenceSession(model, so, providers=["CUDAExecutionProvider"])
