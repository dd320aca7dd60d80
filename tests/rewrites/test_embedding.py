"""Embedding: the rule on real exports (a decoder's token embedding) and on hand-built Gathers, near-misses that must
stay unfused, and the CPU kernel's ids (negative ids from the end, out-of-range ids an error like Gather's)."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import fuse, runtime, soundness

from cases import export_case as _export

V, D = 50, 72  # rows of 288 bytes in fp32, 144 in fp16


def _gather_graph(axis=0, overridable=False, ids_type=TensorProto.INT64, ids_shape=(2, 7), dtype=np.float32):
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((V, D)).astype(dtype), "table")
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = [helper.make_tensor_value_info("ids", ids_type, list(ids_shape))]
    if overridable:
        inputs.append(helper.make_tensor_value_info("table", et, [V, D]))
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["Y"], axis=axis)], "g", inputs,
                          [helper.make_tensor_value_info("Y", et, None)], [table])
    return onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10))


def _ids(shape, low=-V, high=V, seed=1, dtype=np.int64):
    return np.random.default_rng(seed).integers(low, high, size=shape).astype(dtype)


def _fuse(tmp_path, model, **kw):
    src, dst = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(model, str(src))
    return src, dst, fuse.fuse(src, dst, force=True, **kw)


@pytest.mark.parametrize("dtype", [np.float32])
def test_lookup_fuses_and_matches_gather(tmp_path, dtype):
    src, dst, res = _fuse(tmp_path, _gather_graph(dtype=dtype))
    assert [m.op for m in res.matches] == ["Embedding"]
    soundness.check_model(onnx.load(str(dst)))
    feeds = {"ids": _ids((2, 7))}  # negative ids included: Gather counts them from the end
    ref = runtime.session(str(src), "cpu", library=False).run(None, feeds)[0]
    for library in (False, True):
        out = runtime.session(str(dst), "cpu", library=library).run(None, feeds)[0]
        np.testing.assert_array_equal(out, ref)


def test_narrow_rows_are_left_to_onnxruntime(tmp_path):
    """fp16 rows of 72 values (144 bytes) are below the threshold: refused, and --explain says why."""
    src, dst, res = _fuse(tmp_path, _gather_graph(dtype=np.float16), explain=True)
    assert not res.matches and any("bound by the launch" in r["reason"] for r in res.refusals), res.refusals


def test_out_of_range_id_is_an_error_like_gather(tmp_path):
    src, dst, res = _fuse(tmp_path, _gather_graph())
    feeds = {"ids": np.array([[0, 1, 2, 3, 4, 5, V]], np.int64).reshape(1, 7).repeat(2, 0)}
    with pytest.raises(Exception, match="out of"):
        runtime.session(str(src), "cpu", library=False).run(None, feeds)
    with pytest.raises(Exception, match=f"id {V} at position 6 is out of the table's range"):
        runtime.session(str(dst), "cpu", library=True).run(None, feeds)


@pytest.mark.parametrize("kw,reason", [
    (dict(axis=1), "axis 1"),
    (dict(overridable=True), "graph input"),
    (dict(ids_type=TensorProto.INT32), "int32"),
])
def test_near_misses_are_refused(tmp_path, kw, reason):
    model = _gather_graph(**kw)
    src, dst, res = _fuse(tmp_path, model, explain=True)
    assert not res.matches and not dst.exists()
    assert any(reason in r["reason"] for r in res.refusals), res.refusals


def test_gathers_on_run_time_data_are_not_listed(tmp_path):
    """A Gather on a computed tensor (a column of ids) is no lookup table: --explain does not list it."""
    g = helper.make_graph([helper.make_node("Relu", ["X"], ["r"]), helper.make_node("Gather", ["r", "i"], ["Y"])],
                          "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 5])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(np.array([1, 2], np.int64), "i")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    src, dst, res = _fuse(tmp_path, onnx.shape_inference.infer_shapes(m), explain=True)
    assert not res.matches and res.refusals == []


def test_llama_token_embedding_fuses(exported, tmp_path):
    src = _export(exported, "llama2", "dynamo", "fp32")
    res = fuse.fuse(src, tmp_path / "f.onnx")
    ops = collections.Counter(m.op for m in res.matches)
    assert ops["Embedding"] == 1
    node = next(n for n in onnx.load(str(tmp_path / "f.onnx")).graph.node if n.op_type == "Embedding")
    assert node.name == "onnxfuse/embedding/model.embed_tokens"
