"""The two-stage pipeline: onnxruntime's own fusions (stage 1), then onnxfuse's rules (stage 2).

Node counts by (domain, op) after each stage are pinned for the tiny presets in tests/data/fuse_signatures.json
(regenerate with ONNXFUSE_UPDATE_SIGNATURES=1 after an intended change, and read the diff): if an onnxscript,
exporter or transformers upgrade changes what stage 1 fuses, or stage 1 starts eating what stage 2 fuses, a test
fails instead of speed being lost silently. A stage-1 fusion that changes the outputs is left out and named.
"""
from __future__ import annotations

import collections
import json
import os
import pathlib

import numpy as np
import onnx
import pytest

from onnxfuse import cli, fuse, onnxio, ort_fusions, runtime, soundness, verify

from cases import CASES, COMBOS, expected_ops, export_case as _export, valid_feeds as _valid_feeds

DATA = pathlib.Path(__file__).parent / "data"
SIGNATURES = DATA / "fuse_signatures.json"
UPDATE = os.environ.get("ONNXFUSE_UPDATE_SIGNATURES") == "1"


def _counts(graph_nodes) -> dict[str, int]:
    c = collections.Counter(f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in graph_nodes)
    return dict(sorted(c.items()))


@pytest.mark.parametrize("exporter,dtype", COMBOS)
@pytest.mark.parametrize("case", list(CASES))
def test_stage_counts_are_pinned(exported, tmp_path, case, exporter, dtype):
    src = _export(exported, case, exporter, dtype)
    stage1_model, stage1 = fuse.ort_stage(src, onnxio.load(src))
    res = fuse.fuse(src, tmp_path / "f.onnx")
    fused = onnx.load(str(tmp_path / "f.onnx"))
    soundness.check_model(fused)
    got = {"ort_fusions": stage1.applied, "after_ort": _counts(stage1_model.graph), "after": _counts(fused.graph.node)}
    assert res.ort.applied == stage1.applied and not res.ort.left_out
    assert res.ort.checked or not stage1.applied, res.ort.note
    key = f"{case}/{exporter}/{dtype}"
    if UPDATE:
        pinned = json.loads(SIGNATURES.read_text()) if SIGNATURES.exists() else {}
        pinned[key] = got
        SIGNATURES.write_text(json.dumps(dict(sorted(pinned.items())), indent=1) + "\n")
    pinned = json.loads(SIGNATURES.read_text())
    assert got == pinned[key]
    # stage 2 still fuses what it fuses without stage 1
    want = {f"onnxfuse::{op}": c for op, c in expected_ops(case, dtype).items()}
    assert {op: c for op, c in got["after"].items() if op.startswith("onnxfuse::")} == want


def test_llama_stage1_takes_norms_and_attention_and_gives_rotary_back(exported):
    """The dynamo Llama: RMSNorm, SkipRMSNorm and attention (SDPA into MultiHeadAttention) stay fused; the rotary
    fusion matches but onnxruntime's op needs a cos/sin cache, so its function is inlined back: it is reported as
    intermediate, not applied (onnxfuse's own rotary_embedding rule takes it in stage 2)."""
    src = _export(exported, "llama2", "dynamo", "fp32")
    model, stage1 = fuse.ort_stage(src, onnxio.load(src))
    for name in ("rms_normalization", "skip_rms_normalization", "sdpa_via_mha"):
        assert stage1.applied.get(name), stage1.applied
    assert stage1.intermediate.get("rotary_embedding") == 4 and stage1.intermediate.get("sdpa") == 2, stage1
    ops = {(n.domain, n.op_type) for n in model.graph}
    assert ("com.microsoft", "MultiHeadAttention") in ops and ("com.microsoft", "RotaryEmbedding") not in ops


@pytest.mark.parametrize("case", ["llama-lora", "dlrm"])
def test_two_stage_model_verifies_and_runs_with_and_without_the_library(exported, tmp_path, case):
    src = _export(exported, case, "dynamo", "fp32")
    fuse.fuse(src, tmp_path / "f.onnx")
    assert verify.verify(tmp_path / "f.onnx").passed
    sess = runtime.session(str(src), "cpu")
    feeds = _valid_feeds(sess, seed=3)
    ref = sess.run(None, feeds)[0]
    for library in (False, True):
        out = runtime.session(str(tmp_path / "f.onnx"), "cpu", library=library).run(None, feeds)[0]
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def test_no_ort_fusions_gives_the_single_stage_graph(exported, tmp_path):
    src = _export(exported, "llama2", "dynamo", "fp32")
    res = fuse.fuse(src, tmp_path / "f.onnx", ort=False)
    fused = onnx.load(str(tmp_path / "f.onnx"))
    assert res.ort is None and res.report()["ort_fusions"] is None
    assert not any(n.domain == "com.microsoft" for n in fused.graph.node)
    assert cli.main(["fuse", str(src), "-o", str(tmp_path / "g.onnx"), "--no-ort-fusions", "-q"]) == 0
    assert _counts(onnx.load(str(tmp_path / "g.onnx")).graph.node) == _counts(fused.graph.node)


def test_report_shows_both_stages(exported, tmp_path, capsys):
    src = _export(exported, "llama2", "dynamo", "fp32")
    assert cli.main(["fuse", str(src), "-o", str(tmp_path / "f.onnx"), "--report", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert "stage 1, onnxruntime's fusions" in out and "rms_normalization" in out and "stage 2, onnxfuse" in out
    assert "stage 1 checked" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ort_fusions"]["applied"]["sdpa_via_mha"] == 2 and report["patterns"][0]["op"] == "SwiGLU"
    assert report["ort_fusions"]["intermediate"]["rotary_embedding"] == 4
    meta = json.loads(onnxio.get_metadata(onnx.load(str(tmp_path / "f.onnx")), fuse.REPORT_KEY))
    assert meta["ort_fusions"]["applied"] == report["ort_fusions"]["applied"]


def test_a_fusion_that_changes_the_outputs_is_left_out_and_named(exported, tmp_path, monkeypatch, capsys):
    """A planted stage-1 'fusion' that doubles the first weight it finds: the check catches it, fuse leaves it out,
    keeps the others, says which, and the result verifies."""
    real_steps = ort_fusions._steps

    def steps():
        def corrupt(model, applied):
            init = next(v for v in model.graph.initializers.values() if v.const_value is not None
                        and v.const_value.numpy().ndim == 2)
            from onnxscript import ir
            init.const_value = ir.tensor(init.const_value.numpy() * 2, name=init.name)
            return 1
        return [("planted_bug", corrupt)] + real_steps()

    monkeypatch.setattr(ort_fusions, "_steps", steps)
    src = _export(exported, "llama2", "dynamo", "fp32")
    res = fuse.fuse(src, tmp_path / "f.onnx")
    assert [d["fusion"] for d in res.ort.left_out] == ["planted_bug"]
    assert "planted_bug" not in res.ort.applied and res.ort.applied.get("rms_normalization")
    assert verify.verify(tmp_path / "f.onnx").passed
    assert cli.main(["fuse", str(src), "-o", str(tmp_path / "g.onnx")]) == 0
    assert "stage 1 left out planted_bug: it changed the outputs" in capsys.readouterr().out


def _gelu_with_overridable_half(tmp_path):
    """0.5 * g * (1 + erf(g / sqrt 2)) with g = X @ W, where the 0.5 is an initializer that is also a graph input."""
    from onnx import TensorProto, helper, numpy_helper
    mk = helper.make_node
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array(1.4142135, np.float32), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    nodes = [mk("MatMul", ["X", "W"], ["g"]), mk("Div", ["g", "sqrt2"], ["z"]), mk("Erf", ["z"], ["e"]),
             mk("Add", ["e", "one"], ["s"]), mk("Mul", ["g", "s"], ["gs"]), mk("Mul", ["gs", "half"], ["Y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 8]),
                                       helper.make_tensor_value_info("half", TensorProto.FLOAT, [])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 6])], inits)
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(src))
    feeds = {"X": rng.standard_normal((4, 8)).astype(np.float32), "half": np.array(2.0, np.float32)}
    return src, feeds


def test_stage1_does_not_bake_an_overridable_initializer(tmp_path):
    """onnxscript's patterns read an initializer's value even when it is also a graph input: its GELU fusion would
    bake a caller-overridable 0.5 into com.microsoft Gelu. Stage 1 shows those initializers no value, so nothing
    fuses there and the output follows the caller's value."""
    src, feeds = _gelu_with_overridable_half(tmp_path)
    res = fuse.fuse(src, tmp_path / "f.onnx", write_unchanged=True)
    assert not res.ort.applied and not res.matches, (res.ort, res.matches)
    ref = runtime.session(str(src), "cpu").run(None, feeds)[0]
    out = runtime.session(str(tmp_path / "f.onnx"), "cpu").run(None, feeds)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_the_check_feeds_overridable_initializers_new_values(tmp_path, monkeypatch):
    """A planted stage-1 step that replaces the overridable 0.5 by a constant 0.5: equal for the default feeds, so
    only the check's second run, with every overridable initializer fed a new value, catches it."""
    real_steps = ort_fusions._steps

    def steps():
        def bake(model, applied):
            from onnxscript import ir
            half = next(v for v in model.graph.inputs if v.name == "half")
            const = ir.Value(name="half_baked", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.FLOAT),
                             const_value=ir.tensor(np.array(0.5, np.float32), name="half_baked"))
            model.graph.register_initializer(const)
            half.replace_all_uses_with(const)
            return 1
        return [("planted_bake", bake)] + real_steps()

    monkeypatch.setattr(ort_fusions, "_steps", steps)
    src, feeds = _gelu_with_overridable_half(tmp_path)
    res = fuse.fuse(src, tmp_path / "f.onnx", write_unchanged=True)
    assert [d["fusion"] for d in res.ort.left_out] == ["planted_bake"], res.ort
    assert "overridable initializers fed new values" in res.ort.left_out[0]["reason"]
    ref = runtime.session(str(src), "cpu").run(None, feeds)[0]
    out = runtime.session(str(tmp_path / "f.onnx"), "cpu").run(None, feeds)[0]
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
