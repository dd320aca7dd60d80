"""The LinearRelu / LinearSigmoid rule (onnxfuse/rewrites/linear_act.py) on hand-made graphs: the refusals it
explains and the well-formed twin it fuses."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import cli, fuse


def _linear_relu_graph(bias_shape=(8,), weight_is_input=False, reuse_intermediate=False, k=6, n=8):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(bias_shape).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["Y"])]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    if reuse_intermediate:
        nodes.append(helper.make_node("Neg", ["z"], ["Z2"]))
        outputs.append(helper.make_tensor_value_info("Z2", TensorProto.FLOAT, None))
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, k])]
    inits = [b]
    if weight_is_input:
        inputs.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, [k, n]))
    else:
        inits.append(w)
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("variant,reason", [
    (dict(bias_shape=(4, 1)), "does not broadcast along the last axis"),
    (dict(weight_is_input=True), "not a constant"),
    (dict(reuse_intermediate=True), "z is also used by"),
])
def test_rule_refuses_and_explains(tmp_path, variant, reason, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_linear_relu_graph(**variant), str(path))
    res = fuse.fuse(path, tmp_path / "out.onnx", explain=True)
    assert not res.matches and not (tmp_path / "out.onnx").exists()
    assert any(reason in r["reason"] for r in res.refusals), res.refusals
    assert cli.main(["fuse", str(path), "-o", str(tmp_path / "out.onnx"), "--explain"]) == 0
    assert reason in capsys.readouterr().out


def test_rule_fires_on_the_well_formed_twin(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_linear_relu_graph(bias_shape=(1, 8)), str(path))
    res = fuse.fuse(path, tmp_path / "out.onnx")
    assert [m.op for m in res.matches] == ["LinearRelu"]
