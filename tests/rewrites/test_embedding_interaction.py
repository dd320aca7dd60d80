"""The embedding_interaction pass and the EmbeddingInteraction / EmbeddingBagInteraction ops.

  * onnxfuse's DLRM (both exporters, dot and cat, fp32/fp16, LoRA, dynamic batch; with and without fuse's stage 1)
    becomes MLPStack -> EmbeddingInteraction -> MLPStack, and the fused model matches the PyTorch module with the
    kernel library and through the function bodies;
  * the original DLRM (onnxfuse/upstream_dlrm.py, a re-implementation of facebookresearch/dlrm's DLRM_Net that
    exports to the same ONNX spelling) fuses to EmbeddingBagInteraction with multi-hot and empty bags;
  * near-misses are refused with their reason (another triangle, another order, tables that are graph inputs or
    overridable, intermediates needed elsewhere, a bag mode other than sum, an old opset), or keep the part that
    differs (a hash with another constant stays in the graph);
  * the CPU kernel and the function bodies against schema.reference on edge-case ids and bags, every dtype.
"""
from __future__ import annotations

import collections
import os
import pathlib
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import cli, fuse, kernels, runtime, schema, testing, verify, zoo

from onnxfuse import upstream_dlrm as dlrm_original  # noqa: E402

TT = {"float": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(scope="module")
def lib() -> pathlib.Path:
    return kernels.build(backends=["cpu"], quiet=True).path


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in model.graph.node)


def _run(path, feeds, library: bool):
    return runtime.session(str(path), "cpu", library=library).run(None, feeds)[0]


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(1e-6, np.abs(b).max()))


# ------------------------------------------------------------------------------------------------ onnxfuse's DLRM
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("interaction", ["dot", "cat"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_dlrm_is_two_stacks_around_one_interaction(exported, tmp_path, exporter, interaction, dtype):
    kw = {} if interaction == "dot" else {"interaction": "cat"}
    src = exported("dlrm", exporter, dtype, **kw)
    res = fuse.fuse(src, tmp_path / "f.onnx")
    fused = onnx.load(str(tmp_path / "f.onnx"))
    assert _ops(fused) == {"onnxfuse::MLPStack": 2, "onnxfuse::EmbeddingInteraction": 1}
    (node,) = [n for n in fused.graph.node if n.op_type == "EmbeddingInteraction"]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["interaction"] == interaction.encode() and attrs["hash"] == b"mod"
    assert node.overload == f"{interaction}.mod" and node.name.startswith("onnxfuse/embedding_interaction/")
    assert [(f.name, f.overload) for f in fused.functions if f.name == "EmbeddingInteraction"] == \
        [("EmbeddingInteraction", f"{interaction}.mod")]
    spec = zoo.DlrmSpec.from_preset("small", **kw)
    # one concatenated table (the 26 tables' rows), the per-feature offsets and cardinalities; the old tables are gone
    inits = {i.name: numpy_helper.to_array(i) for i in fused.graph.initializer}
    table = inits[node.input[2]]
    assert table.shape == (sum(spec.table_sizes), spec.embedding_dim)
    np.testing.assert_array_equal(inits[node.input[3]], np.cumsum((0,) + spec.table_sizes[:-1]))
    np.testing.assert_array_equal(inits[node.input[4]], spec.table_sizes)
    assert not any(n.startswith("embeddings.") for n in inits)
    assert sum(m.op == "EmbeddingInteraction" for m in res.matches) == 1
    # numerics against the PyTorch module, with the kernel library and through the function bodies
    module = zoo.build_dlrm(spec, 0, dtype).float()
    batch = zoo.criteo_batch(spec, spec.batch, 7, dtype)
    with torch.no_grad():
        ref = module(batch["dense"].float(), batch["sparse"]).numpy()
    feeds = {k: v.numpy() for k, v in batch.items()}
    tol = 1e-5 if dtype == "fp32" else 1e-2
    for library in (True, False):
        assert _rel(_run(tmp_path / "f.onnx", feeds, library), ref) < tol


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_dlrm_lora_dynamic_batch_fuses_before_and_after_ort_fusions(tmp_path, exporter):
    from onnxfuse import export
    spec = zoo.DlrmSpec.from_preset("small", interaction="cat", lora_rank=4)
    src = tmp_path / "m.onnx"
    export.export("dlrm", spec, src, exporter=exporter, dtype="fp16", dynamic=True, force=True)
    for ort_stage in (True, False):
        out = tmp_path / f"f{int(ort_stage)}.onnx"
        fuse.fuse(src, out, ort=ort_stage)
        counts = _ops(onnx.load(str(out)))
        assert counts["onnxfuse::EmbeddingInteraction"] == 1 and counts["onnxfuse::LoRALinearRelu"] == 6, counts
        for batch_size in (1, 19):  # dynamic batch: any size
            batch = zoo.criteo_batch(spec, batch_size, 3, "fp16")
            module = zoo.build_dlrm(spec, 0, "fp16").float()
            with torch.no_grad():
                ref = module(batch["dense"].float(), batch["sparse"]).numpy()
            got = _run(out, {k: v.numpy() for k, v in batch.items()}, True)
            assert got.shape == (batch_size, 1) and _rel(got, ref) < 1e-2


def test_criteo_kaggle_preset_cat_lora_dynamic_verifies_on_the_cpu(tmp_path):
    """The acceptance configuration: the criteo-kaggle preset (26 tables capped at 262144 rows), --interaction cat,
    --lora-rank 4, dynamic batch, fused and verified against the module rebuilt from its recipe."""
    from onnxfuse import export
    spec = zoo.DlrmSpec.from_preset("criteo-kaggle", interaction="cat", lora_rank=4)
    export.export("dlrm", spec, tmp_path / "m.onnx", dtype="fp32", dynamic=True, force=True)
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx")
    assert [m.op for m in res.matches].count("EmbeddingInteraction") == 1
    result = verify.verify(tmp_path / "f.onnx", provider="cpu")
    assert result.passed and result.library, result.to_dict()


# ------------------------------------------------------------------------------------------------ hand-made graphs
def _interaction_graph(*, n_feat=3, d=4, batch=5, sizes=(3, 7, 2), hash_add=1, fmod=0, card=None, pairs=None,
                       tables_as_inputs=False, overridable=False, emb_output=False, widths=None, symbolic=False,
                       gram_other=False, opset=18) -> onnx.ModelProto:
    """The dynamo spelling of onnxfuse's DLRM interaction with knobs for near-misses: Add/Mod hash, Gather per
    column, Gather per table, Unsqueeze + Concat stack, MatMul(T, Transpose(T)), Transpose, GatherND, Transpose,
    Concat(X, pairs)."""
    rng = np.random.default_rng(0)
    mk = helper.make_node
    n = n_feat + 1
    b = "batch" if symbolic else batch
    widths = widths or [d] * n_feat
    nodes, inits, inputs = [], [], [helper.make_tensor_value_info("X", TensorProto.FLOAT, [b, d]),
                                    helper.make_tensor_value_info("sparse", TensorProto.INT64, [b, n_feat])]
    c = lambda name, arr: inits.append(numpy_helper.from_array(np.asarray(arr), name))  # noqa: E731
    c("add_c", np.array(hash_add, np.int64))
    c("card", np.asarray(card if card is not None else sizes, np.int64))
    nodes += [mk("Add", ["sparse", "add_c"], ["added"]), mk("Mod", ["added", "card"], ["hashed"], fmod=fmod)]
    c("axis1", np.array([1], np.int64))
    stack = [("X", "xu")]
    for f in range(n_feat):
        w = rng.standard_normal((sizes[f], widths[f])).astype(np.float32)
        if tables_as_inputs or overridable:
            inputs.append(helper.make_tensor_value_info(f"W{f}", TensorProto.FLOAT, list(w.shape)))
        if not tables_as_inputs:
            c(f"W{f}", w)
        c(f"col{f}", np.array(f, np.int64))
        nodes += [mk("Gather", ["hashed", f"col{f}"], [f"idx{f}"], axis=1),
                  mk("Gather", [f"W{f}", f"idx{f}"], [f"e{f}"])]
        stack.append((f"e{f}", f"eu{f}"))
    nodes += [mk("Unsqueeze", [v, "axis1"], [u]) for v, u in stack]
    nodes.append(mk("Concat", [u for _, u in stack], ["T"], axis=1))
    nodes.append(mk("Transpose", ["T2" if gram_other else "T"], ["Tt"], perm=[0, 2, 1]))
    if gram_other:
        nodes.append(mk("Neg", ["T"], ["T2"]))
    nodes += [mk("MatMul", ["T", "Tt"], ["Z"]), mk("Transpose", ["Z"], ["Zt"], perm=[1, 2, 0])]
    if pairs is None:
        li, lj = np.tril_indices(n, -1)
        pairs = np.stack([li, lj], 1)
    c("pairs", np.asarray(pairs, np.int64))
    nodes += [mk("GatherND", ["Zt", "pairs"], ["sel"]), mk("Transpose", ["sel"], ["tri"], perm=[1, 0]),
              mk("Concat", ["X", "tri"], ["Y"], axis=1)]
    outputs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [b, d + len(pairs)])]
    if emb_output:
        outputs.append(helper.make_tensor_value_info("e1", TensorProto.FLOAT, [b, d]))
    g = helper.make_graph(nodes, "interaction", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _feeds(batch=5, n_feat=3, d=4, extra=None):
    rng = np.random.default_rng(1)
    feeds = {"X": rng.standard_normal((batch, d)).astype(np.float32),
             "sparse": rng.integers(0, 2 ** 40, (batch, n_feat)).astype(np.int64)}
    feeds.update(extra or {})
    return feeds


def _fuse_and_compare(tmp_path, model, feeds=None, explain=True, keep_opset=False):
    onnx.save(model, str(tmp_path / "m.onnx"))
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", explain=explain, write_unchanged=True,
                    keep_opset=keep_opset)
    fused = onnx.load(str(tmp_path / "f.onnx"))
    feeds = feeds or _feeds()
    ref = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
    for library in (True, False):
        got = runtime.session(str(tmp_path / "f.onnx"), "cpu", library=library).run(None, feeds)
        for a, b in zip(got, ref):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return res, fused


def _refusal(res, text: str) -> dict:
    hits = [r for r in res.refusals if r["rule"].startswith("embedding_interaction") and text in r["reason"]]
    assert hits, res.refusals
    return hits[0]


@pytest.mark.parametrize("symbolic", [False, True])
def test_hand_made_interaction_fuses_and_keeps_the_dense_vector_first(tmp_path, symbolic):
    res, fused = _fuse_and_compare(tmp_path, _interaction_graph(symbolic=symbolic))
    assert _ops(fused) == {"onnxfuse::EmbeddingInteraction": 1}
    node = fused.graph.node[0]
    assert list(node.input[:2]) == ["X", "sparse"] and node.overload == "dot.mod"
    # 19 less the Transpose FusedMatMul took
    assert [m.op for m in res.matches] == ["EmbeddingInteraction"] and len(res.matches[0].replaced) == 18


@pytest.mark.parametrize("pairs,why", [
    (np.stack(np.tril_indices(4, 0), 1), "not the strict lower triangle"),            # arch_interaction_itself
    ([(i, j) for j in range(4) for i in range(j + 1, 4)], "not the strict lower triangle"),  # j-major order
    (np.stack(np.tril_indices(4, -1), 1)[:-1], "not the strict lower triangle"),      # a pair missing
])
def test_other_pair_selections_are_refused(tmp_path, pairs, why):
    res, fused = _fuse_and_compare(tmp_path, _interaction_graph(pairs=pairs))
    assert "onnxfuse::EmbeddingInteraction" not in _ops(fused)
    _refusal(res, why)


@pytest.mark.parametrize("variant,why", [
    (dict(tables_as_inputs=True), "graph input"),
    (dict(overridable=True), "also a graph input"),
    (dict(emb_output=True), "also used by a graph output"),
    (dict(widths=[4, 3, 4]), "wide"),
    (dict(opset=14), "opset 14 is below 15"),
])
def test_near_misses_are_refused_with_their_reason(tmp_path, variant, why):
    extra = ({f"W{f}": np.random.default_rng(f).standard_normal((s, 4)).astype(np.float32)
              for f, s in enumerate((3, 7, 2))}
             if variant.get("tables_as_inputs") or variant.get("overridable") else None)
    feeds = _feeds(extra=extra)
    if variant.get("widths"):  # mixed widths cannot even be stacked: a cat of them is what a model could do
        model = _cat_graph_mixed_widths()
        feeds["sparse"] = np.random.default_rng(4).integers(0, 5, (5, 3)).astype(np.int64)
    else:
        model = _interaction_graph(**variant)
    res, fused = _fuse_and_compare(tmp_path, model, feeds, keep_opset="opset" in variant)
    assert "onnxfuse::EmbeddingInteraction" not in _ops(fused)
    _refusal(res, why)


def _cat_graph_mixed_widths() -> onnx.ModelProto:
    """Concat(X, e0, e1) where e1's table is 3 wide: a concatenation the op (one width) cannot express."""
    rng = np.random.default_rng(0)
    mk = helper.make_node
    inits = [numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "W0"),
             numpy_helper.from_array(rng.standard_normal((6, 3)).astype(np.float32), "W1"),
             numpy_helper.from_array(np.array(0, np.int64), "c0"), numpy_helper.from_array(np.array(1, np.int64), "c1")]
    nodes = [mk("Gather", ["sparse", "c0"], ["i0"], axis=1), mk("Gather", ["sparse", "c1"], ["i1"], axis=1),
             mk("Gather", ["W0", "i0"], ["e0"]), mk("Gather", ["W1", "i1"], ["e1"]),
             mk("Concat", ["X", "e0", "e1"], ["Y"], axis=1)]
    g = helper.make_graph(nodes, "cat", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [5, 4]),
                                         helper.make_tensor_value_info("sparse", TensorProto.INT64, [5, 3])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [5, 11])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_gram_of_two_different_tensors_is_no_candidate(tmp_path):
    res, fused = _fuse_and_compare(tmp_path, _interaction_graph(gram_other=True))
    assert "onnxfuse::EmbeddingInteraction" not in _ops(fused)


@pytest.mark.parametrize("variant", [dict(hash_add=2), dict(fmod=1), dict(card=(3, 8, 2))])
def test_a_hash_other_than_id_plus_one_mod_rows_stays_in_the_graph(tmp_path, variant):
    """(id + 2) % card, C-style fmod, or a modulus past a table's rows is not onnxfuse's hash: the op does not absorb
    it (hash=none) and looks up the ids the unfused Add/Mod compute, exactly as Gather does."""
    feeds = _feeds(extra={"sparse": np.random.default_rng(2).integers(-50, 50, (5, 3)).astype(np.int64)}) \
        if variant.get("fmod") else _feeds()
    model = _interaction_graph(**variant)
    if variant.get("card"):  # the unfused graph fails on ids past a table; feed ids that stay inside
        feeds["sparse"] = np.random.default_rng(3).integers(0, 2, (5, 3)).astype(np.int64) * 0
    res, fused = _fuse_and_compare(tmp_path, model, feeds)
    counts = _ops(fused)
    assert counts["onnxfuse::EmbeddingInteraction"] == 1 and counts["Mod"] == 1 and counts["Add"] == 1, counts
    node = next(n for n in fused.graph.node if n.op_type == "EmbeddingInteraction")
    assert node.input[1] == "hashed" and node.overload == "dot.none"


def test_cat_interaction_of_separate_vectors(tmp_path):
    """The original DLRM's cat spelling on one-id lookups: Concat(X, e_0, ..., e_F) straight into the top MLP."""
    rng = np.random.default_rng(0)
    mk = helper.make_node
    inits, nodes = [], []
    for f, s in enumerate((3, 9)):
        inits += [numpy_helper.from_array(rng.standard_normal((s, 4)).astype(np.float32), f"W{f}"),
                  numpy_helper.from_array(np.array(f, np.int64), f"c{f}")]
        nodes += [mk("Gather", ["sparse", f"c{f}"], [f"i{f}"], axis=1), mk("Gather", [f"W{f}", f"i{f}"], [f"e{f}"])]
    nodes.append(mk("Concat", ["X", "e0", "e1"], ["Y"], axis=1))
    g = helper.make_graph(nodes, "cat", [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["b", 4]),
                                         helper.make_tensor_value_info("sparse", TensorProto.INT64, ["b", 2])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", 12])], inits)
    feeds = {"X": rng.standard_normal((6, 4)).astype(np.float32),
             "sparse": rng.integers(-3, 3, (6, 2)).astype(np.int64)}  # negative ids: ONNX Gather counts back
    res, fused = _fuse_and_compare(tmp_path, helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)],
                                                               ir_version=10), feeds)
    (node,) = fused.graph.node
    assert node.op_type == "EmbeddingInteraction" and node.overload == "cat.none"


def test_explain_names_the_refused_triangle(tmp_path, capsys):
    onnx.save(_interaction_graph(pairs=np.stack(np.tril_indices(4, 0), 1)), str(tmp_path / "m.onnx"))
    assert cli.main(["fuse", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "f.onnx"), "--explain",
                     "--write-unchanged"]) == 0
    out = capsys.readouterr().out
    assert "embedding_interaction/dot" in out and "strict lower triangle" in out


# ------------------------------------------------------------------------------------------------ original DLRM
LN_EMB = [5, 7, 3, 11]


def _original(tmp_path, interaction="dot", itself=False, mode="sum", bags=(2, 0, 1, 3), batch_size=6):
    d = 4
    top = dlrm_original.top_width(d, len(LN_EMB), interaction, itself)
    module = dlrm_original.OriginalDLRM(d, LN_EMB, [13, 8, d], [top, 8, 1], interaction, itself, mode).eval()
    batch = dlrm_original.make_batch(LN_EMB, batch_size, list(bags))
    path = tmp_path / f"orig-{interaction}-{itself}-{mode}.onnx"
    dlrm_original.export_torchscript(module, batch, path)
    return module, batch, path


def _original_feeds(batch):
    dense, offsets, indices = batch
    return {"dense_x": dense.numpy(), "offsets": offsets.numpy(), "indices": indices.numpy()}


@pytest.mark.parametrize("interaction", ["dot", "cat"])
def test_original_dlrm_fuses_to_one_bag_interaction(tmp_path, interaction):
    module, batch, src = _original(tmp_path, interaction)
    res = fuse.fuse(src, tmp_path / "f.onnx")
    fused = onnx.load(str(tmp_path / "f.onnx"))
    assert _ops(fused) == {"onnxfuse::MLPStack": 2, "onnxfuse::EmbeddingBagInteraction": 1}
    node = next(n for n in fused.graph.node if n.op_type == "EmbeddingBagInteraction")
    assert list(node.input[:3]) == [node.input[0], "indices", "offsets"] and node.overload == interaction
    assert not any(n.op_type == "Loop" for n in fused.graph.node)
    # other batches (dynamic batch and bag lengths, empty bags included) through the kernel and the function body
    for bags, batch_size in (((2, 0, 1, 3), 6), ((1,), 9), ((0, 4), 5)):
        other = dlrm_original.make_batch(LN_EMB, batch_size, list(bags), seed=batch_size)
        with torch.no_grad():
            ref = module(*other).numpy()
        for library in (True, False):
            assert _rel(_run(tmp_path / "f.onnx", _original_feeds(other), library), ref) < 1e-5
    assert [m.op for m in res.matches].count("EmbeddingBagInteraction") == 1


def test_original_dlrm_self_interaction_and_mean_bags_are_refused(tmp_path):
    module, batch, src = _original(tmp_path, "dot", itself=True)
    res = fuse.fuse(src, tmp_path / "f1.onnx", explain=True)
    fused = onnx.load(str(tmp_path / "f1.onnx"))
    assert _ops(fused)["onnxfuse::MLPStack"] == 2
    # the dot with the diagonal is refused; the bags and their concatenation (a cat interaction the Reshape, the
    # product and the selection still read) do fuse
    bags = [n for n in fused.graph.node if n.op_type == "EmbeddingBagInteraction"]
    assert [n.overload for n in bags] == ["cat"] and _ops(fused)["com.microsoft::FusedMatMul"] == 1
    _refusal(res, "strict lower triangle")
    with torch.no_grad():
        ref = module(*batch).numpy()
    assert _rel(_run(tmp_path / "f1.onnx", _original_feeds(batch), True), ref) < 1e-5
    for mode in ("mean", "max"):
        module, batch, src = _original(tmp_path, "cat", mode=mode)
        res = fuse.fuse(src, tmp_path / f"f-{mode}.onnx", explain=True)
        assert "onnxfuse::EmbeddingBagInteraction" not in _ops(onnx.load(str(tmp_path / f"f-{mode}.onnx")))
        _refusal(res, f"mode='{mode}'")


def test_original_dlrm_at_opset_11_is_upgraded_then_fused(tmp_path):
    """Issue 33: the repository's own export (TorchScript, opset 11) is converted to opset 18 by fuse, checked against
    the original in onnxruntime, and fused (the bag interaction and the MLPs); --keep-opset keeps it at 11, where the
    embedding ops' bodies cannot live, and --explain says so."""
    d = 4
    module = dlrm_original.OriginalDLRM(d, LN_EMB, [13, 8, d], [dlrm_original.top_width(d, 4, "dot"), 8, 1]).eval()
    batch = dlrm_original.make_batch(LN_EMB, 6, [1, 2])
    dlrm_original.export_torchscript(module, batch, tmp_path / "m11.onnx", opset=11)  # the repository's own call
    res = fuse.fuse(tmp_path / "m11.onnx", tmp_path / "f11.onnx", explain=True, keep_opset=True)
    assert not any(m.op.startswith("Embedding") for m in res.matches) and res.upgrade is None
    _refusal(res, "opset 11 is below 15")
    res = fuse.fuse(tmp_path / "m11.onnx", tmp_path / "f18.onnx")
    assert (res.upgrade.source, res.upgrade.target) == (11, 18), res.upgrade
    assert res.report()["opset_upgrade"]["target"] == 18
    assert [m.op for m in res.matches].count("EmbeddingBagInteraction") == 1, res.matches
    fused = onnx.load(str(tmp_path / "f18.onnx"))
    assert [o.version for o in fused.opset_import if o.domain in ("", "ai.onnx")] == [18]
    with torch.no_grad():
        ref = module(*batch).numpy()
    assert _rel(_run(tmp_path / "f18.onnx", _original_feeds(batch), True), ref) < 1e-5


def _list_feeds(dense, lS_o, lS_i) -> dict:
    n = len(lS_o)
    return dict(zip(dlrm_original.list_input_names(n), [t.numpy() for t in (dense, *lS_o, *lS_i)]))


@pytest.mark.parametrize("interaction,opset,dynamic", [("dot", 11, True), ("cat", 11, True), ("dot", 18, True),
                                                       ("dot", 11, False), ("cat", 18, False)])
def test_upstream_per_table_lists_fuse_whole(tmp_path, interaction, opset, dynamic):
    """Issue 33: DLRM_Net as its users call it, lS_o and lS_i lists with one tensor per table (tables whose lookups
    differ in length), exported as the repository does (one offsets_i / indices_i input pair per table; opset 11,
    which fuse upgrades, or 18; dynamic or static shapes): MLPStack x2 and one EmbeddingBagInteraction, no Loop left,
    within 1e-5 of PyTorch on batches with empty and long bags, through the kernel and through the function body."""
    d, n = 4, len(LN_EMB)
    top = dlrm_original.top_width(d, n, interaction)
    module = dlrm_original.OriginalDLRM(d, LN_EMB, [13, 8, d], [top, 8, 1], interaction).eval()
    batch = dlrm_original.make_lists(LN_EMB, 6, [1, 2, 0])
    assert len({len(i) for i in batch[2]}) == n  # every table's indices have their own length
    src = tmp_path / "upstream.onnx"
    dlrm_original.export_torchscript(module, batch, src, opset=opset, dynamic=dynamic)
    res = fuse.fuse(src, tmp_path / "f.onnx", explain=True)
    assert (res.upgrade is not None) == (opset < 15)
    fused = onnx.load(str(tmp_path / "f.onnx"))
    ops = _ops(fused)
    assert ops["onnxfuse::MLPStack"] == 2 and ops["onnxfuse::EmbeddingBagInteraction"] == 1, (ops, res.refusals)
    assert "Loop" not in ops
    node = next(n for n in fused.graph.node if n.op_type == "EmbeddingBagInteraction")
    assert node.overload == interaction
    others = [batch] + ([dlrm_original.make_lists(LN_EMB, b, list(bags), seed=b)
                         for bags, b in (((0, 4), 5), ((1,), 9), ((0,), 3))] if dynamic else [])
    for other in others:
        with torch.no_grad():
            ref = module(*other).numpy()
        for library in (True, False):
            assert _rel(_run(tmp_path / "f.onnx", _list_feeds(*other), library), ref) < 1e-5, (library, other[0].shape)


def test_upstream_stacked_offsets_with_per_table_indices_fuse(tmp_path):
    """lS_o one [F, B] tensor (the repository's loaders) with lS_i a list of per-table tensors: one op, the offsets
    matrix read as it is."""
    d, n = 4, len(LN_EMB)
    module = dlrm_original.OriginalDLRM(d, LN_EMB, [13, 8, d], [dlrm_original.top_width(d, n, "dot"), 8, 1]).eval()
    dense, offsets, indices = dlrm_original.make_batch(LN_EMB, 6, [1, 2, 0])
    lS_i = [indices[f][: int(offsets[f, -1]) + 1 + f] for f in range(n)]  # the last bag holds 1 + f ids
    names = ["dense_x", "offsets", *[f"indices_{f}" for f in range(n)]]
    torch.onnx.export(module, (dense, offsets, lS_i), str(tmp_path / "m.onnx"), opset_version=18,
                      input_names=names, output_names=["pred"], dynamo=False,
                      dynamic_axes={"dense_x": {0: "B"}, "offsets": {1: "B"}, **{k: {0: k} for k in names[2:]}})
    fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx")
    ops = _ops(onnx.load(str(tmp_path / "f.onnx")))
    assert ops["onnxfuse::EmbeddingBagInteraction"] == 1 and "Loop" not in ops, ops
    feeds = dict(zip(names, [t.numpy() for t in (dense, offsets, *lS_i)]))
    with torch.no_grad():
        ref = module(dense, offsets, lS_i).numpy()
    for library in (True, False):
        assert _rel(_run(tmp_path / "f.onnx", feeds, library), ref) < 1e-5


class _WeightedBags(dlrm_original.OriginalDLRM):
    """DLRM_Net with per_sample_weights on its bags (one weight per index), per-table lists."""

    def apply_emb(self, lS_o, lS_i):
        return [bag(i, o, per_sample_weights=torch.linspace(0.5, 1.5, len(i)))
                for bag, o, i in zip(self.emb_l, lS_o, lS_i)]


def test_upstream_per_sample_weights_are_refused_with_the_reason(tmp_path):
    """EmbeddingBag(per_sample_weights=...) is not what the op computes: the bags stay onnxruntime's, --explain says
    why, and the model still runs as it did (the MLPs fuse)."""
    d, n = 4, len(LN_EMB)
    module = _WeightedBags(d, LN_EMB, [13, 8, d], [dlrm_original.top_width(d, n, "dot"), 8, 1]).eval()
    batch = dlrm_original.make_lists(LN_EMB, 6, [1, 2, 0])
    dlrm_original.export_torchscript(module, batch, tmp_path / "w.onnx", opset=18)
    res = fuse.fuse(tmp_path / "w.onnx", tmp_path / "f.onnx", explain=True)
    ops = _ops(onnx.load(str(tmp_path / "f.onnx")))
    assert "onnxfuse::EmbeddingBagInteraction" not in ops and ops["onnxfuse::MLPStack"] == 2, ops
    _refusal(res, "per-sample weights are not fused")
    with torch.no_grad():
        ref = module(*batch).numpy()
    assert _rel(_run(tmp_path / "f.onnx", _list_feeds(*batch), True), ref) < 1e-5


def test_upstream_per_table_verify_takes_the_factorys_list_inputs(tmp_path, capsys):
    """verify --module with a user's factory that builds DLRM_Net and returns list inputs (K_0.. or in order)."""
    d = 4
    module = dlrm_original.OriginalDLRM(d, LN_EMB, [13, 8, d], [dlrm_original.top_width(d, 4, "dot"), 8, 1]).eval()
    dense, lS_o, lS_i = dlrm_original.make_lists(LN_EMB, 6, [1, 2, 0])
    src = tmp_path / "upstream11.onnx"
    dlrm_original.export_torchscript(module, (dense, lS_o, lS_i), src, opset=11)
    res = fuse.fuse(src, tmp_path / "f.onnx")
    assert [m.op for m in res.matches].count("EmbeddingBagInteraction") == 1, res.matches
    factory = tmp_path / "make_upstream.py"
    factory.write_text(
        "from onnxfuse import upstream_dlrm as m\n"
        "def make():\n"
        f"    module = m.OriginalDLRM({d}, {LN_EMB}, [13, 8, {d}], [m.top_width({d}, 4, 'dot'), 8, 1]).eval()\n"
        f"    dense, lS_o, lS_i = m.make_lists({LN_EMB}, 6, [1, 2, 0])\n"
        "    return module, {'dense_x': dense, 'offsets': lS_o, 'indices': lS_i}\n")
    assert cli.main(["verify", str(tmp_path / "f.onnx"), "--module", f"{factory}:make"]) == 0, capsys.readouterr()
    result = verify.verify(tmp_path / "f.onnx", module=module, inputs={"dense_x": dense, "o": lS_o, "i": lS_i})
    assert result.passed  # names that are not the model's: matched in order


@pytest.mark.parametrize("layout", ["upstream", "upstream-tables"])
def test_export_dlrm_layout_upstream_fuses_and_verifies_from_its_recipe(tmp_path, layout, capsys):
    """`onnxfuse export dlrm --layout upstream[-tables]`: DLRM_Net as its --save-onnx writes it (TorchScript, opset
    11, the repository's dynamic axes) with a recipe, so fuse (which upgrades the opset) and verify need no module."""
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    assert cli.main(["export", "dlrm", "--preset", "small", "--batch", "8", "--layout", layout, "-o", str(src),
                     "-q"]) == 0
    model = onnx.load(str(src))
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [11]
    names = [i.name for i in model.graph.input]
    assert names[:3] == (["dense_x", "offsets", "indices"] if layout == "upstream" else
                         ["dense_x", "offsets_0", "offsets_1"])
    assert cli.main(["fuse", str(src), "-o", str(out), "-q"]) == 0
    ops = _ops(onnx.load(str(out)))
    assert ops["onnxfuse::MLPStack"] == 2 and ops["onnxfuse::EmbeddingBagInteraction"] == 1 and "Loop" not in ops
    assert cli.main(["verify", str(out), "-q"]) == 0
    for bad in (["--lora-rank", "2"], ["--exporter", "dynamo"]):
        assert cli.main(["export", "dlrm", "--layout", layout, "-o", str(tmp_path / "x.onnx"), *bad]) == 2
    assert not (tmp_path / "x.onnx").exists()


# ------------------------------------------------------------------------------------------------ kernels
def _model(op, dtype, shapes, attrs) -> bytes:
    """One node between Casts (float32 graph inputs and output; int64 inputs as they are), with its function body
    for the library-less runs."""
    return testing.op_model(op, dtype, shapes, attrs, cast=True, functions=True).SerializeToString()


def _case(op, dtype, batch, d, sizes, interaction, hash_="none", bag_len=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    f = len(sizes)
    card = torch.tensor(sizes, dtype=torch.int64)
    toff = torch.cumsum(card, 0) - card
    x = torch.randn(batch, d, generator=g).to(TT[dtype])
    table = torch.randn(int(card.sum()), d, generator=g).to(TT[dtype])
    attrs = {"interaction": interaction}
    if op == "EmbeddingInteraction":
        ids = (torch.rand(batch, f, generator=g) * 3 * card - card).long()
        if ids.numel():
            ids.view(-1)[0] = 2 ** 63 - 1
            ids.view(-1)[-1] = -(2 ** 63)
        attrs["hash"] = hash_
        inputs = {"X": x, "ids": ids}
    elif hash_ == "flat":  # per-table indices of their own lengths, concatenated: [1, N] and [F, B + 1] offsets
        lengths = [int(v) for v in torch.randint(0, 2 * batch * bag_len + 1, (f,), generator=g)]
        parts = [(torch.rand(n, generator=g) * 3 * c - c).long() for n, c in zip(lengths, card.tolist())]
        base = torch.tensor([0, *lengths]).cumsum(0)
        offs = [torch.sort(torch.randint(-1, n + 2, (batch,), generator=g)).values.clamp(0, n) for n in lengths]
        offsets = torch.stack([torch.cat([o + base[i], base[i + 1:i + 2]]) for i, o in enumerate(offs)])
        inputs = {"X": x, "indices": torch.cat(parts)[None], "offsets": offsets}
    else:
        n_idx = batch * bag_len
        indices = (torch.rand(f, n_idx, generator=g) * 3 * card[:, None] - card[:, None]).long()
        offsets = torch.sort(torch.randint(-2, n_idx + 3, (f, batch), generator=g), dim=1).values
        inputs = {"X": x, "indices": indices, "offsets": offsets}
    inputs.update(table=table, table_offsets=toff, cardinality=card)
    ref = schema.reference(op, list(inputs.values()), attrs)
    feeds = {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in inputs.items()}
    return _model(op, dtype, {k: list(v.shape) for k, v in inputs.items()}, attrs), feeds, ref


CASES = [  # (batch, d, table rows per feature): DLRM's 26 features of 16, a single feature, odd widths, 40 features
    (37, 16, [(7 * f + 3) % 50 + 1 for f in range(26)]), (1, 3, [1]), (9, 20, [5] * 40), (4, 1, [2, 9]),
]


@pytest.mark.parametrize("dtype", schema.TYPES)
@pytest.mark.parametrize("op,hash_", [("EmbeddingInteraction", "none"), ("EmbeddingInteraction", "mod"),
                                      ("EmbeddingBagInteraction", "none"), ("EmbeddingBagInteraction", "flat")])
@pytest.mark.parametrize("interaction", ["dot", "cat"])
def test_cpu_kernel_and_function_body_match_the_reference(lib, op, hash_, interaction, dtype):
    so = kernels.session_options(path=lib)
    for i, (batch, d, sizes) in enumerate(CASES):
        model, feeds, ref = _case(op, dtype, batch, d, sizes, interaction, hash_, seed=i)
        ref = ref.float().numpy()
        got = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        # the kernel rounds where the reference does; only the fp32 sums' order differs (one T ulp at most)
        testing.assert_close(got, ref, dtype, f"batch {batch} d {d} features {len(sizes)}", kind="embedding")
        if dtype == "float":  # the function body (ONNX ops in T) where numpy can carry T
            body = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
            tol = 1e-4 if hash_ == "flat" else 1e-5  # longer bags: the fp32 membership MatMul sums in its own order
            np.testing.assert_allclose(body, ref, rtol=tol, atol=tol)


def test_cpu_kernel_shape_errors_name_the_op(lib):
    _, feeds, _ = _case("EmbeddingInteraction", "float", 5, 4, [3, 4], "dot")
    feeds["ids"] = feeds["ids"][:, :1]  # one id column for two features
    model = _model("EmbeddingInteraction", "float", {k: list(v.shape) for k, v in feeds.items()},
                   {"interaction": "dot", "hash": "none"})
    sess = ort.InferenceSession(model, kernels.session_options(path=lib), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="EmbeddingInteraction: ids must be"):
        sess.run(None, feeds)


def test_empty_batch_and_empty_bags(lib):
    so = kernels.session_options(path=lib)
    for op in schema.EMBEDDING_OPS:
        model, feeds, ref = _case(op, "float", 0, 4, [3, 5], "dot", bag_len=0)
        got = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        assert got.shape == (0, 4 + 3)
    model, feeds, ref = _case("EmbeddingBagInteraction", "float", 6, 4, [3, 5], "dot", bag_len=0)
    got = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-6, atol=1e-6)  # every bag empty: zero vectors


_ISA_SCRIPT = r"""
import sys, pathlib
sys.path[:0] = [sys.argv[2], str(pathlib.Path(sys.argv[2]) / "tests" / "rewrites")]
import numpy as np, onnxruntime as ort
import test_embedding_interaction as t
from onnxfuse import kernels
so = kernels.session_options(path=pathlib.Path(sys.argv[1]))
for batch, d, sizes in t.CASES:
    model, feeds, ref = t._case("EmbeddingInteraction", "float", batch, d, sizes, "dot", "mod")
    got = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-5)
print("ok")
"""


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_other_instruction_sets(lib, isa):
    root = pathlib.Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-c", _ISA_SCRIPT, str(lib), str(root)],
                       env={**os.environ, "ONNXFUSE_CPU_ISA": isa}, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr
