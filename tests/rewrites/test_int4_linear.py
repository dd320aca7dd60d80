"""Int4Linear: the rule on onnxruntime's MatMulNBits (what genai's builder writes with -p int4), the fused model against
onnxruntime's own kernel and against a PyTorch dequantize-then-matmul, through the CPU kernel and through the function
body; near-misses that must stay unfused, each with its reason in --explain. Int4SwiGLU likewise on genai's int4 gated
MLP. SkipRMSNormInt4Linear and SkipRMSNormInt4SwiGLU: onnxruntime's residual add and RMS norm
(SkipSimplifiedLayerNormalization, as genai's builder writes it before each layer's qkv and gate/up projections) and
the int4 projection after it as one op, both outputs against onnxruntime's unfused model. The GPU kernels:
tests/test_gpu.py and `onnxfuse doctor --ops Int4Linear` (and the other three)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import fuse, runtime, schema, soundness, testing
from onnxfuse.ops.int4_linear import dequantize, quantize

M = 3


def _nbits_graph(k=40, n=24, block=16, bits=4, zero_points=None, scales_1d=False, scales_input=False,
                 scales_dtype=np.float32, x_rank=2, accuracy_level=None, attrs=None):
    """One MatMulNBits; zero_points: None, "flat" (MatMulNBits' [N * ceil(n_blocks / 2)]), "2d", "wrong" (a byte
    short per column) or "float" (zero points in X's type, MatMulNBits' other form), of an asymmetric quantization;
    accuracy_level: the node's (None: absent); attrs: more attributes of the node."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype(np.float32) * 0.2 + 0.05
    if zero_points:
        packed, scales, zp = quantize(w, block, symmetric=False)
    else:
        packed, scales = quantize(w, block)
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
        z = {"flat": zp.reshape(-1), "2d": zp, "wrong": zp[:, :-1].copy(),
             "float": np.full(scales.shape, 8.0, np.float32)}[zero_points]
        inits.append(numpy_helper.from_array(z, "zp"))
        node_inputs.append("zp")
    node = helper.make_node("MatMulNBits", node_inputs, ["Y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block, name="/model/layers.0/mlp/down_proj/MatMul_Q4",
                            **_level_attr(accuracy_level), **(attrs or {}))
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, x_shape[:-1] + [n])
    g = helper.make_graph([node], "g", inputs, [y], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    if zero_points in ("flat", "2d"):
        return model, packed, scales, zp
    return model, packed, scales


def _level_attr(level) -> dict:
    """MatMulNBits' accuracy_level as make_node keywords: none for None."""
    return {} if level is None else {"accuracy_level": level}


def _accuracy_level(node):
    """A fused node's accuracy_level, None when it has none."""
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == "accuracy_level"), None)


def _save(tmp_path, model, name):
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def _fuse(tmp_path, model, **kw):
    src, dst = _save(tmp_path, model, "m.onnx"), tmp_path / "f.onnx"
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


@pytest.mark.parametrize("k,n,block,layout", [
    (40, 24, 16, "flat"),     # 3 blocks: the last byte's high nibble is padding
    (100, 33, 32, "2d"),      # ragged K, odd N, 4 blocks
    (256, 8, 128, "flat"),    # 2 blocks
])
def test_matmulnbits_with_zero_points_fuses_and_matches_onnxruntime(tmp_path, k, n, block, layout):
    """An asymmetric MatMulNBits (the builder's is_symmetric=false, AWQ/GPTQ): Int4Linear with the zero points as
    [N, ceil(n_blocks / 2)], on the zp overload, equal to onnxruntime's kernel and to PyTorch."""
    model, packed, scales, zp = _nbits_graph(k=k, n=n, block=block, zero_points=layout)
    src, dst, res = _fuse(tmp_path, model)
    assert [m.op for m in res.matches] == ["Int4Linear"]
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    node = next(nd for nd in fused.graph.node if nd.op_type == "Int4Linear")
    assert len(node.input) == 4 and node.overload == "zp"
    assert [f.overload for f in fused.functions if f.name == "Int4Linear"] == ["zp"]
    zp_init = next(t for t in fused.graph.initializer if t.name == node.input[3])
    assert list(zp_init.dims) == [n, (-(-k // block) + 1) // 2]
    x = np.random.default_rng(1).standard_normal((M, k)).astype(np.float32)
    ref = runtime.session(str(src), "cpu", library=False).run(None, {"X": x})[0]
    torch_ref = (torch.from_numpy(x) @ dequantize(torch.from_numpy(packed), torch.from_numpy(scales), k,
                                                  torch.from_numpy(zp)).T).numpy()
    np.testing.assert_allclose(ref, torch_ref, rtol=1e-4, atol=1e-4)  # onnxruntime's MatMulNBits agrees with ours
    sym = (torch.from_numpy(x) @ dequantize(torch.from_numpy(packed), torch.from_numpy(scales), k).T).numpy()
    assert np.abs(sym - torch_ref).max() > 1e-2  # the zero points matter here
    for library in (True, False):  # the CPU kernel, then the function body
        out = runtime.session(str(dst), "cpu", library=library).run(None, {"X": x})[0]
        np.testing.assert_allclose(out, torch_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("zp", [False, True])
def test_cpu_kernel_matches_the_reference_in_16_bit(dtype, zp):
    op = schema.op_def("Int4Linear")
    shapes, _, _ = op.doctor_entry((5, 200, 67, 32) + (("zp",) if zp else ()))
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
    (dict(zero_points="wrong"), "zero points zp have shape [24, 1], not [N, ceil(n_blocks / 2)] = [24, 2]"),
    (dict(zero_points="float"), "zero points zp are float: the int4 ops take MatMulNBits' packed uint8"),
    (dict(bits=8), "8-bit weights"),
    (dict(block=8), "block size 8"),
    (dict(scales_input=True), "graph input"),
    (dict(scales_dtype=np.float16), "element types differ"),
    (dict(accuracy_level=7), "has accuracy_level 7: MatMulNBits defines 0 to 4"),
    (dict(accuracy_level=-1), "has accuracy_level -1: MatMulNBits defines 0 to 4"),
    # B in onnxruntime's CUDA fpA_intB layout (the builder's matmulnbits_weights_prepacked): same shape, other bytes
    (dict(attrs={"weight_prepacked": 2}), "has weight_prepacked 2: B is in onnxruntime's CUDA fpA_intB layout"),
    (dict(attrs={"weight_prepacked": 1}), "has weight_prepacked 1"),
    (dict(attrs={"group_order": 1}), "has attribute group_order, which MatMulNBits did not have"),
])
def test_near_misses_are_refused(tmp_path, kw, reason):
    model, _, _ = _nbits_graph(**kw)
    src, dst, res = _fuse(tmp_path, model, explain=True)
    assert not res.matches and not dst.exists()
    assert any(reason in r["reason"] for r in res.refusals), res.refusals


def test_weight_prepacked_0_is_the_blockwise_layout(tmp_path):
    """weight_prepacked 0 is MatMulNBits' default (B blockwise): such a node fuses and computes what it computed."""
    src, dst, res = _fuse(tmp_path, _nbits_graph(attrs={"weight_prepacked": 0})[0])
    assert [m.op for m in res.matches] == ["Int4Linear"]
    _same_as_unfused(src, dst, np.random.default_rng(1).standard_normal((M, 40)).astype(np.float32))


def test_a_wrong_shape_is_a_clear_error():
    op = schema.op_def("Int4Linear")
    shapes, _, _ = op.doctor_entry((2, 64, 8, 32, "zp"))
    x, wq, s, zp = op.make_doctor_inputs(torch.float32, shapes, seed=5)
    with pytest.raises(Exception, match="ceil\\(K / block\\) blocks"):
        testing.run_op("Int4Linear", [x[:, :32].contiguous(), wq, s])
    with pytest.raises(Exception, match="zero_points must be \\[N, ceil\\(n_blocks / 2\\)\\]"):
        testing.run_op("Int4Linear", [x, wq, s, zp[:4].contiguous()])


@pytest.mark.parametrize("level,want", [(None, None), (0, None), (2, 2), (4, 4)])
def test_the_accuracy_level_goes_onto_int4_linear(tmp_path, level, want):
    """MatMulNBits' accuracy_level is the fused node's; a level of 0 or none leaves the node without the attribute
    (a level-0 model fuses as it did before the ops had it). The function declares it (default 0)."""
    src, dst, res = _fuse(tmp_path, _nbits_graph(accuracy_level=level)[0])
    assert [m.op for m in res.matches] == ["Int4Linear"]
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    node = next(nd for nd in fused.graph.node if nd.op_type == "Int4Linear")
    assert _accuracy_level(node) == want
    function = next(f for f in fused.functions if f.name == "Int4Linear")
    assert helper.get_attribute_value(next(a for a in function.attribute_proto if a.name == "accuracy_level")) == 0


@pytest.mark.parametrize("zero_points", [None, "flat"])
def test_a_level_4_model_computes_in_x_type_on_the_cpu(tmp_path, zero_points):
    """A fused node with accuracy_level 4 runs through the CPU kernel (which ignores the attribute) and through the
    function body (which declares it), and gives the unfused model's output at level 0: X is not rounded to int8 off
    the CUDA GEMV. onnxruntime's own CPU MatMulNBits at level 4 does round X to int8 (MLAS), so the level-4 source is
    only within that rounding of it."""
    k = 100
    model4, packed, scales, *zp = _nbits_graph(k=k, n=33, block=32, zero_points=zero_points, accuracy_level=4)
    src4, dst, res = _fuse(tmp_path, model4)
    assert [m.op for m in res.matches] == ["Int4Linear"]
    assert _accuracy_level(next(nd for nd in onnx.load(str(dst)).graph.node if nd.op_type == "Int4Linear")) == 4
    src0 = _save(tmp_path, _nbits_graph(k=k, n=33, block=32, zero_points=zero_points)[0], "m0.onnx")
    x = np.random.default_rng(1).standard_normal((M, k)).astype(np.float32)
    _same_as_unfused(src0, dst, x)
    want = runtime.session(str(src0), "cpu", library=False).run(None, {"X": x})[0]
    int8 = runtime.session(str(src4), "cpu", library=False).run(None, {"X": x})[0]
    w = dequantize(torch.from_numpy(packed), torch.from_numpy(scales.reshape(33, -1)), k,
                   torch.from_numpy(zp[0]) if zp else None).numpy()
    # a step of int8 rounding (max |x| / 127) on every value of a row, times each column's |W| summed
    bound = np.abs(x).max(-1, keepdims=True) / 127 * np.abs(w).sum(-1)[None, :]
    assert (np.abs(int8 - want) <= bound + 1e-4).all()


@pytest.mark.parametrize("block", [32, 64, 128])
def test_the_int8_x_reference_is_onnxruntimes_level_4_rounding(tmp_path, block):
    """int8_x_product, the PyTorch form of the CUDA one-row GEMV's accuracy_level-4 path (X rounded to int8 per 32
    values, scale max |x| / 127), is onnxruntime's own CPU MatMulNBits at level 4 (MLAS: X rounded per quantization
    block): the same numbers at block 32, and with units of the block at 64 and 128 (where the CUDA path's units of 32
    round more finely than onnxruntime's); both within the reference's bound of the exact product, which they miss by
    far more than fp32's sums."""
    from onnxfuse.ops.int4_linear import INT8_X_UNIT, int8_x_product
    k, n = 1024, 40
    model, packed, scales = _nbits_graph(k=k, n=n, block=block, accuracy_level=4)
    src = _save(tmp_path, model, "m4.onnx")
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((M, k)).astype(np.float32))
    got = runtime.session(str(src), "cpu", library=False).run(None, {"X": x.numpy()})[0]
    s = torch.from_numpy(scales.reshape(n, -1))
    want, bound = (t.numpy() for t in int8_x_product(x, torch.from_numpy(packed), s, k, block, unit=block))
    scale = float(np.abs(want).max())
    assert np.abs(got - want).max() <= 1e-5 * scale
    exact = (x @ dequantize(torch.from_numpy(packed), s, k).T).numpy()
    assert np.abs(exact - want).max() > 100 * 1e-5 * scale  # the rounding shows: the check above tells them apart
    assert (np.abs(exact - want) <= bound + 1e-5 * scale).all()
    ours, ours_bound = (t.numpy() for t in int8_x_product(x, torch.from_numpy(packed), s, k, block))
    assert (np.abs(exact - ours) <= ours_bound + 1e-5 * scale).all()
    if block == INT8_X_UNIT:
        np.testing.assert_array_equal(ours, want)


def _gated_graph(k=64, n=48, act="sigmoid_mul", blocks=(32, 32), gate_zero_points=False, gate_output=False,
                 x_rank=2, down=False, zero_points=False, levels=(None, None)):
    """genai's int4 gated MLP: gate and up MatMulNBits of X, the gate's activation, then act * up (Y; down: the
    product an intermediate of unknown type after contrib ops, Y = down_proj(product) as a MatMulNBits too).
    zero_points: both projections asymmetric (flat zero points, as the builder writes them); gate_zero_points: the
    gate's only; levels: the gate's and up's accuracy_level (None: absent)."""
    rng = np.random.default_rng(2)
    inits, nodes = [], []
    for name, block, level in zip(("gate", "up"), blocks, levels):
        w = rng.standard_normal((k, n)).astype(np.float32) * 0.2 + 0.05
        asym = zero_points or (name == "gate" and gate_zero_points)
        wq, s, *zp = quantize(w, block, symmetric=not asym)
        inits += [numpy_helper.from_array(wq, f"{name}.B"), numpy_helper.from_array(s, f"{name}.S")]
        ins = ["X", f"{name}.B", f"{name}.S"]
        if asym:
            inits.append(numpy_helper.from_array(zp[0].reshape(-1), f"{name}.zp"))
            ins.append(f"{name}.zp")
        nodes.append(helper.make_node("MatMulNBits", ins, [name], domain="com.microsoft", K=k, N=n, bits=4,
                                      block_size=block, name=f"/model/layers.0/mlp/{name}_proj/MatMul_Q4",
                                      **_level_attr(level)))
    if act == "sigmoid_mul":  # silu as x * sigmoid(x)
        nodes += [helper.make_node("Sigmoid", ["gate"], ["sig"]), helper.make_node("Mul", ["gate", "sig"], ["act"])]
    elif act == "quick_gelu_1":  # silu as genai's builder writes it
        nodes.append(helper.make_node("QuickGelu", ["gate"], ["act"], domain="com.microsoft", alpha=1.0))
    elif act == "fast_gelu":  # gelu_tanh (Gemma)
        nodes.append(helper.make_node("FastGelu", ["gate"], ["act"], domain="com.microsoft"))
    else:
        nodes.append(helper.make_node(act, ["gate"], ["act"]))
    nodes.append(helper.make_node("Mul", ["act", "up"], ["h" if down else "Y"]))
    x_shape = [M, k] if x_rank == 2 else [2, M, k]
    y_width = n
    if down:
        wq, s = quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.2, 16)
        inits += [numpy_helper.from_array(wq, "down.B"), numpy_helper.from_array(s, "down.S")]
        nodes.append(helper.make_node("MatMulNBits", ["h", "down.B", "down.S"], ["Y"], domain="com.microsoft", K=n,
                                      N=k, bits=4, block_size=16, name="/model/layers.0/mlp/down_proj/MatMul_Q4"))
        y_width = k
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, x_shape[:-1] + [y_width])]
    if gate_output:
        outputs.append(helper.make_tensor_value_info("gate", TensorProto.FLOAT, x_shape[:-1] + [n]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)], outputs,
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def _same_as_unfused(src, dst, x):
    want = runtime.session(str(src), "cpu", library=False).run(None, {"X": x})
    for library in (True, False):  # the CPU kernel, then the function body
        got = runtime.session(str(dst), "cpu", library=library).run(None, {"X": x})
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act,activation,k,n,x_rank", [
    ("sigmoid_mul", "silu", 64, 48, 2),
    ("quick_gelu_1", "silu", 100, 33, 3),   # genai's spelling; ragged K and odd N; X of rank 3
    ("fast_gelu", "gelu_tanh", 64, 16, 2),
    ("Relu", "relu", 96, 40, 2),
])
def test_an_int4_gated_mlp_fuses_to_one_op(tmp_path, act, activation, k, n, x_rank):
    """genai's int4 gated MLP becomes one Int4SwiGLU node, equal to onnxruntime's unfused model through the kernel and
    through the function body; with its down projection, that one becomes Int4Linear."""
    for down in (False, True):
        src, dst, res = _fuse(tmp_path, _gated_graph(k=k, n=n, act=act, x_rank=x_rank, down=down))
        assert [m.op for m in res.matches] == ["Int4SwiGLU"] + ["Int4Linear"] * down
        # the report: a row per op of the pattern
        assert [(r["pattern"], r["op"], r["matches"]) for r in res.table()] == \
            [("int4_linear", "Int4SwiGLU", 1)] + [("int4_linear", "Int4Linear", 1)] * down
        fused = onnx.load(str(dst))
        soundness.check_model(fused)
        node = next(nd for nd in fused.graph.node if nd.op_type == "Int4SwiGLU")
        assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "activation")).decode() \
            == activation
        assert node.name == "onnxfuse/int4_linear/model.layers.0.mlp"
        assert [nd.op_type for nd in fused.graph.node] == ["Int4SwiGLU"] + ["Int4Linear"] * down
        x = np.random.default_rng(3).standard_normal([2, M, k][-x_rank:]).astype(np.float32)
        _same_as_unfused(src, dst, x)


def test_an_int4_gated_mlp_with_zero_points_fuses_to_one_op(tmp_path):
    """Both projections asymmetric: one Int4SwiGLU with both zero points (overload silu.zp), its down projection
    Int4Linear; equal to onnxruntime's unfused model through the kernel and through the function body."""
    src, dst, res = _fuse(tmp_path, _gated_graph(k=100, n=33, act="quick_gelu_1", zero_points=True, down=True))
    assert [m.op for m in res.matches] == ["Int4SwiGLU", "Int4Linear"]
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    node = next(nd for nd in fused.graph.node if nd.op_type == "Int4SwiGLU")
    assert len(node.input) == 7 and node.overload == "silu.zp"
    assert {(f.name, f.overload) for f in fused.functions} == {("Int4SwiGLU", "silu.zp"), ("Int4Linear", "")}
    _same_as_unfused(src, dst, np.random.default_rng(3).standard_normal((M, 100)).astype(np.float32))


@pytest.mark.parametrize("kw,reason,ops,rule", [
    # both projections fuse as Int4Linear, the gate's with its zero points
    (dict(gate_zero_points=True), "only the gate projection gate has zero points (the up projection has none)",
     ["Int4Linear", "Int4Linear"], "int4_linear/int4_swiglu"),
    (dict(blocks=(32, 64)), "differ in (K, N, n_blocks, block)", ["Int4Linear", "Int4Linear"],
     "int4_linear/int4_swiglu"),
    (dict(act="Tanh"), "activation is", ["Int4Linear", "Int4Linear"], "int4_linear/int4_swiglu"),
    (dict(gate_output=True), "gate is a graph output", ["Int4Linear", "Int4Linear"], "int4_linear/int4_swiglu"),
])
def test_an_int4_gated_mlp_near_miss_is_explained(tmp_path, kw, reason, ops, rule):
    """A gated MLP Int4SwiGLU cannot take keeps its projections for Int4Linear, and --explain says why."""
    src, dst, res = _fuse(tmp_path, _gated_graph(**kw), explain=True)
    assert sorted(m.op for m in res.matches) == ops
    assert any(reason in r["reason"] and r["rule"].startswith(rule) for r in res.refusals), res.refusals
    assert not any("SwiGLU has no int4 form" in r["reason"] for r in res.refusals)
    _same_as_unfused(src, dst, np.random.default_rng(4).standard_normal((M, 64)).astype(np.float32))


@pytest.mark.parametrize("levels,want", [((4, 0), None), ((None, 4), None), ((4, 2), 2), ((4, 4), 4),
                                         ((None, None), None)])
def test_int4_swiglu_takes_the_lower_accuracy_level(tmp_path, levels, want):
    """Int4SwiGLU carries the lower of its gate's and up's accuracy_level (X rounded to int8 only where both allow
    it), none at 0; through the CPU kernel and the function body it equals the unfused model at level 0."""
    src, dst, res = _fuse(tmp_path, _gated_graph(levels=levels))
    assert [m.op for m in res.matches] == ["Int4SwiGLU"]
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    assert _accuracy_level(next(nd for nd in fused.graph.node if nd.op_type == "Int4SwiGLU")) == want
    _same_as_unfused(_save(tmp_path, _gated_graph(), "m0.onnx"), dst,
                     np.random.default_rng(3).standard_normal((M, 64)).astype(np.float32))


def test_an_accuracy_level_past_4_keeps_the_gated_mlp(tmp_path):
    """A gate projection with accuracy_level 7 stays onnxruntime's, and with it the gated MLP; the up projection
    fuses alone, with its level. --explain names the gate once (both rules refuse it for the same reason)."""
    src, dst, res = _fuse(tmp_path, _gated_graph(levels=(7, 4)), explain=True)
    assert [m.op for m in res.matches] == ["Int4Linear"]
    assert [r["node"] for r in res.refusals if "has accuracy_level 7: MatMulNBits defines 0 to 4" in r["reason"]
            and r["rule"].startswith("int4_linear/")] == ["/model/layers.0/mlp/gate_proj/MatMul_Q4"], res.refusals
    fused = onnx.load(str(dst))
    assert _accuracy_level(next(nd for nd in fused.graph.node if nd.op_type == "Int4Linear")) == 4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_int4_swiglu_cpu_kernel_matches_the_reference_in_16_bit(dtype):
    op = schema.op_def("Int4SwiGLU")
    for entry in [(5, 200, 67, 32, "silu"), (9, 96, 40, 16, "gelu"), (3, 200, 67, 16, "silu", "zp")]:
        shapes, attrs, _ = op.doctor_entry(entry)
        ins = op.make_doctor_inputs(testing.torch_type(dtype), shapes, seed=6)
        testing.assert_close(testing.run_op("Int4SwiGLU", ins, attrs), schema.reference("Int4SwiGLU", ins, attrs),
                             dtype)


def test_int4_swiglu_weights_of_two_shapes_are_a_clear_error():
    op = schema.op_def("Int4SwiGLU")
    shapes, _, _ = op.doctor_entry((2, 64, 8, 32, "silu"))
    x, wg, sg, wu, su = op.make_doctor_inputs(torch.float32, shapes, seed=7)
    with pytest.raises(Exception, match="Wq_gate's and scales_gate's shapes"):
        testing.run_op("Int4SwiGLU", [x, wg, sg, wu[:4].contiguous(), su[:4].contiguous()])


# ------------------------------------------------------------------ the norm before the projection
NK = 64  # the norm tests' K


def _norm_graph(proj="linear", n=40, outputs=4, sum_output=True, normed_output=False, bias=False, x_batch=None,
                zero_points=False, epsilon=1e-5, accuracy_level=None, product_typed=True):
    """genai's layer boundary: SkipSimplifiedLayerNormalization(X, skip, gamma) (outputs: 4, its sum a graph output
    or not, or 1: the final norm), then proj: "linear" (one MatMulNBits) or "gated" (gate and up MatMulNBits,
    QuickGelu(alpha 1) of the gate times up, as the builder writes silu). x_batch: X [x_batch, M, NK], the residual
    [M, NK] broadcast over it. accuracy_level: every MatMulNBits' (None: absent). product_typed=False: the gated
    product an intermediate (Identity to Y), so that neither it nor the norm's output has a known type."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal(NK) * 0.5 + 1.0).astype(np.float32), "gamma")]
    norm_ins = ["X", "skip", "gamma"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(NK).astype(np.float32), "beta"))
        norm_ins.append("beta")
    norm_outs = ["normed"] if outputs == 1 else ["normed", "", "", "sum"]
    attrs = {"epsilon": epsilon} if epsilon is not None else {}
    nodes = [helper.make_node("SkipSimplifiedLayerNormalization", norm_ins, norm_outs, domain="com.microsoft",
                              name="/model/layers.1/input_layernorm/SkipLayerNorm", **attrs)]
    names = ("gate", "up") if proj == "gated" else ("qkv",)
    for name in names:
        w = rng.standard_normal((NK, n)).astype(np.float32) * 0.2
        wq, s, *zp = quantize(w, 32, symmetric=not zero_points)
        inits += [numpy_helper.from_array(wq, f"{name}.B"), numpy_helper.from_array(s, f"{name}.S")]
        ins = ["normed", f"{name}.B", f"{name}.S"]
        if zero_points:
            inits.append(numpy_helper.from_array(zp[0].reshape(-1), f"{name}.zp"))
            ins.append(f"{name}.zp")
        out = name if proj == "gated" else "Y"
        nodes.append(helper.make_node("MatMulNBits", ins, [out], domain="com.microsoft", K=NK, N=n, bits=4,
                                      block_size=32, name=f"/model/layers.1/attn/{name}_proj/MatMul_Q4",
                                      **_level_attr(accuracy_level)))
    if proj == "gated":
        nodes += [helper.make_node("QuickGelu", ["gate"], ["act"], domain="com.microsoft", alpha=1.0),
                  helper.make_node("Mul", ["act", "up"], ["Y" if product_typed else "prod"])]
        if not product_typed:
            nodes.append(helper.make_node("Identity", ["prod"], ["Y"]))
    lead = [x_batch, M] if x_batch else [M]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, lead + [NK]),
              helper.make_tensor_value_info("skip", TensorProto.FLOAT, [M, NK])]
    outs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, lead + [n])]
    if outputs == 4 and sum_output:
        outs.append(helper.make_tensor_value_info("sum", TensorProto.FLOAT, lead + [NK]))
    if normed_output:
        outs.append(helper.make_tensor_value_info("normed", TensorProto.FLOAT, lead + [NK]))
    g = helper.make_graph(nodes, "g", inputs, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def _norm_feeds(x_batch=None):
    rng = np.random.default_rng(6)
    return {"X": rng.standard_normal(((x_batch,) if x_batch else ()) + (M, NK)).astype(np.float32),
            "skip": rng.standard_normal((M, NK)).astype(np.float32)}


def _same_outputs(src, dst, feeds):
    want = runtime.session(str(src), "cpu", library=False).run(None, feeds)
    for library in (True, False):  # the CPU kernel, then the function body
        got = runtime.session(str(dst), "cpu", library=library).run(None, feeds)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("proj,op,zero_points", [
    ("linear", "SkipRMSNormInt4Linear", False),
    ("linear", "SkipRMSNormInt4Linear", True),
    ("gated", "SkipRMSNormInt4SwiGLU", False),
    ("gated", "SkipRMSNormInt4SwiGLU", True),
])
def test_the_norm_and_its_int4_projection_fuse_to_one_op(tmp_path, proj, op, zero_points):
    """The norm and the projection after it become one node with the norm's sum as its second output, the
    projection's overload kept; equal to onnxruntime's unfused model (both outputs)."""
    src, dst, res = _fuse(tmp_path, _norm_graph(proj, zero_points=zero_points))
    projection = "Int4SwiGLU" if proj == "gated" else "Int4Linear"
    assert [m.op for m in res.matches] == [projection, op]
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    assert [nd.op_type for nd in fused.graph.node] == [op]
    node = fused.graph.node[0]
    assert list(node.input[:3]) == ["X", "skip", "gamma"] and list(node.output) == ["Y", "sum"]
    assert len(node.input) == (3 + (4 if proj == "gated" else 2) + (2 if proj == "gated" else 1) * zero_points)
    want = ("silu" if proj == "gated" else "") + (".zp" if zero_points and proj == "gated" else
                                                  "zp" if zero_points else "")
    assert node.overload == want
    eps = next(a for a in node.attribute if a.name == "epsilon")
    assert helper.get_attribute_value(eps) == pytest.approx(1e-5)
    _same_outputs(src, dst, _norm_feeds())


def test_a_norm_and_gated_mlp_of_unknown_types_fuse_and_save(tmp_path):
    """The gated product an intermediate whose type shape inference cannot reach (after the norm and QuickGelu, both
    contrib ops): Int4SwiGLU's output takes the scales' type, so the norm op after it is written (the model failed
    to serialize, a type without an element type, before) and equals onnxruntime's unfused model."""
    src, dst, res = _fuse(tmp_path, _norm_graph("gated", product_typed=False))
    assert [m.op for m in res.matches] == ["Int4SwiGLU", "SkipRMSNormInt4SwiGLU"]
    soundness.check_model(onnx.load(str(dst)))
    _same_outputs(src, dst, _norm_feeds())


@pytest.mark.parametrize("outputs,sum_output", [(4, False), (1, False)])
def test_a_norm_whose_sum_is_unused_fuses_too(tmp_path, outputs, sum_output):
    """The last layer's norm (one output) before lm_head, or a sum nobody reads: the op's sum dangles."""
    src, dst, res = _fuse(tmp_path, _norm_graph("linear", outputs=outputs, sum_output=sum_output))
    assert [m.op for m in res.matches] == ["Int4Linear", "SkipRMSNormInt4Linear"]
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    assert [nd.op_type for nd in fused.graph.node] == ["SkipRMSNormInt4Linear"]
    _same_outputs(src, dst, _norm_feeds())


@pytest.mark.parametrize("kw,reason", [
    (dict(normed_output=True), "normed"),                      # the normed rows are a graph output too
    (dict(bias=True), "has a bias (its fourth input)"),
    (dict(epsilon=None), "has no epsilon attribute"),
    (dict(x_batch=2), "differ in shape"),                      # a broadcast residual
])
def test_near_misses_keep_the_norm(tmp_path, kw, reason):
    """A norm the op cannot take stays onnxruntime's, its projection Int4Linear; --explain says why."""
    src, dst, res = _fuse(tmp_path, _norm_graph("linear", **kw), explain=True)
    assert [m.op for m in res.matches] == ["Int4Linear"]
    fused = onnx.load(str(dst))
    assert sorted(nd.op_type for nd in fused.graph.node) == ["Int4Linear", "SkipSimplifiedLayerNormalization"]
    assert any(reason in r["reason"] and r["rule"].startswith("int4_linear/skip_rms_norm") for r in res.refusals) \
        or any(reason in r.get("value", "") for r in res.refusals), res.refusals
    _same_outputs(src, dst, _norm_feeds(kw.get("x_batch")))


@pytest.mark.parametrize("proj,op", [("linear", "SkipRMSNormInt4Linear"), ("gated", "SkipRMSNormInt4SwiGLU")])
@pytest.mark.parametrize("level,want", [(4, 4), (None, None)])
def test_the_norm_op_keeps_the_projections_accuracy_level(tmp_path, proj, op, level, want):
    """The norm op takes its projection's accuracy_level (none where the projection has none); both outputs equal
    the unfused model's at level 0, through the CPU kernel and the function body."""
    src, dst, res = _fuse(tmp_path, _norm_graph(proj, accuracy_level=level))
    assert [m.op for m in res.matches] == ["Int4SwiGLU" if proj == "gated" else "Int4Linear", op]
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    assert [nd.op_type for nd in fused.graph.node] == [op]
    assert _accuracy_level(fused.graph.node[0]) == want
    _same_outputs(_save(tmp_path, _norm_graph(proj), "m0.onnx"), dst, _norm_feeds())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("op,entries", [
    ("SkipRMSNormInt4Linear", [(5, 200, 67, 32), (2, 96, 40, 16, "zp")]),
    ("SkipRMSNormInt4SwiGLU", [(5, 200, 67, 32, "silu"), (1, 96, 40, 16, "gelu", "zp")]),
])
def test_cpu_kernels_match_the_reference(dtype, op, entries):
    """Y and sum against the PyTorch reference (the norm of the rounded sum, rounded, then the dequantized GEMM)."""
    definition = schema.op_def(op)
    for entry in entries:
        shapes, attrs, _ = definition.doctor_entry(entry)
        ins = definition.make_doctor_inputs(testing.torch_type(dtype), shapes, seed=8)
        attrs = {**attrs, "epsilon": 1e-6}
        got = testing.run_op(op, ins, attrs)
        want = schema.reference(op, ins, attrs)
        for g, w in zip(got, want):
            testing.assert_close(g, w, dtype)
        # sum is X + skip rounded to the type, exactly
        assert torch.equal(got[1], (ins[0].float() + ins[1].float()).to(ins[0].dtype))


def test_a_wrong_norm_shape_is_a_clear_error():
    definition = schema.op_def("SkipRMSNormInt4Linear")
    shapes, _, _ = definition.doctor_entry((2, 64, 8, 32))
    x, skip, gamma, wq, s = definition.make_doctor_inputs(torch.float32, shapes, seed=9)
    with pytest.raises(Exception, match="gamma must be \\[K\\]"):
        testing.run_op("SkipRMSNormInt4Linear", [x, skip, gamma[:32].contiguous(), wq, s])
    with pytest.raises(Exception, match="skip must have X's shape"):
        testing.run_op("SkipRMSNormInt4Linear", [x, skip[:1].contiguous(), gamma, wq, s])
