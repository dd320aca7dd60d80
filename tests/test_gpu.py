"""GPU tests (marker `gpu`): skipped on machines without an NVIDIA GPU and onnxruntime-gpu (CI), run on the device.

    pytest -m gpu tests/test_gpu.py        # ONNXFUSE_LIBRARY=<prebuilt .so> to use a library built elsewhere
"""
from __future__ import annotations


import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def _cuda_first():
    import torch  # noqa: F401  (loads the CUDA libraries onnxruntime's CUDA EP links against)
    import onnxruntime as ort
    ort.preload_dlls()


def test_doctor_every_op_backend_dtype_and_mode_on_cuda():
    """Every op x {cuda, triton} x {fp32, fp16, bf16} against PyTorch: plain, on a user stream, under CUDA graphs."""
    from onnxfuse import doctor
    rows = doctor.run_doctor(providers=("cuda",), backends=("cuda", "triton"))
    assert rows
    bad = [doctor.format_row(r) for r in rows if r["status"] != "PASS"]
    assert not bad, "\n".join(bad)
    assert {r["mode"] for r in rows} == set(doctor.ALL_MODES)


def test_doctor_special_values_on_cuda():
    """IEEE semantics on the GPU: rows of NaN, +-Inf, -0, the type's max and subnormals through every op x {cuda,
    triton} x dtype, plain, on a user stream and under CUDA graphs; NaN and Inf exactly where PyTorch has them."""
    from onnxfuse import doctor
    rows = doctor.run_doctor(providers=("cuda",), backends=("cuda", "triton"), special=True)
    assert rows and all(r["values"] == "special" for r in rows)
    bad = [doctor.format_row(r) for r in rows if r["status"] != "PASS"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("kind,overrides,dtype", [
    ("llama", dict(num_hidden_layers=2), "fp16"),
    ("llama", dict(lora_rank=8), "fp32"),
    ("llama", dict(lora_rank=16, mlp_only=True), "fp16"),  # LoRAGatedMLP
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
    export.torch_export(module, inputs, tmp_path / "m.onnx", "dynamo", ["x"], ["y"], None)
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", backend=backend)
    # fp16 and bf16: the down projection fuses as Linear too (rewrites/linear.py; fp32 MatMuls stay onnxruntime's)
    assert [m.op for m in res.matches] == ["SwiGLU"] + ["Linear"] * factory.endswith("_fp16")
    out = verify.verify(tmp_path / "f.onnx", module=module, inputs=inputs, provider="cuda", library=True)
    assert out.passed, out.outputs


def test_gated_mlp_bench_cases_run_on_the_gpu(tmp_path):
    from onnxfuse import bench
    res = bench.run(["llama-mlp", "geglu-mlp", "phi3-mlp"],
                    bench.Options(device="cuda", quick=True, runs=10, warmup=2, compile=False, cache_dir=tmp_path,
                                  sizes=[64]))
    for case in res["cases"]:  # the fp16 down projection, where Linear's rule takes its width, as Linear
        ops = case["models"]["fused_ops"]
        assert ops.get("SwiGLU") == 1 and set(ops) <= {"SwiGLU", "Linear"}, (case["case"], ops)
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


@pytest.mark.parametrize("stack_mode", ["fused", "layers", "grid"])
def test_mlp_stack_modes_from_the_node_attribute(stack_mode):
    """stack_mode=fused (one Triton kernel, row blocks), =grid (one persistent kernel, layers split over the SMs)
    and =layers (a launch per layer), forced per node, against PyTorch."""
    from onnxfuse import doctor
    shapes = {"MLPStack": [(m, (13, 512, 256, 64, 16), "relu.relu.relu.relu") for m in (1, 128, 333, 20000)]
              + [(m, (367, 512, 256, 1), "relu.relu.sigmoid") for m in (128, 2048)]
              + [(77, (29, 40), "sigmoid")]}
    rows = doctor.run_doctor(providers=("cuda",), backends=("triton",), ops=["MLPStack"], shapes=shapes,
                             modes=("plain", "cuda_graph"), node_attrs={"stack_mode": stack_mode})
    bad = [doctor.format_row(r) for r in rows if r["status"] != "PASS"]
    assert rows and not bad, "\n".join(bad)


def _stack_session(m, widths, acts, stack_mode, cuda_graph):
    import onnxruntime as ort

    from onnxfuse import kernels
    from onnxfuse import doctor
    model = doctor.make_model("MLPStack", "float16", doctor.stack_shapes(m, widths), "triton",
                              extra_attrs={"activations": acts, "stack_mode": stack_mode})
    opts = {"enable_cuda_graph": "1"} if cuda_graph else {}
    return ort.InferenceSession(model, kernels.session_options(path=kernels.library_path(provider="cuda")),
                                providers=[("CUDAExecutionProvider", opts)])


@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize("m,widths,acts", [(128, (13, 512, 256, 64, 16), "relu.relu.relu.relu"),
                                            (128, (367, 512, 256, 1), "relu.relu.sigmoid"),
                                            (2048, (367, 512, 256, 1), "relu.relu.sigmoid")])
def test_mlp_stack_grid_barrier_holds_over_many_runs(m, widths, acts, cuda_graph):
    """The grid kernel's barrier under repetition: 100 runs (CUDA-graph replays) with new X in the same buffer, each
    output against PyTorch. A missing fence or a stale read shows up as a run that differs, not as a crash."""
    import onnxruntime as ort
    import torch

    from onnxfuse import schema
    from onnxfuse import doctor
    shp = doctor.stack_shapes(m, widths)
    fixed = doctor.make_inputs("MLPStack", "float16", shp, 0, "cpu")[1:]
    feeds = {name: t.float().numpy() for name, t in zip(list(shp)[1:], fixed)}
    sess = _stack_session(m, widths, acts, "grid", cuda_graph)
    x0 = torch.randn(m, widths[0]).half()
    vals = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in {"X": x0.float().numpy(), **feeds}.items()}
    y = ort.OrtValue.ortvalue_from_shape_and_type([m, widths[-1]], np.float32, "cuda", 0)
    io = sess.io_binding()
    for k, v in vals.items():
        io.bind_ortvalue_input(k, v)
    io.bind_ortvalue_output("Y", y)
    worst = 0.0
    for run in range(100):
        x = torch.randn(m, widths[0], generator=torch.Generator().manual_seed(run)).half()
        vals["X"].update_inplace(x.float().numpy())
        sess.run_with_iobinding(io)
        ref = schema.reference("MLPStack", [x] + list(fixed), {"activations": acts}).float().numpy()
        ok, err, tol = doctor.compare(y.numpy(), ref, "float16")
        worst = max(worst, err)
        assert ok, f"run {run}: max err {err:.3g} > {tol:.3g}"
    assert worst < 0.05


def test_embedding_ops_past_the_triton_tiles_run_on_the_cuda_kernel():
    """d = 136 (> the widest Triton tile, 128) and 70 features (71 vectors > 64): backend=cuda and =auto serve them
    (auto falls back from Triton), backend=triton says it has no kernel."""
    import onnxruntime as ort

    from onnxfuse import kernels, schema
    from onnxfuse import doctor
    shapes = {"EmbeddingInteraction": [(9, 136, 3, "dot", "mod"), (5, 16, 70, "dot", "none")],
              "EmbeddingBagInteraction": [(7, 136, 4, "cat", 2)]}
    rows = doctor.run_doctor(providers=("cuda",), backends=("cuda",), ops=list(shapes), shapes=shapes)
    bad = [doctor.format_row(r) for r in rows if r["status"] != "PASS"]
    assert rows and not bad, "\n".join(bad)
    lib = kernels.library_path(provider="cuda")
    for op, entries in shapes.items():
        for entry in entries:
            shp, attrs, (m, _, n, _, _) = doctor.shape_entry(op, entry)
            ins = doctor.make_inputs(op, "float16", shp, 3, "cpu")
            feeds = {k: (t.float() if t.is_floating_point() else t).numpy() for k, t in zip(shp, ins)}
            ref = schema.reference(op, ins, attrs).float().numpy()
            for backend in ("auto", "triton"):
                model = doctor.make_model(op, "float16", shp, backend, extra_attrs=attrs)
                sess = ort.InferenceSession(model, kernels.session_options(path=lib),
                                            providers=["CUDAExecutionProvider"])
                if backend == "triton":
                    with pytest.raises(Exception, match="no Triton kernel compiled for this shape"):
                        sess.run(None, feeds)
                else:
                    ok, err, tol = doctor.compare(sess.run(None, feeds)[0], ref, "float16")
                    assert ok, (op, entry, err, tol)


@pytest.mark.parametrize("backend", ["cuda", "triton", "auto"])
def test_criteo_kaggle_cat_lora_dynamic_verifies_on_the_cuda_ep(tmp_path, backend):
    """The acceptance configuration on the GPU: the criteo-kaggle preset, --interaction cat, --lora-rank 4, dynamic
    batch, fp16; fused (EmbeddingInteraction + LoRA layers) and verified against the module from its recipe."""
    from onnxfuse import export, fuse, verify, zoo
    spec = zoo.DlrmSpec.from_preset("criteo-kaggle", interaction="cat", lora_rank=4)
    export.export("dlrm", spec, tmp_path / "m.onnx", dtype="fp16", dynamic=True)
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", backend=backend)
    assert [m.op for m in res.matches].count("EmbeddingInteraction") == 1
    out = verify.verify(tmp_path / "f.onnx", provider="cuda", library=True)
    assert out.passed, out.outputs


@pytest.mark.parametrize("interaction", ["dot", "cat"])
@pytest.mark.parametrize("backend", ["cuda", "triton", "auto"])
def test_original_dlrm_bags_on_the_cuda_ep(tmp_path, interaction, backend):
    """The original DLRM (onnxfuse/upstream_dlrm.py, multi-hot and empty bags) fused to EmbeddingBagInteraction,
    run on the CUDA EP against PyTorch."""

    import torch

    from onnxfuse import fuse, runtime
    from onnxfuse import upstream_dlrm as orig
    ln_emb, d = [50, 70, 30, 110, 9], 16
    module = orig.OriginalDLRM(d, ln_emb, [13, 64, d], [orig.top_width(d, len(ln_emb), interaction), 32, 1],
                               interaction).eval()
    batch = orig.make_batch(ln_emb, 40, [2, 0, 1, 3])
    orig.export_torchscript(module, batch, tmp_path / "m.onnx")
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", backend=backend)
    assert [m.op for m in res.matches].count("EmbeddingBagInteraction") == 1
    for bags, size in (((2, 0, 1, 3), 40), ((1,), 129)):
        other = orig.make_batch(ln_emb, size, list(bags), seed=size)
        with torch.no_grad():
            ref = module(*other).numpy()
        feeds = {"dense_x": other[0].numpy(), "offsets": other[1].numpy(), "indices": other[2].numpy()}
        got = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True).run(None, feeds)[0]
        np.testing.assert_allclose(got, ref, rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("interaction", ["dot", "cat"])
@pytest.mark.parametrize("backend", ["cuda", "triton"])
def test_upstream_per_table_bags_on_the_cuda_ep(tmp_path, interaction, backend):
    """DLRM_Net called with per-table lists (each table's indices of their own length, long and empty bags), exported
    at opset 11 and fused: the graph's concatenation nodes and the one bag op on the CUDA EP against PyTorch (the
    bench case dlrm-upstream-tables times it)."""
    import torch

    from onnxfuse import fuse, runtime
    from onnxfuse import upstream_dlrm as orig
    ln_emb, d = [50, 70, 30, 110, 9], 16
    module = orig.OriginalDLRM(d, ln_emb, [13, 64, d], [orig.top_width(d, len(ln_emb), interaction), 32, 1],
                               interaction).eval()
    orig.export_torchscript(module, orig.make_lists(ln_emb, 40, [2, 0, 1, 3]), tmp_path / "m.onnx", opset=11)
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", backend=backend)
    assert [m.op for m in res.matches].count("EmbeddingBagInteraction") == 1
    names = orig.list_input_names(len(ln_emb))
    sess = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True)
    for bags, size in (((2, 0, 1, 3), 40), ((1,), 129)):
        dense, lS_o, lS_i = orig.make_lists(ln_emb, size, list(bags), seed=size)
        with torch.no_grad():
            ref = module(dense, lS_o, lS_i).numpy()
        feeds = dict(zip(names, [t.numpy() for t in (dense, *lS_o, *lS_i)]))
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref, rtol=5e-3, atol=5e-3)


def test_bench_dlrm_profile_shows_the_fused_kernels(tmp_path):
    """`onnxfuse bench dlrm --profile`: the fused runs' kernels are the two stacks and the interaction, and the
    unfused run's Gathers are gone from them."""
    from onnxfuse import bench
    res = bench.run(["dlrm"], bench.Options(device="cuda", quick=True, runs=10, warmup=2, compile=False,
                                            cache_dir=tmp_path, profile=True, sizes=[128],
                                            variants=["ort-unfused+graph", "fused-triton+graph", "fused-cuda+graph"]))
    case = res["cases"][0]
    assert case["models"]["fused_ops"] == {"MLPStack": 2, "EmbeddingInteraction": 1}
    names = {v: " ".join(k["name"] for k in (case["variants"][v].get("top_kernels") or []))
             for v in ("fused-triton+graph", "fused-cuda+graph")}
    assert "_embedding_interaction_kernel" in names["fused-triton+graph"], names
    assert "_mlp_stack_grid_kernel" in names["fused-triton+graph"], names  # stack_mode=auto at batch 128
    assert "EmbeddingInteractionKernel" in names["fused-cuda+graph"], names
    assert "GatherKernel" not in names["fused-triton+graph"], names


def test_adapter_swap_under_cuda_graph(tmp_path):
    """Issue 30: a fused LoRA model with --lora-as-inputs under enable_cuda_graph: the adapter inputs bound once
    (adapters.AdapterSlots), the graph captured, a second adapter copied into the same buffers (from the host, then
    preloaded and activated by a device-to-device copy), the replay gives the second adapter's numbers (the plain
    CUDA session fed that adapter), and back."""
    import onnxruntime as ort

    from onnxfuse import adapters, export, fuse, runtime, zoo
    spec = zoo.LlamaSpec.from_preset("tiny", mlp_only=True, lora_rank=8)
    res = export.export("llama", spec, tmp_path / "m.onnx", dtype="fp16", lora_as_inputs=True)
    fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx")
    x = zoo.make_inputs("llama", spec, 0, "fp16")["x"].numpy()
    first = adapters.read_adapter(res.adapter_path)
    rng = np.random.default_rng(3)
    second = {k: (rng.standard_normal(v.shape) * 0.1).astype(v.dtype) for k, v in first.items()}
    plain = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True)
    refs = [plain.run(None, {"x": x, **p})[0] for p in (first, second)]
    assert not np.allclose(refs[0], refs[1], atol=1e-2)
    sess = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True, cuda_graph=True)
    io = sess.io_binding()
    xv = ort.OrtValue.ortvalue_from_numpy(x, "cuda", 0)
    out = ort.OrtValue.ortvalue_from_shape_and_type(list(refs[0].shape), refs[0].dtype, "cuda", 0)
    io.bind_ortvalue_input("x", xv)
    io.bind_ortvalue_output(sess.get_outputs()[0].name, out)
    slots = adapters.AdapterSlots(sess, io, first, device="cuda")
    for _ in range(3):  # the first runs capture the graph
        sess.run_with_iobinding(io)
    np.testing.assert_allclose(out.numpy(), refs[0], rtol=1e-3, atol=1e-3)
    for params, ref in ((second, refs[1]), (first, refs[0])):
        slots.load(params)
        sess.run_with_iobinding(io)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-3, atol=1e-3)
    slots.preload("first", first)
    slots.preload("second", second)
    for name, ref in (("second", refs[1]), ("first", refs[0]), ("second", refs[1])):  # device-to-device swaps
        slots.activate(name)
        sess.run_with_iobinding(io)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("backend", ["cuda", "triton", "auto"])
def test_multi_adapter_batch_under_cuda_graph(tmp_path, backend):
    """Issue 30's mixed batch on the GPU: the --adapters 4 model (fp16, MultiLoRALinear on gate/up/down) with every
    input bound once under enable_cuda_graph; new adapter rows and a new index mix copied into the bound buffers
    between replays; each replay equals the CPU run of the same feeds (the kernel library's CPU kernels)."""
    import onnxruntime as ort

    from onnxfuse import adapters, export, fuse, runtime, zoo
    spec = zoo.LlamaSpec.from_preset("tiny", mlp_only=True, lora_rank=8, batch=4, seq=3)
    res = export.export("llama", spec, tmp_path / "m.onnx", dtype="fp16", lora_as_inputs=True, multi_adapters=4)
    fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", backend=backend, write_unchanged=True)
    x = zoo.make_inputs("llama", spec, 0, "fp16")["x"].numpy()
    one = adapters.read_adapter(res.adapter_path)
    rng = np.random.default_rng(5)
    ads = [{k: (rng.standard_normal(v.shape) * 0.1).astype(v.dtype) for k, v in one.items()} for _ in range(4)]
    mixes = [([0, 1, 2, 3], adapters.stack_adapters(ads, [2.0, 1.0, 0.5, 3.0])),
             ([3, -1, 3, 1], adapters.stack_adapters(ads[::-1], [1.0, 1.0, 2.0, 0.5]))]
    cpu = runtime.session(str(tmp_path / "f.onnx"), "cpu", library=True)
    refs = [cpu.run(None, {"x": x, **f, adapters.ADAPTER_INDEX: np.array(i, np.int64)})[0] for i, f in mixes]
    assert not np.allclose(refs[0], refs[1], atol=1e-2)
    sess = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True, cuda_graph=True)
    io = sess.io_binding()
    bound = {"x": x, **mixes[0][1], adapters.ADAPTER_INDEX: np.array(mixes[0][0], np.int64)}
    values = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in bound.items()}
    for k, v in values.items():
        io.bind_ortvalue_input(k, v)
    out = ort.OrtValue.ortvalue_from_shape_and_type(list(refs[0].shape), refs[0].dtype, "cuda", 0)
    io.bind_ortvalue_output(sess.get_outputs()[0].name, out)
    for _ in range(3):  # the first runs capture the graph
        sess.run_with_iobinding(io)
    np.testing.assert_allclose(out.numpy(), refs[0], rtol=2e-2, atol=2e-2)
    for (index, feeds), ref in zip(mixes[::-1] + mixes, refs[::-1] + refs):
        for k, v in {**feeds, adapters.ADAPTER_INDEX: np.array(index, np.int64)}.items():
            values[k].update_inplace(v)
        sess.run_with_iobinding(io)
        np.testing.assert_allclose(out.numpy(), ref, rtol=2e-2, atol=2e-2)


def _save_fp16_model(path, nodes, inits, k, n):
    """A graph X [m, k] -> Y [m, n], both fp16, of `nodes` and `inits` (opsets 21, com.microsoft 1), saved to path."""
    import onnx
    from onnx import TensorProto, helper
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT16, ["m", k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT16, ["m", n])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                                ir_version=10), str(path))


@pytest.mark.parametrize("block,zp", [(32, False), (128, False), (32, True), (64, True)])
@pytest.mark.parametrize("backend", ["cuda", "triton", "auto"])
def test_int4_linear_matches_matmulnbits_on_the_cuda_ep(tmp_path, block, zp, backend):
    """genai's int4 projection (MatMulNBits, fp16, symmetric or with zero points) fused to Int4Linear: on the CUDA EP at
    decode (1 row: the GEMV; 3, 9, 16: the tensor-core kernel, one and two sets of 8 rows) and prefill (37, 300 rows) it
    equals onnxruntime's own MatMulNBits and the PyTorch dequantize-then-matmul."""
    import torch
    from onnx import helper, numpy_helper

    from onnxfuse import fuse, runtime
    from onnxfuse.ops.int4_linear import dequantize, quantize
    k, n = 1000, 392  # ragged K: the last block padded (block 64: 16 blocks; 32: 32 blocks, whole zero-point bytes)
    rng = np.random.default_rng(0)
    wq, s, *z = quantize(rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k) + 0.01, block, symmetric=not zp)
    node = helper.make_node("MatMulNBits", ["X", "B", "S"] + ["Z"] * zp, ["Y"], domain="com.microsoft", K=k, N=n,
                            bits=4, block_size=block)
    _save_fp16_model(tmp_path / "m.onnx", [node], [numpy_helper.from_array(wq, "B"),
                     numpy_helper.from_array(s.astype(np.float16), "S")]
                     + ([numpy_helper.from_array(z[0].reshape(-1), "Z")] if zp else []), k, n)
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", ort=False, provider="cuda", backend=backend)
    assert [m.op for m in res.matches] == ["Int4Linear"]
    unfused = runtime.session(str(tmp_path / "m.onnx"), "cuda", library=False)
    fused = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True, cpu_fallback=False)
    w = dequantize(torch.from_numpy(wq), torch.from_numpy(s.astype(np.float16)), k,
                   torch.from_numpy(z[0]) if zp else None)
    for m in (1, 3, 9, 16, 37, 300):
        x = rng.standard_normal((m, k)).astype(np.float16)
        want = (torch.from_numpy(x).float() @ w.T).numpy()
        got = fused.run(None, {"X": x})[0].astype(np.float32)
        ort_y = unfused.run(None, {"X": x})[0].astype(np.float32)
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() <= 4e-3 * scale, (m, np.abs(got - want).max())
        assert np.abs(got - ort_y).max() <= 8e-3 * scale, (m, np.abs(got - ort_y).max())


@pytest.mark.parametrize("k,n,block", [(4096, 1000, 32), (11008, 300, 64), (2048, 37, 128), (1024, 5000, 32)])
@pytest.mark.parametrize("gated", [False, True])
def test_int4_one_row_gemv_matches_matmulnbits(tmp_path, k, n, block, gated):
    """One row, fp16, symmetric, K a multiple of the block (genai's decode at batch 1): the one-row GEMV
    (Int4RowGemv: K split across a block's warps, a block's columns contiguous; 11008 leaves its last warp 24 units; 37
    and 300 columns give blocks of one or two) runs and equals onnxruntime's MatMulNBits (Int4Linear) or its unfused
    gated MLP (Int4SwiGLU) and the PyTorch dequantize-then-matmul, with X in the hundreds (the unit sums taken over X
    scaled by a power of two); a scale of Inf in one block and one of NaN in another give onnxruntime's NaN and Inf
    there."""
    import torch
    from onnx import helper, numpy_helper
    from torch.profiler import ProfilerActivity, profile

    from onnxfuse import fuse, runtime
    from onnxfuse.ops.int4_linear import dequantize, quantize
    rng = np.random.default_rng(7)
    names = ("gate", "up") if gated else ("w",)
    inits, nodes, ws = [], [], {}
    for i, name in enumerate(names):
        wq, s = quantize(rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k) + 0.01, block, symmetric=True)
        s = s.astype(np.float16)
        if i == 0:  # special scales: Inf in column 3's block 1, NaN in column n - 1's last block
            s.reshape(n, -1)[3, 1] = np.inf
            s.reshape(n, -1)[n - 1, -1] = np.nan
        inits += [numpy_helper.from_array(wq, f"{name}.B"), numpy_helper.from_array(s, f"{name}.S")]
        nodes.append(helper.make_node("MatMulNBits", ["X", f"{name}.B", f"{name}.S"], [name if gated else "Y"],
                                      domain="com.microsoft", K=k, N=n, bits=4, block_size=block))
        ws[name] = dequantize(torch.from_numpy(wq), torch.from_numpy(s), k, None).float()
    if gated:
        nodes += [helper.make_node("QuickGelu", ["gate"], ["act"], domain="com.microsoft", alpha=1.0),
                  helper.make_node("Mul", ["act", "up"], ["Y"])]
    _save_fp16_model(tmp_path / "m.onnx", nodes, inits, k, n)
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", ort=False, provider="cuda", backend="cuda")
    assert [m.op for m in res.matches] == ["Int4SwiGLU" if gated else "Int4Linear"]
    unfused = runtime.session(str(tmp_path / "m.onnx"), "cuda", library=False)
    fused = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True, cpu_fallback=False)
    for amp in (1.0, 30.0 if gated else 300.0):  # |x| past 4 in every unit; the gated outputs stay below fp16's max
        x = (rng.standard_normal((1, k)) * amp).astype(np.float16)
        xf = torch.from_numpy(x).float()
        want = (xf @ ws[names[0]].T)
        if gated:
            want = torch.nn.functional.silu(want) * (xf @ ws["up"].T)
        want = want.numpy()
        fused.run(None, {"X": x})
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            got = fused.run(None, {"X": x})[0].astype(np.float32)
            torch.cuda.synchronize()
        assert "Int4RowGemv" in " ".join(e.name for e in prof.events() if e.device_type.name == "CUDA")
        ort_y = unfused.run(None, {"X": x})[0].astype(np.float32)
        special = ~np.isfinite(ort_y)
        assert special[0, 3] and special[0, n - 1]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ort_y))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ort_y))
        np.testing.assert_array_equal(got[special], ort_y[special])
        ok = np.isfinite(want)
        scale = max(1.0, float(np.abs(want[ok]).max()))
        assert np.abs(got[ok] - want[ok]).max() <= 4e-3 * scale, (amp, np.abs(got[ok] - want[ok]).max())
        assert np.abs(got[ok] - ort_y[ok]).max() <= 8e-3 * scale, (amp, np.abs(got[ok] - ort_y[ok]).max())


def test_int4_linear_auto_picks_its_kernel_by_rows_and_width(tmp_path):
    """backend=auto on an Int4Linear (triton/table.py AUTO_CUDA): the tensor-core kernel at 8 rows; at 32 rows the
    rows path (Int4MmaGemm) where K is a multiple of 64, else Triton's GEMM where N is 16384 (an lm_head) and the
    dequantization + cuBLASLt GEMM where N is 4096; the dequantization + GEMM at 300 rows; each output equal to the
    PyTorch dequantize-then-matmul."""
    import torch
    from onnx import helper, numpy_helper
    from torch.profiler import ProfilerActivity, profile

    from onnxfuse import fuse, runtime
    from onnxfuse.ops.int4_linear import dequantize, quantize
    block = 32
    rng = np.random.default_rng(3)
    for n, m, k, want in ((16384, 8, 256, "Int4MmaFast"), (16384, 32, 256, "Int4MmaGemm"),
                          (4096, 32, 256, "Int4MmaGemm"), (16384, 32, 288, "_int4_linear_kernel"),
                          (4096, 32, 288, "Int4Dequantize"), (4096, 300, 256, "Int4Dequantize")):
        wq, s = quantize(rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k), block, symmetric=True)[:2]
        node = helper.make_node("MatMulNBits", ["X", "B", "S"], ["Y"], domain="com.microsoft", K=k, N=n, bits=4,
                                block_size=block)
        src, dst = tmp_path / f"m{n}-{k}.onnx", tmp_path / f"f{n}-{k}.onnx"
        _save_fp16_model(src, [node], [numpy_helper.from_array(wq, "B"),
                         numpy_helper.from_array(s.astype(np.float16), "S")], k, n)
        fuse.fuse(src, dst, ort=False, provider="cuda", backend="auto", force=True)
        sess = runtime.session(str(dst), "cuda", library=True, cpu_fallback=False)
        x = rng.standard_normal((m, k)).astype(np.float16)
        sess.run(None, {"X": x})
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            got = sess.run(None, {"X": x})[0].astype(np.float32)
            torch.cuda.synchronize()
        names = " ".join(e.name for e in prof.events() if e.device_type.name == "CUDA")
        assert want in names, (n, m, names)
        w = dequantize(torch.from_numpy(wq), torch.from_numpy(s.astype(np.float16)), k)
        ref = (torch.from_numpy(x).float() @ w.T).numpy()
        assert np.abs(got - ref).max() <= 4e-3 * max(1.0, float(np.abs(ref).max())), (n, m)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("gated", [False, True])
def test_int4_decode_below_three_rows_runs_the_tensor_core_common_form(tmp_path, dtype, gated):
    """Int4Linear / Int4SwiGLU at 1 and 2 rows where the fp16 one-row GEMV does not take the call (fp16 at 2 rows, bf16
    at 1 and 2; symmetric, block 32, K a multiple of 128): the tensor-core kernel's common form (Int4MmaFast) runs, not
    the GEMV it replaced there (a 7B layer 48 against 61 us in fp16 at 2 rows, 54 against 80 and 140 in bf16 on an
    H200), and the output equals the PyTorch dequantize-then-matmul, a scale of Inf in one block giving NaN or Inf
    exactly where the reference has them."""
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper
    from torch.profiler import ProfilerActivity, profile

    from onnxfuse import fuse, runtime
    from onnxfuse.ops.int4_linear import dequantize, quantize
    tt, td = (TensorProto.FLOAT16, torch.float16) if dtype == "float16" else (TensorProto.BFLOAT16, torch.bfloat16)
    k, n, block = 512, 392, 32
    rng = np.random.default_rng(11)
    names = ("gate", "up") if gated else ("w",)
    inits, ws = [], {}
    nodes = [helper.make_node("Cast", ["X32"], ["X"], to=tt)]
    for i, name in enumerate(names):
        wq, s = quantize(rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k) + 0.01, block, symmetric=True)[:2]
        st = torch.from_numpy(s).to(td)
        if i == 0:  # column 5's block 3: scale Inf
            st.view(n, -1)[5, 3] = float("inf")
        inits += [numpy_helper.from_array(wq, f"{name}.B"), _scales_init(f"{name}.S", st, tt)]
        nodes.append(helper.make_node("MatMulNBits", ["X", f"{name}.B", f"{name}.S"], [name if gated else "Yt"],
                                      domain="com.microsoft", K=k, N=n, bits=4, block_size=block, accuracy_level=4))
        ws[name] = dequantize(torch.from_numpy(wq), st, k, None).float()
    if gated:
        nodes += [helper.make_node("QuickGelu", ["gate"], ["act"], domain="com.microsoft", alpha=1.0),
                  helper.make_node("Mul", ["act", "up"], ["Yt"])]
    nodes.append(helper.make_node("Cast", ["Yt"], ["Y"], to=TensorProto.FLOAT))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X32", TensorProto.FLOAT, ["m", k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["m", n])], inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    onnx.save(helper.make_model(g, opset_imports=opsets, ir_version=10), str(tmp_path / "m.onnx"))
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", ort=False, provider="cuda", backend="cuda")
    assert [m.op for m in res.matches] == ["Int4SwiGLU" if gated else "Int4Linear"]
    sess = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True, cpu_fallback=False)
    for m in (1, 2) if dtype == "bfloat16" else (2,):
        x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(td).float()
        sess.run(None, {"X32": x.numpy()})
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            got = sess.run(None, {"X32": x.numpy()})[0]
            torch.cuda.synchronize()
        kernels = " ".join(e.name for e in prof.events() if e.device_type.name == "CUDA")
        assert "Int4MmaFast" in kernels and "Int4Gemv" not in kernels, (m, kernels)
        want = x @ ws[names[0]].T
        if gated:
            want = (torch.nn.functional.silu(want) * (x @ ws["up"].T))
        want = want.to(td).float().numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        assert not np.isfinite(want[:, 5]).any()
        ok = np.isfinite(want)
        tol = (4e-3 if dtype == "float16" else 3e-2) * max(1.0, float(np.abs(want[ok]).max()))
        assert np.abs(got[ok] - want[ok]).max() <= tol, (m, np.abs(got[ok] - want[ok]).max())


def _scales_init(name, st, tt):
    """A 16-bit scales tensor (torch fp16 or bf16) as an initializer of ONNX type tt, from its raw bytes (numpy has no
    bfloat16)."""
    import torch
    from onnx import helper
    return helper.make_tensor(name, tt, list(st.shape), st.contiguous().view(torch.int16).numpy().tobytes(), raw=True)


@pytest.mark.parametrize("gated", [False, True])
def test_int4_accuracy_level_4_rounds_x_to_int8_at_one_row(tmp_path, gated):
    """A MatMulNBits of accuracy_level 4 (onnxruntime's "X may be quantized to int8") fuses to a node that keeps it, and
    at one fp16 row the CUDA backend runs the GEMV over X rounded to int8 (Int4RowGemvI8: a 7B layer 36.1 against 39.7
    us on an H200): its output equals the int8 path's float64 emulation to fp16's rounding and stays within the int8
    rounding's bound of the exact product (and the emulation is farther than that from the exact product, so the test
    tells the paths apart); a level-0 node runs the fp16 GEMV; at 2 rows the exact tensor-core kernel runs; X with an
    Inf and a scale of Inf put NaN and Inf where the reference does; a CUDA graph replays it; the norm op in front
    (SkipRMSNormInt4Linear) passes the level on."""
    import onnx
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper
    from torch.profiler import ProfilerActivity, profile

    from onnxfuse import fuse, runtime
    from onnxfuse.ops.int4_linear import dequantize, int8_x_product, quantize
    fp16 = TensorProto.FLOAT16
    rng = np.random.default_rng(31)

    def build(level, k, n, block, norm=False, inf_scale=False):
        names = ("gate", "up") if gated else ("w",)
        inits, parts = [], {}
        nodes = [helper.make_node("Cast", ["X32"], ["X"], to=fp16)]
        x_in = "X"
        if norm:
            gamma = (rng.standard_normal(k) * 0.3 + 1.0).astype(np.float16)
            inits.append(numpy_helper.from_array(gamma, "gamma"))
            nodes.append(helper.make_node("SkipSimplifiedLayerNormalization", ["X", "skip", "gamma"],
                                          ["normed", "", "", "sum"], domain="com.microsoft", epsilon=1e-5))
            x_in, parts["gamma"] = "normed", torch.from_numpy(gamma).float()
        for i, name in enumerate(names):
            wq, s = quantize(rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k) + 0.01, block,
                             symmetric=True)[:2]
            st = torch.from_numpy(s).to(torch.float16)
            if inf_scale and i == 0:  # column 5's block 1: scale Inf
                st.view(n, -1)[5, 1] = float("inf")
            inits += [numpy_helper.from_array(wq, f"{name}.B"), _scales_init(f"{name}.S", st, fp16)]
            nodes.append(helper.make_node("MatMulNBits", [x_in, f"{name}.B", f"{name}.S"], [name if gated else "Yt"],
                                          domain="com.microsoft", K=k, N=n, bits=4, block_size=block,
                                          **({"accuracy_level": level} if level else {})))
            parts[name] = (wq, st, dequantize(torch.from_numpy(wq), st, k, None).float())
        if gated:
            nodes += [helper.make_node("QuickGelu", ["gate"], ["act"], domain="com.microsoft", alpha=1.0),
                      helper.make_node("Mul", ["act", "up"], ["Yt"])]
        nodes.append(helper.make_node("Cast", ["Yt"], ["Y"], to=TensorProto.FLOAT))
        inputs = [helper.make_tensor_value_info("X32", TensorProto.FLOAT, ["m", k])]
        if norm:
            inputs.append(helper.make_tensor_value_info("skip", fp16, ["m", k]))
        g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["m", n])],
                              inits)
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
        tag = f"{level}-{k}-{n}-{block}-{int(norm)}-{int(inf_scale)}"
        src, dst = tmp_path / f"m{tag}.onnx", tmp_path / f"f{tag}.onnx"
        onnx.save(helper.make_model(g, opset_imports=opsets, ir_version=10), str(src))
        res = fuse.fuse(src, dst, ort=False, provider="cuda", backend="cuda", force=True)
        want_op = ("SkipRMSNorm" if norm else "") + ("Int4SwiGLU" if gated else "Int4Linear")
        assert [mt.op for mt in res.matches][-1] == want_op
        node = next(nd for nd in onnx.load(str(dst)).graph.node if nd.op_type == want_op)
        assert {a.name: helper.get_attribute_value(a) for a in node.attribute}.get("accuracy_level", 0) == level
        return runtime.session(str(dst), "cuda", library=True, cpu_fallback=False), parts

    def run(sess, feeds):
        sess.run(None, feeds)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            got = sess.run(None, feeds)[0]
            torch.cuda.synchronize()
        return got, " ".join(e.name for e in prof.events() if e.device_type.name == "CUDA")

    def exact(x, parts):
        y = x @ parts[("gate", "up")[0] if gated else "w"][2].T
        return (torch.nn.functional.silu(y) * (x @ parts["up"][2].T) if gated else y).numpy()

    def emulated(x, parts, k, block):
        if not gated:
            return [t.numpy() for t in int8_x_product(x, torch.from_numpy(parts["w"][0]), parts["w"][1], k, block)]
        g, u = (int8_x_product(x, torch.from_numpy(parts[nm][0]), parts[nm][1], k, block)[0] for nm in ("gate", "up"))
        return (torch.nn.functional.silu(g) * u).numpy(), None

    for k, n, block in ((1024, 392, 32), (4096, 520, 64)):
        sess4, parts = build(4, k, n, block)
        x = torch.from_numpy(rng.standard_normal((1, k)).astype(np.float32)).half().float()
        got, kernels = run(sess4, {"X32": x.numpy()})
        assert "Int4RowGemvI8" in kernels, kernels
        want, bound = emulated(x, parts, k, block)
        scale = float(np.abs(want).max())
        tol = 1e-3 * np.abs(want) + 1e-4 * scale  # fp16's rounding of the output, fp32's sums
        assert (np.abs(got - want) <= tol).all(), float(np.abs(got - want).max())
        ex = exact(x, parts)
        assert (np.abs(ex - want) > tol).any(), "the exact product passes too: the test cannot tell the paths apart"
        if bound is not None:
            assert (np.abs(got - ex) <= bound + 1e-3 * np.abs(ex) + 1e-4 * scale).all()
        sess0, parts0 = build(0, k, n, block)
        got0, kernels0 = run(sess0, {"X32": x.numpy()})
        assert "Int4RowGemv" in kernels0 and "Int4RowGemvI8" not in kernels0, kernels0
        ex0 = exact(x, parts0)
        assert np.abs(got0 - ex0).max() <= 4e-3 * max(1.0, float(np.abs(ex0).max()))
        x2 = torch.from_numpy(rng.standard_normal((2, k)).astype(np.float32)).half().float()
        got2, kernels2 = run(sess4, {"X32": x2.numpy()})  # 2 rows: the exact tensor-core kernel
        assert "Int4MmaFast" in kernels2 and "Int4RowGemvI8" not in kernels2, kernels2
        ex2 = exact(x2, parts)
        assert np.abs(got2 - ex2).max() <= 4e-3 * max(1.0, float(np.abs(ex2).max()))
        # under a CUDA graph: the same kernel, the same output for each of two inputs bound in place
        graph = runtime.session(str(tmp_path / f"f4-{k}-{n}-{block}-0-0.onnx"), "cuda", library=True,
                                cuda_graph=True)
        xs = [x.numpy(), torch.from_numpy(rng.standard_normal((1, k)).astype(np.float32)).half().float().numpy()]
        refs = [sess4.run(None, {"X32": v})[0] for v in xs]
        xv = ort.OrtValue.ortvalue_from_numpy(xs[0], "cuda", 0)
        out = ort.OrtValue.ortvalue_from_shape_and_type([1, n], np.float32, "cuda", 0)
        io = graph.io_binding()
        io.bind_ortvalue_input("X32", xv)
        io.bind_ortvalue_output("Y", out)
        for _ in range(3):  # the first runs capture the graph
            graph.run_with_iobinding(io)
        np.testing.assert_array_equal(out.numpy(), refs[0])
        xv.update_inplace(xs[1])
        graph.run_with_iobinding(io)
        np.testing.assert_array_equal(out.numpy(), refs[1])

    # X with an Inf (then also a NaN), and a scale of Inf: every output's class as the exact product's
    k, n, block = 1024, 392, 32
    sess, parts = build(4, k, n, block, inf_scale=True)
    x = torch.from_numpy(rng.standard_normal((1, k)).astype(np.float32)).half().float()
    for pos, val in ((None, None), (100, float("inf")), (700, float("nan"))):
        if pos is not None:
            x[0, pos] = val
        got, kernels = run(sess, {"X32": x.numpy()})
        assert "Int4RowGemvI8" in kernels, kernels
        ex = exact(x, parts)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ex))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ex))
        np.testing.assert_array_equal(got[np.isinf(got)], ex[np.isinf(ex)])
        assert not np.isfinite(ex[:, 5]).any()
        if pos is None:  # the other columns on the int8 path
            ok = np.isfinite(ex)
            want = emulated(x, parts, k, block)[0]
            assert np.abs(got[ok] - want[ok]).max() <= 1e-3 * float(np.abs(want[ok]).max())

    # the norm op in front passes the level on: its norm kernel, then the int8 GEMV
    sess, parts = build(4, k, n, block, norm=True)
    feeds = {"X32": rng.standard_normal((1, k)).astype(np.float16).astype(np.float32),
             "skip": rng.standard_normal((1, k)).astype(np.float16)}
    got, kernels = run(sess, feeds)
    assert "Int4SkipNormRows" in kernels and "Int4RowGemvI8" in kernels, kernels
    s_ref = (torch.from_numpy(feeds["X32"]).half().float() + torch.from_numpy(feeds["skip"]).float()).half().float()
    xn = (s_ref * torch.rsqrt(s_ref.pow(2).mean(-1, keepdim=True) + 1e-5) * parts["gamma"]).half().float()
    ex = exact(xn, parts)
    assert np.abs(got - ex).max() <= 1e-2 * max(1.0, float(np.abs(ex).max())), float(np.abs(got - ex).max())

def test_int4_bf16_with_zero_points_runs_the_tensor_cores_from_one_row(tmp_path):
    """bf16 Int4Linear with zero points (the tensor-core kernel's general form, Int4Mma) at 1 and 2 rows, where the
    GEMV took 88 and 146 us for a 7B layer against Int4Mma's 78 on an H200: Int4Mma runs, and the output equals the
    PyTorch dequantize-then-matmul (blocks of 16, K not a multiple of 8: the form's copies and X by elements)."""
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper
    from torch.profiler import ProfilerActivity, profile

    from onnxfuse import fuse, runtime
    from onnxfuse.ops.int4_linear import dequantize, quantize
    rng = np.random.default_rng(12)
    for k, n, block in ((512, 392, 32), (1004, 200, 16)):
        wq, s, z = quantize(rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k) + 0.01, block, symmetric=False)
        st = torch.from_numpy(s).to(torch.bfloat16)
        inits = [numpy_helper.from_array(wq, "B"), numpy_helper.from_array(z.reshape(-1), "Z"),
                 _scales_init("S", st, TensorProto.BFLOAT16)]
        nodes = [helper.make_node("Cast", ["X32"], ["X"], to=TensorProto.BFLOAT16),
                 helper.make_node("MatMulNBits", ["X", "B", "S", "Z"], ["Yt"], domain="com.microsoft", K=k, N=n, bits=4,
                                  block_size=block, accuracy_level=4),
                 helper.make_node("Cast", ["Yt"], ["Y"], to=TensorProto.FLOAT)]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X32", TensorProto.FLOAT, ["m", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["m", n])], inits)
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
        src, dst = tmp_path / f"m{k}.onnx", tmp_path / f"f{k}.onnx"
        onnx.save(helper.make_model(g, opset_imports=opsets, ir_version=10), str(src))
        res = fuse.fuse(src, dst, ort=False, provider="cuda", backend="cuda", force=True)
        assert [m.op for m in res.matches] == ["Int4Linear"]
        sess = runtime.session(str(dst), "cuda", library=True, cpu_fallback=False)
        w = dequantize(torch.from_numpy(wq), st, k, torch.from_numpy(z)).float()
        for m in (1, 2):
            x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).to(torch.bfloat16).float()
            sess.run(None, {"X32": x.numpy()})
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                got = sess.run(None, {"X32": x.numpy()})[0]
                torch.cuda.synchronize()
            kernels = " ".join(e.name for e in prof.events() if e.device_type.name == "CUDA")
            assert "Int4Mma" in kernels and "Int4Gemv" not in kernels, (k, m, kernels)
            want = (x @ w.T).to(torch.bfloat16).float().numpy()
            assert np.abs(got - want).max() <= 3e-2 * max(1.0, float(np.abs(want).max())), (k, m)


@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_int4_past_16_rows_runs_the_rows_path_then_cutlass(tmp_path, zp, dtype):
    """genai's int4 MLP (gate and up MatMulNBits, QuickGelu, the product, down; K 512 and 1152; fp32 in and out through
    Casts) fused to Int4SwiGLU + Int4Linear, past the GEMV's 16 rows (17, 64, 96, 128, 160, 224, 300, 1000): the rows
    path (Int4MmaGemm) to 128 rows in blocks of 32, its sm_90a form (Int4WgmmaGemm) from 65 to 192 rows on a 9.0
    device with a library built for sm_90, and in blocks of 128 to 64 rows where CUTLASS's mixed-input GEMM runs past it
    (sm_90, a library built with CUTLASS; elsewhere the rows path to 128), then CUTLASS or the dequantization + cuBLAS
    GEMM; with zero points the dequantization at every row count. In fp16 and bf16, the output equal to the PyTorch
    dequantize-then-matmul."""
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper
    from torch.profiler import ProfilerActivity, profile

    from onnxfuse import fuse, kernels, runtime
    from onnxfuse.ops.int4_linear import dequantize, quantize
    info = kernels.build_info(kernels.library_path(provider="cuda"))
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    cutlass, wgmma = sm90 and bool(info.get("cutlass")), sm90 and "90" in info.get("archs", [])
    tt, td = (TensorProto.FLOAT16, torch.float16) if dtype == "float16" else (TensorProto.BFLOAT16, torch.bfloat16)
    hidden, inter = 512, 1152
    rng = np.random.default_rng(5)
    paths = {"Int4MmaGemm", "Int4WgmmaGemm", "cutlass", "Int4Dequantize"}

    def want_for(block, m):
        if zp:  # CUTLASS's q * s + z would not give 0 where q == zp (int4_linear.cu MixedPath): dequantized
            return "Int4Dequantize"
        if wgmma and block == 32 and 64 < m <= 192:
            return "Int4WgmmaGemm"
        if m <= (64 if block >= 64 and cutlass else 128):
            return "Int4MmaGemm"
        return "cutlass" if block >= 64 and cutlass else "Int4Dequantize"

    for block in (128, 32):
        inits, ws = [], {}
        nodes = [helper.make_node("Cast", ["X32"], ["X"], to=tt)]
        for name, (k, n) in (("gate", (hidden, inter)), ("up", (hidden, inter)), ("down", (inter, hidden))):
            wq, s, *z = quantize(rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k) + 0.01, block,
                                 symmetric=not zp)
            st = torch.from_numpy(s).to(td)
            inits += [numpy_helper.from_array(wq, f"{name}.B"), _scales_init(f"{name}.S", st, tt)]
            if zp:
                inits.append(numpy_helper.from_array(z[0].reshape(-1), f"{name}.Z"))
            if name == "down":
                nodes += [helper.make_node("QuickGelu", ["gate"], ["act"], domain="com.microsoft", alpha=1.0),
                          helper.make_node("Mul", ["act", "up"], ["h"])]
            nodes.append(helper.make_node("MatMulNBits", ["h" if name == "down" else "X", f"{name}.B", f"{name}.S"]
                                          + [f"{name}.Z"] * zp, [name], domain="com.microsoft", K=k, N=n, bits=4,
                                          block_size=block, accuracy_level=4))
            ws[name] = dequantize(torch.from_numpy(wq), st, k, torch.from_numpy(z[0]) if zp else None).float()
        nodes.append(helper.make_node("Cast", ["down"], ["Y"], to=TensorProto.FLOAT))
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X32", TensorProto.FLOAT, ["m", hidden])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["m", hidden])], inits)
        src, dst = tmp_path / f"m{block}.onnx", tmp_path / f"f{block}.onnx"
        opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
        onnx.save(helper.make_model(g, opset_imports=opsets, ir_version=10), str(src))
        res = fuse.fuse(src, dst, ort=False, provider="cuda", backend="cuda", force=True)
        assert sorted(m.op for m in res.matches) == ["Int4Linear", "Int4SwiGLU"]
        sess = runtime.session(str(dst), "cuda", library=True, cpu_fallback=False)
        for m in (17, 64, 96, 128, 160, 224, 300, 1000):
            x = torch.from_numpy(rng.standard_normal((m, hidden)).astype(np.float32)).to(td).float()
            sess.run(None, {"X32": x.numpy()})
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                got = torch.from_numpy(sess.run(None, {"X32": x.numpy()})[0])
                torch.cuda.synchronize()
            names = " ".join(e.name for e in prof.events() if e.device_type.name == "CUDA")
            want = want_for(block, m)
            assert want in names and not any(p in names for p in paths - {want}), (block, m, names)
            h = (torch.nn.functional.silu(x @ ws["gate"].T) * (x @ ws["up"].T)).to(td).float()
            ref = h @ ws["down"].T
            tol = (8e-3 if dtype == "float16" else 3e-2) * max(1.0, float(ref.abs().max()))
            assert float((got - ref).abs().max()) <= tol, (block, m, float((got - ref).abs().max()))


@pytest.mark.parametrize("zp", [False, True])
@pytest.mark.parametrize("backend", ["cuda", "triton", "auto"])
def test_int4_swiglu_matches_the_unfused_int4_mlp_on_the_cuda_ep(tmp_path, backend, zp):
    """genai's int4 gated MLP (gate and up MatMulNBits, SiLU as QuickGelu(alpha=1), the product; fp16; symmetric or
    both with zero points) fused to one Int4SwiGLU: on the CUDA EP at decode (1, 2 rows: the GEMV; 5, 16: the
    tensor-core kernel; Triton's small tiles) and prefill (37, 300 rows: the dequantized GEMM) it equals onnxruntime's
    unfused model and the PyTorch dequantize-then-matmul."""
    import torch
    from onnx import helper, numpy_helper

    from onnxfuse import fuse, runtime
    from onnxfuse.ops.int4_linear import dequantize, quantize
    k, n, block = 1000, 392, 32  # ragged K: the last block padded
    rng = np.random.default_rng(1)
    inits, nodes, ws = [], [], {}
    for name in ("gate", "up"):
        wq, s, *z = quantize(rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k) + 0.01, block,
                             symmetric=not zp)
        inits += [numpy_helper.from_array(wq, f"{name}.B"), numpy_helper.from_array(s.astype(np.float16), f"{name}.S")]
        if zp:
            inits.append(numpy_helper.from_array(z[0].reshape(-1), f"{name}.Z"))
        nodes.append(helper.make_node("MatMulNBits", ["X", f"{name}.B", f"{name}.S"] + [f"{name}.Z"] * zp, [name],
                                      domain="com.microsoft", K=k, N=n, bits=4, block_size=block))
        ws[name] = dequantize(torch.from_numpy(wq), torch.from_numpy(s.astype(np.float16)), k,
                              torch.from_numpy(z[0]) if zp else None)
    nodes += [helper.make_node("QuickGelu", ["gate"], ["act"], domain="com.microsoft", alpha=1.0),
              helper.make_node("Mul", ["act", "up"], ["Y"])]
    _save_fp16_model(tmp_path / "m.onnx", nodes, inits, k, n)
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", ort=False, provider="cuda", backend=backend)
    assert [m.op for m in res.matches] == ["Int4SwiGLU"]
    unfused = runtime.session(str(tmp_path / "m.onnx"), "cuda", library=False)
    fused = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True, cpu_fallback=False)
    for m in (1, 2, 5, 16, 37, 300):
        x = rng.standard_normal((m, k)).astype(np.float16)
        xf = torch.from_numpy(x).float()
        want = (torch.nn.functional.silu(xf @ ws["gate"].T) * (xf @ ws["up"].T)).numpy()
        got = fused.run(None, {"X": x})[0].astype(np.float32)
        ort_y = unfused.run(None, {"X": x})[0].astype(np.float32)
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() <= 4e-3 * scale, (m, np.abs(got - want).max())
        assert np.abs(got - ort_y).max() <= 8e-3 * scale, (m, np.abs(got - ort_y).max())


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("backend", ["cuda", "triton", "auto"])
def test_skip_norm_int4_matches_the_unfused_layer_boundary_on_the_cuda_ep(tmp_path, gated, backend):
    """genai's layer boundary in fp16: onnxruntime's residual add and RMS norm (SkipSimplifiedLayerNormalization, its
    sum a graph output) and the int4 projection after it (one MatMulNBits, or the gated MLP's gate and up) fused to one
    SkipRMSNormInt4Linear / SkipRMSNormInt4SwiGLU: on the CUDA EP at 1 and 2 rows (the op's norm kernel, then the
    GEMV; onnxruntime's norm kernel gone), 5 and 16 (then the tensor cores) and 37 (then the prefill path), Y and sum
    equal onnxruntime's unfused model and the PyTorch reference."""
    import onnx
    import torch
    from onnx import TensorProto, helper, numpy_helper
    from torch.profiler import ProfilerActivity, profile

    from onnxfuse import fuse, runtime
    from onnxfuse.ops.int4_linear import dequantize, quantize
    k, n, block = 1000, 392, 32  # ragged K: the last block padded, the staged groups' last one partial
    rng = np.random.default_rng(2)
    gamma = (rng.standard_normal(k) * 0.3 + 1.0).astype(np.float16)
    inits, ws = [numpy_helper.from_array(gamma, "gamma")], {}
    nodes = [helper.make_node("SkipSimplifiedLayerNormalization", ["X", "skip", "gamma"], ["normed", "", "", "sum"],
                              domain="com.microsoft", epsilon=1e-5)]
    for name in ("gate", "up") if gated else ("qkv",):
        wq, s = quantize(rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k) + 0.01, block)
        inits += [numpy_helper.from_array(wq, f"{name}.B"), numpy_helper.from_array(s.astype(np.float16), f"{name}.S")]
        nodes.append(helper.make_node("MatMulNBits", ["normed", f"{name}.B", f"{name}.S"],
                                      [name if gated else "Y"], domain="com.microsoft", K=k, N=n, bits=4,
                                      block_size=block, accuracy_level=4))
        ws[name] = dequantize(torch.from_numpy(wq), torch.from_numpy(s.astype(np.float16)), k)
    if gated:
        nodes += [helper.make_node("QuickGelu", ["gate"], ["act"], domain="com.microsoft", alpha=1.0),
                  helper.make_node("Mul", ["act", "up"], ["Y"])]
    fp16 = TensorProto.FLOAT16
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", fp16, ["m", k]),
                                       helper.make_tensor_value_info("skip", fp16, ["m", k])],
                          [helper.make_tensor_value_info("Y", fp16, ["m", n]),
                           helper.make_tensor_value_info("sum", fp16, ["m", k])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                                ir_version=10), str(tmp_path / "m.onnx"))
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", ort=False, provider="cuda", backend=backend)
    op = "SkipRMSNormInt4SwiGLU" if gated else "SkipRMSNormInt4Linear"
    assert [m.op for m in res.matches][-1] == op
    unfused = runtime.session(str(tmp_path / "m.onnx"), "cuda", library=False)
    fused = runtime.session(str(tmp_path / "f.onnx"), "cuda", library=True, cpu_fallback=False)
    for m in (1, 2, 5, 16, 37):
        feeds = {"X": rng.standard_normal((m, k)).astype(np.float16),
                 "skip": rng.standard_normal((m, k)).astype(np.float16)}
        s_ref = (torch.from_numpy(feeds["X"]).float() + torch.from_numpy(feeds["skip"]).float()).half().float()
        xn = (s_ref * torch.rsqrt(s_ref.pow(2).mean(-1, keepdim=True) + 1e-5) * torch.from_numpy(gamma).float())
        xn = xn.half().float()
        want = (torch.nn.functional.silu(xn @ ws["gate"].T) * (xn @ ws["up"].T) if gated else xn @ ws["qkv"].T).numpy()
        if m == 1 and backend != "triton":
            fused.run(None, feeds)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                got, got_sum = fused.run(None, feeds)
                torch.cuda.synchronize()
            names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
            assert any("Int4Gemv" in nm for nm in names) and any("Int4SkipNormRows" in nm for nm in names), names
            assert not any("SkipLayerNorm" in nm for nm in names), names  # onnxruntime's norm kernel is gone
        else:
            got, got_sum = fused.run(None, feeds)
        ort_y, ort_sum = unfused.run(None, feeds)
        np.testing.assert_array_equal(got_sum, s_ref.half().numpy())
        np.testing.assert_allclose(got_sum.astype(np.float32), ort_sum.astype(np.float32), rtol=1e-3, atol=1e-3)
        got, ort_y = got.astype(np.float32), ort_y.astype(np.float32)
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(got - want).max() <= 4e-3 * scale, (m, np.abs(got - want).max())
        assert np.abs(got - ort_y).max() <= 1e-2 * scale, (m, np.abs(got - ort_y).max())
