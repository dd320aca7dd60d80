"""Random graphs that mix fusable subgraphs with near-misses (hypothesis): chains of Linear+activation, gated MLP and
LoRA blocks, each with perturbations that change its semantics (an initializer that is also a graph input, a bias or
scale that raises the rank, Gemm alpha/beta, an activation no op fuses, a SiLU that is not one, a GELU or quick_gelu
constant off by 0.1 %, a merged gate_up projection cut into the same chunk twice or in [up | gate] order, an
intermediate that is also a graph output). Every graph is fused; the fused model must load and give the original's
outputs in onnxruntime (CPU EP, library registered) for the default feeds, for feeds that override every overridable
initializer, and for an X whose rows hold NaN, +-Inf, -0 and subnormals (NaN and +-Inf exactly where the original has
them: IEEE semantics). A fusion that changes a value or a shape fails here.

Graphs per profile (quick in CI, nightly): tests/fuzzing.py. The other rule families (rotary, embedding, DLRM
interactions and bags): test_soundness_random_families.py.
"""
from __future__ import annotations

import numpy as np
import onnx
import torch
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import testing

from fuzzing import compare_fused, fuzz_settings

DTYPES = {"fp32": (TensorProto.FLOAT, np.float32, 1e-4), "fp16": (TensorProto.FLOAT16, np.float16, 2e-2)}
mk = helper.make_node


class Builder:
    """Accumulates nodes, initializers and graph inputs; tracks the running value's shape (numpy broadcasting)."""

    def __init__(self, draw, dtype: str, seed: int):
        self.draw, self.dtype = draw, dtype
        self.et, self.np_type, _ = DTYPES[dtype]
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.overridable: dict[str, np.ndarray] = {}
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def const(self, base: str, arr: np.ndarray, allow_input: bool = True) -> str:
        """A constant as an initializer, an initializer that is also a graph input, or a Constant node."""
        name = self.name(base)
        arr = np.asarray(arr).astype(self.np_type)
        how = self.draw(st.sampled_from(["init", "init", "init", "overridable", "constant"] if allow_input
                                        else ["init", "constant"]))
        if how == "constant":
            self.nodes.append(mk("Constant", [], [name], value=numpy_helper.from_array(arr, name + "_value")))
        else:
            self.inits.append(numpy_helper.from_array(arr, name))
            if how == "overridable":
                self.inputs.append(helper.make_tensor_value_info(name, self.et, list(arr.shape)))
                self.overridable[name] = arr
        return name

    def weight(self, k: int, n: int) -> np.ndarray:
        return self.rng.standard_normal((k, n)) / np.sqrt(k)

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(mk(op, inputs, [out], **attrs))
        return out

    def maybe_expose(self, value: str) -> None:
        """Sometimes make an intermediate a graph output, or give it a second consumer."""
        how = self.draw(st.sampled_from(["none"] * 6 + ["output", "consumer"]))
        if how == "output":
            self.outputs.append(value)
        elif how == "consumer":
            self.outputs.append(self.node("Neg", [value]))


def linear_block(b: Builder, x: str, shape: tuple) -> tuple[str, tuple]:
    k, n = shape[-1], b.draw(st.integers(1, 12))
    rank2 = len(shape) == 2
    form = b.draw(st.sampled_from(["gemm_c", "gemm_add", "matmul_add", "matmul"] if rank2
                                  else ["matmul_add", "matmul"]))
    w = b.weight(k, n)
    out_shape = shape[:-1] + (n,)
    if form.startswith("gemm"):
        trans = b.draw(st.booleans())
        attrs = {"transB": int(trans)}
        if b.draw(st.integers(0, 5)) == 0:
            attrs["alpha"] = 0.5
        w_name = b.const("W", w.T if trans else w)
        if form == "gemm_c":
            bias_shape = b.draw(st.sampled_from([(n,), (1, n), (1,), (shape[0], n)]))
            if b.draw(st.integers(0, 5)) == 0:
                attrs["beta"] = 0.5
            z = b.node("Gemm", [x, w_name, b.const("b", b.rng.standard_normal(bias_shape))], **attrs)
            out_shape = np.broadcast_shapes(out_shape, bias_shape)
        else:
            z = b.node("Gemm", [x, w_name], **attrs)
    else:
        z = b.node("MatMul", [x, b.const("W", w)])
    if form.endswith("add"):
        b.maybe_expose(z)
        bias_shape = b.draw(st.sampled_from([(n,), (1, n), (1, 1, n), (1,), (shape[-2], 1)]))
        bias = b.const("b", b.rng.standard_normal(bias_shape))
        z = b.node("Add", [bias, z] if b.draw(st.booleans()) else [z, bias])
        out_shape = np.broadcast_shapes(out_shape, bias_shape)
    act = b.draw(st.sampled_from(["Relu", "Relu", "Sigmoid", "Tanh", "LeakyRelu", None]))
    if act is not None:
        b.maybe_expose(z)
        z = b.node(act, [z])
    return z, tuple(out_shape)


def swiglu_block(b: Builder, x: str, shape: tuple) -> tuple[str, tuple]:
    k, n = shape[-1], b.draw(st.integers(1, 12))
    gemm = len(shape) == 2 and b.draw(st.booleans())
    projections = []
    for tag in ("g", "u"):
        w = b.weight(k, n)
        projections.append(b.node("Gemm", [x, b.const("W" + tag, w.T)], transB=1) if gemm
                           else b.node("MatMul", [x, b.const("W" + tag, w)]))
    g, u = projections
    spelling = b.draw(st.sampled_from(["sigmoid_mul", "div_exp", "reciprocal_exp", "sigmoid_of_up", "exp_no_neg"]))
    if spelling in ("sigmoid_mul", "sigmoid_of_up"):
        silu = b.node("Mul", [g, b.node("Sigmoid", [g if spelling == "sigmoid_mul" else u])])
    else:
        e = b.node("Exp", [g if spelling == "exp_no_neg" else b.node("Neg", [g])])
        one = b.draw(st.sampled_from([1.0, 1.0, 2.0]))
        d = b.node("Add", [e, b.const("one", np.array(one))])
        silu = b.node("Div", [g, d]) if spelling == "div_exp" else b.node("Mul", [g, b.node("Reciprocal", [d])])
    b.maybe_expose(silu)
    return b.node("Mul", [silu, u] if b.draw(st.booleans()) else [u, silu]), shape[:-1] + (n,)


def gated_block(b: Builder, x: str, shape: tuple) -> tuple[str, tuple]:
    """The gated-MLP family: separate or merged (Split / Slices, halves or not) projections; GELU (erf and tanh
    forms), quick_gelu, ReLU or a bilinear gate; constants right or slightly wrong (a wrong one must not fuse)."""
    k, n = shape[-1], b.draw(st.integers(1, 8))
    merged = b.draw(st.sampled_from(["no", "no", "split", "slice"]))
    if merged == "no":
        g = b.node("MatMul", [x, b.const("Wg", b.weight(k, n) * 2)])
        u = b.node("MatMul", [x, b.const("Wu", b.weight(k, n))])
    else:
        h = b.node("MatMul", [x, b.const("W", b.weight(k, 2 * n) * 1.5)])
        cut = b.draw(st.sampled_from(["halves", "halves", "swapped", "same"]))
        def i64(values):
            name = b.name("i")
            b.inits.append(numpy_helper.from_array(np.array(values, np.int64), name))
            return name
        if merged == "split" and cut != "same":
            parts = [b.name("part"), b.name("part")]
            b.nodes.append(mk("Split", [h], parts, axis=-1, num_outputs=2))
        else:
            lo = [0, n] if cut != "same" else [0, 0]
            parts = [b.node("Slice", [h, i64([s_]), i64([s_ + n]), i64([-1])]) for s_ in lo]
        g, u = parts[::-1] if cut == "swapped" else parts
    wrong = b.draw(st.sampled_from([1.0] * 4 + [1.001, 0.9]))
    act = b.draw(st.sampled_from(["gelu_erf", "gelu_tanh", "quick_gelu", "relu", "none"]))
    c = lambda v: b.const("c", np.array(v))  # noqa: E731
    if act == "gelu_erf":
        s_ = b.node("Add", [b.node("Erf", [b.node("Div", [g, c(np.sqrt(2.0) * wrong)])]), c(1.0)])
        a = b.node("Mul", [b.node("Mul", [g, s_]), c(0.5)])
    elif act == "gelu_tanh":
        inner = b.node("Add", [g, b.node("Mul", [c(0.044715 * wrong), b.node("Pow", [g, c(3.0)])])])
        t = b.node("Tanh", [b.node("Mul", [c(np.sqrt(2.0 / np.pi)), inner])])
        a = b.node("Mul", [g, b.node("Mul", [c(0.5), b.node("Add", [t, c(1.0)])])])
    elif act == "quick_gelu":
        a = b.node("Mul", [g, b.node("Sigmoid", [b.node("Mul", [g, c(1.702 * wrong)])])])
    elif act == "relu":
        a = b.node("Relu", [g])
    else:
        a = g
    b.maybe_expose(a)
    return b.node("Mul", [a, u] if b.draw(st.booleans()) else [u, a]), shape[:-1] + (n,)


def lora_block(b: Builder, x: str, shape: tuple) -> tuple[str, tuple]:
    k, n, r = shape[-1], b.draw(st.integers(1, 12)), b.draw(st.integers(1, 4))
    base = b.node("MatMul", [x, b.const("W", b.weight(k, n))])
    out_shape = shape[:-1] + (n,)
    if b.draw(st.booleans()):
        base = b.node("Add", [base, b.const("b", b.rng.standard_normal((n,)))])
    xa = b.node("MatMul", [x, b.const("A", b.weight(k, r))])
    xab = b.node("MatMul", [xa, b.const("B", b.weight(r, n))])
    scale_shape = b.draw(st.sampled_from([(), (), (1,), (1, 1), (1, 1, 1), (n,)]))
    s = b.const("s", np.full(scale_shape, b.draw(st.sampled_from([0.5, 2.0]))))
    out_shape = np.broadcast_shapes(out_shape, scale_shape)
    branch = b.node("Mul", [xab, s])
    y = b.node("Add", [base, branch] if b.draw(st.booleans()) else [branch, base])
    if b.draw(st.booleans()):
        y = b.node("Relu", [y])
    return y, tuple(out_shape)


BLOCKS = {"linear": linear_block, "swiglu": swiglu_block, "gated": gated_block, "lora": lora_block}


@st.composite
def random_graphs(draw):
    dtype = draw(st.sampled_from(["fp32", "fp32", "fp16"]))
    b = Builder(draw, dtype, draw(st.integers(0, 2**31 - 1)))
    m, k = draw(st.integers(1, 9)), draw(st.integers(1, 12))
    shape = (m, k) if draw(st.booleans()) else (draw(st.integers(1, 3)), m, k)
    x = "X"
    b.inputs.insert(0, helper.make_tensor_value_info("X", b.et, list(shape)))
    for _ in range(draw(st.integers(1, 3))):
        x, shape = BLOCKS[draw(st.sampled_from(["linear", "linear", "swiglu", "gated", "lora"]))](b, x, shape)
    b.outputs.append(x)
    if draw(st.booleans()):  # a reduction over axis 0: its value changes if a fused op drops a leading 1
        b.inits.append(numpy_helper.from_array(np.array([0], np.int64), "reduce_axes"))
        b.outputs.append(b.node("ReduceSum", [x, "reduce_axes"], keepdims=0))
    outputs = [helper.make_tensor_value_info(o, b.et, None) for o in dict.fromkeys(b.outputs)]
    graph = helper.make_graph(b.nodes, "random", b.inputs, outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    model = onnx.shape_inference.infer_shapes(model)  # types the outputs (the checker needs their shapes)
    x_value = np.random.default_rng(1).standard_normal(shape_of(model, "X")).astype(b.np_type)
    feeds = [{"X": x_value}]
    # special values (not the type's max: whether a sum overflows depends on where the original rounds intermediates)
    special = testing.with_special_rows(torch.from_numpy(x_value.copy()), type_max=False)[0].numpy()
    feeds.append({"X": special})
    if b.overridable:
        rng = np.random.default_rng(2)
        feeds.append({"X": x_value, **{name: np.asarray(rng.standard_normal(a.shape) + 0.5).astype(b.np_type)
                                      for name, a in b.overridable.items()}})
    return model, feeds, dtype


def shape_of(model: onnx.ModelProto, name: str) -> list[int]:
    vi = next(i for i in model.graph.input if i.name == name)
    return [d.dim_value for d in vi.type.tensor_type.shape.dim]


@fuzz_settings("gemm")
@given(random_graphs())
def test_random_graphs_fuse_soundly(case):
    model, feeds, dtype = case
    compare_fused(model, feeds, DTYPES[dtype][2])
