"""Linear and LinearSkipRMSNorm: the rules on hand-built MatMuls by constant weights (what genai's o_proj and down_proj
are) and on the residual add and RMS norm after them (genai's SkipSimplifiedLayerNormalization), on an export, the
near-misses they must refuse, the CPU provider leaving them to onnxruntime, and the kernels against PyTorch (the CPU
kernels here, the GPU's GEMV and GEMM on a GPU machine)."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import fuse, runtime, schema, soundness, testing
from onnxfuse.ops.linear import LINEAR, LINEAR_SKIP_RMS_NORM
from onnxfuse.rewrites.linear import MAX_N

from cases import export_case as _export

ET = {np.float16: TensorProto.FLOAT16, np.float32: TensorProto.FLOAT}


def _matmul_graph(k=96, n=64, x_shape=(1, 1, 96), dtype=np.float16, overridable=False, two_activations=False):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype), "W")
    inputs = [helper.make_tensor_value_info("X", ET[dtype], list(x_shape))]
    if overridable:
        inputs.append(helper.make_tensor_value_info("W", ET[dtype], [k, n]))
    nodes = [helper.make_node("MatMul", ["X", "W"], ["Y"])]
    if two_activations:  # X @ X^T (attention's scores): no constant weight to stream
        nodes = [helper.make_node("Transpose", ["X"], ["xt"], perm=[0, 2, 1]),
                 helper.make_node("MatMul", ["X", "xt"], ["Y"])]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("Y", ET[dtype], None)],
                          [] if two_activations else [w])
    return onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10))


def _fuse(tmp_path, model, **kw):
    src, dst = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(model, str(src))
    return src, dst, fuse.fuse(src, dst, force=True, **kw)


@pytest.mark.parametrize("provider", [None, "cuda"])
@pytest.mark.parametrize("x_shape", [(1, 1, 96), (2, 5, 96)])
def test_constant_weight_matmul_fuses_and_matches(tmp_path, provider, x_shape):
    src, dst, res = _fuse(tmp_path, _matmul_graph(x_shape=x_shape), provider=provider)
    assert [m.op for m in res.matches] == [LINEAR.name]
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    assert [n.op_type for n in fused.graph.node] == [LINEAR.name]
    feeds = {"X": np.random.default_rng(1).standard_normal(x_shape).astype(np.float16)}
    ref = runtime.session(str(src), "cpu", library=False).run(None, feeds)[0]
    for library in (False, True):  # the function body, then the CPU kernel
        out = runtime.session(str(dst), "cpu", library=library).run(None, feeds)[0]
        testing.assert_close(out.astype(np.float32), ref.astype(np.float32), "float16", f"library={library}")


def test_cpu_provider_leaves_it_to_onnxruntime(tmp_path):
    src, dst, res = _fuse(tmp_path, _matmul_graph(), provider="cpu")
    assert not res.matches and "MLAS" in res.left_to_ort["linear"], res.left_to_ort


@pytest.mark.parametrize("kw,reason", [
    (dict(n=68), "not a multiple of 8"),
    (dict(n=MAX_N + 8, k=16, x_shape=(1, 16)), f"above {MAX_N}"),
    (dict(overridable=True), "graph input"),
])
def test_near_misses_are_refused(tmp_path, kw, reason):
    src, dst, res = _fuse(tmp_path, _matmul_graph(**kw), explain=True, provider="cuda")
    assert not res.matches and not dst.exists()
    assert any(reason in r["reason"] for r in res.refusals), res.refusals


@pytest.mark.parametrize("kw", [dict(two_activations=True, x_shape=(1, 4, 96)), dict(dtype=np.float32)])
def test_products_of_activations_and_fp32_are_not_listed(tmp_path, kw):
    src, dst, res = _fuse(tmp_path, _matmul_graph(**kw), explain=True, provider="cuda")
    assert not res.matches and not [r for r in res.refusals if r["rule"].startswith("linear")], res.refusals


def test_gated_mlp_keeps_its_projections(exported, tmp_path):
    """The family runs last: an fp16 Llama's gate and up stay SwiGLU's, its other projections become Linear."""
    src = _export(exported, "llama2", "dynamo", "fp16")
    res = fuse.fuse(src, tmp_path / "f.onnx", provider="cuda")
    ops = collections.Counter(m.op for m in res.matches)
    assert ops["SwiGLU"] == 2 and ops[LINEAR.name] >= 2, ops  # down_proj of each layer at least
    fused = onnx.load(str(tmp_path / "f.onnx"))
    assert not [n for n in fused.graph.node if n.op_type == "MatMul" and n.input[1] in
                {i.name for i in fused.graph.initializer}], "a MatMul by a constant weight left unfused"


def _skip_norm_graph(k=96, n=64, product_at=1, outputs=4, dtype=np.float16, bias=False, mean_used=False,
                     residual_shape=None, gamma_input=False, eps=1e-5):
    """MatMul(X, W) into com.microsoft SkipSimplifiedLayerNormalization (input `product_at` of it; the residual R the
    other), as genai's builder writes a layer's o_proj / down_proj and the norm after it."""
    rng = np.random.default_rng(0)
    et = ET[dtype]
    w = numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype), "W")
    gamma = numpy_helper.from_array((1 + 0.1 * rng.standard_normal(n)).astype(dtype), "gamma")
    ins = ["P", "R"] if product_at == 0 else ["R", "P"]
    outs = ["Y", "mean" if mean_used else "", "", "S"][:outputs]
    nodes = [helper.make_node("MatMul", ["X", "W"], ["P"]),
             helper.make_node("SkipSimplifiedLayerNormalization", ins + ["gamma"] + (["bias"] if bias else []), outs,
                              domain="com.microsoft", **({} if eps is None else {"epsilon": eps}))]
    inits = [w] + ([] if gamma_input else [gamma])
    if bias:
        inits.append(numpy_helper.from_array(np.zeros(n, dtype), "bias"))
    graph_in = [helper.make_tensor_value_info("X", et, ["b", "s", k]),
                helper.make_tensor_value_info("R", et, residual_shape or ["b", "s", n])]
    if gamma_input:
        graph_in.append(helper.make_tensor_value_info("gamma", et, [n]))
    graph_out = [helper.make_tensor_value_info(o, et, ["b", "s", n]) if o != "mean" else
                 helper.make_tensor_value_info(o, TensorProto.FLOAT, ["b", "s", 1]) for o in outs if o]
    g = helper.make_graph(nodes, "g", graph_in, graph_out, inits,
                          value_info=[helper.make_tensor_value_info("P", et, ["b", "s", n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


# LinearSkipRMSNorm is an opt-in pattern (fuse.OPT_IN_PATTERNS), run before linear's
SKIP_NORM_PATTERNS = ["linear_skip_norm", "linear"]


@pytest.mark.parametrize("provider", [None, "cuda"])
def test_skip_norm_is_opt_in(tmp_path, provider):
    """By default (measured slower in genai's model than Linear and onnxruntime's own norm) the MatMul fuses as Linear
    and the norm stays onnxruntime's."""
    src, dst, res = _fuse(tmp_path, _skip_norm_graph(), provider=provider)
    assert [m.op for m in res.matches] == [LINEAR.name]
    assert "linear_skip_norm" in fuse.RULES and "linear_skip_norm" not in fuse.PATTERNS
    assert list(fuse.RULES).index("linear_skip_norm") == list(fuse.RULES).index("linear") - 1


@pytest.mark.parametrize("product_at,outputs", [(1, 4), (0, 4), (1, 1)])
@pytest.mark.parametrize("provider", [None, "cuda"])
def test_skip_norm_fuses_and_matches(tmp_path, product_at, outputs, provider):
    """genai's form (the product as the norm's skip, 4 outputs), the product as its input, the final norm (1 output):
    one LinearSkipRMSNorm; its function body and its CPU kernel give the original's outputs."""
    src, dst, res = _fuse(tmp_path, _skip_norm_graph(product_at=product_at, outputs=outputs), provider=provider,
                          patterns=SKIP_NORM_PATTERNS)
    assert [m.op for m in res.matches] == [LINEAR_SKIP_RMS_NORM.name]
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    assert [n.op_type for n in fused.graph.node] == [LINEAR_SKIP_RMS_NORM.name]
    rng = np.random.default_rng(1)
    feeds = {"X": rng.standard_normal((2, 3, 96)).astype(np.float16),
             "R": rng.standard_normal((2, 3, 64)).astype(np.float16)}
    ref = runtime.session(str(src), "cpu", library=False).run(None, feeds)
    assert len(ref) == (2 if outputs == 4 else 1)
    for library in (False, True):  # the function body, then the CPU kernel
        out = runtime.session(str(dst), "cpu", library=library).run(None, feeds)
        for name, got, want in zip(("Y", "sum"), out, ref):
            testing.assert_close(got.astype(np.float32), want.astype(np.float32), "float16",
                                 f"{name}, library={library}")


def test_skip_norm_kernel_matches_the_reference():
    """The CPU kernel against the PyTorch reference with a non-default epsilon, over rows of another scale."""
    import torch

    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(5, 130, generator=gen), torch.randn(130, 72, generator=gen) / 130 ** 0.5
    skip, gamma = 3 * torch.randn(5, 72, generator=gen), torch.randn(72, generator=gen)
    attrs = {"epsilon": 0.25}
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        ins = [t.to(dtype) for t in (x, w, skip, gamma)]
        want = schema.reference(LINEAR_SKIP_RMS_NORM.name, ins, attrs)
        got = testing.run_op(LINEAR_SKIP_RMS_NORM.name, ins, attrs)
        for name, g, r in zip(("Y", "sum"), got, want):
            testing.assert_close(g.float().numpy(), r.float().numpy(), testing.dtype_name(dtype), name)
    default_eps = schema.reference(LINEAR_SKIP_RMS_NORM.name, [x, w, skip, gamma], {})[0]
    got = testing.run_op(LINEAR_SKIP_RMS_NORM.name, [x, w, skip, gamma], attrs)[0]
    assert (got - default_eps).abs().max() > 1e-3  # the node's epsilon reaches the kernel


@pytest.mark.parametrize("kw", [dict(bias=True), dict(residual_shape=[64]), dict(gamma_input=True),
                                dict(mean_used=True), dict(eps=None)])
def test_skip_norm_near_misses_keep_the_norm(tmp_path, kw):
    """A norm with a bias, a broadcast residual, a gamma that is a graph input, a norm whose mean output is read (the
    op returns none), one without an epsilon attribute (onnxruntime's default is its own): the norm stays
    onnxruntime's and only its MatMul fuses, as Linear (so --explain, which reads the model after fusing, no longer
    sees the pair); the fused model still gives the original's outputs."""
    src, dst, res = _fuse(tmp_path, _skip_norm_graph(**kw), provider="cuda", patterns=SKIP_NORM_PATTERNS)
    assert [m.op for m in res.matches] == [LINEAR.name]
    assert "SkipSimplifiedLayerNormalization" in [n.op_type for n in onnx.load(str(dst)).graph.node]


def test_skip_norm_refusal_of_its_matmul_is_explained(tmp_path):
    src, dst, res = _fuse(tmp_path, _skip_norm_graph(n=68), explain=True, provider="cuda", patterns=SKIP_NORM_PATTERNS)
    assert not res.matches and any("not a multiple of 8" in r["reason"] for r in res.refusals), res.refusals


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,k,n", [(1, 11008, 4096), (1, 4096, 4096), (1, 1037, 264), (1, 100, 64), (8, 4096, 4096),
                                   (1, 4096, 67)])
def test_cuda_skip_norm_matches_pytorch(m, k, n, dtype):
    """One row runs the GEMV with the add and the norm in its last blocks (ragged K and a partial tile, one K slice at
    K = 100), three calls in a row (the tile and row counters reset themselves); 8 rows and a width that is not a
    multiple of 8 run cuBLASLt's GEMM and the norm kernel; the Triton backend its GEMM and the norm kernel."""
    import onnxruntime
    import torch

    onnxruntime.preload_dlls()
    op = LINEAR_SKIP_RMS_NORM.name
    tdt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    feeds = {"X": torch.randn(m, k, generator=gen).to(tdt), "W": (torch.randn(k, n, generator=gen) / k ** 0.5).to(tdt),
             "skip": torch.randn(m, n, generator=gen).to(tdt), "gamma": torch.randn(n, generator=gen).to(tdt)}
    model = testing.op_model(op, dtype, {name: list(t.shape) for name, t in feeds.items()})
    ref = [r.float().numpy() for r in schema.reference(op, list(feeds.values()), {})]
    for backend in ("auto", "cuda", "triton"):
        sess = runtime.session(model, "cuda", backend=backend, cpu_fallback=False)
        for run in range(3):
            got = testing.run_session(sess, op, feeds, None, [(m, n), (m, n)])
            for name, g, r in zip(("Y", "sum"), got, ref):
                testing.assert_close(g.float().numpy(), r, dtype, f"{op} {m}x{k}x{n} {dtype} {name}, {backend} {run}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,k,n", [(1, 11008, 4096), (1, 4096, 4096), (1, 1037, 264), (1, 100, 64), (8, 4096, 4096),
                                   (1, 4096, 67)])
def test_cuda_gemv_and_gemm_match_pytorch(m, k, n, dtype):
    """One row runs the split-K GEMV (ragged K and a partial column tile too, and one K slice at K = 100), three
    calls in a row (its counters reset themselves); 8 rows and a width that is not a multiple of 8 run cuBLASLt's
    GEMM; each against the fp32 reference."""
    import onnxruntime
    import torch

    onnxruntime.preload_dlls()
    tdt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(tdt)
    w = (torch.randn(k, n, generator=gen) / k ** 0.5).to(tdt)
    model = testing.op_model(LINEAR.name, dtype, {"X": [m, k], "W": [k, n]})
    ref = schema.reference(LINEAR.name, [x, w]).float().numpy()
    for backend in ("auto", "cuda"):
        sess = runtime.session(model, "cuda", backend=backend, cpu_fallback=False)
        for run in range(3):  # the GEMV's counters are back at 0 for each next call
            got = testing.run_session(sess, LINEAR.name, {"X": x, "W": w}, (m, n)).float().numpy()
            testing.assert_close(got, ref, dtype, f"Linear {m}x{k}x{n} {dtype}, backend {backend}, run {run}")
