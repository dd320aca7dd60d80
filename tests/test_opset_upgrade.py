"""Issue 33: old opsets are upgraded, not refused. A model below the opset the rules' ops need is converted with onnx's
version converter, checked against the original in onnxruntime, reported and fused; --keep-opset keeps it; a model
whose converted form fails the check stays as it was, with the reason. (The upstream DLRM at opset 11:
tests/rewrites/test_embedding_interaction.py.)"""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import cli, fuse, runtime
from onnxfuse.opset_upgrade import UPGRADE_TO, needed_opset


def _linear_relu(opset: int, local_function: bool = False) -> onnx.ModelProto:
    """MatMul + Add + Relu (what linear_act fuses; its body needs opset 13) at `opset`; with `local_function`, a
    Squeeze through a model-local function at the same opset follows it."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(6).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
             helper.make_node("Relu", ["u"], ["r"])]
    functions, opsets, out_shape = [], [helper.make_opsetid("", opset)], [3, 6]
    if local_function:
        nodes += [helper.make_node("Unsqueeze", ["r"], ["r1"], axes=[1]),
                  helper.make_node("Sq", ["r1"], ["y"], domain="local")]
        functions = [helper.make_function("local", "Sq", ["x"], ["y"],
                                          [helper.make_node("Squeeze", ["x"], ["y"], axes=[1])],
                                          [helper.make_opsetid("", opset)])]
        opsets.append(helper.make_opsetid("local", 1))
    else:
        nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], initializer=inits)
    return helper.make_model(g, opset_imports=opsets, ir_version=6 if not local_function else 8, functions=functions)


def _outputs(path, library):
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    if library:
        return runtime.session(str(path), "cpu", library=True).run(None, {"x": x})[0]
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_an_opset_11_model_is_converted_checked_and_fused(tmp_path):
    src = tmp_path / "m11.onnx"
    onnx.save(_linear_relu(11), str(src))
    res = fuse.fuse(src, tmp_path / "f.onnx", ort=False)
    up = res.upgrade
    assert (up.source, up.target, up.checked, up.reason) == (11, UPGRADE_TO, True, ""), up
    assert [m.op for m in res.matches] == ["LinearRelu"]
    fused = onnx.load(str(tmp_path / "f.onnx"))
    assert [o.version for o in fused.opset_import if o.domain == ""] == [UPGRADE_TO]
    assert fused.ir_version >= 8  # what opset 18 needs (the opset-11 export carried IR 6)
    np.testing.assert_allclose(_outputs(tmp_path / "f.onnx", True), _outputs(src, False), rtol=1e-5, atol=1e-6)
    assert json.loads(json.dumps(res.report()))["opset_upgrade"]["source"] == 11


def test_keep_opset_keeps_it_and_the_rules_say_why_they_refuse(tmp_path, capsys):
    src = tmp_path / "m11.onnx"
    onnx.save(_linear_relu(11), str(src))
    res = fuse.fuse(src, tmp_path / "f.onnx", ort=False, explain=True, keep_opset=True)
    assert res.upgrade is None and not res.matches
    assert any("opset 11 is below 13" in r["reason"] for r in res.refusals), res.refusals
    assert not (tmp_path / "f.onnx").exists()
    assert cli.main(["fuse", str(src), "-o", str(tmp_path / "c.onnx"), "--no-ort-fusions"]) == 0
    out = capsys.readouterr().out
    assert f"opset 11 -> {UPGRADE_TO} (onnx's version converter; checked against the original in onnxruntime)" in out
    assert cli.main(["fuse", str(src), "-o", str(tmp_path / "k.onnx"), "--no-ort-fusions", "--keep-opset"]) == 0
    assert "opset 11" not in capsys.readouterr().out and not (tmp_path / "k.onnx").exists()


def test_a_model_whose_converted_form_fails_the_check_is_left_as_it_was(tmp_path):
    """A model-local function at opset 11: the converter converts the graph, but onnxruntime cannot run the result
    (its function no longer resolves), so the model stays at opset 11, the reason is reported and the rules that
    need a newer opset refuse; the model is not written half-converted."""
    src = tmp_path / "fn11.onnx"
    onnx.save(_linear_relu(11, local_function=True), str(src))
    _outputs(src, False)  # the original runs
    res = fuse.fuse(src, tmp_path / "f.onnx", ort=False, explain=True)
    up = res.upgrade
    assert up.source == 11 and up.target is None and up.checked, up
    assert "fails the check against the original" in up.reason and "onnxruntime cannot run it" in up.reason, up
    assert not res.matches and not (tmp_path / "f.onnx").exists()
    assert any("opset 11 is below 13" in r["reason"] for r in res.refusals), res.refusals
    assert up.line().startswith("opset 11 kept: ")


def test_a_model_at_the_needed_opset_is_not_touched(tmp_path):
    need = needed_opset(list(fuse.PATTERNS))
    assert need == max(needed_opset([p]) for p in fuse.PATTERNS) and 13 <= need < UPGRADE_TO
    src = tmp_path / "m.onnx"
    onnx.save(_linear_relu(need), str(src))
    res = fuse.fuse(src, tmp_path / "f.onnx", ort=False)
    assert res.upgrade is None and [m.op for m in res.matches] == ["LinearRelu"]
    assert [o.version for o in onnx.load(str(tmp_path / "f.onnx")).opset_import if o.domain == ""] == [need]
    # only the selected patterns count: linear_act alone needs 13
    onnx.save(_linear_relu(13), str(src))
    assert fuse.fuse(src, tmp_path / "g.onnx", ort=False, patterns=["linear_act"]).upgrade is None


def _gelu_mlp(opset: int) -> onnx.ModelProto:
    """A gated MLP whose gate is GELU in the dynamo's erf spelling, g * (0.5 * (1 + erf(g / sqrt 2))) * (X @ W_up),
    at `opset` (its SwiGLU function body needs CastLike: opset 15)."""
    rng = np.random.default_rng(2)
    c = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)  # noqa: E731
    inits = [numpy_helper.from_array(rng.standard_normal((8, 12)).astype(np.float32), w) for w in ("Wg", "Wu")]
    inits += [c("sqrt2", np.sqrt(2.0)), c("one", 1.0), c("half", 0.5)]
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "Wg"], ["g"]), mk("Div", ["g", "sqrt2"], ["z"]), mk("Erf", ["z"], ["e"]),
             mk("Add", ["e", "one"], ["s"]), mk("Mul", ["half", "s"], ["hs"]), mk("Mul", ["g", "hs"], ["act"]),
             mk("MatMul", ["x", "Wu"], ["u"]), mk("Mul", ["act", "u"], ["y"])]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 12])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


@pytest.mark.parametrize("opset", [11, 14])
def test_a_gated_mlp_from_an_older_exporter_fuses(tmp_path, opset):
    """The issue's example, a Llama-family MLP at opset 14 (and 11): kept, SwiGLU refuses (CastLike); upgraded, it
    fuses and computes the original's outputs."""
    src = tmp_path / "mlp.onnx"
    onnx.save(_gelu_mlp(opset), str(src))
    kept = fuse.fuse(src, tmp_path / "k.onnx", ort=False, keep_opset=True)
    assert not kept.matches
    res = fuse.fuse(src, tmp_path / "f.onnx", ort=False)
    assert res.upgrade.target == UPGRADE_TO and [m.op for m in res.matches] == ["SwiGLU"], (res.upgrade, res.matches)
    np.testing.assert_allclose(_outputs(tmp_path / "f.onnx", True), _outputs(src, False), rtol=1e-5, atol=1e-6)
