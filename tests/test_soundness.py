"""Rewrite soundness on near-miss graphs: graphs that look like a fused pattern but differ in semantics must either
be left alone or fused into something that computes exactly the same outputs, and `fuse` must never write a model
that onnx.checker or onnxruntime cannot load.

Each test builds its graph by hand and checks the one thing that matters: the original and the fuse output, both
run in onnxruntime (CPU EP, kernel library registered), give the same outputs for the same feeds, including feeds
that override initializers listed among the graph inputs. The classes follow issue 13:
  1. initializers that are also graph inputs (defaults a caller may override) are not constants;
  2. broadcasts that raise the output's rank are refused;
  3. names made by a rewrite are unique against the whole model (second passes, clashing names);
  4. matches inside If/Loop bodies are fused completely (function added, library registered), model-local
     functions are left alone and the report says so;
  5. function opsets follow the model, a shared Gemm(transB=1) weight is transposed once, --explain names values.
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import cli, fuse, runtime, soundness
from onnxfuse.errors import OnnxfuseError

F32 = TensorProto.FLOAT
mk = helper.make_node


def _init(name, arr, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(arr, dtype=dtype), name)


def _model(nodes, inputs, outputs, inits=(), opset=18, functions=(), extra_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset), *extra_opsets]
    return helper.make_model(g, opset_imports=opsets, ir_version=10, functions=list(functions))


def _vi(name, shape, et=F32):
    return helper.make_tensor_value_info(name, et, shape)


def _rand(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _run(path, feeds, library):
    sess = runtime.session(str(path), "cpu", library=library)
    return sess.run(None, feeds)


def _fuse(tmp_path, model, name="m", **kw):
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}.fused.onnx"
    onnx.save(model, str(src))
    res = fuse.fuse(src, dst, force=True, **kw)
    return src, dst, res


def assert_sound(tmp_path, model, feeds_list, name="m", **kw):
    """Fuse `model`; the output (if any) must pass the full checker and give the original's outputs for every feed
    dict (library registered). Returns the fuse result and the fused path (None when nothing was written)."""
    src, dst, res = _fuse(tmp_path, model, name, **kw)
    if not dst.exists():
        return res, None
    soundness.check_model(onnx.load(str(dst)))
    for feeds in feeds_list:
        ref = _run(src, feeds, library=False)
        out = _run(dst, feeds, library=True)
        assert len(ref) == len(out)
        for r, o in zip(ref, out):
            assert r.shape == o.shape and r.dtype == o.dtype, (r.shape, o.shape)
            np.testing.assert_allclose(o, r, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(r).max(initial=0))))
    return res, dst


def _ops(path):
    return [(n.domain, n.op_type) for n in onnx.load(str(path)).graph.node]


# ---------------------------------------------------------------------------------------- 1. overridable initializers

K, N, M = 6, 8, 5


def _gemm_relu(overridable: set[str], trans_b=True, bias_shape=(N,), scale_init=None):
    """relu(Gemm(X, W, b)) with the named initializers also listed as graph inputs (defaults a caller may override)."""
    w = _rand((N, K) if trans_b else (K, N), 1)
    inits = [_init("W", w), _init("b", _rand(bias_shape, 2))]
    nodes = [mk("Gemm", ["X", "W", "b"], ["z"], transB=int(trans_b)), mk("Relu", ["z"], ["Y"])]
    inputs = [_vi("X", [M, K])] + [_vi(i.name, list(i.dims)) for i in inits if i.name in overridable]
    return _model(nodes, inputs, [_vi("Y", [M, N])], inits)


@pytest.mark.parametrize("overridable", [{"W"}, {"b"}, {"W", "b"}])
@pytest.mark.parametrize("trans_b", [True, False])
def test_overridable_gemm_weight_and_bias_are_not_constants(tmp_path, overridable, trans_b):
    model = _gemm_relu(overridable, trans_b)
    x = _rand((M, K), 3)
    feeds = [{"X": x}, {"X": x, **{name: _rand(list(next(i.dims for i in model.graph.initializer if i.name == name)),
                                               10 + len(name)) for name in overridable}}]
    res, dst = assert_sound(tmp_path, model, feeds, explain=True)
    assert not res.matches, "a value a caller may override was baked into the fused node"
    assert any("graph input" in r["reason"] and "override" in r["reason"] for r in res.refusals), res.refusals


def _matmul_add_relu(inits, overridable=(), x_shape=(M, K), bias_first=False, y_shape=None):
    add_inputs = ["b", "xw"] if bias_first else ["xw", "b"]
    nodes = [mk("MatMul", ["X", "W"], ["xw"]), mk("Add", add_inputs, ["z"]), mk("Relu", ["z"], ["Y"])]
    inputs = [_vi("X", list(x_shape))] + [_vi(i.name, list(i.dims)) for i in inits if i.name in overridable]
    return _model(nodes, inputs, [_vi("Y", y_shape)], inits)


def test_overridable_reshaped_bias_is_not_baked(tmp_path):
    # a [1, N] bias is reshaped to [N] at fuse time: only sound for a true constant
    model = _matmul_add_relu([_init("W", _rand((K, N), 1)), _init("b", _rand((1, N), 2))], overridable={"b"})
    x = _rand((M, K), 3)
    res, dst = assert_sound(tmp_path, model, [{"X": x}, {"X": x, "b": _rand((1, N), 9)}])
    assert not res.matches


def _lora(scale_shape=(), overridable=(), x_shape=(M, K), scale=0.5):
    r = 3
    inits = [_init("W", _rand((K, N), 1)), _init("A", _rand((K, r), 2)), _init("B", _rand((r, N), 3)),
             _init("s", np.full(scale_shape, scale))]
    nodes = [mk("MatMul", ["X", "W"], ["base"]), mk("MatMul", ["X", "A"], ["xa"]), mk("MatMul", ["xa", "B"], ["xab"]),
             mk("Mul", ["xab", "s"], ["br"]), mk("Add", ["base", "br"], ["Y"])]
    inputs = [_vi("X", list(x_shape))] + [_vi(i.name, list(i.dims)) for i in inits if i.name in overridable]
    return _model(nodes, inputs, [_vi("Y", None)], inits)


def test_overridable_lora_scale_is_not_baked_into_the_attribute(tmp_path):
    model = _lora(overridable={"s"})
    x = _rand((M, K), 4)
    res, _ = assert_sound(tmp_path, model, [{"X": x}, {"X": x, "s": np.array(3.0, np.float32)},
                                            {"X": x, "s": np.array(0.0, np.float32)}])
    assert not res.matches


def test_overridable_swiglu_one_is_not_a_constant(tmp_path):
    """silu spelled g / (1 + exp(-g)) where the 1 is an overridable initializer: not SiLU once a caller feeds 2."""
    inits = [_init("Wg", _rand((K, N), 1)), _init("Wu", _rand((K, N), 2)), _init("one", np.array(1.0))]
    nodes = [mk("MatMul", ["X", "Wg"], ["g"]), mk("MatMul", ["X", "Wu"], ["u"]), mk("Neg", ["g"], ["ng"]),
             mk("Exp", ["ng"], ["e"]), mk("Add", ["e", "one"], ["d"]), mk("Div", ["g", "d"], ["silu"]),
             mk("Mul", ["silu", "u"], ["Y"])]
    model = _model(nodes, [_vi("X", [M, K]), _vi("one", [])], [_vi("Y", [M, N])], inits)
    x = _rand((M, K), 5)
    res, _ = assert_sound(tmp_path, model, [{"X": x}, {"X": x, "one": np.array(2.0, np.float32)}])
    assert not res.matches


def test_constant_node_weights_are_constants(tmp_path):
    """The positive twin: weights from Constant nodes (not graph inputs) are constants and fuse."""
    w, b = _rand((K, N), 1), _rand((N,), 2)
    nodes = [mk("Constant", [], ["W"], value=numpy_helper.from_array(w)),
             mk("Constant", [], ["b"], value=numpy_helper.from_array(b)),
             mk("MatMul", ["X", "W"], ["xw"]), mk("Add", ["xw", "b"], ["z"]), mk("Relu", ["z"], ["Y"])]
    model = _model(nodes, [_vi("X", [M, K])], [_vi("Y", [M, N])])
    res, dst = assert_sound(tmp_path, model, [{"X": _rand((M, K), 3)}])
    assert [m.op for m in res.matches] == ["LinearRelu"]


# ---------------------------------------------------------------------------------------- 2. rank-raising broadcasts

@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("reduce", [False, True])
def test_bias_that_raises_the_rank_is_refused(tmp_path, bias_first, reduce):
    """X[M,K] @ W + b[1,1,N] is [1, M, N] in ONNX; a fused [M, N] would change what follows (here a reduction)."""
    model = _matmul_add_relu([_init("W", _rand((K, N), 1)), _init("b", _rand((1, 1, N), 2))], bias_first=bias_first)
    if reduce:  # a downstream reduction over axis 0 changes value when the rank changes
        model.graph.node.append(mk("ReduceSum", ["Y", "axes"], ["R"], keepdims=0))
        model.graph.initializer.append(_init("axes", [0], np.int64))
        del model.graph.output[:]
        model.graph.output.append(_vi("R", None))
    res, dst = assert_sound(tmp_path, model, [{"X": _rand((M, K), 3)}], explain=True)
    assert not res.matches
    assert any("rank" in r["reason"] for r in res.refusals), res.refusals


def test_bias_of_equal_rank_still_fuses_on_3d_input(tmp_path):
    model = _matmul_add_relu([_init("W", _rand((K, N), 1)), _init("b", _rand((1, 1, N), 2))], x_shape=(2, M, K))
    res, dst = assert_sound(tmp_path, model, [{"X": _rand((2, M, K), 3)}])
    assert [m.op for m in res.matches] == ["LinearRelu"]


def test_lora_scale_that_raises_the_rank_is_refused(tmp_path):
    model = _lora(scale_shape=(1, 1, 1))
    res, dst = assert_sound(tmp_path, model, [{"X": _rand((M, K), 4)}], explain=True)
    assert not res.matches
    assert any("rank" in r["reason"] for r in res.refusals), res.refusals


def test_lora_scale_of_size_one_and_equal_rank_fuses(tmp_path):
    model = _lora(scale_shape=(1, 1))
    res, dst = assert_sound(tmp_path, model, [{"X": _rand((M, K), 4)}])
    assert [m.op for m in res.matches] == ["LoRALinear"]


# ---------------------------------------------------------------------------------------- 3. names

def test_new_initializer_names_do_not_clash_with_existing_ones(tmp_path):
    """The model already holds tensors named like the ones a rewrite makes (W_KxN, W_zero_bias, b_N)."""
    inits = [_init("W", _rand((N, K), 1)), _init("W_KxN", _rand((M, N), 2)), _init("W2", _rand((N, N), 3)),
             _init("W2_zero_bias", _rand((M, N), 4)), _init("b3", _rand((1, N), 5)), _init("W3", _rand((N, N), 7)),
             _init("b3_N", _rand((M, N), 6))]
    nodes = [mk("Gemm", ["X", "W"], ["z1"], transB=1), mk("Relu", ["z1"], ["h1"]),
             mk("Add", ["h1", "W_KxN"], ["h1b"]),
             mk("MatMul", ["h1b", "W2"], ["z2"]), mk("Relu", ["z2"], ["h2"]),
             mk("Add", ["h2", "W2_zero_bias"], ["h2b"]),
             mk("MatMul", ["h2b", "W3"], ["xw3"]), mk("Add", ["xw3", "b3"], ["z3"]), mk("Relu", ["z3"], ["h3"]),
             mk("Add", ["h3", "b3_N"], ["Y"])]
    model = _model(nodes, [_vi("X", [M, K])], [_vi("Y", [M, N])], inits)
    res, dst = assert_sound(tmp_path, model, [{"X": _rand((M, K), 8)}], patterns=["linear_act"])
    assert [m.op for m in res.matches] == ["LinearRelu"] * 3


def test_second_pass_over_a_fused_model_is_loadable(tmp_path):
    """`fuse --patterns swiglu` then `fuse --patterns linear_act` over its output: names made by the second pass
    are unique against what the first pass wrote (node names included)."""
    inits = [_init("Wg", _rand((N, K), 1)), _init("Wu", _rand((N, K), 2)), _init("W", _rand((N, N), 3)),
             _init("W2", _rand((N, N), 4))]
    nodes = [mk("Gemm", ["X", "Wg"], ["g"], transB=1), mk("Gemm", ["X", "Wu"], ["u"], transB=1),
             mk("Sigmoid", ["g"], ["sg"]), mk("Mul", ["g", "sg"], ["silu"]), mk("Mul", ["silu", "u"], ["h"]),
             mk("Gemm", ["h", "W"], ["z"], transB=1), mk("Relu", ["z"], ["h2"]),
             mk("Gemm", ["h2", "W2"], ["z2"], transB=1), mk("Relu", ["z2"], ["Y"])]
    model = _model(nodes, [_vi("X", [M, K])], [_vi("Y", [M, N])], inits)
    src, first, res1 = _fuse(tmp_path, model, "p1", patterns=["swiglu"])
    assert [m.op for m in res1.matches] == ["SwiGLU"]
    res2 = fuse.fuse(first, tmp_path / "p2.onnx", patterns=["linear_act"])
    assert [m.op for m in res2.matches] == ["LinearRelu", "LinearRelu"]
    m2 = onnx.load(str(tmp_path / "p2.onnx"))
    soundness.check_model(m2)
    names = [n.name for n in m2.graph.node]
    assert len(names) == len(set(names))
    x = _rand((M, K), 5)
    np.testing.assert_allclose(_run(tmp_path / "p2.onnx", {"X": x}, True)[0], _run(src, {"X": x}, False)[0],
                               rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------- 4. subgraphs and functions

def _branch(name, seed):
    """A graph body computing relu(X @ W_<name> + b_<name>) from outer-scope X and weights."""
    nodes = [mk("MatMul", ["X", f"W_{name}"], [f"xw_{name}"]), mk("Add", [f"xw_{name}", f"b_{name}"], [f"z_{name}"]),
             mk("Relu", [f"z_{name}"], [f"y_{name}"])]
    return helper.make_graph(nodes, name, [], [_vi(f"y_{name}", [M, N])])


def test_match_inside_if_branches_is_fused_completely(tmp_path):
    inits = [_init("W_then", _rand((K, N), 1)), _init("b_then", _rand((N,), 2)),
             _init("W_else", _rand((K, N), 3)), _init("b_else", _rand((N,), 4))]
    nodes = [mk("If", ["cond"], ["Y"], then_branch=_branch("then", 0), else_branch=_branch("else", 1))]
    model = _model(nodes, [_vi("X", [M, K]), _vi("cond", [], TensorProto.BOOL)], [_vi("Y", [M, N])], inits)
    x = _rand((M, K), 5)
    res, dst = assert_sound(tmp_path, model, [{"X": x, "cond": np.array(True)}, {"X": x, "cond": np.array(False)}])
    assert [m.op for m in res.matches] == ["LinearRelu", "LinearRelu"]
    fused = onnx.load(str(dst))
    assert runtime.has_onnxfuse_nodes(fused)
    assert {f.name for f in fused.functions if f.domain == "onnxfuse"} == {"LinearRelu"}
    branch_ops = [n.op_type for a in fused.graph.node[0].attribute for n in a.g.node]
    assert branch_ops == ["LinearRelu", "LinearRelu"]
    report = json.loads(next(p.value for p in fused.metadata_props if p.key == fuse.REPORT_KEY))
    assert report["nodes_after"] == 1 and len(report["nodes"]) == 2


def test_match_inside_a_loop_body_is_fused_and_runs(tmp_path):
    """h <- relu(h @ W + b), three times in a Loop: the body's Linear+ReLU becomes a LinearRelu inside the body."""
    body = helper.make_graph(
        [mk("MatMul", ["h_in", "W"], ["xw"]), mk("Add", ["xw", "b"], ["z"]), mk("Relu", ["z"], ["h_out"]),
         mk("Identity", ["cond_in"], ["cond_out"])], "body",
        [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("h_in", [M, K])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("h_out", [M, K])])
    inits = [_init("W", _rand((K, K), 1) / 3), _init("b", _rand((K,), 2)), _init("trips", np.array(3), np.int64),
             _init("true", np.array(True), np.bool_)]
    model = _model([mk("Loop", ["trips", "true", "X"], ["Y"], body=body)], [_vi("X", [M, K])], [_vi("Y", [M, K])],
                   inits)
    res, dst = assert_sound(tmp_path, model, [{"X": _rand((M, K), 3)}])
    assert [m.op for m in res.matches] == ["LinearRelu"]
    assert [n.op_type for n in onnx.load(str(dst)).graph.node[0].attribute[0].g.node] == ["LinearRelu", "Identity"]


def test_match_inside_a_model_local_function_is_left_alone_and_said(tmp_path, capsys):
    body = [mk("Constant", [], ["W"], value=numpy_helper.from_array(_rand((K, N), 1))),
            mk("Constant", [], ["b"], value=numpy_helper.from_array(_rand((N,), 2))),
            mk("MatMul", ["x", "W"], ["xw"]), mk("Add", ["xw", "b"], ["z"]), mk("Relu", ["z"], ["y"])]
    f = helper.make_function("local", "Layer", ["x"], ["y"], body, [helper.make_opsetid("", 18)])
    model = _model([mk("Layer", ["X"], ["Y"], domain="local")], [_vi("X", [M, K])], [_vi("Y", [M, N])],
                   functions=[f], extra_opsets=[helper.make_opsetid("local", 1)])
    src, dst, res = _fuse(tmp_path, model, explain=True, ort=False)
    assert not res.matches and not dst.exists()
    assert any("function local.Layer" in r["reason"] for r in res.refusals), res.refusals
    assert cli.main(["fuse", str(src), "-o", str(dst), "--explain", "--force", "--no-ort-fusions"]) == 0
    assert "local.Layer" in capsys.readouterr().out
    res = fuse.fuse(src, dst, force=True, ort=False)  # without --explain: counted, and the CLI says so
    assert res.in_functions == 1 and res.report()["in_functions"] == 1
    assert cli.main(["fuse", str(src), "-o", str(dst), "--force", "--no-ort-fusions"]) == 0
    assert "1 candidate(s) inside model-local functions were left alone" in capsys.readouterr().out
    # Stage 1 (onnxruntime's fusions) inlines model-local functions first, as optimize_for_ort does: then it fuses
    res, dst = assert_sound(tmp_path, model, [{"X": _rand((M, K), 3)}], name="inlined")
    assert [m.op for m in res.matches] == ["LinearRelu"] and res.in_functions == 0


# ---------------------------------------------------------------------------------------- 5. smaller ones

@pytest.mark.parametrize("opset", [14, 17, 21])
def test_functions_import_the_models_opset(tmp_path, opset):
    model = _matmul_add_relu([_init("W", _rand((K, N), 1)), _init("b", _rand((N,), 2))], y_shape=[M, N])
    model.opset_import[0].version = opset
    res, dst = assert_sound(tmp_path, model, [{"X": _rand((M, K), 3)}], keep_opset=True)
    assert [m.op for m in res.matches] == ["LinearRelu"]
    fused = onnx.load(str(dst))
    for f in fused.functions:
        assert [(o.domain, o.version) for o in f.opset_import if o.domain in ("", "ai.onnx")] == [("", opset)]


def test_lora_below_opset_15_is_refused_with_a_reason(tmp_path):
    """The LoRA function body needs CastLike (opset 15): an older model kept at its opset (--keep-opset) keeps its
    LoRA subgraph."""
    model = _lora()
    model.opset_import[0].version = 14
    res, _ = assert_sound(tmp_path, model, [{"X": _rand((M, K), 3)}], explain=True, keep_opset=True)
    assert not res.matches
    assert any("opset 14" in r["reason"] for r in res.refusals), res.refusals


def test_shared_transposed_weight_is_stored_once(tmp_path):
    inits = [_init("W", _rand((K, K), 1)), _init("b", _rand((K,), 2))]
    nodes = [mk("Gemm", ["X", "W", "b"], ["z1"], transB=1), mk("Relu", ["z1"], ["h1"]),
             mk("Gemm", ["h1", "W", "b"], ["z2"], transB=1), mk("Relu", ["z2"], ["h2"]),
             mk("Add", ["h1", "h2"], ["Y"])]
    model = _model(nodes, [_vi("X", [M, K])], [_vi("Y", [M, K])], inits)
    res, dst = assert_sound(tmp_path, model, [{"X": _rand((M, K), 3)}])
    assert [m.op for m in res.matches] == ["LinearRelu", "LinearRelu"]
    fused = onnx.load(str(dst))
    assert len(fused.graph.initializer) == 2, [i.name for i in fused.graph.initializer]
    a, b = [n for n in fused.graph.node if n.domain == "onnxfuse"]
    assert a.input[1] == b.input[1]


def test_explain_names_the_other_use_of_an_intermediate(tmp_path, capsys):
    inits = [_init("W", _rand((K, N), 1)), _init("b", _rand((N,), 2))]
    nodes = [mk("MatMul", ["X", "W"], ["xw"], name="proj"), mk("Add", ["xw", "b"], ["pre_act"], name="bias_add"),
             mk("Relu", ["pre_act"], ["Y"], name="act"), mk("Tanh", ["pre_act"], ["T"], name="side_branch")]
    model = _model(nodes, [_vi("X", [M, K])], [_vi("Y", [M, N]), _vi("T", [M, N])], inits)
    src, dst, res = _fuse(tmp_path, model, explain=True)
    assert not res.matches
    reasons = [r["reason"] for r in res.refusals]
    assert any("pre_act" in r and "side_branch" in r for r in reasons), reasons
    # A graph output as the other use
    nodes = nodes[:3]
    model = _model(nodes, [_vi("X", [M, K])], [_vi("Y", [M, N]), _vi("pre_act", [M, N])], inits)
    src, dst, res = _fuse(tmp_path, model, name="g", explain=True)
    reasons = [r["reason"] for r in res.refusals]
    assert any("pre_act" in r and "graph output" in r for r in reasons), reasons


def test_explain_reports_only_unfused_candidates(tmp_path):
    """A Llama MLP that fuses into SwiGLU: no leftover lines from linear_act or lora_linear about its nodes."""
    inits = [_init("Wg", _rand((K, N), 1)), _init("Wu", _rand((K, N), 2))]
    nodes = [mk("MatMul", ["X", "Wg"], ["g"]), mk("MatMul", ["X", "Wu"], ["u"]), mk("Sigmoid", ["g"], ["sg"]),
             mk("Mul", ["g", "sg"], ["silu"]), mk("Mul", ["silu", "u"], ["Y"])]
    model = _model(nodes, [_vi("X", [M, K])], [_vi("Y", [M, N])], inits)
    src, dst, res = _fuse(tmp_path, model, explain=True)
    assert [m.op for m in res.matches] == ["SwiGLU"]
    assert res.refusals == []


def test_explain_reports_structural_near_misses(tmp_path):
    """MatMul + Add + Tanh: no pattern ends in Tanh; --explain says what follows the GEMM instead of staying silent."""
    inits = [_init("W", _rand((K, N), 1)), _init("b", _rand((N,), 2))]
    nodes = [mk("MatMul", ["X", "W"], ["xw"], name="proj"), mk("Add", ["xw", "b"], ["z"], name="bias_add"),
             mk("Tanh", ["z"], ["Y"], name="act")]
    model = _model(nodes, [_vi("X", [M, K])], [_vi("Y", [M, N])], inits)
    src, dst, res = _fuse(tmp_path, model, explain=True)
    assert not res.matches
    assert any(r["node"] == "proj" and "Tanh" in r["reason"] for r in res.refusals), res.refusals


def test_shape_inference_failure_is_one_line(tmp_path, capsys):
    """A model ONNX type inference rejects (a float16 bias added to a float product): one line, no logged traceback,
    exit 2, nothing written."""
    model = _matmul_add_relu([_init("W", _rand((K, N), 1)), _init("b", _rand((N,), 2), np.float16)])
    src = tmp_path / "bad.onnx"
    onnx.save(model, str(src))
    assert cli.main(["fuse", str(src), "-o", str(tmp_path / "out.onnx")]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert "Traceback" not in err + captured.out and len(err.strip().splitlines()) == 1, err
    assert "inconsistent type" in err and "shape inference" in err
    assert not (tmp_path / "out.onnx").exists()


def test_declared_shape_that_contradicts_the_subgraph_is_not_fused(tmp_path):
    """The graph says Y is [M, N+3] while X @ W gives [M, N]: the fused op's shape would differ from the declared
    one, so the rule refuses and says which value."""
    model = _matmul_add_relu([_init("W", _rand((K, N), 1)), _init("b", _rand((N,), 2))], y_shape=[M, N + 3])
    src, dst, res = _fuse(tmp_path, model, explain=True)
    assert not res.matches and not dst.exists()
    assert any("Y" in r["reason"] and "shape" in r["reason"] for r in res.refusals), res.refusals


# ---------------------------------------------------------------------------------------- the soundness gate

def _break_rank(monkeypatch):
    """Make the linear_act rule emit a node whose output has one dimension too few (a planted rewrite bug)."""
    from onnxfuse.rewrites import linear_act

    orig = linear_act.LinearAct.rewrite

    def bad(self, op, x, w, lin, b=None, **kw):
        out = orig(self, op, x, w, lin, b, **kw)
        return op.ReduceSum(out, op.Constant(value_ints=[0]), keepdims=0)

    monkeypatch.setattr(linear_act.LinearAct, "rewrite", bad)


def _assert_gate_trips(tmp_path) -> pathlib.Path:
    """Fuse a Linear+ReLU model with a planted rewrite bug: the gate raises, nothing is written."""
    model = _matmul_add_relu([_init("W", _rand((K, N), 1)), _init("b", _rand((N,), 2))], y_shape=[M, N])
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    with pytest.raises(OnnxfuseError, match="soundness"):
        fuse.fuse(src, tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists()
    return src


def test_gate_trips_on_a_rewrite_that_changes_an_output_signature(tmp_path, monkeypatch, capsys):
    _break_rank(monkeypatch)
    src = _assert_gate_trips(tmp_path)
    assert cli.main(["fuse", str(src), "-o", str(tmp_path / "out.onnx")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "soundness" in err
    assert not (tmp_path / "out.onnx").exists()


def test_gate_trips_on_an_unloadable_output(tmp_path, monkeypatch):
    """A rewrite that leaves an input nobody defines: onnx.checker rejects it, fuse writes nothing."""
    from onnxscript import ir

    from onnxfuse.rewrites import linear_act

    orig = linear_act.LinearAct.rewrite

    def dangling(self, op, x, w, lin, b=None, **kw):
        out = orig(self, op, x, w, lin, b, **kw)
        out.producer().replace_input_with(1, ir.Value(name="ghost_weight", type=w.type, shape=w.shape))
        return out

    monkeypatch.setattr(linear_act.LinearAct, "rewrite", dangling)
    _assert_gate_trips(tmp_path)


def test_gate_trips_on_external_data_models_too(tmp_path, monkeypatch):
    _break_rank(monkeypatch)
    model = _matmul_add_relu([_init("W", _rand((K, N), 1)), _init("b", _rand((N,), 2))], y_shape=[M, N])
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src), save_as_external_data=True, all_tensors_to_one_file=True, location="m.onnx.data",
              size_threshold=0)
    with pytest.raises(OnnxfuseError, match="soundness"):
        fuse.fuse(src, tmp_path / "out.onnx")
    assert not (tmp_path / "out.onnx").exists() and not (tmp_path / "out.onnx.data").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".onnxfuse")] == []
