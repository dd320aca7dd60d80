"""Linear: the rule on hand-built MatMuls by constant weights (what genai's o_proj and down_proj are) and on an
export, the near-misses it must refuse, the CPU provider leaving it to onnxruntime, and the kernels against PyTorch
(the CPU kernel here, the GPU's GEMV and GEMM on a GPU machine)."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import fuse, runtime, schema, soundness, testing
from onnxfuse.ops.linear import LINEAR
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
