"""RotaryEmbedding: the rule on real Llama exports and on hand-built graphs (the spelling, its head-transposed form,
and near-misses that must stay unfused), numerics against onnxruntime running the original graph."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from onnxfuse import fuse, runtime, soundness, verify

from cases import COMBOS, export_case as _export

mk = helper.make_node
I64_MAX = 2**63 - 1


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _rotary_graph(x_shape, cos_shape, *, transposed=False, halves=None, steps=(1, 1), axes=(-1, -1),
                  concat_axis=-1, neg_first=False, swap_concat=False, perm=(0, 2, 1, 3), perm_out=None,
                  dtype=np.float32):
    """q -> [Transpose] -> rotary(rotate_half) -> [Transpose]; the knobs spell near-misses."""
    et = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    d = x_shape[-1] if not transposed else x_shape[-1]
    h = d // 2
    (s0, e0), (s1, e1) = halves or ((0, h), (h, I64_MAX))
    inits = [_i64("s0", [s0]), _i64("e0", [e0]), _i64("s1", [s1]), _i64("e1", [e1]), _i64("a0", [axes[0]]),
             _i64("a1", [axes[1]]), _i64("st0", [steps[0]]), _i64("st1", [steps[1]])]
    nodes = []
    t = "X"
    if transposed:
        nodes.append(mk("Transpose", ["X"], ["t"], perm=list(perm)))
        t = "t"
    nodes += [mk("Slice", [t, "s0", "e0", "a0", "st0"], ["first"]),
              mk("Slice", [t, "s1", "e1", "a1", "st1"], ["second"])]
    if neg_first:
        nodes += [mk("Neg", ["first"], ["neg"]), mk("Concat", ["neg", "second"], ["rot"], axis=concat_axis)]
    else:
        nodes.append(mk("Neg", ["second"], ["neg"]))
        nodes.append(mk("Concat", ["first", "neg"] if swap_concat else ["neg", "first"], ["rot"], axis=concat_axis))
    nodes += [mk("Mul", [t, "cos"], ["xc"]), mk("Mul", ["rot", "sin"], ["rs"]), mk("Add", ["xc", "rs"], ["y"])]
    if transposed:
        nodes.append(mk("Transpose", ["y"], ["Y"], perm=list(perm_out or perm)))
    else:
        nodes.append(mk("Identity", ["y"], ["Y"]))
    g = helper.make_graph(nodes, "rotary", [helper.make_tensor_value_info("X", et, list(x_shape)),
                                            helper.make_tensor_value_info("cos", et, list(cos_shape)),
                                            helper.make_tensor_value_info("sin", et, list(cos_shape))],
                          [helper.make_tensor_value_info("Y", et, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return onnx.shape_inference.infer_shapes(m)


def _feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        dt = helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        out[i.name] = rng.standard_normal(shape).astype(dt)
    return out


def _fuse_and_compare(tmp_path, model, name="m", **kw):
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}.fused.onnx"
    onnx.save(model, str(src))
    res = fuse.fuse(src, dst, force=True, **kw)
    if dst.exists():
        soundness.check_model(onnx.load(str(dst)))
        feeds = _feeds(model)
        ref = runtime.session(str(src), "cpu", library=False).run(None, feeds)[0]
        for library in (False, True):
            out = runtime.session(str(dst), "cpu", library=library).run(None, feeds)[0]
            assert out.shape == ref.shape and out.dtype == ref.dtype
            tol = 1e-5 if ref.dtype == np.float32 else 2e-3
            np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * max(1.0, float(np.abs(ref).max())))
    return res, dst


def _ops(path):
    return collections.Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


# ------------------------------------------------------------------------------------------------ real exports

@pytest.mark.parametrize("exporter,dtype", COMBOS)
def test_llama_rotary_fuses_with_its_transposes_and_verifies(exported, tmp_path, exporter, dtype):
    src = _export(exported, "llama2", exporter, dtype)
    fuse.fuse(src, tmp_path / "f.onnx")
    ops = _ops(tmp_path / "f.onnx")
    assert ops["RotaryEmbedding"] == 4  # q and k of 2 layers
    assert ops["Neg"] == 0 and ops["Slice"] == 0, ops
    # the head transposes around q/k went with the rotary: no Transpose feeds X or reads Y of a RotaryEmbedding
    g = onnx.load(str(tmp_path / "f.onnx"), load_external_data=False).graph
    producer = {o: n for n in g.node for o in n.output}
    for n in g.node:
        if n.op_type == "RotaryEmbedding":
            assert producer[n.input[0]].op_type != "Transpose"
            assert not [m for m in g.node if n.output[0] in m.input and m.op_type == "Transpose"]
    if dtype == "fp32":
        assert verify.verify(tmp_path / "f.onnx").passed


# ------------------------------------------------------------------------------------------------ hand-built graphs

@pytest.mark.parametrize("x_shape,cos_shape", [((2, 4, 6, 8), (2, 1, 6, 8)), ((2, 4, 6, 8), (1, 1, 6, 8)),
                                               ((3, 5, 16), (1, 5, 16)), ((7, 12), (7, 12)), ((2, 4, 6, 8), (6, 8))])
def test_plain_spelling_fuses(tmp_path, x_shape, cos_shape):
    res, dst = _fuse_and_compare(tmp_path, _rotary_graph(x_shape, cos_shape))
    assert [m.op for m in res.matches] == ["RotaryEmbedding"]


def test_transposed_spelling_takes_the_transposes(tmp_path):
    res, dst = _fuse_and_compare(tmp_path, _rotary_graph((2, 6, 4, 8), (2, 1, 6, 8), transposed=True))
    assert [m.op for m in res.matches] == ["RotaryEmbedding"]
    ops = _ops(dst)
    assert ops["RotaryEmbedding"] == 1 and ops["Transpose"] == 2  # only cos's and sin's (tiny), none on X


def test_fp16(tmp_path):
    res, dst = _fuse_and_compare(tmp_path, _rotary_graph((2, 6, 4, 8), (2, 1, 6, 8), transposed=True,
                                                         dtype=np.float16))
    assert [m.op for m in res.matches] == ["RotaryEmbedding"]


@pytest.mark.parametrize("kind,kw,reason", [
    ("interleaved", dict(halves=((0, 8), (1, I64_MAX)), steps=(2, 2)), "rotate_half"),
    ("overlapping halves", dict(halves=((0, 4), (3, 7))), "rotate_half"),
    ("neg on the first half", dict(neg_first=True), None),
    ("halves swapped in concat", dict(swap_concat=True), None),
    ("rotation along another axis", dict(axes=(1, 1), concat_axis=1, halves=((0, 2), (2, I64_MAX))), None),
    ("cos grows X", dict(x_shape=(1, 4, 6, 8), cos_shape=(3, 1, 6, 8)), "broadcast"),
    ("cos last dim broadcasts", dict(cos_shape=(2, 1, 6, 1)), "broadcast"),
    ("transposes not inverse", dict(transposed=True, x_shape=(2, 6, 4, 8), perm=(0, 2, 1, 3), perm_out=(2, 0, 1, 3)),
     None),
])
def test_near_misses_are_refused(tmp_path, kind, kw, reason):
    args = dict(x_shape=(2, 4, 6, 8), cos_shape=(2, 1, 6, 8))
    args.update(kw)
    x_shape, cos_shape = args.pop("x_shape"), args.pop("cos_shape")
    model = _rotary_graph(x_shape, cos_shape, **args)
    try:  # a valid model onnxruntime runs
        runtime.session(model, "cpu", library=False).run(None, _feeds(model))
    except Exception as e:
        pytest.fail(f"{kind}: the near-miss graph itself is invalid: {e}")
    res, dst = _fuse_and_compare(tmp_path, model, explain=True)  # whatever fused computes the original
    if kind == "transposes not inverse":  # the rotary itself may fuse, in the transposed layout, Transposes kept
        assert _ops(dst)["Transpose"] == 2 if dst.exists() else True
    else:
        assert not [m for m in res.matches if m.op == "RotaryEmbedding"], kind
    if reason is not None:
        assert any(reason in r["reason"] for r in res.refusals), res.refusals


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 3), h=st.integers(1, 4), s=st.integers(1, 7), half=st.integers(1, 12),
       cos_b=st.booleans(), cos_h=st.booleans(), transposed=st.booleans(), fp16=st.booleans())
def test_property_shapes_and_broadcasts(tmp_path_factory, b, h, s, half, cos_b, cos_h, transposed, fp16):
    d = 2 * half
    if transposed:  # X [B, S, H, D], the rotary in [B, H, S, D]
        x_shape, cos_shape = (b, s, h, d), (b if cos_b else 1, h if cos_h else 1, s, d)
    else:
        x_shape, cos_shape = (b, h, s, d), (b if cos_b else 1, h if cos_h else 1, s, d)
    model = _rotary_graph(x_shape, cos_shape, transposed=transposed, dtype=np.float16 if fp16 else np.float32)
    res, dst = _fuse_and_compare(tmp_path_factory.mktemp("rot"), model)
    assert [m.op for m in res.matches] == ["RotaryEmbedding"]
