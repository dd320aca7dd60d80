"""Rewrites on real exports (dynamo and TorchScript, fp32 and fp16): counts, nothing else changed, numerics equal
to the unfused model with onnxruntime's optimisations on and off, annotations, refusals and idempotence."""
from __future__ import annotations

import collections
import json
import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import cli, export, fuse, runtime, soundness, verify

DATA = pathlib.Path(__file__).parent / "data"
# model -> (spec overrides, expected onnxfuse op counts, nodes each match removes by op type)
CASES = {
    "llama2": (dict(kind="llama", num_hidden_layers=2), {"SwiGLU": 2, "RotaryEmbedding": 4}),
    "llama-lora": (dict(kind="llama", lora_rank=8), {"LoRALinear": 3, "RotaryEmbedding": 2}),
    # bottom 13-512-256-64-16 (4 x relu) and top 367-512-256-1 (relu, relu, sigmoid): one MLPStack each; the hash,
    # the 26 lookups and the dot interaction between them: one EmbeddingInteraction
    "dlrm": (dict(kind="dlrm"), {"MLPStack": 2, "EmbeddingInteraction": 1}),
    "dlrm-lora": (dict(kind="dlrm", lora_rank=4), {"LoRALinearRelu": 6, "LoRALinear": 1, "EmbeddingInteraction": 1}),
}
COMBOS = [(e, d) for e in ("dynamo", "torchscript") for d in ("fp32", "fp16")]


def expected_ops(case: str, dtype: str) -> dict[str, int]:
    """CASES' op counts, plus the token Embedding where its rows pass the rule's threshold (the tiny Llama's 64
    values are 256 bytes in fp32, 128 in fp16)."""
    want = dict(CASES[case][1])
    if CASES[case][0]["kind"] == "llama" and dtype == "fp32":
        want["Embedding"] = 1
    return want


def _counts(model):
    return collections.Counter((n.domain or "", n.op_type) for n in model.graph.node)


def _valid_feeds(sess, seed):
    """Random feeds the models accept: non-negative categorical ids, an all-ones attention mask."""
    feeds = runtime.random_feeds(sess, seed=seed)
    if "sparse" in feeds:
        feeds["sparse"] = np.abs(feeds["sparse"])
    if "attention_mask" in feeds:
        feeds["attention_mask"] = np.ones_like(feeds["attention_mask"])
    return feeds


def _export(exported, case, exporter, dtype):
    kw = dict(CASES[case][0])
    return exported(kw.pop("kind"), exporter=exporter, dtype=dtype, **kw)


def test_export_spellings_match_reference(exported):
    """The exporters' spellings of every reference model, pinned: an upgrade that changes them fails here first."""
    ref = json.loads((DATA / "export_signatures.json").read_text())
    got = {}
    for case in CASES:
        for exporter, dtype in COMBOS:
            m = onnx.load(str(_export(exported, case, exporter, dtype)))
            got[f"{case}/{exporter}/{dtype}"] = export.op_counts(m)
    assert got == ref


@pytest.mark.parametrize("exporter,dtype", COMBOS)
@pytest.mark.parametrize("case", list(CASES))
def test_fusion_counts_and_nothing_else_changed(exported, tmp_path, case, exporter, dtype):
    """onnxfuse's rules alone (--no-ort-fusions): the expected ops, and nothing but the matched nodes changed."""
    src = _export(exported, case, exporter, dtype)
    res = fuse.fuse(src, tmp_path / "f.onnx", ort=False)
    fused = onnx.load(str(tmp_path / "f.onnx"))
    soundness.check_model(fused)
    got = {op: c for (dom, op), c in _counts(fused).items() if dom == "onnxfuse"}
    assert got == expected_ops(case, dtype)
    # every removed node is accounted for by a match, and no other node changed
    before, after = _counts(onnx.load(str(src))), _counts(fused)
    removed = collections.Counter()
    for m in res.matches:
        removed.update(("", t) for _, t in m.replaced)
    # The rotary rule in its head-transposed form adds what it needs in the untransposed layout: cos and sin
    # transposed once per graph (the plain form, e.g. before onnxruntime's attention fusion, adds nothing)
    transposed = any(m.op == "RotaryEmbedding" and "Transpose" in [t for _, t in m.replaced] for m in res.matches)
    added = collections.Counter({("", "Transpose"): 2}) if transposed else collections.Counter()
    for key in before:
        if key == ("", "Constant"):
            # Constants only the replaced nodes read (the TorchScript exporter's LoRA scale) are dropped as dead
            assert after.get(key, 0) <= before[key] - removed.get(key, 0), key
        else:
            assert after.get(key, 0) == before[key] - removed.get(key, 0) + added.get(key, 0), key
    # shape inference types every output of every fused node
    inferred = onnx.shape_inference.infer_shapes(fused, strict_mode=True)
    typed = {v.name for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for node in inferred.graph.node:
        if node.domain == "onnxfuse":
            assert node.output[0] in typed


@pytest.mark.parametrize("graph_opt", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_equals_unfused(exported, tmp_path, case, graph_opt):
    """Function bodies (no library) and the CPU kernels both give the unfused model's outputs."""
    src = _export(exported, case, "dynamo", "fp32")
    fuse.fuse(src, tmp_path / "f.onnx")
    sess = runtime.session(str(src), "cpu", graph_optimization=graph_opt)
    feeds = _valid_feeds(sess, seed=1)
    ref = sess.run(None, feeds)[0]
    for library in (False, True):
        s = runtime.session(str(tmp_path / "f.onnx"), "cpu", library=library, graph_optimization=graph_opt)
        out = s.run(None, feeds)[0]
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


@pytest.mark.parametrize("case", list(CASES))
def test_verify_passes_on_fused_models(exported, tmp_path, case):
    src = _export(exported, case, "dynamo", "fp32")
    fuse.fuse(src, tmp_path / "f.onnx")
    res = verify.verify(tmp_path / "f.onnx")
    assert res.passed and res.fused_nodes == sum(expected_ops(case, "fp32").values())


def test_annotations_and_report(exported, tmp_path):
    src = _export(exported, "llama2", "dynamo", "fp32")
    fuse.fuse(src, tmp_path / "f.onnx")
    m = onnx.load(str(tmp_path / "f.onnx"))
    nodes = [n for n in m.graph.node if n.domain == "onnxfuse" and n.op_type == "SwiGLU"]
    assert [n.name for n in nodes] == ["onnxfuse/swiglu/model.layers.0.mlp", "onnxfuse/swiglu/model.layers.1.mlp"]
    rotary = [n.name for n in m.graph.node if n.op_type == "RotaryEmbedding"]
    assert rotary == ["onnxfuse/rotary_embedding/model.layers.0.self_attn",
                      "onnxfuse/rotary_embedding/model.layers.0.self_attn#2",
                      "onnxfuse/rotary_embedding/model.layers.1.self_attn",
                      "onnxfuse/rotary_embedding/model.layers.1.self_attn#2"]
    doc = nodes[0].doc_string
    for needle in ("replaced 5 nodes", "(MatMul)", "(Sigmoid)", "  X [2,16,64]", "module: model.layers.0.mlp", "float", "triton", "cuda", "cpu",
                   "chosen"):
        assert needle in doc, needle
    assert max(len(line) for line in doc.splitlines()) <= 64, "Netron shows doc lines unwrapped in a narrow panel"
    assert not [p.key for p in nodes[0].metadata_props if p.key.startswith("pkg.torch")]
    report = json.loads(next(p.value for p in m.metadata_props if p.key == fuse.REPORT_KEY))
    swiglu = next(r for r in report["patterns"] if r["op"] == "SwiGLU")
    assert swiglu["matches"] == 2 and 0.3 < report["flop_share"] < 0.8
    assert {f.name for f in m.functions if f.domain == "onnxfuse"} == {"SwiGLU", "RotaryEmbedding", "Embedding"}


def test_fuse_is_idempotent_and_writes_nothing_without_match(exported, tmp_path, capsys):
    src = _export(exported, "dlrm", "dynamo", "fp32")
    assert cli.main(["fuse", str(src), "-o", str(tmp_path / "f.onnx")]) == 0
    assert cli.main(["fuse", str(tmp_path / "f.onnx"), "-o", str(tmp_path / "g.onnx")]) == 0
    assert "already fused" in capsys.readouterr().out and not (tmp_path / "g.onnx").exists()
    assert cli.main(["fuse", str(tmp_path / "f.onnx"), "-o", str(tmp_path / "g.onnx"), "--write-unchanged"]) == 0
    assert (tmp_path / "g.onnx").exists()


def test_fuse_bad_input(tmp_path, capsys):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a protobuf \x00\xff" * 10)
    assert cli.main(["fuse", str(junk), "-o", str(tmp_path / "out.onnx")]) == 2
    assert "not a readable ONNX model" in capsys.readouterr().err
    assert not (tmp_path / "out.onnx").exists()
    assert cli.main(["fuse", str(tmp_path / "missing.onnx")]) == 2


# ------------------------------------------------------------------------------ hand-made graphs: spellings, refusals

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


@pytest.mark.parametrize("graph_opt", [True, False])
@pytest.mark.parametrize("case", ["dlrm", "llama2"])
def test_fp16_fused_equals_unfused_with_ort_optimisations(exported, tmp_path, case, graph_opt):
    """onnxruntime's own Gemm+activation fusion has broken fp16 models before: compare with it on and off."""
    src = _export(exported, case, "dynamo", "fp16")
    fuse.fuse(src, tmp_path / "f.onnx")
    sess = runtime.session(str(src), "cpu", graph_optimization=graph_opt)
    feeds = _valid_feeds(sess, seed=3)
    ref = sess.run(None, feeds)[0].astype(np.float32)
    out = runtime.session(str(tmp_path / "f.onnx"), "cpu", library=True,
                          graph_optimization=graph_opt).run(None, feeds)[0].astype(np.float32)
    assert np.isfinite(out).all()
    assert np.abs(out - ref).max() <= 1e-2 * max(1.0, float(np.abs(ref).max()))


def test_fuse_provider_cpu_leaves_slower_patterns_to_onnxruntime(tmp_path):
    """fuse(provider="cpu") does not apply the patterns of fuse.CPU_LEFT_TO_ORT and says why; --patterns overrides."""
    import onnx
    from onnx import TensorProto, helper

    from onnxfuse import fuse as f
    w = helper.make_tensor("W", TensorProto.FLOAT, [8, 4], [0.1] * 32)
    b = helper.make_tensor("b", TensorProto.FLOAT, [4], [0.0] * 4)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
                          helper.make_node("Relu", ["u"], ["y"])], "g",
                         [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])], initializer=[w, b])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(src))
    res = f.fuse(src, tmp_path / "cpu.onnx", provider="cpu", ort=False, write_unchanged=True)
    assert not res.matches and set(res.left_to_ort) == set(f.CPU_LEFT_TO_ORT) and "linear_act" in res.left_to_ort
    assert res.report()["left_to_ort"] == res.left_to_ort
    res = f.fuse(src, tmp_path / "all.onnx", provider="cpu", ort=False, patterns=["linear_act"])
    assert [m.op for m in res.matches] == ["LinearRelu"] and not res.left_to_ort
