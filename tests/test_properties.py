"""Property tests per rewrite rule: hand-built ONNX graphs in every spelling the rules accept (see the docstrings
of onnxfuse/rewrites/*.py), with random shapes (1, odd sizes, non-multiples of 16), dtypes (fp32, fp16) and
attributes (Gemm transB, bias present/absent and its shape, 2-D/3-D X, LoRA rank and scale, operand order of the
commutative ops). Each example asserts that the rule fires exactly once (the fused graph is the one onnxfuse node)
and that the fused model, run with the CPU kernels, equals the unfused model within the dtype's tolerance.

Quick by default; ONNXFUSE_HYPOTHESIS_PROFILE=nightly runs thousands of examples per test (profiles: conftest.py).
"""
from __future__ import annotations

import os
import pathlib
import tempfile

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import fuse, runtime, testing

QUICK = os.environ.get("ONNXFUSE_HYPOTHESIS_PROFILE", "quick") == "quick"
DTYPES = {"fp32": (TensorProto.FLOAT, np.float32), "fp16": (TensorProto.FLOAT16, np.float16)}
# Fused against unfused: testing.TOLERANCES' "graph" entries, max |fused - unfused| / max(1, max|unfused|) (the
# unfused fp16 graph rounds every intermediate to fp16, the kernels accumulate in fp32 and round once; a dropped
# bias, LoRA branch or scale is off by far more).

dims = st.integers(1, 40) | st.sampled_from([1, 3, 17, 33, 64])


def examples(quick: int):
    """Per-test example count: `quick` under the quick profile, the profile's count otherwise (nightly)."""
    return settings(max_examples=quick) if QUICK else settings()


# ------------------------------------------------------------------------------------------------ helpers

def _init(name, arr, dtype):
    return numpy_helper.from_array(np.asarray(arr).astype(DTYPES[dtype][1]), name)


def _model(nodes, x_shape, dtype, inits, opset=18):
    et = DTYPES[dtype][0]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", et, list(x_shape))],
                          [helper.make_tensor_value_info("Y", et, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _x_shape(rank, batch, m, k):
    return (m, k) if rank == 2 else (batch, m, k)


def fuse_and_compare(model: onnx.ModelProto, op: str, dtype: str, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = pathlib.Path(tmp) / "m.onnx", pathlib.Path(tmp) / "f.onnx"
        onnx.save(model, str(src))
        res = fuse.fuse(src, dst)
        assert [m.op for m in res.matches] == [op], [m.op for m in res.matches]
        fused = onnx.load(str(dst))
        assert [(n.domain, n.op_type) for n in fused.graph.node] == [("onnxfuse", op)], \
            [n.op_type for n in fused.graph.node]
        x_dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = np.random.default_rng(seed).standard_normal(x_dims).astype(DTYPES[dtype][1])
        ref = runtime.session(str(src), "cpu", library=False).run(None, {"X": x})[0]
        out = runtime.session(str(dst), "cpu", library=True).run(None, {"X": x})[0]
        assert out.dtype == ref.dtype and out.shape == ref.shape
        testing.assert_close(out, ref, dtype, f"{op} fused vs unfused", kind="graph")


# ------------------------------------------------------------------------------------------------ linear_act

@st.composite
def linear_act_cases(draw):
    spelling = draw(st.sampled_from(["gemm_c", "gemm_add", "matmul_add", "matmul", "gemm"]))
    gemm = spelling.startswith("gemm")
    return dict(
        spelling=spelling, act=draw(st.sampled_from(["relu", "sigmoid"])), dtype=draw(st.sampled_from(list(DTYPES))),
        trans_b=draw(st.booleans()) if gemm else False,
        rank=2 if gemm else draw(st.sampled_from([2, 3])), batch=draw(st.integers(1, 3)),
        m=draw(dims), k=draw(dims), n=draw(dims),
        bias_2d=draw(st.booleans()),  # bias as [N] or [1, N] (bias present spellings)
        bias_first=draw(st.booleans()),  # Add(b, lin) instead of Add(lin, b)
        seed=draw(st.integers(0, 2**16)))


def linear_act_graph(c):
    rng = np.random.default_rng(c["seed"])
    k, n, dt = c["k"], c["n"], c["dtype"]
    w = rng.standard_normal((n, k) if c["trans_b"] else (k, n)) / np.sqrt(k)
    b = rng.standard_normal((1, n) if c["bias_2d"] else (n,)) * 0.5
    inits = [_init("W", w, dt)]
    mk = helper.make_node
    gemm_attrs = {"transB": 1} if c["trans_b"] else {}
    sp = c["spelling"]
    if sp == "gemm_c":
        nodes = [mk("Gemm", ["X", "W", "b"], ["z"], **gemm_attrs)]
    elif sp in ("gemm", "gemm_add"):
        nodes = [mk("Gemm", ["X", "W"], ["z" if sp == "gemm" else "lin"], **gemm_attrs)]
    else:
        nodes = [mk("MatMul", ["X", "W"], ["z" if sp == "matmul" else "lin"])]
    if sp in ("gemm_add", "matmul_add"):
        nodes.append(mk("Add", ["b", "lin"] if c["bias_first"] else ["lin", "b"], ["z"]))
    if sp in ("gemm_c", "gemm_add", "matmul_add"):
        inits.append(_init("b", b, dt))
    nodes.append(mk("Relu" if c["act"] == "relu" else "Sigmoid", ["z"], ["Y"]))
    return _model(nodes, _x_shape(c["rank"], c["batch"], c["m"], k), dt, inits)


@examples(25)
@given(linear_act_cases())
def test_linear_act_fires_once_and_matches(c):
    op = "LinearRelu" if c["act"] == "relu" else "LinearSigmoid"
    fuse_and_compare(linear_act_graph(c), op, c["dtype"], c["seed"])


# ------------------------------------------------------------------------------------------------ swiglu

@st.composite
def swiglu_cases(draw):
    linear = draw(st.sampled_from(["matmul", "gemm"]))
    return dict(
        linear=linear, silu=draw(st.sampled_from(["sigmoid_mul", "swish", "div_exp", "reciprocal_exp"])),
        dtype=draw(st.sampled_from(list(DTYPES))),
        trans_gate=draw(st.booleans()) if linear == "gemm" else False,
        trans_up=draw(st.booleans()) if linear == "gemm" else False,
        rank=2 if linear == "gemm" else draw(st.sampled_from([2, 3])), batch=draw(st.integers(1, 3)),
        m=draw(dims), k=draw(dims), n=draw(dims),
        swap=draw(st.lists(st.booleans(), min_size=3, max_size=3)),  # operand order of Mul/Add/Mul
        seed=draw(st.integers(0, 2**16)))


def swiglu_graph(c):
    rng = np.random.default_rng(c["seed"])
    k, n, dt = c["k"], c["n"], c["dtype"]
    wg = rng.standard_normal((n, k) if c["trans_gate"] else (k, n)) / np.sqrt(k)
    wu = rng.standard_normal((n, k) if c["trans_up"] else (k, n)) / np.sqrt(k)
    inits = [_init("Wg", wg, dt), _init("Wu", wu, dt), _init("one", np.array(1.0), dt)]
    mk = helper.make_node
    s1, s2, s3 = c["swap"]
    order = lambda a, b, swap: [b, a] if swap else [a, b]  # noqa: E731
    if c["linear"] == "gemm":
        nodes = [mk("Gemm", ["X", "Wg"], ["g"], **({"transB": 1} if c["trans_gate"] else {})),
                 mk("Gemm", ["X", "Wu"], ["u"], **({"transB": 1} if c["trans_up"] else {}))]
    else:
        nodes = [mk("MatMul", ["X", "Wg"], ["g"]), mk("MatMul", ["X", "Wu"], ["u"])]
    silu = c["silu"]
    if silu == "sigmoid_mul":
        nodes += [mk("Sigmoid", ["g"], ["sg"]), mk("Mul", order("g", "sg", s1), ["silu"])]
    elif silu == "swish":
        nodes += [mk("Swish", ["g"], ["silu"])]
    else:
        nodes += [mk("Neg", ["g"], ["ng"]), mk("Exp", ["ng"], ["e"]), mk("Add", order("e", "one", s2), ["d"])]
        if silu == "div_exp":
            nodes += [mk("Div", ["g", "d"], ["silu"])]
        else:
            nodes += [mk("Reciprocal", ["d"], ["rd"]), mk("Mul", order("g", "rd", s1), ["silu"])]
    nodes.append(mk("Mul", order("silu", "u", s3), ["Y"]))
    return _model(nodes, _x_shape(c["rank"], c["batch"], c["m"], k), dt, inits, opset=24 if silu == "swish" else 18)


@examples(25)
@given(swiglu_cases())
def test_swiglu_fires_once_and_matches(c):
    fuse_and_compare(swiglu_graph(c), "SwiGLU", c["dtype"], c["seed"])


# ------------------------------------------------------------------------------------------------ lora_linear

@st.composite
def lora_cases(draw):
    base = draw(st.sampled_from(["matmul", "matmul_add", "gemm_c", "gemm"]))
    gemm = base.startswith("gemm")
    return dict(
        base=base, tail=draw(st.sampled_from(["none", "cast", "relu", "cast_relu"])),
        dtype=draw(st.sampled_from(list(DTYPES))), trans_b=draw(st.booleans()) if gemm else False,
        rank=2 if gemm else draw(st.sampled_from([2, 3])), batch=draw(st.integers(1, 3)),
        m=draw(dims), k=draw(dims), n=draw(dims), r=draw(st.sampled_from([1, 2, 4, 8, 16]) | st.integers(1, 12)),
        scale=draw(st.sampled_from([1.0, 2.0, 0.5]) | st.floats(0.05, 8.0, allow_nan=False)),
        bias_2d=draw(st.booleans()),
        swap=draw(st.lists(st.booleans(), min_size=3, max_size=3)),  # Add(lin,b), Mul(branch,s), Add(base,branch)
        seed=draw(st.integers(0, 2**16)))


def lora_graph(c):
    rng = np.random.default_rng(c["seed"])
    k, n, r, dt = c["k"], c["n"], c["r"], c["dtype"]
    w = rng.standard_normal((n, k) if c["trans_b"] else (k, n)) / np.sqrt(k)
    a = rng.standard_normal((k, r)) / np.sqrt(k)
    bm = rng.standard_normal((r, n)) / np.sqrt(r)
    b = rng.standard_normal((1, n) if c["bias_2d"] else (n,)) * 0.5
    inits = [_init("W", w, dt), _init("A", a, dt), _init("Bm", bm, dt), _init("s", np.array(c["scale"]), dt)]
    mk = helper.make_node
    s1, s2, s3 = c["swap"]
    order = lambda x, y, swap: [y, x] if swap else [x, y]  # noqa: E731
    gemm_attrs = {"transB": 1} if c["trans_b"] else {}
    base = c["base"]
    if base == "gemm_c":
        nodes = [mk("Gemm", ["X", "W", "b"], ["base"], **gemm_attrs)]
    elif base == "gemm":
        nodes = [mk("Gemm", ["X", "W"], ["base"], **gemm_attrs)]
    elif base == "matmul":
        nodes = [mk("MatMul", ["X", "W"], ["base"])]
    else:
        nodes = [mk("MatMul", ["X", "W"], ["lin"]), mk("Add", order("lin", "b", s1), ["base"])]
    if base in ("gemm_c", "matmul_add"):
        inits.append(_init("b", b, dt))
    nodes += [mk("MatMul", ["X", "A"], ["xa"]), mk("MatMul", ["xa", "Bm"], ["xab"]),
              mk("Mul", order("xab", "s", s2), ["branch"])]
    tail = c["tail"]
    last = "Y" if tail == "none" else "sum"
    nodes.append(mk("Add", order("base", "branch", s3), [last]))
    if tail.startswith("cast"):
        nodes.append(mk("Cast", ["sum"], ["Y" if tail == "cast" else "cast"], to=DTYPES[dt][0]))
    if tail.endswith("relu"):
        nodes.append(mk("Relu", ["cast" if tail == "cast_relu" else "sum"], ["Y"]))
    return _model(nodes, _x_shape(c["rank"], c["batch"], c["m"], k), dt, inits)


@examples(25)
@given(lora_cases())
def test_lora_linear_fires_once_and_matches(c):
    op = "LoRALinearRelu" if c["tail"].endswith("relu") else "LoRALinear"
    fuse_and_compare(lora_graph(c), op, c["dtype"], c["seed"])


# ------------------------------------------------------------------------------------------------ every spelling once

@pytest.mark.parametrize("spelling", ["gemm_c", "gemm_add", "matmul_add", "matmul", "gemm"])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_linear_act_spelling(spelling, dtype):
    """Each spelling at least once per dtype, whatever hypothesis draws (odd sizes, not multiples of 16)."""
    c = dict(spelling=spelling, act="relu", dtype=dtype, trans_b=spelling.startswith("gemm"), rank=2, batch=1,
             m=7, k=19, n=33, bias_2d=False, bias_first=True, seed=3)
    fuse_and_compare(linear_act_graph(c), "LinearRelu", dtype, 3)


@pytest.mark.parametrize("silu", ["sigmoid_mul", "swish", "div_exp", "reciprocal_exp"])
@pytest.mark.parametrize("linear", ["matmul", "gemm"])
def test_every_swiglu_spelling(linear, silu):
    c = dict(linear=linear, silu=silu, dtype="fp16" if linear == "gemm" else "fp32", trans_gate=linear == "gemm",
             trans_up=False, rank=2 if linear == "gemm" else 3, batch=2, m=5, k=23, n=17, swap=[True, True, False],
             seed=4)
    fuse_and_compare(swiglu_graph(c), "SwiGLU", c["dtype"], 4)


@pytest.mark.parametrize("tail", ["none", "cast", "relu", "cast_relu"])
@pytest.mark.parametrize("base", ["matmul", "matmul_add", "gemm_c", "gemm"])
def test_every_lora_spelling(base, tail):
    c = dict(base=base, tail=tail, dtype="fp32", trans_b=base == "gemm_c", rank=2 if base.startswith("gemm") else 3,
             batch=2, m=3, k=21, n=35, r=5, scale=0.75, bias_2d=base == "matmul_add", swap=[True, True, True], seed=5)
    op = "LoRALinearRelu" if tail.endswith("relu") else "LoRALinear"
    fuse_and_compare(lora_graph(c), op, "fp32", 5)
