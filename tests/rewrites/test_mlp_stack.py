"""The mlp_stack pass and the MLPStack op: chains of Linear+activation layers become one node whose function
overload matches its depth; numerics equal the unfused chain with and without the kernel library; chains break
where an intermediate is needed elsewhere, and split past MAX_STACK_LAYERS."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import cli, fuse, runtime, schema, soundness


def _chain_graph(widths, acts, *, gemm=True, reuse_at: int | None = None, output_at: int | None = None,
                 dtype=np.float32):
    """X -> [Gemm(transB=1) or MatMul+Add] -> act per layer. reuse_at=i: layer i's output also feeds a Neg;
    output_at=i: layer i's output is also a graph output."""
    rng = np.random.default_rng(0)
    et = TensorProto.FLOAT if dtype == np.float32 else TensorProto.FLOAT16
    mk = helper.make_node
    nodes, inits, outputs = [], [], []
    h = "X"
    for i, (k, n, act) in enumerate(zip(widths[:-1], widths[1:], acts)):
        w = (rng.standard_normal((n, k) if gemm else (k, n)) / np.sqrt(k)).astype(dtype)
        b = (rng.standard_normal(n) * 0.5).astype(dtype)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        if gemm:
            nodes.append(mk("Gemm", [h, f"W{i}", f"b{i}"], [f"z{i}"], transB=1))
        else:
            nodes += [mk("MatMul", [h, f"W{i}"], [f"m{i}"]), mk("Add", [f"m{i}", f"b{i}"], [f"z{i}"])]
        out = "Y" if i == len(acts) - 1 else f"h{i}"
        nodes.append(mk("Relu" if act == "relu" else "Sigmoid", [f"z{i}"], [out]))
        if i == reuse_at:
            nodes.append(mk("Neg", [out], ["other"]))
            outputs.append(helper.make_tensor_value_info("other", et, None))
        if i == output_at:
            outputs.append(helper.make_tensor_value_info(out, et, None))
        h = out
    outputs.insert(0, helper.make_tensor_value_info("Y", et, None))
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("X", et, [7, widths[0]])], outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _stacks(model):
    return [n for n in model.graph.node if n.domain == schema.DOMAIN]


def _run_all(path, feeds):
    """Outputs of the model on the CPU EP with the kernel library, and without it (function bodies)."""
    return [runtime.session(str(path), "cpu", library=lib).run(None, feeds) for lib in (True, False)]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("gemm", [True, False])
def test_chain_becomes_one_stack_with_its_overload(tmp_path, gemm, dtype):
    widths, acts = [13, 40, 24, 9, 1], ["relu", "relu", "relu", "sigmoid"]
    onnx.save(_chain_graph(widths, acts, gemm=gemm, dtype=dtype), str(tmp_path / "m.onnx"))
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx")
    assert [m.op for m in res.matches] == ["MLPStack"]
    assert len(res.matches[0].replaced) == (8 if gemm else 12)
    fused = onnx.load(str(tmp_path / "f.onnx"))
    soundness.check_model(fused)
    (node,) = _stacks(fused)
    assert [n.op_type for n in fused.graph.node] == ["MLPStack"]
    assert node.overload == "relu.relu.relu.sigmoid"
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "activations")) == \
        b"relu.relu.relu.sigmoid"
    assert len(node.input) == 9 and node.name == "onnxfuse/mlp_stack/root"
    assert "layers: 13-40-24-9-1" in node.doc_string
    (fn,) = [f for f in fused.functions if f.name == "MLPStack"]
    assert fn.overload == node.overload and len(fn.input) == 9
    # the transposed Gemm weights the rules replaced are gone, not carried twice
    assert len(fused.graph.initializer) == 8
    x = np.random.default_rng(1).standard_normal((7, 13)).astype(dtype)
    ref = runtime.session(str(tmp_path / "m.onnx"), "cpu", library=False).run(None, {"X": x})[0]
    tol = 1e-5 if dtype == np.float32 else 2e-3
    for out in _run_all(tmp_path / "f.onnx", {"X": x}):
        np.testing.assert_allclose(out[0].astype(np.float32), ref.astype(np.float32), rtol=tol, atol=tol)


def test_long_chain_splits_at_the_kernel_limit(tmp_path):
    widths = [8, 16, 12, 20, 10, 6, 5]
    acts = ["relu"] * 5 + ["sigmoid"]
    onnx.save(_chain_graph(widths, acts), str(tmp_path / "m.onnx"))
    fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx")
    fused = onnx.load(str(tmp_path / "f.onnx"))
    assert [(n.op_type, n.overload) for n in fused.graph.node] == [
        ("MLPStack", "relu.relu.relu.relu"), ("MLPStack", "relu.sigmoid")]
    assert sorted((f.name, f.overload) for f in fused.functions) == [
        ("MLPStack", "relu.relu.relu.relu"), ("MLPStack", "relu.sigmoid")]
    x = np.random.default_rng(2).standard_normal((7, 8)).astype(np.float32)
    ref = runtime.session(str(tmp_path / "m.onnx"), "cpu", library=False).run(None, {"X": x})[0]
    for out in _run_all(tmp_path / "f.onnx", {"X": x}):
        np.testing.assert_allclose(out[0], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant,reason", [
    (dict(reuse_at=1), "has 2 uses"),
    (dict(output_at=1), "is a graph output"),
])
def test_chain_breaks_where_an_intermediate_is_needed(tmp_path, variant, reason, capsys):
    widths, acts = [6, 10, 8, 4, 3], ["relu", "relu", "relu", "relu"]
    onnx.save(_chain_graph(widths, acts, **variant), str(tmp_path / "m.onnx"))
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", explain=True)
    fused = onnx.load(str(tmp_path / "f.onnx"))
    # layers 0-1 stack, layer 1's output stays in memory, layers 2-3 stack
    assert collections.Counter(n.op_type for n in _stacks(fused)) == {"MLPStack": 2}
    assert any(r["rule"] == "mlp_stack/chain" and reason in r["reason"] for r in res.refusals), res.refusals
    out_names = {o.name for o in fused.graph.output}
    assert "h1" in out_names or any("h1" in n.input for n in fused.graph.node)
    x = np.random.default_rng(3).standard_normal((7, 6)).astype(np.float32)
    ref = runtime.session(str(tmp_path / "m.onnx"), "cpu", library=False).run(None, {"X": x})
    for outs in _run_all(tmp_path / "f.onnx", {"X": x}):
        for a, b in zip(outs, ref):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert cli.main(["fuse", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "g.onnx"), "--explain"]) == 0
    assert reason in capsys.readouterr().out


def test_lone_layer_is_not_a_stack_and_patterns_can_skip_the_pass(tmp_path):
    onnx.save(_chain_graph([6, 4], ["relu"]), str(tmp_path / "one.onnx"))
    res = fuse.fuse(tmp_path / "one.onnx", tmp_path / "f1.onnx")
    assert [m.op for m in res.matches] == ["LinearRelu"]
    onnx.save(_chain_graph([6, 5, 4], ["relu", "sigmoid"]), str(tmp_path / "two.onnx"))
    res = fuse.fuse(tmp_path / "two.onnx", tmp_path / "f2.onnx", patterns=["linear_act"])
    assert [m.op for m in res.matches] == ["LinearRelu", "LinearSigmoid"]
    res = fuse.fuse(tmp_path / "two.onnx", tmp_path / "f3.onnx")
    assert [m.op for m in res.matches] == ["MLPStack"]
    assert cli.main(["fuse", str(tmp_path / "two.onnx"), "-o", str(tmp_path / "f5.onnx"), "--patterns",
                     "mlp_stack,linear_act", "-q"]) == 0
    assert [n.op_type for n in onnx.load(str(tmp_path / "f5.onnx")).graph.node] == ["MLPStack"]
    again = fuse.fuse(tmp_path / "f3.onnx", tmp_path / "f4.onnx")  # idempotent: nothing left to fuse
    assert not again.matches and again.already_fused == 1 and not (tmp_path / "f4.onnx").exists()


def test_external_data_model_gets_the_overloaded_functions(tmp_path):
    onnx.save(_chain_graph([6, 10, 8, 3], ["relu", "relu", "sigmoid"]), str(tmp_path / "m.onnx"))
    fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", external_data=True)
    assert (tmp_path / "f.onnx.data").exists()
    fused = onnx.load(str(tmp_path / "f.onnx"))
    assert [(f.name, f.overload) for f in fused.functions] == [("MLPStack", "relu.relu.sigmoid")]
    x = np.random.default_rng(4).standard_normal((7, 6)).astype(np.float32)
    ref = runtime.session(str(tmp_path / "m.onnx"), "cpu", library=False).run(None, {"X": x})[0]
    for out in _run_all(tmp_path / "f.onnx", {"X": x}):
        np.testing.assert_allclose(out[0], ref, rtol=1e-5, atol=1e-6)
