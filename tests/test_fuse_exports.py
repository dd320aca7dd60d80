"""Rewrites on real exports (dynamo and TorchScript, fp32 and fp16): counts, nothing else changed, numerics equal
to the unfused model with onnxruntime's optimisations on and off, annotations, refusals and idempotence."""
from __future__ import annotations

import collections
import json

import numpy as np
import onnx
import pytest

from onnxfuse import cli, export, fuse, runtime, soundness, verify
from onnxfuse.errors import OnnxfuseError

from cases import CASES, COMBOS, DATA, expected_ops, export_case as _export, valid_feeds as _valid_feeds


def _counts(model):
    return collections.Counter((n.domain or "", n.op_type) for n in model.graph.node)


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
    for needle in ("replaced 5 nodes", "(MatMul)", "(Sigmoid)", "  X [2,16,64]", "module: model.layers.0.mlp", "float",
                   "triton", "cuda", "cpu", "chosen"):
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


@pytest.mark.parametrize("family", ["avx512", "avx2", "generic"])
def test_fuse_provider_cpu_leaves_slower_patterns_to_onnxruntime(tmp_path, family, monkeypatch):
    """fuse(provider="cpu") does not apply the patterns of fuse.CPU_LEFT_TO_ORT for the host's family and says why,
    naming the family; --patterns overrides; --cpu-isa picks another family's table."""
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
    # the tables as a 2-thread host applies them (past CPU_TABLE_MAX_THREADS an avx512 host has its many-thread
    # table: test_cpu_table_of_a_small_host_family_only_holds_on_small_hosts), whatever this host's thread count
    # (and with oneDNN in the library, whose tables these are: test_cpu_tables_need_onednn)
    from onnxfuse import cpu_policy
    monkeypatch.setattr(cpu_policy.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cpu_policy, "cpu_gemm_engine", lambda: (True, ""))
    res = f.fuse(src, tmp_path / "cpu.onnx", provider="cpu", cpu_isa=family, ort=False, write_unchanged=True)
    want = set(f.CPU_LEFT_TO_ORT[family]) | set(cpu_policy.CPU_ALWAYS_LEFT_TO_ORT)  # int4_linear on every host
    assert not res.matches and set(res.left_to_ort) == want, res.left_to_ort
    assert [n.op_type for n in onnx.load(str(tmp_path / "cpu.onnx")).graph.node] == ["MatMul", "Add", "Relu"]
    assert all(why.startswith(f"on {family} hosts, ") or (p in cpu_policy.CPU_ALWAYS_LEFT_TO_ORT and
                                                        why.startswith("on every CPU host, "))
               for p, why in res.left_to_ort.items()), res.left_to_ort
    assert res.report()["left_to_ort"] == res.left_to_ort
    res = f.fuse(src, tmp_path / "all.onnx", provider="cpu", cpu_isa=family, ort=False, patterns=["linear_act"])
    assert [m.op for m in res.matches] == ["LinearRelu"] and not res.left_to_ort
    # without --cpu-isa, the family the kernels run here: forcing the lowest one gives its table
    monkeypatch.setenv("ONNXFUSE_CPU_ISA", "generic")  # (the forced family must be one this CPU has: generic is)
    res = f.fuse(src, tmp_path / "here.onnx", provider="cpu", ort=False, write_unchanged=True, force=True)
    assert set(res.left_to_ort) == set(f.CPU_LEFT_TO_ORT["generic"]) | set(cpu_policy.CPU_ALWAYS_LEFT_TO_ORT)
    with pytest.raises(OnnxfuseError, match="--cpu-isa goes with --provider cpu"):
        f.fuse(src, tmp_path / "x.onnx", cpu_isa="avx2", ort=False)


def test_fuse_provider_cpu_on_avx2_fuses_the_dlrm_embeddings_and_leaves_its_mlps(exported, tmp_path, monkeypatch):
    """On avx2 hosts the DLRM's MLPs stay MatMul/Gemm + activation for onnxruntime's MLAS (CPU_LEFT_TO_ORT), while
    the embeddings and the interaction fuse as on every family; the model still equals the unfused one. The avx2
    table with oneDNN in the library, whose table it is, whatever this host's library has (without oneDNN every
    GEMM pattern is left with another reason: test_cpu_tables_need_onednn)."""
    import onnxruntime as ort

    from onnxfuse import cpu_policy
    monkeypatch.setattr(cpu_policy, "cpu_gemm_engine", lambda: (True, ""))
    src = exported("dlrm")
    res = fuse.fuse(src, tmp_path / "f.onnx", provider="cpu", cpu_isa="avx2")
    ops = _counts(onnx.load(str(tmp_path / "f.onnx")))
    assert ops[("onnxfuse", "EmbeddingInteraction")] == 1, ops
    assert not any(op in ("LinearRelu", "LinearSigmoid", "MLPStack") for _, op in ops), ops
    assert [m.op for m in res.matches] == ["EmbeddingInteraction"], res.matches
    assert {"linear_act", "mlp_stack"} <= set(res.left_to_ort) and "MLAS" in res.left_to_ort["linear_act"]
    plain = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    feeds = _valid_feeds(plain, 0)
    np.testing.assert_allclose(runtime.session(str(tmp_path / "f.onnx"), library=True).run(None, feeds)[0],
                               plain.run(None, feeds)[0], rtol=1e-5, atol=1e-6)


def test_fuse_provider_cpu_leaves_the_slower_attention_fusion_out_of_stage_1(exported, tmp_path):
    """cpu_policy.CPU_STAGE1_LEFT_OUT: for the CPU provider, stage 1 does not make onnxruntime's MultiHeadAttention
    (measured slower than the unfused attention on both measured families) and says so; without a provider the
    attention fusion stays; both models equal the original."""
    import onnxruntime as ort
    src = exported("llama")
    cpu = fuse.fuse(src, tmp_path / "cpu.onnx", provider="cpu")
    default = fuse.fuse(src, tmp_path / "default.onnx")
    assert "MultiHeadAttention" in {op for _, op in _counts(onnx.load(str(tmp_path / "default.onnx")))}
    assert "MultiHeadAttention" not in {op for _, op in _counts(onnx.load(str(tmp_path / "cpu.onnx")))}
    left = [x for x in cpu.ort.left_out if x.get("kind") == "slower"]
    assert [x["fusion"] for x in left] == ["sdpa"] and "slower" in left[0]["reason"], cpu.ort.left_out
    assert not any(x.get("kind") == "slower" for x in default.ort.left_out)
    assert cpu.ort.checked and cpu.ort.applied  # the norm fusions stay
    plain = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    feeds = _valid_feeds(plain, 0)
    for name in ("cpu.onnx", "default.onnx"):
        np.testing.assert_allclose(runtime.session(str(tmp_path / name), library=True).run(None, feeds)[0],
                                   plain.run(None, feeds)[0], rtol=1e-4, atol=1e-5)


def test_cpu_table_of_a_small_host_family_only_holds_on_small_hosts():
    """The avx512 table was measured on 2 cores; on 16 threads every GEMM pattern but the LoRA linear won, so past
    CPU_TABLE_MAX_THREADS only that one is left out, and the reason says for which hosts."""
    from onnxfuse import cpu_policy
    always = set(cpu_policy.CPU_ALWAYS_LEFT_TO_ORT)  # int4_linear, on every host
    assert (set(cpu_policy.cpu_left_to_ort("avx512", threads=2, onednn=True))
            == set(cpu_policy.CPU_LEFT_TO_ORT["avx512"]) | always)
    many = cpu_policy.cpu_left_to_ort("avx512", threads=16, onednn=True)
    assert set(many) == {"lora_linear"} | always
    assert many["lora_linear"].startswith("on avx512 hosts of more than 4 threads, ")
    assert cpu_policy.cpu_left_to_ort("avx512", threads=4, onednn=True) == cpu_policy.cpu_left_to_ort(
        "avx512", threads=2, onednn=True)
    assert (cpu_policy.cpu_left_to_ort("avx2", threads=16, onednn=True)
            == cpu_policy.cpu_left_to_ort("avx2", threads=2, onednn=True))


def test_cpu_tables_need_onednn(monkeypatch):
    """The family tables assume the library's CPU GEMMs run on oneDNN; with the built-in GEMM (no oneDNN) every GEMM
    pattern is left to onnxruntime on every family and thread count, and the reason says how to get oneDNN. The
    engine is the one ONNXFUSE_LIBRARY recorded, else what a build here would find."""
    from onnxfuse import cpu_policy, kernels
    gemm = {"linear_act", "mlp_stack", "swiglu", "lora_linear"}
    always = set(cpu_policy.CPU_ALWAYS_LEFT_TO_ORT)  # int4_linear, on every host, with its own reason
    for family in ("avx512", "avx2", "generic"):
        left = cpu_policy.cpu_left_to_ort(family, threads=16, onednn=False)
        assert set(left) == gemm | always and all("onnxfuse[cpu]" in left[p] for p in gemm), left
    lib = kernels.library_path(provider="cpu")
    monkeypatch.setenv("ONNXFUSE_LIBRARY", str(lib))
    assert cpu_policy.cpu_gemm_engine()[0] == kernels.build_info(lib)["cpu_gemm"].startswith("onednn ")
    monkeypatch.delenv("ONNXFUSE_LIBRARY")
    monkeypatch.setenv("ONNXFUSE_ONEDNN_ROOT", "off")
    onednn, why = cpu_policy.cpu_gemm_engine()
    assert not onednn and "ONNXFUSE_ONEDNN_ROOT=off" in why
    assert set(cpu_policy.cpu_left_to_ort("avx512", threads=16)) == gemm | always
