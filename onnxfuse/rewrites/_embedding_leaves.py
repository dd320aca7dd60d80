"""The leaves of the embedding_interaction pass: an embedding lookup or bag, recognised node by node.

`onehot_leaf`: Gather(table, column f of one id matrix) with a constant [R_f, d] table. `bag_leaf`: TorchScript's
EmbeddingBag(mode="sum", offsets) Loop (slice indices[offsets[b] : offsets[b+1]], gather, ReduceSum over the bag),
each node and value of the loop and its bounds checked; its indices and offsets are rows of stacked matrices or
tensors of their own (one per table). Each returns a Leaf (None when the value is not that kind of lookup at all)
or raises Refused naming the check that failed. `bag_inputs` makes the bag op's inputs from per-table tensors.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from onnxscript import ir

from . import _base
from ._index_interpreter import Match, Refused, int_attr, is_default, made_by, value_name


@dataclasses.dataclass
class Leaf:
    value: ir.Value
    kind: str                     # "x" | "onehot" | "bag"
    table: ir.Value | None = None
    ids: ir.Value | None = None   # onehot: the [B, F] id matrix; bag: the [F, N] indices, or the feature's own [N_f]
    offsets: ir.Value | None = None  # bag: the [F, B] offsets, or the feature's own [B]
    column: int = -1              # the feature: id column (onehot) or row of indices (bag; -1: its own tensor)
    offset_row: int = -1          # bag: the row of the offsets matrix (-1: the feature's own tensor)


def _scalar(v: ir.Value | None) -> int | None:
    c = _base.const(v)
    if c is None or c.dtype.kind not in "iu" or c.size != 1 or c.ndim > 1:
        return None
    return int(c.reshape(-1)[0])


def _const_list(v: ir.Value | None) -> list[int] | None:
    c = _base.const(v)
    if c is None or c.dtype.kind not in "iu":
        return None
    return [int(x) for x in c.reshape(-1)]


def _row_of(m: Match, v: ir.Value, axis: int) -> tuple[ir.Value, int]:
    """`v` is slice `k` of a matrix along `axis`: Gather(M, k, axis) with a scalar k, or Squeeze(Split(M, axis)[k],
    [axis]) with unit splits. Returns (M, k)."""
    g = made_by(v, "Gather")
    if g is not None and int_attr(g, "axis", 0) == axis and _scalar(g.inputs[1]) is not None \
            and _base.const(g.inputs[1]).ndim == 0:
        m.read(g)
        k = _scalar(g.inputs[1])
        d = _base.dims(g.inputs[0])
        if k < 0 and d is not None and isinstance(d[axis], int):
            k += d[axis]
        return g.inputs[0], k
    sq = made_by(v, "Squeeze")
    if sq is not None and len(sq.inputs) > 1 and _const_list(sq.inputs[1]) == [axis]:
        sp = made_by(sq.inputs[0], "Split")
        if sp is not None and int_attr(sp, "axis", 0) == axis:
            n_out = len(sp.outputs)
            sizes = _const_list(sp.inputs[1]) if len(sp.inputs) > 1 and sp.inputs[1] is not None else None
            d = _base.dims(sp.inputs[0])
            unit = sizes == [1] * n_out if sizes is not None else (d is not None and d[axis] == n_out)
            if unit:
                m.read(sq)
                m.read(sp)
                m.keep_private(sq.inputs[0])
                return sp.inputs[0], sq.inputs[0].index()
    raise Refused(f"{value_name(v)} is not one row (axis {axis}) of an id matrix: Gather(M, k, axis={axis}) or "
                  "Squeeze(Split(M)[k])", v)


def _float_table(v: ir.Value, role: str) -> np.ndarray:
    reason = _base.not_constant(v, role)
    if reason:
        raise Refused(f"{reason}: the tables are concatenated into one constant at fuse time", v)
    arr = v.const_value
    if len(arr.shape) != 2 or v.dtype not in _base.FLOAT_TYPES:
        raise Refused(f"{role} {value_name(v)} is not a 2-D float/float16/bfloat16 table", v)
    return arr


def _truthy(m: Match, v: ir.Value | None) -> bool:
    c = _base.const(v)
    if c is None:
        cast = made_by(v, "Cast", "Identity")
        if cast is None:
            return False
        m.read(cast)
        c = _base.const(cast.inputs[0])
    return c is not None and c.size == 1 and bool(c.reshape(-1)[0])


def onehot_leaf(m: Match, v: ir.Value) -> Leaf | None:
    g = made_by(v, "Gather")
    if g is None or int_attr(g, "axis", 0) != 0:
        return None
    table = g.inputs[0]
    td = _base.dims(table)
    if td is None or len(td) != 2 or table.dtype not in _base.FLOAT_TYPES:
        return None
    _float_table(table, f"the embedding table of {_base.node_label(g)}")
    m.read(g)
    ids, col = _row_of(m, g.inputs[1], 1)
    m.keep_private(g.inputs[1])
    return Leaf(v, "onehot", table, ids, None, col)


def bag_leaf(m: Match, v: ir.Value) -> Leaf | None:
    """TorchScript's EmbeddingBag(mode='sum', offsets) as a Loop over the bags (torch.onnx symbolic_opset11
    embedding_bag): checked node by node, in and around the body."""
    loop = made_by(v, "Loop")
    if loop is None:
        return None
    label = _base.node_label(loop)
    body_attr = loop.attributes.get("body")
    body = body_attr.value if body_attr is not None else None
    if body is None or len(loop.inputs) != 2 or len(loop.outputs) != 1 or len(body.inputs) != 2 \
            or len(body.outputs) != 2:
        raise Refused(f"{label}: a Loop that is not an EmbeddingBag over bags (loop-carried values)", v)
    trip, cond = loop.inputs
    it = body.inputs[0]
    if not _truthy(m, cond) or not (_truthy(m, body.outputs[0]) or body.outputs[0] is body.inputs[1]):
        raise Refused(f"{label}: the Loop's condition is not constant true", v)
    red = body.outputs[1].producer()
    if red is None or red.graph is not body or not is_default(red):
        raise Refused(f"{label}: the Loop body is not an EmbeddingBag", v)
    if red.op_type != "ReduceSum":
        mode = {"ReduceMean": "mean", "ReduceMax": "max"}.get(red.op_type, red.op_type)
        raise Refused(f"{label}: the bag is reduced with {red.op_type} (EmbeddingBag mode={mode!r}): only "
                      "mode='sum' is fused", v)
    if int_attr(red, "keepdims", 1) != 0 or int_attr(red, "noop_with_empty_axes", 0) != 0 \
            or len(red.inputs) < 2 or _const_list(red.inputs[1]) != [0]:
        raise Refused(f"{label}: the bag ReduceSum is not over axis 0 without keepdims", v)
    g = made_by(red.inputs[0], "Gather")
    if g is None or int_attr(g, "axis", 0) != 0:
        raise Refused(f"{label}: the bag rows are not gathered from a table (per-sample weights are not fused)", v)
    table = g.inputs[0]
    _float_table(table, f"the embedding table of {label}")
    sl = made_by(g.inputs[1], "Slice")
    if sl is None or len(sl.inputs) < 4 or _const_list(sl.inputs[3]) != [0] or \
            (len(sl.inputs) > 4 and sl.inputs[4] is not None and _const_list(sl.inputs[4]) != [1]):
        raise Refused(f"{label}: the bag is not a slice of the indices", v)
    idx = sl.inputs[0]

    def at_iter(u: ir.Value) -> ir.Value:
        un = made_by(u, "Unsqueeze")
        if un is None or len(un.inputs) < 2 or _const_list(un.inputs[1]) != [0]:
            raise Refused(f"{label}: the bag bounds are not the offsets at the iteration", v)
        ga = made_by(un.inputs[0], "Gather")
        if ga is None or int_attr(ga, "axis", 0) != 0 or ga.inputs[1] is not it:
            raise Refused(f"{label}: the bag bounds are not the offsets at the iteration", v)
        return ga.inputs[0]

    starts, ends = at_iter(sl.inputs[1]), at_iter(sl.inputs[2])
    # starts = Concat(offsets_f, [len(indices_f)]); ends = starts[1:]; the trip count is len(ends)
    cat = made_by(starts, "Concat")
    if cat is None or int_attr(cat, "axis", 0) != 0 or len(cat.inputs) != 2:
        raise Refused(f"{label}: the bag starts are not the offsets followed by the number of indices", v)
    n_nodes = _indices_length(cat.inputs[1], idx)
    if n_nodes is None:
        raise Refused(f"{label}: the last bag does not end at the number of indices", v)
    n_u, n_g, n_s = n_nodes
    es = made_by(ends, "Slice")
    if es is None or es.inputs[0] is not starts or _const_list(es.inputs[1]) != [1] or \
            (_const_list(es.inputs[2]) or [0])[0] < 2 ** 62 or \
            (len(es.inputs) > 3 and es.inputs[3] is not None and _const_list(es.inputs[3]) != [0]) or \
            (len(es.inputs) > 4 and es.inputs[4] is not None and _const_list(es.inputs[4]) != [1]):
        raise Refused(f"{label}: the bag ends are not the next offsets", v)
    t_g = made_by(trip, "Gather")
    t_s = made_by(t_g.inputs[0], "Shape") if t_g is not None and _scalar(t_g.inputs[1]) == 0 else None
    if t_s is None or t_s.inputs[0] is not ends or int_attr(t_s, "start", 0) != 0:
        if not _static_length(trip, cat.inputs[0]):  # a constant trip count: the offsets' static length
            raise Refused(f"{label}: the Loop does not run once per bag", v)
        t_g = t_s = None
    for node in (loop, cat, n_u, n_g, n_s, es, t_g, t_s):
        if node is not None:
            m.read(node)
    shape_values = [x for nd in (n_u, n_g, t_g) if nd is not None for x in (nd.outputs[0], nd.inputs[0])]
    for val in (starts, ends, *shape_values):
        m.keep_private(val)
    indices, row_i = _row_or_own(m, idx, "indices", label)
    offsets, row_o = _row_or_own(m, cat.inputs[0], "offsets", label)
    if row_i >= 0 and row_o >= 0 and row_i != row_o:
        raise Refused(f"{label}: indices row {row_i} is bagged with offsets row {row_o}", v)
    return Leaf(v, "bag", table, indices, offsets, row_i, row_o)


def _indices_length(n: ir.Value, idx: ir.Value) -> tuple | None:
    """(Unsqueeze, Gather, Shape) when `n` is Unsqueeze(Gather(Shape(idx), 0)), (None, None, None) when it is a
    constant equal to idx's static length (constant propagation folds the Shape; onnxruntime checks a static input's
    shape on every run), else None."""
    n_u = made_by(n, "Unsqueeze")
    n_g = made_by(n_u.inputs[0], "Gather") if n_u is not None and _const_list(n_u.inputs[1]) == [0] else None
    n_s = made_by(n_g.inputs[0], "Shape") if n_g is not None and _scalar(n_g.inputs[1]) == 0 else None
    if n_s is not None and n_s.inputs[0] is idx and int_attr(n_s, "start", 0) == 0:
        return n_u, n_g, n_s
    return (None, None, None) if _static_length(n, idx) else None


def _static_length(n: ir.Value | None, of: ir.Value) -> bool:
    """`n` is a constant [L] or L equal to the static length of the 1-D tensor `of`."""
    c = _const_list(n)
    d = _base.dims(of)
    return c is not None and len(c) == 1 and d is not None and len(d) == 1 and d[0] == c[0]


def _row_or_own(m: Match, v: ir.Value, role: str, label: str) -> tuple[ir.Value, int]:
    """A bag's indices or offsets: (M, k) when `v` is row k of a stacked matrix M (the row's nodes are then the
    match's), else (v, -1) when `v` is a 1-D int64 tensor of its own (the per-table form: one tensor per table, of
    its own length; the rewrite concatenates them in the graph)."""
    try:
        matrix, row = _row_of(m, v, 0)
    except Refused as r:
        d = _base.dims(v)
        if d is None or len(d) != 1 or v.dtype != ir.DataType.INT64:
            raise Refused(f"{label}: the {role} {value_name(v)} are neither a row of a stacked matrix nor a 1-D int64 "
                          f"tensor of their own ({r.reason})", v) from None
        return v, -1
    m.keep_private(v)
    return matrix, row


def bag_inputs(feats: list[Leaf], stacked_indices: bool, stacked_offsets: bool, initializer, unique
               ) -> tuple[ir.Value, ir.Value, list[ir.Node]]:
    """EmbeddingBagInteraction's indices and offsets from bags whose indices or offsets are one tensor per feature
    (the per-table form), and the new nodes that make them (for the caller to insert before the op). Stacked indices
    [F, N] with per-table offsets: the offsets stacked into [F, B] (the op's first form). Per-table indices ([N_f]
    each): the indices concatenated into one row [1, N] and offsets [F, B + 1], each feature's clamped to [0, N_f]
    and moved by base_f = N_0 + ... + N_{f-1}, its last column base_f + N_f (where feature f's indices end).
    Both stacked: the model's matrices as they are, no node. `initializer(name, array)` makes a constant,
    `unique(name)` a fresh name."""
    made: list[ir.Node] = []
    if stacked_indices and stacked_offsets:
        return feats[0].ids, feats[0].offsets, made

    def op(op_type: str, ins: list, name: str, shape: list | None = None, **attrs) -> ir.Value:
        node = ir.Node("", op_type, ins, [ir.AttrInt64(k, v) for k, v in attrs.items()], num_outputs=1,
                       name=unique(f"embedding_bags/{op_type}"))
        node.outputs[0].name = unique(name)
        node.outputs[0].dtype = ir.DataType.INT64
        if shape is not None:
            node.outputs[0].shape = ir.Shape(shape)
        made.append(node)
        return node.outputs[0]

    axis0 = initializer("embedding_bags_axis0", np.array([0], dtype=np.int64))
    n_feat = len(feats)
    if stacked_offsets:
        offsets = feats[0].offsets
    else:
        rows = [op("Unsqueeze", [l.offsets, axis0], "embedding_bags_offsets_row") for l in feats]
        offsets = op("Concat", rows, "embedding_bags_offsets", [n_feat, None], axis=0)
    if stacked_indices:  # [F, N] with the per-table offsets stacked: the op's first form
        return feats[0].ids, offsets, made
    axis1 = initializer("embedding_bags_axis1", np.array([1], dtype=np.int64))
    zero = initializer("embedding_bags_zero", np.array(0, dtype=np.int64))
    lengths = op("Concat", [op("Shape", [l.ids], "embedding_bags_length", [1]) for l in feats],
                 "embedding_bags_lengths", [n_feat], axis=0)
    ends = op("CumSum", [lengths, zero], "embedding_bags_ends", [n_feat])
    bases = op("Sub", [ends, lengths], "embedding_bags_bases", [n_feat])
    flat = op("Concat", [l.ids for l in feats], "embedding_bags_indices_flat", [None], axis=0)
    indices = op("Unsqueeze", [flat, axis0], "embedding_bags_indices", [1, None])
    clamped = op("Min", [op("Max", [offsets, zero], "embedding_bags_offsets_pos"),
                         op("Unsqueeze", [lengths, axis1], "embedding_bags_lengths_col", [n_feat, 1])],
                 "embedding_bags_offsets_clamped")
    moved = op("Add", [clamped, op("Unsqueeze", [bases, axis1], "embedding_bags_bases_col", [n_feat, 1])],
               "embedding_bags_offsets_moved")
    offsets = op("Concat", [moved, op("Unsqueeze", [ends, axis1], "embedding_bags_ends_col", [n_feat, 1])],
                 "embedding_bags_offsets_ends", [n_feat, None], axis=1)
    return indices, offsets, made
