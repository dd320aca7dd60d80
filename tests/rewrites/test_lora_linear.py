"""The LoRALinear / LoRALinearRelu rule (onnxfuse/rewrites/lora_linear.py) on hand-made graphs: the peft spelling it
fuses (with the fused model equal to the unfused one in onnxruntime), and the refusals it explains. The rule's
property tests (every spelling, random shapes) are in tests/test_properties.py; its soundness cases (an
overridable scale, a rank-raising scale, opset 14) in tests/test_soundness.py."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import cli, fuse, runtime

K, N, R, M = 12, 10, 4, 5


def _lora_graph(relu=False, a_is_input=False, reuse_branch=False, scale=0.5, b_is_input=False, a_computed=False,
                a_dims=(K, R), gemm_branch=False):
    """X @ W + b + scale * ((X @ A) @ B), optionally followed by Relu: the graph peft's Linear exports. A and B may
    be graph inputs (adapters fed at run time), A computed in the graph (a_computed: A = Neg(A0)); gemm_branch: the
    branch as Gemm(Gemm(X, A, transB=1), B, transB=1) with A [R, K] and B [N, R] (the dynamo exporter's 2-D X)."""
    rng = np.random.default_rng(0)
    ab = ((R, K), (N, R)) if gemm_branch else ((K, R), (R, N))
    arrays = {"W": (K, N), "b": (N,), "A0" if a_computed else "A": ab[0], "B": ab[1]}
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in arrays.items()
             if not (a_is_input and n == "A") and not (b_is_input and n == "B")]
    inits.append(numpy_helper.from_array(np.array(scale, np.float32), "s"))
    mk = helper.make_node
    nodes = [mk("Neg", ["A0"], ["A"])] if a_computed else []
    branch = ([mk("Gemm", ["X", "A"], ["xa"], transB=1), mk("Gemm", ["xa", "B"], ["xab"], transB=1)] if gemm_branch
              else [mk("MatMul", ["X", "A"], ["xa"]), mk("MatMul", ["xa", "B"], ["xab"])])
    nodes += [mk("MatMul", ["X", "W"], ["xw"]), mk("Add", ["xw", "b"], ["base"]), *branch,
              mk("Mul", ["xab", "s"], ["branch"]),
             mk("Add", ["base", "branch"], ["sum" if relu else "Y"])]
    if relu:
        nodes.append(mk("Relu", ["sum"], ["Y"]))
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [M, K])]
    if a_is_input:
        inputs.append(helper.make_tensor_value_info("A", TensorProto.FLOAT, list(a_dims)))
    if b_is_input:
        inputs.append(helper.make_tensor_value_info("B", TensorProto.FLOAT, [R, N]))
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    if reuse_branch:
        nodes.append(mk("Neg", ["branch"], ["B2"]))
        outputs.append(helper.make_tensor_value_info("B2", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize("gemm_branch", [False, True], ids=["matmul-branch", "gemm-branch"])
@pytest.mark.parametrize("relu,op", [(False, "LoRALinear"), (True, "LoRALinearRelu")])
def test_rule_fuses_the_peft_spelling_and_keeps_the_numbers(tmp_path, relu, op, gemm_branch):
    src, dst = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(_lora_graph(relu=relu, scale=0.5, gemm_branch=gemm_branch), str(src))
    res = fuse.fuse(src, dst, ort=False)
    assert [m.op for m in res.matches] == [op]
    node = next(n for n in onnx.load(str(dst)).graph.node if n.op_type == op)
    assert helper.get_attribute_value(next(a for a in node.attribute if a.name == "scale")) == pytest.approx(0.5)
    x = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
    want = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]
    got = runtime.session(str(dst), library=True).run(None, {"X": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("relu", [False, True])
def test_adapters_as_graph_inputs_fuse_and_swap(tmp_path, relu):
    """Issue 30: A and B fed at run time (an adapter per run) fuse, stay op inputs under their names (nothing baked),
    and the fused model equals the unfused one for two different adapters in turn."""
    src, dst = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(_lora_graph(relu=relu, a_is_input=True, b_is_input=True), str(src))
    res = fuse.fuse(src, dst, ort=False)
    assert [m.op for m in res.matches] == ["LoRALinearRelu" if relu else "LoRALinear"]
    fused = onnx.load(str(dst))
    node = next(n for n in fused.graph.node if n.op_type == res.matches[0].op)
    assert list(node.input[2:4]) == ["A", "B"]
    assert [i.name for i in fused.graph.input] == ["X", "A", "B"]
    assert not {"A", "B"} & {t.name for t in fused.graph.initializer}
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    sess = runtime.session(str(dst), library=True)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((M, K)).astype(np.float32)
    for _ in range(2):  # two adapters, one after the other, on the same session
        feeds = {"X": x, "A": rng.standard_normal((K, R)).astype(np.float32),
                 "B": rng.standard_normal((R, N)).astype(np.float32)}
        np.testing.assert_allclose(sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("variant,reason", [
    (dict(a_computed=True), "computed by"),
    (dict(a_is_input=True, a_dims=(K, "r")), "needs a static 2-D shape"),
    (dict(reuse_branch=True), "branch is also used by"),
    (dict(gemm_branch=True, a_is_input=True, a_dims=(R, K)), "read by a Gemm with transB=1"),
])
def test_rule_refuses_and_explains(tmp_path, variant, reason, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(_lora_graph(**variant), str(path))
    res = fuse.fuse(path, tmp_path / "out.onnx", explain=True, ort=False, patterns=["lora_linear"])
    assert not res.matches and not (tmp_path / "out.onnx").exists()
    assert any(reason in r["reason"] for r in res.refusals), res.refusals
    assert cli.main(["fuse", str(path), "-o", str(tmp_path / "out.onnx"), "--explain", "--no-ort-fusions",
                     "--patterns", "lora_linear"]) == 0
    assert reason in capsys.readouterr().out


@pytest.mark.parametrize("variant", [{"lora_dropout": 0.25}, {"use_rslora": True}])
def test_peft_variants_fuse_and_keep_the_numbers(tmp_path, variant):
    """peft's LoRA with dropout (gone in eval) and with rank-stabilised scaling (alpha / sqrt(r)): exported by torch,
    fused to LoRALinear with peft's scaling, the fused model equal to the module in eval."""
    import torch
    from peft import LoraConfig, inject_adapter_in_model

    from onnxfuse import export

    torch.manual_seed(0)
    module = torch.nn.Sequential()
    module.add_module("proj", torch.nn.Linear(K, N))
    cfg = LoraConfig(r=R, lora_alpha=3 * R, target_modules=["proj"], init_lora_weights=False, **variant)
    module = inject_adapter_in_model(cfg, module).eval()
    x = torch.randn(M, K)
    export.torch_export(module, {"x": x}, tmp_path / "m.onnx", "dynamo", ["x"], ["y"])
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx")
    assert [m.op for m in res.matches] == ["LoRALinear"]
    fused = onnx.load(str(tmp_path / "f.onnx"))
    node = next(n for n in fused.graph.node if n.op_type == "LoRALinear")
    scale = next(a.f for a in node.attribute if a.name == "scale")
    expected = 3 * R / (R ** 0.5 if variant.get("use_rslora") else R)
    assert scale == pytest.approx(expected)
    with torch.no_grad():
        ref = module(x).numpy()
    got = runtime.session(str(tmp_path / "f.onnx"), library=True).run(None, {"x": x.numpy()})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
