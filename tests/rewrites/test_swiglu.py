"""SwiGLU, the gated-MLP op: every activation (silu, gelu, gelu_tanh, quick_gelu, relu, sigmoid) in every spelling
the exporters and onnxruntime's stage-1 fusions write, the merged gate_up projection, the near-misses that must be
refused (and what --explain says about them), transformers' own MLP modules end to end (both exporters, fp32/fp16,
fuse in two stages, verify against the module), the CPU kernel per activation with tolerances that tell the
activations apart, and models fused before the activation attribute existed.
"""
from __future__ import annotations

import collections
import importlib.util
import math
import pathlib

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import cli, export, functions, fuse, runtime, schema, soundness, testing, verify
from onnxfuse.testing import assert_close

from test_properties import examples

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"
HF_MLPS = DATA / "hf_mlps.py"
DTYPES = {"fp32": (TensorProto.FLOAT, np.float32), "fp16": (TensorProto.FLOAT16, np.float16)}
SQRT2, BETA, KAPPA, ALPHA = math.sqrt(2.0), math.sqrt(2.0 / math.pi), schema.GELU_TANH_COEFF, schema.QUICK_GELU_ALPHA
mk = helper.make_node


def _hf():
    spec = importlib.util.spec_from_file_location("hf_mlps", HF_MLPS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


hf = _hf()


# ------------------------------------------------------------------------------------------------ graph builder

class Graph:
    """A hand-built gated MLP: X -> projections -> act(gate) * up, in a chosen spelling."""

    def __init__(self, dtype: str, seed: int = 0, swap: int = 0):
        self.dtype, self.et, self.np = dtype, *DTYPES[dtype]
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.opset = 18
        self.extra_opsets: list = []
        self._swap = swap  # bit i: swap the operands of the i-th commutative node
        self._i = 0

    def name(self, prefix: str) -> str:
        self._i += 1
        return f"{prefix}{self._i}"

    def const(self, value: float) -> str:
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.array(value, dtype=self.np), n))
        return n

    def node(self, op: str, inputs: list[str], domain: str = "", **attrs) -> str:
        out = self.name(op.lower())
        if op in ("Mul", "Add") and (self._swap >> (self._i % 16)) & 1:
            inputs = inputs[::-1]
        self.nodes.append(mk(op, inputs, [out], domain=domain, **attrs))
        return out

    def i64(self, values) -> str:
        n = self.name("i")
        self.inits.append(numpy_helper.from_array(np.array(values, dtype=np.int64), n))
        return n

    def weight(self, k: int, n: int, scale: float, trans: bool = False) -> str:
        w = self.rng.standard_normal((n, k) if trans else (k, n)) * scale / math.sqrt(k)
        name = self.name("W")
        self.inits.append(numpy_helper.from_array(w.astype(self.np), name))
        return name

    def model(self, x_shape, out: str, y_shape=None) -> onnx.ModelProto:
        """The graph with output Y = out ([..., N] declared when given: com.microsoft ops have no shape inference)."""
        self.nodes.append(mk("Identity", [out], ["Y"]))
        g = helper.make_graph(self.nodes, "g", [helper.make_tensor_value_info("X", self.et, list(x_shape))],
                              [helper.make_tensor_value_info("Y", self.et, y_shape)], self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", self.opset), *self.extra_opsets],
                                 ir_version=10)


def ms(b: Graph) -> None:
    if not b.extra_opsets:
        b.extra_opsets.append(helper.make_opsetid("com.microsoft", 1))


# Each spelling writes act(g) with the graph builder and returns the activation it computes. `c` overrides a
# constant (for the near-misses): {"sqrt2": 1.5}, {"kappa": 0.0447}, {"alpha": 1.5}, {"half": 0.6}, ...
def _sigmoid_mul(b, g, c, alpha=None):
    a = alpha if alpha is None else c.get("alpha", alpha)
    arg = g if a is None else b.node("Mul", [g, b.const(a)])
    return b.node("Mul", [g, b.node("Sigmoid", [arg])])


def _div_exp(b, g, c, alpha=None, reciprocal=False):
    a = alpha if alpha is None else c.get("alpha", alpha)
    arg = b.node("Neg", [g]) if a is None else b.node("Mul", [g, b.const(-a)])
    d = b.node("Add", [b.node("Exp", [arg]), b.const(c.get("one", 1.0))])
    return b.node("Mul", [g, b.node("Reciprocal", [d])]) if reciprocal else b.node("Div", [g, d])


def _erf(b, g, c, form):
    if form == "mul_rsqrt2":
        z = b.node("Mul", [g, b.const(1.0 / c.get("sqrt2", SQRT2))])
    else:
        z = b.node("Div", [g, b.const(c.get("sqrt2", SQRT2))])
    s = b.node("Add", [b.node("Erf", [z]), b.const(1.0)])
    half = b.const(c.get("half", 0.5))
    if form == "torchscript":  # (g * (1 + erf)) * 0.5
        return b.node("Mul", [b.node("Mul", [g, s]), half])
    if form == "python":  # g * 0.5 * (1 + erf)
        return b.node("Mul", [b.node("Mul", [g, half]), s])
    return b.node("Mul", [g, b.node("Mul", [half, s])])  # dynamo: g * (0.5 * (1 + erf))


def _tanh(b, g, c, form):
    kappa, beta, half = c.get("kappa", KAPPA), c.get("beta", BETA), b.const(c.get("half", 0.5))
    if form == "fast":  # transformers' gelu_fast: 0.5 x (1 + tanh(x * 0.7978845608 * (1 + 0.044715 x x)))
        inner = b.node("Add", [b.const(1.0), b.node("Mul", [b.node("Mul", [b.const(kappa), g]), g])])
        t = b.node("Mul", [b.node("Mul", [g, b.const(beta)]), inner])
    elif form == "expanded":  # sqrt(2/pi) x + sqrt(2/pi) 0.044715 x^3
        t = b.node("Add", [b.node("Mul", [b.const(beta), g]),
                           b.node("Mul", [b.const(beta * kappa), b.node("Pow", [g, b.const(3.0)])])])
    else:
        cube = b.node("Pow", [g, b.const(3.0)]) if form in ("pow", "new") else \
            b.node("Mul", [g, b.node("Mul", [g, g])])
        t = b.node("Mul", [b.const(beta), b.node("Add", [g, b.node("Mul", [b.const(kappa), cube])])])
    s = b.node("Add", [b.node("Tanh", [t]), b.const(1.0)])
    if form == "new":  # gelu_new: 0.5 * x * (1 + tanh)
        return b.node("Mul", [b.node("Mul", [half, g]), s])
    if form == "mulmul":  # torchscript: 0.5 * (x * (1 + tanh))
        return b.node("Mul", [half, b.node("Mul", [g, s])])
    return b.node("Mul", [g, b.node("Mul", [half, s])])


def _opset(b, v):
    b.opset = max(b.opset, v)


SPELLINGS = {
    # name: (activation, builder(b, g, overrides) -> act value)
    "silu/sigmoid_mul": ("silu", lambda b, g, c: _sigmoid_mul(b, g, c)),
    "silu/div_exp": ("silu", lambda b, g, c: _div_exp(b, g, c)),
    "silu/reciprocal_exp": ("silu", lambda b, g, c: _div_exp(b, g, c, reciprocal=True)),
    "silu/swish": ("silu", lambda b, g, c: (_opset(b, 24), b.node("Swish", [g]))[1]),
    "silu/ms_quick_gelu": ("silu", lambda b, g, c: (ms(b), b.node("QuickGelu", [g], "com.microsoft", alpha=1.0))[1]),
    "quick_gelu/sigmoid_mul": ("quick_gelu", lambda b, g, c: _sigmoid_mul(b, g, c, ALPHA)),
    "quick_gelu/div_exp": ("quick_gelu", lambda b, g, c: _div_exp(b, g, c, ALPHA)),
    "quick_gelu/swish": ("quick_gelu", lambda b, g, c: (_opset(b, 24), b.node("Swish", [g], alpha=ALPHA))[1]),
    "quick_gelu/ms_quick_gelu": ("quick_gelu", lambda b, g, c: (ms(b), b.node("QuickGelu", [g], "com.microsoft"))[1]),
    "gelu/erf_dynamo": ("gelu", lambda b, g, c: _erf(b, g, c, "dynamo")),
    "gelu/erf_torchscript": ("gelu", lambda b, g, c: _erf(b, g, c, "torchscript")),
    "gelu/erf_python": ("gelu", lambda b, g, c: _erf(b, g, c, "python")),
    "gelu/erf_mul_rsqrt2": ("gelu", lambda b, g, c: _erf(b, g, c, "mul_rsqrt2")),
    "gelu/onnx_gelu": ("gelu", lambda b, g, c: (_opset(b, 20), b.node("Gelu", [g]))[1]),
    "gelu/ms_gelu": ("gelu", lambda b, g, c: (ms(b), b.node("Gelu", [g], "com.microsoft"))[1]),
    "gelu_tanh/pow": ("gelu_tanh", lambda b, g, c: _tanh(b, g, c, "pow")),
    "gelu_tanh/mulmul": ("gelu_tanh", lambda b, g, c: _tanh(b, g, c, "mulmul")),
    "gelu_tanh/gelu_new": ("gelu_tanh", lambda b, g, c: _tanh(b, g, c, "new")),
    "gelu_tanh/gelu_fast": ("gelu_tanh", lambda b, g, c: _tanh(b, g, c, "fast")),
    "gelu_tanh/expanded": ("gelu_tanh", lambda b, g, c: _tanh(b, g, c, "expanded")),
    "gelu_tanh/onnx_gelu": ("gelu_tanh", lambda b, g, c: (_opset(b, 20), b.node("Gelu", [g], approximate="tanh"))[1]),
    "gelu_tanh/ms_fast_gelu": ("gelu_tanh", lambda b, g, c: (ms(b), b.node("FastGelu", [g], "com.microsoft"))[1]),
    "relu/relu": ("relu", lambda b, g, c: b.node("Relu", [g])),
    "sigmoid/sigmoid": ("sigmoid", lambda b, g, c: b.node("Sigmoid", [g])),
}
PROJECTIONS = ("matmul", "gemm", "gemm_transb", "split", "split_sizes", "slice", "split_up_gate")


def gated(spelling: str, dtype: str = "fp32", proj: str = "matmul", *, m=5, k=24, n=20, rank=3, batch=2, seed=0,
          swap=0, overrides=None, up_first=False):
    """(model, activation) of a gated MLP X -> act(gate) * up with the given activation spelling and projections."""
    b = Graph(dtype, seed, swap)
    act_name, build = SPELLINGS[spelling]
    if proj.startswith("gemm"):
        rank = 2
    x_shape = (m, k) if rank == 2 else (batch, m, k)
    if proj in ("matmul", "gemm", "gemm_transb"):
        trans = proj == "gemm_transb"
        op, attrs = ("MatMul", {}) if proj == "matmul" else ("Gemm", {"transB": 1} if trans else {})
        wg, wu = b.weight(k, n, 2.0, trans), b.weight(k, n, 1.0, trans)
        g = b.node(op, ["X", wg], **attrs)
        u = b.node(op, ["X", wu], **attrs)
    else:
        w = b.weight(k, 2 * n, 1.5)
        h = b.node("MatMul", ["X", w])
        if proj == "slice":
            first = b.node("Slice", [h, b.i64([0]), b.i64([n]), b.i64([-1])])
            second = b.node("Slice", [h, b.i64([n]), b.i64([2 ** 62]), b.i64([-1])])
        else:
            outs = [b.name("half"), b.name("half")]
            ins = [h, b.i64([n, n])] if proj == "split_sizes" else [h]
            attrs = {} if proj == "split_sizes" else {"num_outputs": 2}
            b.nodes.append(mk("Split", ins, outs, axis=-1, **attrs))
            first, second = outs
        g, u = (second, first) if proj == "split_up_gate" else (first, second)
    a = build(b, g, overrides or {})
    y = b.node("Mul", [u, a] if up_first else [a, u])
    return b.model(x_shape, y, list(x_shape[:-1]) + [n]), act_name


def _fuse(tmp_path, model, name="m", **kw):
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}.fused.onnx"
    onnx.save(model, str(src))
    res = fuse.fuse(src, dst, force=True, **kw)
    return src, dst, res


def _feeds(model, seed=0):
    et = model.graph.input[0].type.tensor_type.elem_type
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    np_t = np.float16 if et == TensorProto.FLOAT16 else np.float32
    return {"X": np.random.default_rng(seed).standard_normal(shape).astype(np_t)}


def assert_fused_equal(tmp_path, model, activation, dtype, name="m", **kw):
    """One SwiGLU node with `activation`, equal to the unfused model (function body and CPU kernel)."""
    src, dst, res = _fuse(tmp_path, model, name, **kw)
    assert [mm.op for mm in res.matches] == ["SwiGLU"], res.refusals
    fused = onnx.load(str(dst))
    node, = [n for n in fused.graph.node if n.op_type != "Identity"]
    assert (node.domain, node.op_type) == ("onnxfuse", "SwiGLU")
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["activation"].decode() == activation and node.overload == activation
    soundness.check_model(fused)
    feeds = _feeds(model, 7)
    ref = runtime.session(str(src), "cpu", library=False).run(None, feeds)[0].astype(np.float64)
    for library in (False, True):
        out = runtime.session(str(dst), "cpu", library=library).run(None, feeds)[0].astype(np.float64)
        assert_close(out, ref, dtype, f"library={library}", kind="graph")
    return res, fused


# ------------------------------------------------------------------------------------------------ spellings

@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_every_activation_spelling_fuses_and_matches(tmp_path, spelling, dtype):
    model, act = gated(spelling, dtype, "matmul", swap=0b1010101)
    assert_fused_equal(tmp_path, model, act, dtype, ort=False)


@pytest.mark.parametrize("proj", PROJECTIONS)
def test_every_projection_spelling_fuses_and_matches(tmp_path, proj):
    model, act = gated("gelu_tanh/pow", "fp32", proj)
    res, fused = assert_fused_equal(tmp_path, model, act, "fp32", ort=False)
    if proj.startswith(("split", "slice")):
        # the merged [K, 2N] weight is cut into two [K, N] halves and dropped
        inits = {i.name: list(i.dims) for i in fused.graph.initializer}
        assert sorted(inits.values()) == [[24, 20], [24, 20]], inits
        assert "merged" in fused.graph.node[0].doc_string


@examples(25)
@given(spelling=st.sampled_from(list(SPELLINGS)), dtype=st.sampled_from(list(DTYPES)),
       proj=st.sampled_from(PROJECTIONS), swap=st.integers(0, 2 ** 16 - 1), up_first=st.booleans(),
       m=st.integers(1, 9), k=st.integers(1, 33), n=st.integers(1, 17), seed=st.integers(0, 2 ** 16))
def test_property_gated_mlp_fuses_once_and_matches(tmp_path_factory, spelling, dtype, proj, swap, up_first, m, k, n,
                                                   seed):
    """Any activation spelling x projection spelling x operand order x shape: one SwiGLU, same outputs."""
    model, act = gated(spelling, dtype, proj, m=m, k=k, n=n, seed=seed, swap=swap, up_first=up_first)
    assert_fused_equal(tmp_path_factory.mktemp("p"), model, act, dtype, ort=False)


# ------------------------------------------------------------------------------------------------ near-misses

NEAR_MISSES = {
    # name: (spelling, projections, overrides, dtype, words the --explain reason must contain)
    "gelu_erf_other_constant": ("gelu/erf_dynamo", "matmul", {"sqrt2": 1.5}, "fp32", ["erf", "0.6666667"]),
    "gelu_erf_other_half": ("gelu/erf_torchscript", "matmul", {"half": 0.6}, "fp32", ["erf", "0.6"]),
    "gelu_tanh_wrong_coefficient": ("gelu_tanh/pow", "matmul", {"kappa": 0.0447}, "fp32", ["tanh", "x^3"]),
    "gelu_tanh_wrong_beta": ("gelu_tanh/mulmul", "matmul", {"beta": 0.8}, "fp32", ["tanh", "sqrt(2/pi)"]),
    "gelu_fast_wrong_coefficient": ("gelu_tanh/gelu_fast", "matmul", {"kappa": 0.05}, "fp32", ["tanh"]),
    "sigmoid_gate_other_alpha": ("quick_gelu/sigmoid_mul", "matmul", {"alpha": 1.5}, "fp32", ["a = 1.5", "silu"]),
    "silu_exp_other_one": ("silu/div_exp", "matmul", {"one": 2.0}, "fp32", ["1 + exp"]),
    "tanh_coefficient_fp16_off_by_more_than_an_ulp": ("gelu_tanh/pow", "matmul", {"kappa": 0.045}, "fp16",
                                                      ["x^3"]),
}


@pytest.mark.parametrize("case", list(NEAR_MISSES))
def test_activation_near_misses_are_refused_and_explained(tmp_path, case, capsys):
    spelling, proj, overrides, dtype, words = NEAR_MISSES[case]
    model, _ = gated(spelling, dtype, proj, overrides=overrides)
    src, dst, res = _fuse(tmp_path, model, explain=True)
    assert not res.matches and not dst.exists()
    reasons = [r["reason"] for r in res.refusals if r["rule"].startswith("swiglu")]
    assert len(reasons) == 1 and all(w in reasons[0] for w in words), res.refusals
    assert "SwiGLU computes silu, gelu, gelu_tanh, quick_gelu, relu, sigmoid" in reasons[0]
    assert cli.main(["fuse", str(src), "-o", str(tmp_path / "out.onnx"), "--explain"]) == 0
    assert words[0] in capsys.readouterr().out


def _merged(dtype="fp32", *, split=None, slices=None, axis=-1, n=8, k=12, rows=3, steps=None, gate_index=0,
            up_index=1):
    """X @ W[K, 2N] cut by Split(split sizes) or Slices [(start, end), ...], then silu(part gate) * part up."""
    b = Graph(dtype)
    w = b.weight(k, 2 * n, 1.0)
    h = b.node("MatMul", ["X", w])
    if split is not None:
        outs = [b.name("part") for _ in split]
        b.nodes.append(mk("Split", [h, b.i64(split)], outs, axis=axis))
    else:
        outs = []
        for s, e in slices:
            ins = [h, b.i64([s]), b.i64([e]), b.i64([axis])] + ([b.i64(steps)] if steps else [])
            outs.append(b.node("Slice", ins))
    g, u = outs[gate_index], outs[up_index]
    a = b.node("Mul", [g, b.node("Sigmoid", [g])])
    return b.model((rows, k), b.node("Mul", [a, u]))


MERGED_NEAR_MISSES = {
    # unequal parts broadcast ([.., 15] * [.., 1]) into a valid graph that is not a gated MLP
    "split_into_unequal_halves": (dict(split=[15, 1]), "not its two halves"),
    "split_into_three": (dict(split=[8, 4, 4], gate_index=1, up_index=2), "not its two halves"),
    "slices_overlap": (dict(slices=[(0, 8), (4, 12)]), "not its two halves"),
    "slices_leave_a_gap": (dict(slices=[(0, 6), (10, 16)]), "not its two halves"),
    "slices_interleaved_step_2": (dict(slices=[(0, 16), (1, 16)], steps=[2]), "step 2"),
    "gate_and_up_the_same_chunk": (dict(slices=[(0, 8), (0, 8)]), "not its two halves"),
    "split_along_rows": (dict(split=[2, 2], axis=0, rows=4), "not the last axis"),
}


@pytest.mark.parametrize("case", list(MERGED_NEAR_MISSES))
def test_merged_projection_near_misses_are_refused(tmp_path, case):
    kw, words = MERGED_NEAR_MISSES[case]
    src, dst, res = _fuse(tmp_path, _merged(**kw), explain=True, ort=False)
    assert not res.matches and not dst.exists(), res.matches
    assert any(words in r["reason"] for r in res.refusals), res.refusals


def test_merged_projection_in_up_gate_order_takes_the_right_halves(tmp_path):
    """A gate_up projection laid out [up | gate] (diffusers' GEGLU order): the gate is read from the second half.
    A rule that assumed Phi-3's [gate | up] layout would silently compute silu(up) * gate; this one either cuts the
    halves by the dataflow or refuses, and the outputs say which."""
    model = _merged(slices=[(0, 8), (8, 16)], gate_index=1, up_index=0)
    res, fused = assert_fused_equal(tmp_path, model, "silu", "fp32", ort=False)
    assert "gate cols [8,16)" in fused.graph.node[0].doc_string


def test_graph_input_weights_are_refused(tmp_path):
    model, _ = gated("gelu/erf_dynamo", "fp32", "matmul")
    w = model.graph.initializer[0]
    model.graph.input.append(helper.make_tensor_value_info(w.name, TensorProto.FLOAT, list(w.dims)))
    src, dst, res = _fuse(tmp_path, model, explain=True, ort=False)
    assert not res.matches
    assert any("graph input" in r["reason"] and r["rule"].startswith("swiglu") for r in res.refusals), res.refusals


def test_an_intermediate_with_another_use_is_refused(tmp_path):
    model, _ = gated("gelu_tanh/pow", "fp32", "matmul")
    tanh = next(n for n in model.graph.node if n.op_type == "Tanh")
    model.graph.output.append(helper.make_tensor_value_info(tanh.output[0], TensorProto.FLOAT, None))
    src, dst, res = _fuse(tmp_path, model, explain=True, ort=False)
    assert not res.matches
    assert any(tanh.output[0] in r["reason"] and "graph output" in r["reason"] for r in res.refusals), res.refusals


def test_a_gate_with_a_bias_is_refused(tmp_path):
    b = Graph("fp32")
    wg, wu = b.weight(8, 6, 1.0, True), b.weight(8, 6, 1.0, True)
    bias = b.const(0.5)
    g = b.node("Gemm", ["X", wg, bias], transB=1)
    u = b.node("Gemm", ["X", wu], transB=1)
    model = b.model((4, 8), b.node("Mul", [_erf(b, g, {}, "dynamo"), u]))
    src, dst, res = _fuse(tmp_path, model, explain=True, ort=False)
    assert not [mm for mm in res.matches if mm.op == "SwiGLU"]
    assert any("adds a bias" in r["reason"] for r in res.refusals), res.refusals


@pytest.mark.parametrize("act,words", [("Tanh", "Tanh of the gate"), ("Softplus", "Softplus of the gate"),
                                       ("mish", "mish"), ("none", "bilinear"), ("relu2", "relu^2"),
                                       ("LeakyRelu", "LeakyRelu of the gate")])
def test_unsupported_activation_is_named(tmp_path, act, words):
    """A gated MLP whose activation SwiGLU does not compute: --explain says which activation it saw."""
    b = Graph("fp32")
    g = b.node("MatMul", ["X", b.weight(8, 6, 1.0)])
    u = b.node("MatMul", ["X", b.weight(8, 6, 1.0)])
    if act == "mish":
        a = b.node("Mul", [g, b.node("Tanh", [b.node("Softplus", [g])])])
    elif act == "none":
        a = g
    elif act == "relu2":
        r = b.node("Relu", [g])
        a = b.node("Mul", [r, r])
    else:
        a = b.node(act, [g])
    model = b.model((4, 8), b.node("Mul", [a, u]))
    src, dst, res = _fuse(tmp_path, model, explain=True, ort=False)
    # (relu^2: linear_act then takes the gate's MatMul + Relu; the line comes from the swiglu pass before it)
    assert [mm.op for mm in res.matches] == (["LinearRelu"] if act == "relu2" else [])
    rows = [r for r in res.refusals if r["rule"].startswith("swiglu")]
    assert len(rows) == 1 and words in rows[0]["reason"], res.refusals
    # the gate's GEMM is covered by that line: no second line about it from linear_act's near-miss search
    assert not [r for r in res.refusals if r["rule"] == "linear_act/structure" and r["node"] == rows[0]["node"]]


def test_silu_of_one_projection_is_not_a_gated_mlp(tmp_path):
    """g * sigmoid(g) with no up projection is silu(g), not SwiGLU(W, W): fusing it would run the GEMM twice."""
    b = Graph("fp32")
    g = b.node("MatMul", ["X", b.weight(8, 6, 1.0)])
    model = b.model((4, 8), b.node("Mul", [g, b.node("Sigmoid", [g])]))
    src, dst, res = _fuse(tmp_path, model, explain=True, ort=False)
    assert not res.matches and not [r for r in res.refusals if r["rule"].startswith("swiglu")]


def test_old_opset_refuses_activations_whose_body_needs_castlike(tmp_path):
    model, _ = gated("gelu/erf_dynamo", "fp32", "matmul")
    model.opset_import[0].version = 14
    src, dst, res = _fuse(tmp_path, model, explain=True, ort=False, keep_opset=True)
    assert not res.matches
    assert any("opset 14 is below 15" in r["reason"] for r in res.refusals), res.refusals
    model, _ = gated("relu/relu", "fp32", "matmul")
    model.opset_import[0].version = 14
    assert_fused_equal(tmp_path, model, "relu", "fp32", name="relu", ort=False)


# ------------------------------------------------------------------------------------------------ transformers' MLPs

COMBOS = [(e, d) for e in ("dynamo", "torchscript") for d in ("fp32", "fp16")]


def _export_hf(tmp_path, factory: str, exporter: str):
    module, inputs = getattr(hf, factory)()
    src = tmp_path / f"{factory}-{exporter}.onnx"
    export.torch_export(module, inputs, src, exporter, ["x"], ["y"], None)
    return src, module, inputs


def _fused_ops(path) -> collections.Counter:
    return collections.Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}"
                               for n in onnx.load(str(path), load_external_data=False).graph.node)


def _check_hf(tmp_path, factory, exporter, dtype):
    name, _, act = hf.FACTORIES[factory]
    src, module, inputs = _export_hf(tmp_path, factory, exporter)
    dst = tmp_path / f"{factory}-{exporter}.fused.onnx"
    res = fuse.fuse(src, dst)  # both stages, the default
    ops = _fused_ops(dst)
    # one op per MLP, besides down_proj (a 16-bit MatMul by a constant weight: Linear)
    down = next(op for op in ("onnxfuse::Linear", "ai.onnx::MatMul", "ai.onnx::Gemm") if ops.get(op))
    assert ops == {"onnxfuse::SwiGLU": 1, down: 1}, ops
    assert down != "ai.onnx::MatMul" or dtype == "fp32", ops
    node = next(n for n in onnx.load(str(dst), load_external_data=False).graph.node if n.op_type == "SwiGLU")
    got = next(helper.get_attribute_value(a).decode() for a in node.attribute if a.name == "activation")
    assert got == hf.activation_of(name, act)
    result = verify.verify(dst, module=module, inputs=inputs)
    assert result.passed and result.fused_nodes == 1 + (down == "onnxfuse::Linear"), result.outputs
    return res


@pytest.mark.parametrize("exporter,dtype", COMBOS)
@pytest.mark.parametrize("name", list(hf.MODULES))
def test_transformers_mlp_fuses_fully_and_verifies(tmp_path, name, exporter, dtype):
    _check_hf(tmp_path, name + ("" if dtype == "fp32" else f"_{dtype}"), exporter, dtype)


@pytest.mark.parametrize("exporter,dtype", COMBOS)
@pytest.mark.parametrize("act", hf.MISTRAL_ACTIVATIONS)
def test_mistral_with_other_activations_fuses_fully_and_verifies(tmp_path, act, exporter, dtype):
    _check_hf(tmp_path, f"mistral_{act}" + ("" if dtype == "fp32" else f"_{dtype}"), exporter, dtype)


@pytest.mark.parametrize("factory", ["phi3", "gemma2_fp16"])
def test_cli_fuse_then_verify_module(tmp_path, factory, capsys):
    """The issue's flow as a new user runs it: torch.onnx.export, `onnxfuse fuse`, `onnxfuse verify --module`."""
    src, _, _ = _export_hf(tmp_path, factory, "dynamo")
    dst = tmp_path / "f.onnx"
    assert cli.main(["fuse", str(src), "-o", str(dst)]) == 0
    act = hf.activation_of(hf.FACTORIES[factory][0])
    assert f"onnxfuse::SwiGLU ({act} x1)" in capsys.readouterr().out
    assert cli.main(["verify", str(dst), "--module", f"{HF_MLPS}:{factory}"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_annotation_records_the_activation_and_the_merged_weights(tmp_path):
    src, _, _ = _export_hf(tmp_path, "phi3", "torchscript")
    fuse.fuse(src, tmp_path / "f.onnx")
    m = onnx.load(str(tmp_path / "f.onnx"))
    node = next(n for n in m.graph.node if n.op_type == "SwiGLU")
    doc = node.doc_string
    for needle in ("Y = act(X @ W_gate) * (X @ W_up)", "activation: silu", "merged weight", "gate cols [0,512)",
                   "up cols [512,1024)", "(Slice)", "(Sigmoid)"):
        assert needle in doc, (needle, doc)
    assert max(len(line) for line in doc.splitlines()) <= 64
    meta = {p.key: p.value for p in node.metadata_props}
    assert meta["onnxfuse.activation"] == "silu" and meta["onnxfuse.projections"] == "merged Slice"
    assert {(f.name, f.overload) for f in m.functions if f.domain == "onnxfuse"} == {("SwiGLU", "silu")}
    src, _, _ = _export_hf(tmp_path, "gemma", "dynamo")
    fuse.fuse(src, tmp_path / "g.onnx")
    node = next(n for n in onnx.load(str(tmp_path / "g.onnx")).graph.node if n.op_type == "SwiGLU")
    assert "activation: gelu_tanh" in node.doc_string and "com.microsoft FastGelu" in node.doc_string
    assert node.name == "onnxfuse/swiglu/root"


# ------------------------------------------------------------------------------------------------ kernels

@pytest.fixture(scope="module")
def lib():
    from onnxfuse import kernels
    return kernels.build(backends=["cpu"], quiet=True).path


# Weights as graph inputs run the built-in GEMM's epilogue; as initializers, oneDNN's eltwise post-op for the gate
# (where the library and the CPU have oneDNN for the type; relu stays in the built-in epilogue).
WEIGHTS = ("inputs", "constants")


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("dtype", schema.TYPES)
@pytest.mark.parametrize("act", schema.GATE_ACTIVATIONS)
def test_cpu_kernel_matches_reference_per_activation(lib, act, dtype, weights):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 37, 70, generator=g)).to(testing.torch_type(dtype))
    wg = (torch.randn(70, 45, generator=g) * 2.5 / math.sqrt(70)).to(testing.torch_type(dtype))
    wu = (torch.randn(70, 45, generator=g) / math.sqrt(70)).to(testing.torch_type(dtype))
    attrs = {"activation": act}
    out = testing.run_op("SwiGLU", [x, wg, wu], attrs, library=lib, constants=weights == "constants")
    assert_close(out, schema.reference("SwiGLU", [x, wg, wu], attrs), dtype, f"SwiGLU[{act}, {dtype}, {weights}]")


def _epilogue_probe(dtype: str, act: str):
    """X = I, so g = W_gate and u = W_up exactly: the output is act(W_gate) * W_up element by element.

    fp32: g spans [-4.5, 4.5] and u = 1, so the output is act(g) itself (gelu and gelu_tanh differ by up to 4.7e-4
    there). fp16/bf16 round that difference away, so g is taken where the activations differ most in relative terms,
    [-3.5, -2] and [2, 4], and u = 1 / |act(g)|: every output is about +-1 and a wrong activation is off by a large
    fraction of it. (Further into the tail 1 + erf(g / sqrt 2) cancels in fp32 arithmetic, PyTorch's as much as
    ours, so the probe stays out of it.)"""
    n = 64
    t = testing.torch_type(dtype)
    if dtype == "float":
        g = torch.linspace(-4.5, 4.5, n * n).reshape(n, n)
        u = torch.ones(n, n)
    else:
        g = torch.cat([torch.linspace(-3.5, -2.0, n * n // 2), torch.linspace(2.0, 4.0, n * n // 2)]).reshape(n, n)
        u = 1.0 / schema.gate_activation(act, g.to(t).float()).abs().clamp_min(1e-3)
    return [torch.eye(n, dtype=t), g.to(t), u.to(t)]


@pytest.mark.parametrize("weights", WEIGHTS)
@pytest.mark.parametrize("dtype", schema.TYPES)
@pytest.mark.parametrize("act", schema.GATE_ACTIVATIONS)
def test_tolerance_tells_the_activations_apart(lib, act, dtype, weights):
    """The kernel passes against its own activation's reference and the same tolerance fails every other
    activation's: a kernel computing gelu for gelu_tanh (or silu for quick_gelu) would not pass."""
    inputs = _epilogue_probe(dtype, act)
    out = testing.run_op("SwiGLU", inputs, {"activation": act}, library=lib, constants=weights == "constants")
    assert_close(out, schema.reference("SwiGLU", inputs, {"activation": act}), dtype, act)
    for other in schema.GATE_ACTIVATIONS:
        if other != act:
            with pytest.raises(AssertionError):
                assert_close(out, schema.reference("SwiGLU", inputs, {"activation": other}), dtype, other)


def test_unknown_activation_fails_kernel_creation(lib):
    x, wg, wu = (torch.ones(2, 4), torch.ones(4, 3), torch.ones(4, 3))
    with pytest.raises(Exception, match="unknown activation 'swish2'"):
        testing.run_op("SwiGLU", [x, wg, wu], {"activation": "swish2"}, library=lib)


# ------------------------------------------------------------------------------------------------ models fused before

def _legacy_model():
    """A SwiGLU node as onnxfuse wrote it before the activation attribute: no attribute, empty overload, the silu
    function body."""
    rng = np.random.default_rng(0)
    wg, wu = (rng.standard_normal((8, 6)).astype(np.float32) for _ in range(2))
    node = mk("SwiGLU", ["X", "Wg", "Wu"], ["Y"], domain="onnxfuse", backend="auto")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 6])],
                          [numpy_helper.from_array(wg, "Wg"), numpy_helper.from_array(wu, "Wu")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                            helper.make_opsetid(schema.DOMAIN, schema.DOMAIN_VERSION)], ir_version=10)
    functions.add_functions(m)
    return m, wg, wu


def test_models_fused_before_keep_working(tmp_path, capsys):
    m, wg, wu = _legacy_model()
    assert [(f.name, f.overload) for f in m.functions] == [("SwiGLU", "")]
    onnx.checker.check_model(m, full_check=True)
    path = tmp_path / "old.fused.onnx"
    onnx.save(m, str(path))
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    g = x @ wg
    ref = g / (1 + np.exp(-g)) * (x @ wu)
    for library in (False, True):  # the function body (silu) and the kernel (activation absent: silu)
        out = runtime.session(str(path), "cpu", library=library).run(None, {"X": x})[0]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    # fuse leaves it as it is
    assert cli.main(["fuse", str(path), "-o", str(tmp_path / "again.onnx")]) == 0
    assert "already fused" in capsys.readouterr().out and not (tmp_path / "again.onnx").exists()


# ------------------------------------------------------------------------------------------------ scopes

def _gated_branch(name: str, merged: bool, n=6) -> onnx.GraphProto:
    """A body computing gelu_tanh(X @ Wg) * (X @ Wu) (or Phi-3's merged spelling) from outer-scope X and weights."""
    if merged:
        nodes = [mk("MatMul", ["X", f"W_{name}"], [f"h_{name}"]),
                 mk("Split", [f"h_{name}"], [f"g_{name}", f"u_{name}"], axis=-1, num_outputs=2)]
    else:
        nodes = [mk("MatMul", ["X", f"Wg_{name}"], [f"g_{name}"]), mk("MatMul", ["X", f"Wu_{name}"], [f"u_{name}"])]
    nodes += [mk("Gelu", [f"g_{name}"], [f"a_{name}"], approximate="tanh"),
              mk("Mul", [f"a_{name}", f"u_{name}"], [f"y_{name}"])]
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, [4, n])])


def test_gated_mlps_inside_if_branches_are_fused(tmp_path):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 12)).astype(np.float32), "W_then"),
             numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "Wg_else"),
             numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "Wu_else")]
    node = mk("If", ["cond"], ["Y"], then_branch=_gated_branch("then", True), else_branch=_gated_branch("else", False))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 8]),
                                        helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 6])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    src, dst, res = _fuse(tmp_path, model, ort=False)
    assert [mm.op for mm in res.matches] == ["SwiGLU", "SwiGLU"]
    fused = onnx.load(str(dst))
    assert [[n.op_type for n in a.g.node] for a in fused.graph.node[0].attribute] == [["SwiGLU"], ["SwiGLU"]]
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    for cond in (True, False):
        feeds = {"X": x, "cond": np.array(cond)}
        ref = runtime.session(str(src), "cpu", library=False).run(None, feeds)[0]
        for library in (False, True):
            out = runtime.session(str(dst), "cpu", library=library).run(None, feeds)[0]
            np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_gate_from_an_outer_scope_is_left_alone(tmp_path):
    """The projections in the main graph, the gating Mul inside an If branch: the match would have to replace nodes
    of two graphs, so nothing fuses (and nothing breaks)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), n) for n in ("Wg", "Wu")]
    body = helper.make_graph([mk("Relu", ["g"], ["a"]), mk("Mul", ["a", "u"], ["y_then"])], "then", [],
                             [helper.make_tensor_value_info("y_then", TensorProto.FLOAT, [4, 6])])
    other = helper.make_graph([mk("Identity", ["u"], ["y_else"])], "else", [],
                              [helper.make_tensor_value_info("y_else", TensorProto.FLOAT, [4, 6])])
    nodes = [mk("MatMul", ["X", "Wg"], ["g"]), mk("MatMul", ["X", "Wu"], ["u"]),
             mk("If", ["cond"], ["Y"], then_branch=body, else_branch=other)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 8]),
                                       helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 6])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    src, dst, res = _fuse(tmp_path, model, ort=False, explain=True)
    assert not [mm for mm in res.matches if mm.op == "SwiGLU"]


def test_gated_mlp_inside_a_model_local_function_is_left_alone_and_said(tmp_path):
    rng = np.random.default_rng(0)
    body = [mk("Constant", [], ["Wg"], value=numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32))),
            mk("Constant", [], ["Wu"], value=numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32))),
            mk("MatMul", ["x", "Wg"], ["g"]), mk("MatMul", ["x", "Wu"], ["u"]), mk("Sigmoid", ["g"], ["s"]),
            mk("Mul", ["g", "s"], ["a"]), mk("Mul", ["a", "u"], ["y"])]
    f = helper.make_function("local", "MLP", ["x"], ["y"], body, [helper.make_opsetid("", 18)])
    g = helper.make_graph([mk("MLP", ["X"], ["Y"], domain="local")], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 6])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
                              functions=[f], ir_version=10)
    src, dst, res = _fuse(tmp_path, model, explain=True, ort=False)
    # (counted per candidate root: the gated MLP, and the gate's Linear+Sigmoid that linear_act sees)
    assert not res.matches and res.in_functions == 2
    assert any("function local.MLP" in r["reason"] and r["rule"].startswith("swiglu") for r in res.refusals)
    assert fuse.fuse(src, dst, force=True, ort=False).in_functions == 2


# ------------------------------------------------------------------------------ SiLU spellings on hand-made graphs
def _swiglu_graph(spelling: str, gemm_trans_b: bool = False, k=6, n=10):
    rng = np.random.default_rng(1)
    wg, wu = (rng.standard_normal((n, k) if gemm_trans_b else (k, n)).astype(np.float32) for _ in range(2))
    inits = [numpy_helper.from_array(wg, "Wg"), numpy_helper.from_array(wu, "Wu"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one")]
    mk = helper.make_node
    if gemm_trans_b:
        nodes = [mk("Gemm", ["X", "Wg"], ["g"], transB=1), mk("Gemm", ["X", "Wu"], ["u"], transB=1)]
    else:
        nodes = [mk("MatMul", ["X", "Wg"], ["g"]), mk("MatMul", ["X", "Wu"], ["u"])]
    if spelling == "sigmoid_mul":
        nodes += [mk("Sigmoid", ["g"], ["sg"]), mk("Mul", ["sg", "g"], ["silu"])]
    elif spelling == "swish":
        nodes += [mk("Swish", ["g"], ["silu"])]
    else:
        nodes += [mk("Neg", ["g"], ["ng"]), mk("Exp", ["ng"], ["e"]), mk("Add", ["one", "e"], ["d"])]
        nodes += [mk("Div", ["g", "d"], ["silu"])] if spelling == "div_exp" else [
            mk("Reciprocal", ["d"], ["rd"]), mk("Mul", ["g", "rd"], ["silu"])]
    nodes.append(mk("Mul", ["u", "silu"], ["Y"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [5, k])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits)
    opset = 24 if spelling == "swish" else 18
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10), wg, wu


@pytest.mark.parametrize("spelling,trans", [("sigmoid_mul", False), ("sigmoid_mul", True), ("swish", False),
                                            ("div_exp", False), ("reciprocal_exp", False)])
def test_swiglu_spellings(tmp_path, spelling, trans):
    model, wg, wu = _swiglu_graph(spelling, trans)
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    res = fuse.fuse(path, tmp_path / "f.onnx")
    assert [m.op for m in res.matches] == ["SwiGLU"]
    fused = onnx.load(str(tmp_path / "f.onnx"))
    assert [n.op_type for n in fused.graph.node] == ["SwiGLU"]
    x = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32)
    if trans:
        wg, wu = wg.T, wu.T
    g = x @ wg
    ref = g / (1 + np.exp(-g)) * (x @ wu)
    for library in (False, True):
        out = runtime.session(str(tmp_path / "f.onnx"), "cpu", library=library).run(None, {"X": x})[0]
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_two_d_dynamo_mlp_gemm_transb(tmp_path):
    """The dynamo exporter spells a 2-D Llama MLP as Gemm(transB=1): SwiGLU must still fire, weights transposed."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP
    torch.manual_seed(0)
    mlp = LlamaMLP(LlamaConfig(hidden_size=32, intermediate_size=48)).eval()
    x = torch.randn(7, 32)
    torch.onnx.export(mlp, (x,), str(tmp_path / "m.onnx"), dynamo=True, input_names=["x"], verbose=False)
    m = onnx.load(str(tmp_path / "m.onnx"))
    assert "Gemm" in {n.op_type for n in m.graph.node}
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx")
    assert [mm.op for mm in res.matches] == ["SwiGLU"]
    out = runtime.session(str(tmp_path / "f.onnx"), "cpu").run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(out, mlp(x).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("targets,as_inputs", [
    (("gate_proj", "up_proj", "down_proj"), False),
    (("gate_proj", "up_proj", "down_proj"), True),   # adapters as graph inputs: kept as the op's inputs
    (("gate_proj", "down_proj"), False),             # the up projection without one: a zero adapter
    (("gate_proj", "up_proj"), False),               # no adapter on down: LoRASwiGLU, down a plain GEMM
])
def test_a_gated_mlp_with_lora_is_one_op(tmp_path, targets, as_inputs):
    """Issue 30: a Llama MLP with peft adapters: gate and up with their adapters and act * mul become one LoRASwiGLU
    (the lora_linear rule's LoRALinear nodes on gate/up absorbed, the report counting them once), and with an adapter
    on down too the whole MLP is one LoRAGatedMLP (LoRASwiGLU and down's LoRALinear joined: the down adapter's X @ A
    from the gated kernel's epilogue); the fused model equals the unfused one through the CPU kernel and through the
    function body."""
    from onnxfuse import adapters, zoo
    spec = zoo.LlamaSpec.from_preset("tiny", mlp_only=True, lora_rank=4, lora_targets=targets)
    res_x = export.export("llama", spec, tmp_path / "m.onnx", lora_as_inputs=as_inputs)
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", provider="cuda")  # every pattern, no CPU table
    op = "LoRAGatedMLP" if "down_proj" in targets else "LoRASwiGLU"
    assert [m.op for m in res.matches] == [op]
    assert {(r["op"], r["matches"]) for r in res.table()} == {(op, 1)}
    fused = onnx.load(str(tmp_path / "f.onnx"))
    soundness.check_model(fused)
    assert [n.op_type for n in fused.graph.node if n.domain == "onnxfuse"] == [op]
    node = next(n for n in fused.graph.node if n.op_type == op)
    assert node.overload == "silu" and len(node.input) == (11 if op == "LoRAGatedMLP" else 7)
    graph_inputs = {i.name for i in fused.graph.input}
    assert all((name in graph_inputs) == as_inputs for name in node.input[3:5])  # the gate's A and B
    if op == "LoRAGatedMLP":
        assert all((name in graph_inputs) == as_inputs for name in node.input[8:10])  # the down's A and B
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["scale_down"] == pytest.approx((spec.lora_alpha or 2 * spec.lora_rank) / spec.lora_rank)
        assert node.name.startswith("onnxfuse/swiglu/")
    if "up_proj" not in targets:
        zeros = {t.name: numpy_helper.to_array(t) for t in fused.graph.initializer}
        assert not zeros[node.input[5]].any() and not zeros[node.input[6]].any()
    x = zoo.make_inputs("llama", spec, 0, "fp32")["x"].numpy()
    feeds = {"x": x, **(adapters.read_adapter(res_x.adapter_path) if as_inputs else {})}
    want = runtime.session(str(tmp_path / "m.onnx"), "cpu", library=False).run(None, feeds)[0]
    for library in (True, False):
        got = runtime.session(str(tmp_path / "f.onnx"), "cpu", library=library).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_lora_mlp_whose_activation_has_another_use_is_explained(tmp_path):
    """LoRASwiGLU joins its down projection's LoRALinear only where the activation feeds nothing else: with a second
    use (here a graph output) the two ops stay, and --explain says why."""
    from onnxfuse import zoo
    spec = zoo.LlamaSpec.from_preset("tiny", mlp_only=True, lora_rank=4)
    export.export("llama", spec, tmp_path / "m.onnx")
    m = onnx.load(str(tmp_path / "m.onnx"))
    mul = next(n for n in reversed(m.graph.node) if n.op_type == "Mul"
               and any(c.op_type in ("MatMul", "Gemm") and n.output[0] in c.input for c in m.graph.node))
    m.graph.output.append(onnx.helper.make_tensor_value_info(mul.output[0], onnx.TensorProto.FLOAT, None))
    onnx.save(m, str(tmp_path / "m2.onnx"))
    res = fuse.fuse(tmp_path / "m2.onnx", tmp_path / "f.onnx", explain=True, provider="cuda")
    assert sorted(mm.op for mm in res.matches) == ["LoRALinear", "LoRASwiGLU"]
    reasons = [r["reason"] for r in res.refusals if r["rule"] == "swiglu/lora_mlp"]
    assert any("stays apart from its down projection" in r and "graph output" in r for r in reasons), res.refusals


def test_a_gated_mlp_whose_lora_projection_has_a_bias_is_explained(tmp_path):
    """A LoRALinear gate with a real bias cannot be LoRASwiGLU's projection: --explain says so."""
    from onnxfuse import zoo
    spec = zoo.LlamaSpec.from_preset("tiny", mlp_only=True, lora_rank=4, mlp_bias=True)
    export.export("llama", spec, tmp_path / "m.onnx")
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", explain=True, provider="cuda")
    assert [m.op for m in res.matches] == ["LoRALinear"] * 3
    reasons = [r["reason"] for r in res.refusals if r["rule"].startswith("swiglu")]
    assert any("adds a bias: LoRASwiGLU's projections have none" in r for r in reasons), res.refusals