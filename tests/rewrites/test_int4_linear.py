"""Int4Linear: the rule on onnxruntime's MatMulNBits (what genai's builder writes with -p int4), the fused model against
onnxruntime's own kernel and against a PyTorch dequantize-then-matmul, through the CPU kernel and through the function
body; near-misses that must stay unfused, each with its reason in --explain. The GPU kernels: tests/test_gpu.py and
`onnxfuse doctor --ops Int4Linear`."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import fuse, runtime, schema, soundness, testing
from onnxfuse.ops.int4_linear import dequantize, quantize

M = 3


def _nbits_graph(k=40, n=24, block=16, bits=4, zero_points=False, scales_1d=False, scales_input=False,
                 scales_dtype=np.float32, x_rank=2):
    rng = np.random.default_rng(0)
    packed, scales = quantize(rng.standard_normal((k, n)).astype(np.float32) * 0.2, block)
    scales = scales.astype(scales_dtype)
    if scales_1d:
        scales = scales.reshape(-1)
    inits = [numpy_helper.from_array(packed, "B")]
    x_shape = [M, k] if x_rank == 2 else [2, M, k]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    if scales_input:
        inputs.append(helper.make_tensor_value_info("scales", helper.np_dtype_to_tensor_dtype(scales.dtype),
                                                    list(scales.shape)))
    else:
        inits.append(numpy_helper.from_array(scales, "scales"))
    node_inputs = ["X", "B", "scales"]
    if zero_points:
        inits.append(numpy_helper.from_array(np.full((n * -(-packed.shape[1] // 2),), 0x88, np.uint8), "zp"))
        node_inputs.append("zp")
    node = helper.make_node("MatMulNBits", node_inputs, ["Y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block, name="/model/layers.0/mlp/down_proj/MatMul_Q4")
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, x_shape[:-1] + [n])
    g = helper.make_graph([node], "g", inputs, [y], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    return model, packed, scales


def _fuse(tmp_path, model, **kw):
    src, dst = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(model, str(src))
    return src, dst, fuse.fuse(src, dst, force=True, ort=False, **kw)


@pytest.mark.parametrize("k,n,block,x_rank,scales_1d", [
    (40, 24, 16, 2, False),    # ragged K: 3 blocks of 16, the last padded by 8
    (64, 33, 32, 3, False),    # odd N, X of rank 3
    (100, 16, 64, 2, True),    # scales as MatMulNBits' flat [N * n_blocks]
    (256, 8, 128, 2, False),
])
def test_matmulnbits_fuses_and_matches_onnxruntime(tmp_path, k, n, block, x_rank, scales_1d):
    model, packed, scales = _nbits_graph(k=k, n=n, block=block, x_rank=x_rank, scales_1d=scales_1d)
    src, dst, res = _fuse(tmp_path, model)
    assert [m.op for m in res.matches] == ["Int4Linear"]
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    node = next(nd for nd in fused.graph.node if nd.op_type == "Int4Linear")
    assert node.name == "onnxfuse/int4_linear/model.layers.0.mlp.down_proj"
    assert not any(nd.op_type == "MatMulNBits" for nd in fused.graph.node)
    x = np.random.default_rng(1).standard_normal([2, M, k][-x_rank:]).astype(np.float32)
    ref = runtime.session(str(src), "cpu", library=False).run(None, {"X": x})[0]
    torch_ref = (torch.from_numpy(x) @ dequantize(torch.from_numpy(packed), torch.from_numpy(
        scales.reshape(n, -1)), k).T).numpy()
    np.testing.assert_allclose(ref, torch_ref, rtol=1e-4, atol=1e-4)  # onnxruntime's MatMulNBits agrees with ours
    for library in (True, False):  # the CPU kernel, then the function body
        out = runtime.session(str(dst), "cpu", library=library).run(None, {"X": x})[0]
        np.testing.assert_allclose(out, torch_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cpu_kernel_matches_the_reference_in_16_bit(dtype):
    op = schema.op_def("Int4Linear")
    shapes, _, _ = op.doctor_entry((5, 200, 67, 32))
    ins = op.make_doctor_inputs(testing.torch_type(dtype), shapes, seed=3)
    y = testing.run_op("Int4Linear", ins)
    testing.assert_close(y, schema.reference("Int4Linear", ins), dtype)


def test_padding_past_k_is_ignored():
    """The bytes past K in the last block hold garbage: neither the kernel nor the body may read them as weights."""
    op = schema.op_def("Int4Linear")
    shapes, _, _ = op.doctor_entry((2, 40, 8, 32))
    x, wq, s = op.make_doctor_inputs(torch.float32, shapes, seed=4)
    clean = wq.clone()
    clean[:, -1, 4:] = 0x88  # the padding quantized to zero
    want = schema.reference("Int4Linear", [x, clean, s])
    testing.assert_close(testing.run_op("Int4Linear", [x, wq, s]), want, "float")
    testing.assert_close(schema.reference("Int4Linear", [x, wq, s]), want, "float")


@pytest.mark.parametrize("kw,reason", [
    (dict(zero_points=True), "zero points"),
    (dict(bits=8), "8-bit weights"),
    (dict(block=8), "block size 8"),
    (dict(scales_input=True), "graph input"),
    (dict(scales_dtype=np.float16), "element types differ"),
])
def test_near_misses_are_refused(tmp_path, kw, reason):
    model, _, _ = _nbits_graph(**kw)
    src, dst, res = _fuse(tmp_path, model, explain=True)
    assert not res.matches and not dst.exists()
    assert any(reason in r["reason"] for r in res.refusals), res.refusals


def test_a_wrong_shape_is_a_clear_error():
    op = schema.op_def("Int4Linear")
    shapes, _, _ = op.doctor_entry((2, 64, 8, 32))
    x, wq, s = op.make_doctor_inputs(torch.float32, shapes, seed=5)
    with pytest.raises(Exception, match="ceil\\(K / block\\) blocks"):
        testing.run_op("Int4Linear", [x[:, :32].contiguous(), wq, s])


def test_an_int4_gated_mlp_is_explained(tmp_path):
    """genai's int4 gated MLP (gate and up MatMulNBits, SiLU as Sigmoid * x, then the product): each projection fuses
    as Int4Linear, and --explain says why the gated MLP as a whole did not."""
    k, n = 64, 48
    rng = np.random.default_rng(2)
    inits, nodes = [], []
    for name in ("gate", "up"):
        wq, s = quantize(rng.standard_normal((k, n)).astype(np.float32) * 0.2, 32)
        inits += [numpy_helper.from_array(wq, f"{name}.B"), numpy_helper.from_array(s, f"{name}.S")]
        nodes.append(helper.make_node("MatMulNBits", ["X", f"{name}.B", f"{name}.S"], [name], domain="com.microsoft",
                                      K=k, N=n, bits=4, block_size=32,
                                      name=f"/model/layers.0/mlp/{name}_proj/MatMul_Q4"))
    nodes += [helper.make_node("Sigmoid", ["gate"], ["sig"]), helper.make_node("Mul", ["gate", "sig"], ["act"]),
              helper.make_node("Mul", ["act", "up"], ["Y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [M, k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [M, n])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    src, dst, res = _fuse(tmp_path, model, explain=True)
    assert [m.op for m in res.matches] == ["Int4Linear", "Int4Linear"]
    assert any("int4 weights" in r["reason"] and "SwiGLU has no int4 form" in r["reason"] for r in res.refusals), \
        res.refusals
    x = rng.standard_normal((M, k)).astype(np.float32)
    want = runtime.session(str(src), "cpu", library=False).run(None, {"X": x})[0]
    got = runtime.session(str(dst), "cpu", library=True).run(None, {"X": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
