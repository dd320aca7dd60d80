"""embedding_interaction: DLRM's embedding lookups and feature interaction -> one `EmbeddingInteraction` node (one id
per feature, onnxfuse's DLRM) or `EmbeddingBagInteraction` node (nn.EmbeddingBag(mode="sum") bags, the original
DLRM of facebookresearch/dlrm).

    v_0 = X (the bottom MLP's output, [B, d]);  v_{f+1} = table_f[h(ids[:, f])]  (or the sum over bag (f, b))
    dot:  Y = [X, v_i . v_j for i > j (i-major)]            (d + n(n-1)/2 columns, n = F + 1)
    cat:  Y = [v_0, v_1, ..., v_F]                          (n*d columns)

A graph pass (the feature count varies, which a fixed pattern cannot spell), run after the MLP rules. Each candidate
is a Concat whose output feeds the top MLP; the pass walks back from it and PROVES what the subgraph computes rather
than trusting node names:

  * the pieces between the vectors, the pairwise product and the output (Unsqueeze, Concat, Reshape, Flatten,
    Transpose, Gather / GatherND with constant indices, Squeeze, Identity, and the Shape arithmetic that feeds their
    shape inputs) are run by a small abstract interpreter over index arrays: every element of a value is labelled
    with the source element it holds, the batch axis is tracked symbolically, and a Reshape that would mix the
    batch axis with another refuses. The stacked vectors must come out as [B, n, d] holding v_0..v_F in order, and
    the selected products as [B, n(n-1)/2] holding (i, j) for i > j in row-major order: exactly the op's output.
    Whatever the exporter (dynamo's GatherND, TorchScript's Flatten + Gather of i*n + j with Shape arithmetic,
    onnxruntime's folded constants), only the index arrays matter;
  * the product is MatMul(T, Transpose(T, [0, 2, 1])) or onnxruntime's FusedMatMul(T, T, transB=1, alpha=1)
    (fuse's stage 1 makes it);
  * each embedding is Gather(table, column f of one id matrix) with a constant table [R_f, d], or TorchScript's
    EmbeddingBag Loop (slice indices[offsets[b] : offsets[b+1]], gather, ReduceSum over the bag) checked node by
    node. The hash (id + 1) mod cardinality is absorbed when spelled exactly so (Mod with fmod=0, the constant 1,
    a per-feature constant 0 < cardinality <= rows); any other id computation stays in the graph and the op looks
    the ids up as they come (sound: the op indexes exactly like Gather, negative ids included).

Refused (with the reason, for --explain): a triangle other than the strict lower one (DLRM's
arch_interaction_itself), a Gram matrix of something else, tables that are not constants (graph inputs, or
initializers a caller may override), a bag reduced by anything but ReduceSum (mode="mean"/"max"), per-sample
weights, intermediates used elsewhere or returned as graph outputs, mixed element types, tables of different widths.

The tables are concatenated into one [R, d] initializer at fuse time (a table used by several features is stored
once); table_offsets and cardinality are int64 initializers. An ONNX function has a fixed arity: these ops have one
(the tables are one input), and each node names its function by overload (the interaction, and the hash).
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from onnxscript import ir

from ..schema import DOMAIN, embedding_overload, interaction_width
from . import _base

PATTERN = "embedding_interaction"
_DEFAULT = ("", "ai.onnx")
# Data-movement ops the interpreter runs (input 0 is the data, Concat takes several).
_MOVES = ("Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Gather", "GatherND", "Concat")
_MAX_DEPTH = 64
_INT64_MAX = 2 ** 63 - 1
EMBEDDING_DOC = ("GPU: one kernel (hash, every lookup,",
                 "  the pairwise dots or the concat);",
                 "  CPU: one pass per sample")


class _Batch:
    """The batch dimension: its size is unknown at fuse time (or static, then also known as an int)."""

    def __repr__(self):
        return "B"


BATCH = _Batch()


class Refused(Exception):
    def __init__(self, reason: str, value: ir.Value | None = None):
        super().__init__(reason)
        self.reason = reason
        self.value = value


def _prod(values) -> int:
    return math.prod(int(v) for v in values)


@dataclasses.dataclass
class Abs:
    """A value as the interpreter sees it: its dims (ints, and BATCH at axis `bax`) and, for every element of the
    non-batch axes, the label of the source element it holds."""
    dims: list
    bax: int
    content: np.ndarray


def _name(v: ir.Value | None) -> str:
    return "?" if v is None else (v.name or "?")


def _is_default(node: ir.Node | None) -> bool:
    return node is not None and node.domain in _DEFAULT


def _op(v: ir.Value | None, *types: str) -> ir.Node | None:
    """The producer of `v` if it is a default-domain node of one of `types`."""
    node = v.producer() if v is not None else None
    return node if _is_default(node) and node.op_type in types else None


def _int_attr(node: ir.Node, name: str, default):
    a = node.attributes.get(name)
    return default if a is None else a.value


class _Match:
    """One candidate: the interpreter, the nodes it read and the intermediates that must have no other use."""

    def __init__(self, graph: ir.Graph, x: ir.Value | None):
        self.graph = graph
        self.x = x
        self.nodes: dict[int, ir.Node] = {}
        self.data: dict[int, ir.Value] = {}  # values that must not be used outside the match
        self.abs: dict[int, Abs] = {}
        self.bsize: int | None = None
        self.bname: str | None = None
        self.d: int | None = None
        if x is not None:
            self.set_x(x)

    def set_x(self, x: ir.Value) -> None:
        xd = _base.dims(x)
        if xd is None or len(xd) != 2 or not isinstance(xd[1], int):
            raise Refused(f"the dense vector {_name(x)} has shape {xd}: a [batch, d] tensor with a static d is needed", x)
        self.x = x
        self.d = xd[1]
        self.bsize = xd[0] if isinstance(xd[0], int) else None
        self.bname = xd[0] if isinstance(xd[0], str) else None
        if self.bsize is None and self.bname is None:
            raise Refused(f"the batch dimension of {_name(x)} is unknown", x)

    def read(self, node: ir.Node) -> ir.Node:
        self.nodes[id(node)] = node
        return node

    def keep_private(self, v: ir.Value) -> None:
        self.data[id(v)] = v

    # ------------------------------------------------------------------------------------------ shape arithmetic
    def shape_of(self, v: ir.Value) -> list:
        if id(v) in self.abs:
            return list(self.abs[id(v)].dims)
        if v is self.x:
            return [BATCH, self.d]
        d = _base.dims(v)
        if d is None:
            raise Refused(f"the shape of {_name(v)} is unknown", v)
        out = []
        for s in d:
            if isinstance(s, int):
                out.append(s)
            elif s == self.bname:
                out.append(BATCH)
            else:
                raise Refused(f"{_name(v)} has a symbolic dimension {s!r} other than the batch", v)
        return out

    def ints(self, v: ir.Value | None, depth: int = 0) -> np.ndarray:
        """The value of a small integer tensor computed from constants and shapes (object array of ints and
        BATCH); refuses anything else."""
        out = self._ints(v, depth)
        if not isinstance(out, np.ndarray):  # a scalar picked out of an object array
            holder = np.empty((), dtype=object)
            holder[()] = out
            out = holder
        return out

    def _ints(self, v: ir.Value | None, depth: int):
        if v is None:
            raise Refused("a shape or index input is missing")
        if depth > _MAX_DEPTH:
            raise Refused(f"{_name(v)}: shape computation too deep", v)
        c = _base.const(v)
        if c is not None:
            if c.dtype.kind not in "iu":
                raise Refused(f"{_name(v)} is a {c.dtype} constant where integers are needed", v)
            return np.asarray(c, dtype=np.int64).astype(object)
        node = v.producer()
        if not _is_default(node):
            raise Refused(f"{_name(v)} is neither a constant nor computed from shapes", v)
        self.read(node)
        op = node.op_type
        if op == "Shape":
            dims = self.shape_of(node.inputs[0])
            r = len(dims)
            start, end = _int_attr(node, "start", 0), _int_attr(node, "end", r)
            start, end = (start + r if start < 0 else start), (end + r if end < 0 else end)
            return np.array(dims[max(0, min(start, r)):max(0, min(end, r))], dtype=object)
        if op in ("Identity", "Cast"):
            return self.ints(node.inputs[0], depth + 1)
        if op == "Gather":
            data, idx = self.ints(node.inputs[0], depth + 1), self.ints(node.inputs[1], depth + 1)
            axis = _int_attr(node, "axis", 0)
            if data.ndim != 1 or axis not in (0, -1) or any(i is BATCH for i in idx.ravel()):
                raise Refused(f"{_base.node_label(node)}: unsupported shape Gather", v)
            ii = idx.astype(np.int64)
            ii = np.where(ii < 0, ii + len(data), ii)
            if ii.size and (ii.min() < 0 or ii.max() >= len(data)):
                raise Refused(f"{_base.node_label(node)}: index out of range", v)
            return data[ii]
        if op in ("Unsqueeze", "Squeeze"):
            data = self.ints(node.inputs[0], depth + 1)
            axes = self.ints(node.inputs[1], depth + 1) if len(node.inputs) > 1 and node.inputs[1] is not None else None
            if axes is None:
                if op == "Unsqueeze":
                    raise Refused(f"{_base.node_label(node)}: Unsqueeze without axes", v)
                return data.reshape([s for s in data.shape if s != 1])
            axes = [int(a) for a in axes.ravel()]
            if op == "Unsqueeze":
                rank = data.ndim + len(axes)
                shape, it = [], iter(data.shape)
                axes = {a + rank if a < 0 else a for a in axes}
                shape = [1 if i in axes else next(it) for i in range(rank)]
                return data.reshape(shape)
            axes = {a + data.ndim if a < 0 else a for a in axes}
            return data.reshape([s for i, s in enumerate(data.shape) if i not in axes])
        if op == "Concat":
            parts = [self.ints(i, depth + 1) for i in node.inputs]
            return np.concatenate(parts, axis=_int_attr(node, "axis", 0))
        if op in ("Add", "Sub", "Mul"):
            a, b = self.ints(node.inputs[0], depth + 1), self.ints(node.inputs[1], depth + 1)
            if any(x is BATCH for x in [*a.ravel(), *b.ravel()]):
                raise Refused(f"{_base.node_label(node)}: arithmetic on the batch size", v)
            a, b = a.astype(np.int64), b.astype(np.int64)
            return ({"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op](a, b)).astype(object)
        raise Refused(f"{_name(v)} is computed by {_base.node_label(node)} ({op}), which the index check does not "
                      "evaluate", v)

    # ------------------------------------------------------------------------------------------ data movement
    def run(self, node: ir.Node, ins: list[Abs]) -> Abs:
        op = node.op_type
        a = ins[0]
        label = _base.node_label(node)
        if op == "Identity":
            return a
        if op == "Transpose":
            rank = len(a.dims)
            perm = list(_int_attr(node, "perm", list(range(rank))[::-1]))
            if sorted(perm) != list(range(rank)):
                raise Refused(f"{label}: bad perm {perm}")
            old_nb = [i for i in range(rank) if i != a.bax]
            order = [old_nb.index(p) for p in perm if p != a.bax]
            return Abs([a.dims[p] for p in perm], perm.index(a.bax), a.content.transpose(order))
        if op == "Reshape":
            return self._reshape(a, list(self.ints(node.inputs[1]).ravel()), _int_attr(node, "allowzero", 0), label)
        if op == "Flatten":
            rank = len(a.dims)
            axis = _int_attr(node, "axis", 1)
            axis = axis + rank if axis < 0 else axis
            left = [s for i, s in enumerate(a.dims[:axis]) if i != a.bax]
            right = [s for i, s in enumerate(a.dims[axis:], start=axis) if i != a.bax]
            if a.bax < axis:
                target = [BATCH if _prod(left) == 1 else -2, _prod(right)]
            else:
                target = [_prod(left), BATCH if _prod(right) == 1 else -2]
            if -2 in target:
                raise Refused(f"{label}: Flatten merges the batch axis with other axes")
            return self._reshape(a, target, 1, label)
        if op in ("Unsqueeze", "Squeeze"):
            if len(node.inputs) < 2 or node.inputs[1] is None:
                raise Refused(f"{label}: {op} without an axes input")
            axes = [int(x) for x in self.ints(node.inputs[1]).ravel()]
            if op == "Unsqueeze":
                rank = len(a.dims) + len(axes)
                axes = {x + rank if x < 0 else x for x in axes}
                it = iter(a.dims)
                dims = [1 if i in axes else next(it) for i in range(rank)]
            else:
                rank = len(a.dims)
                axes = {x + rank if x < 0 else x for x in axes}
                if a.bax in axes or any(a.dims[x] != 1 for x in axes):
                    raise Refused(f"{label}: squeezes an axis that is not 1 or the batch axis")
                dims = [s for i, s in enumerate(a.dims) if i not in axes]
            bax = dims.index(BATCH)
            return Abs(dims, bax, a.content.reshape([s for i, s in enumerate(dims) if i != bax]))
        if op == "Gather":
            rank = len(a.dims)
            axis = _int_attr(node, "axis", 0)
            axis = axis + rank if axis < 0 else axis
            if axis == a.bax:
                raise Refused(f"{label}: gathers along the batch axis")
            idx = self._indices(node.inputs[1], a.dims[axis], label)
            ax = axis if axis < a.bax else axis - 1
            dims = a.dims[:axis] + list(idx.shape) + a.dims[axis + 1:]
            bax = a.bax if a.bax < axis else a.bax + idx.ndim - 1
            return Abs(dims, bax, np.take(a.content, idx, axis=ax))
        if op == "GatherND":
            if _int_attr(node, "batch_dims", 0) != 0:
                raise Refused(f"{label}: GatherND with batch_dims")
            raw = self.ints(node.inputs[1])
            if raw.ndim < 1 or any(x is BATCH for x in raw.ravel()):
                raise Refused(f"{label}: GatherND indices are not constant")
            k = raw.shape[-1]
            if a.bax < k:
                raise Refused(f"{label}: GatherND indexes the batch axis")
            idx = raw.astype(np.int64)
            for j in range(k):
                size = a.dims[j]
                idx[..., j] = np.where(idx[..., j] < 0, idx[..., j] + size, idx[..., j])
                if idx.size and (idx[..., j].min() < 0 or idx[..., j].max() >= size):
                    raise Refused(f"{label}: GatherND index out of range")
            content = a.content[tuple(idx[..., j] for j in range(k))]
            return Abs(list(idx.shape[:-1]) + a.dims[k:], idx.ndim - 1 + (a.bax - k), content)
        if op == "Concat":
            rank = len(a.dims)
            axis = _int_attr(node, "axis", 0)
            axis = axis + rank if axis < 0 else axis
            if any(len(b.dims) != rank or b.bax != a.bax for b in ins) or axis == a.bax:
                raise Refused(f"{label}: concatenates along the batch axis or values of other layouts")
            for b in ins:
                if [s for i, s in enumerate(b.dims) if i != axis] != [s for i, s in enumerate(a.dims) if i != axis]:
                    raise Refused(f"{label}: concatenates values of different shapes")
            ax = axis if axis < a.bax else axis - 1
            dims = list(a.dims)
            dims[axis] = sum(int(b.dims[axis]) for b in ins)
            return Abs(dims, a.bax, np.concatenate([b.content for b in ins], axis=ax))
        raise Refused(f"{label}: {op} is not a data-movement op the index check runs")

    def _indices(self, v: ir.Value, size, label: str) -> np.ndarray:
        raw = self.ints(v)
        if any(x is BATCH for x in raw.ravel()) or not isinstance(size, int):
            raise Refused(f"{label}: indices are not constant")
        idx = raw.astype(np.int64)
        idx = np.where(idx < 0, idx + size, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= size):
            raise Refused(f"{label}: index out of range")
        return idx

    def _reshape(self, a: Abs, target: list, allowzero: int, label: str) -> Abs:
        t = list(target)
        for i, v in enumerate(t):
            if v is not BATCH and v == 0 and not allowzero:
                if i >= len(a.dims):
                    raise Refused(f"{label}: a 0 in the shape past the input's rank")
                t[i] = a.dims[i]
        pre, post = _prod(a.dims[:a.bax]), _prod(a.dims[a.bax + 1:])
        if any(v is not BATCH and v < -1 for v in t) or sum(1 for v in t if v is not BATCH and v == -1) > 1:
            raise Refused(f"{label}: invalid target shape {t}")
        if self.bsize is not None:  # static batch: plain ints, then find the axis that is the batch
            t = [self.bsize if v is BATCH else int(v) for v in t]
            total = pre * self.bsize * post
            if -1 in t:
                known = _prod(v for v in t if v != -1)
                if known == 0 or total % known:
                    raise Refused(f"{label}: target shape {t} does not fit {total} elements")
                t[t.index(-1)] = total // known
            if _prod(t) != total:
                raise Refused(f"{label}: target shape {t} does not fit {total} elements")
            q = next((q for q in range(len(t)) if _prod(t[:q]) == pre and t[q] == self.bsize
                      and _prod(t[q + 1:]) == post), None)
            if q is None:
                raise Refused(f"{label}: the reshape to {t} mixes the batch axis with other axes")
        else:
            at = [i for i, v in enumerate(t) if v is BATCH]
            if len(at) > 1:
                raise Refused(f"{label}: the batch size appears twice in the target shape")
            if at:
                q = at[0]
                left, right = t[:q], t[q + 1:]
                for side, want in ((left, pre), (right, post)):
                    if -1 in side:
                        known = _prod(v for v in side if v != -1)
                        if known == 0 or want % known:
                            raise Refused(f"{label}: the reshape mixes the batch axis with other axes")
                        side[side.index(-1)] = want // known
                    if _prod(side) != want:
                        raise Refused(f"{label}: the reshape mixes the batch axis with other axes")
                t = left + [BATCH] + right
            else:
                if -1 not in t:
                    raise Refused(f"{label}: the target shape {t} fixes the batch size of a dynamic batch")
                q = t.index(-1)
                if _prod(v for v in t if v != -1) != pre * post or _prod(t[:q]) != pre:
                    raise Refused(f"{label}: the reshape to {t} mixes the batch axis with other axes")
        dims = [BATCH if i == q else int(v) for i, v in enumerate(t)]
        return Abs(dims, q, a.content.reshape([v for i, v in enumerate(dims) if i != q]))


# ------------------------------------------------------------------------------------------------ leaves
@dataclasses.dataclass
class Leaf:
    value: ir.Value
    kind: str                     # "x" | "onehot" | "bag"
    table: ir.Value | None = None
    ids: ir.Value | None = None   # onehot: the [B, F] id matrix; bag: the [F, N] indices
    offsets: ir.Value | None = None  # bag: the [F, B] offsets
    column: int = -1              # the feature: id column (onehot) or row of indices/offsets (bag)


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


def _row_of(m: _Match, v: ir.Value, axis: int) -> tuple[ir.Value, int]:
    """`v` is slice `k` of a matrix along `axis`: Gather(M, k, axis) with a scalar k, or Squeeze(Split(M, axis)[k],
    [axis]) with unit splits. Returns (M, k)."""
    g = _op(v, "Gather")
    if g is not None and _int_attr(g, "axis", 0) == axis and _scalar(g.inputs[1]) is not None \
            and _base.const(g.inputs[1]).ndim == 0:
        m.read(g)
        k = _scalar(g.inputs[1])
        d = _base.dims(g.inputs[0])
        if k < 0 and d is not None and isinstance(d[axis], int):
            k += d[axis]
        return g.inputs[0], k
    sq = _op(v, "Squeeze")
    if sq is not None and len(sq.inputs) > 1 and _const_list(sq.inputs[1]) == [axis]:
        sp = _op(sq.inputs[0], "Split")
        if sp is not None and _int_attr(sp, "axis", 0) == axis:
            n_out = len(sp.outputs)
            sizes = _const_list(sp.inputs[1]) if len(sp.inputs) > 1 and sp.inputs[1] is not None else None
            d = _base.dims(sp.inputs[0])
            unit = sizes == [1] * n_out if sizes is not None else (d is not None and d[axis] == n_out)
            if unit:
                m.read(sq)
                m.read(sp)
                m.keep_private(sq.inputs[0])
                return sp.inputs[0], sq.inputs[0].index()
    raise Refused(f"{_name(v)} is not one row (axis {axis}) of an id matrix: Gather(M, k, axis={axis}) or "
                  "Squeeze(Split(M)[k])", v)


def _float_table(v: ir.Value, role: str) -> np.ndarray:
    reason = _base.not_constant(v, role)
    if reason:
        raise Refused(f"{reason}: the tables are concatenated into one constant at fuse time", v)
    arr = v.const_value
    if len(arr.shape) != 2 or v.dtype not in _base.FLOAT_TYPES:
        raise Refused(f"{role} {_name(v)} is not a 2-D float/float16/bfloat16 table", v)
    return arr


def _truthy(m: _Match, v: ir.Value | None) -> bool:
    c = _base.const(v)
    if c is None:
        cast = _op(v, "Cast", "Identity")
        if cast is None:
            return False
        m.read(cast)
        c = _base.const(cast.inputs[0])
    return c is not None and c.size == 1 and bool(c.reshape(-1)[0])


def _onehot_leaf(m: _Match, v: ir.Value) -> Leaf | None:
    g = _op(v, "Gather")
    if g is None or _int_attr(g, "axis", 0) != 0:
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


def _bag_leaf(m: _Match, v: ir.Value) -> Leaf | None:
    """TorchScript's EmbeddingBag(mode='sum', offsets) as a Loop over the bags (torch.onnx symbolic_opset11
    embedding_bag): checked node by node, in and around the body."""
    loop = _op(v, "Loop")
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
    if red is None or red.graph is not body or not _is_default(red):
        raise Refused(f"{label}: the Loop body is not an EmbeddingBag", v)
    if red.op_type != "ReduceSum":
        mode = {"ReduceMean": "mean", "ReduceMax": "max"}.get(red.op_type, red.op_type)
        raise Refused(f"{label}: the bag is reduced with {red.op_type} (EmbeddingBag mode={mode!r}): only "
                      "mode='sum' is fused", v)
    if _int_attr(red, "keepdims", 1) != 0 or _int_attr(red, "noop_with_empty_axes", 0) != 0 \
            or len(red.inputs) < 2 or _const_list(red.inputs[1]) != [0]:
        raise Refused(f"{label}: the bag ReduceSum is not over axis 0 without keepdims", v)
    g = _op(red.inputs[0], "Gather")
    if g is None or _int_attr(g, "axis", 0) != 0:
        raise Refused(f"{label}: the bag rows are not gathered from a table (per-sample weights are not fused)", v)
    table = g.inputs[0]
    _float_table(table, f"the embedding table of {label}")
    sl = _op(g.inputs[1], "Slice")
    if sl is None or len(sl.inputs) < 4 or _const_list(sl.inputs[3]) != [0] or \
            (len(sl.inputs) > 4 and sl.inputs[4] is not None and _const_list(sl.inputs[4]) != [1]):
        raise Refused(f"{label}: the bag is not a slice of the indices", v)
    idx = sl.inputs[0]

    def at_iter(u: ir.Value) -> ir.Value:
        un = _op(u, "Unsqueeze")
        if un is None or len(un.inputs) < 2 or _const_list(un.inputs[1]) != [0]:
            raise Refused(f"{label}: the bag bounds are not the offsets at the iteration", v)
        ga = _op(un.inputs[0], "Gather")
        if ga is None or _int_attr(ga, "axis", 0) != 0 or ga.inputs[1] is not it:
            raise Refused(f"{label}: the bag bounds are not the offsets at the iteration", v)
        return ga.inputs[0]

    starts, ends = at_iter(sl.inputs[1]), at_iter(sl.inputs[2])
    # starts = Concat(offsets_f, [len(indices_f)]); ends = starts[1:]; the trip count is len(ends)
    cat = _op(starts, "Concat")
    if cat is None or _int_attr(cat, "axis", 0) != 0 or len(cat.inputs) != 2:
        raise Refused(f"{label}: the bag starts are not the offsets followed by the number of indices", v)
    n_u = _op(cat.inputs[1], "Unsqueeze")
    n_g = _op(n_u.inputs[0], "Gather") if n_u is not None and _const_list(n_u.inputs[1]) == [0] else None
    n_s = _op(n_g.inputs[0], "Shape") if n_g is not None and _scalar(n_g.inputs[1]) == 0 else None
    if n_s is None or n_s.inputs[0] is not idx or _int_attr(n_s, "start", 0) != 0:
        raise Refused(f"{label}: the last bag does not end at the number of indices", v)
    es = _op(ends, "Slice")
    if es is None or es.inputs[0] is not starts or _const_list(es.inputs[1]) != [1] or \
            (_const_list(es.inputs[2]) or [0])[0] < 2 ** 62 or \
            (len(es.inputs) > 3 and es.inputs[3] is not None and _const_list(es.inputs[3]) != [0]) or \
            (len(es.inputs) > 4 and es.inputs[4] is not None and _const_list(es.inputs[4]) != [1]):
        raise Refused(f"{label}: the bag ends are not the next offsets", v)
    t_g = _op(trip, "Gather")
    t_s = _op(t_g.inputs[0], "Shape") if t_g is not None and _scalar(t_g.inputs[1]) == 0 else None
    if t_s is None or t_s.inputs[0] is not ends or _int_attr(t_s, "start", 0) != 0:
        raise Refused(f"{label}: the Loop does not run once per bag", v)
    for node in (loop, cat, n_u, n_g, n_s, es, t_g, t_s):
        m.read(node)
    for val in (starts, ends, cat.inputs[1], n_u.inputs[0], n_g.inputs[0], trip, t_g.inputs[0]):
        m.keep_private(val)
    indices, row_i = _row_of(m, idx, 0)
    offsets, row_o = _row_of(m, cat.inputs[0], 0)
    m.keep_private(idx)
    m.keep_private(cat.inputs[0])
    if row_i != row_o:
        raise Refused(f"{label}: indices row {row_i} is bagged with offsets row {row_o}", v)
    return Leaf(v, "bag", table, indices, offsets, row_i)


# ------------------------------------------------------------------------------------------------ the pass
@dataclasses.dataclass
class Found:
    interaction: str
    final: ir.Node
    leaves: list[Leaf]      # v_0 (X) then the features in order
    match: _Match
    hash_nodes: list[ir.Node] = dataclasses.field(default_factory=list)
    ids: ir.Value | None = None
    cardinality: np.ndarray | None = None
    hash: str = "none"


class EmbeddingInteractionPass:
    """The graph pass (quacks like a rule set: apply_to_model). Refusals of candidates are kept for --explain."""

    def __init__(self, recorder: _base.Recorder):
        self.recorder = recorder
        self.refusals: list[dict] = []
        self.opset: int | None = None

    def apply_to_model(self, model: ir.Model, tracer=None) -> int:
        if tracer is not None:  # --explain's re-run over the fused model: the real pass recorded its refusals
            return 0
        from onnxscript.optimizer import basic_constant_propagation

        self.refusals = []
        self.opset = _base.default_opset(model)
        count = 0
        done: set[int] = set()
        while True:  # the main graph first, then the bodies still there (a rewrite may remove some)
            todo = [g for g in _base.graphs(model.graph) if id(g) not in done]
            if not todo:
                break
            for graph in todo:
                done.add(id(graph))
                for g in [graph, *(a.value for n in graph for a in n.attributes.values()
                                   if a.type == ir.AttributeType.GRAPH)]:
                    basic_constant_propagation(g)
                count += self._graph(model, graph)
        return count

    def _graph(self, model: ir.Model, graph: ir.Graph) -> int:
        count = 0
        explained: set[int] = set()
        for node in reversed(list(graph)):
            if node.graph is not graph or node.op_type != "Concat" or not _is_default(node):
                continue
            try:
                found = self._candidate(graph, node)
            except Refused as r:
                if id(node) not in explained:
                    self._refuse(node, r)
                explained.update(getattr(r, "covered", ()))
                continue
            if found is None:
                continue
            try:
                self._rewrite(model, graph, found)
                count += 1
            except Refused as r:
                self._refuse(node, r)
                explained.update(id(n) for n in found.match.nodes.values())
        return count

    def _refuse(self, node: ir.Node, r: Refused) -> None:
        if r.reason.startswith("the model's opset") and any(x["reason"] == r.reason for x in self.refusals):
            return  # one line for the whole model
        self.refusals.append({"rule": f"{PATTERN}/{getattr(r, 'kind', 'match')}", "node": _base.node_label(node),
                              "op_type": node.op_type, "reason": r.reason})

    # -------------------------------------------------------------------------------------- candidates
    def _opset_check(self) -> None:
        need = max(_base.MIN_OPSET[op] for op in ("EmbeddingInteraction", "EmbeddingBagInteraction"))
        if self.opset is not None and self.opset < need:
            raise Refused(f"the model's opset {self.opset} is below {need}, the lowest in which the embedding ops' "
                          "function bodies (what runs without the kernel library) are valid; export at opset 18 or "
                          "convert the model (onnx.version_converter.convert_version(model, 18))")

    def _candidate(self, graph: ir.Graph, final: ir.Node) -> Found | None:
        """None when `final` is no candidate at all; Found when it matched; Refused (with `covered` node ids so
        that the stacking inside a refused dot candidate is not explained twice) when a candidate fails a check."""
        out = final.outputs[0]
        od = _base.dims(out)
        gram = self._gram_path(final)
        if gram is not None:
            m = _Match(graph, None)
            try:
                self._opset_check()
            except Refused as r:
                r.kind = "dot"
                raise
            try:
                return self._dot(graph, final, gram, m)
            except Refused as r:
                r.kind = "dot"
                r.covered = {id(n) for n in m.nodes.values()}
                raise
        if od is not None and len(od) != 2:
            return None
        try:
            leaves = self._leaves(_Match(graph, None), out, None, probe=True)
        except Refused:
            return None
        if not any(l.kind != "x" for l in leaves):
            return None
        m = _Match(graph, None)
        try:
            self._opset_check()
            return self._cat(graph, final, m)
        except Refused as r:
            r.kind = "cat"
            raise

    def _gram_path(self, final: ir.Node):
        """(Gram node, T, path of data-movement nodes from the Gram to the final Concat's second input), when the
        final Concat is [X, pairwise products of T]; else None."""
        if len(final.inputs) != 2:
            return None
        v, path = final.inputs[1], []
        for _ in range(_MAX_DEPTH):
            node = v.producer() if v is not None else None
            if node is None:
                return None
            if node.op_type == "MatMul" and _is_default(node):
                tr = _op(node.inputs[1], "Transpose")
                if tr is not None and tr.inputs[0] is node.inputs[0]:
                    return node, node.inputs[0], path, tr
                return None
            if node.op_type == "FusedMatMul" and node.domain == "com.microsoft":
                if node.inputs[0] is node.inputs[1]:
                    return node, node.inputs[0], path, None
                return None
            if not _is_default(node) or node.op_type not in _MOVES or node.op_type == "Concat":
                return None
            path.append(node)
            v = node.inputs[0]
        return None

    def _leaves(self, m: _Match, v: ir.Value, x: ir.Value | None, probe: bool = False) -> list[Leaf]:
        """The vectors a stacking/concatenation is made of, walking back through data-movement nodes: X, then the
        embeddings. With `probe` nothing is refused: non-embedding leaves are reported as 'x'."""
        out: list[Leaf] = []
        seen: set[int] = set()

        def walk(u: ir.Value, depth: int) -> None:
            if id(u) in seen:
                raise Refused(f"{_name(u)} is stacked twice", u)
            seen.add(id(u))
            if depth > _MAX_DEPTH:
                raise Refused("the stacking of the vectors is too deep", u)
            if x is not None and u is x:
                out.append(Leaf(u, "x"))
                return
            try:
                leaf = _onehot_leaf(m, u) or _bag_leaf(m, u)
            except Refused:
                if probe:
                    out.append(Leaf(u, "onehot"))  # an embedding-like node: a candidate worth explaining
                    return
                raise
            if leaf is not None:
                m.keep_private(u)
                out.append(leaf)
                return
            node = u.producer()
            if _is_default(node) and node.op_type in _MOVES and node.op_type != "Gather":
                m.read(node)
                m.keep_private(u)
                for i in ([*node.inputs] if node.op_type == "Concat" else [node.inputs[0]]):
                    walk(i, depth + 1)
                return
            if x is None and not any(l.kind == "x" for l in out):
                out.append(Leaf(u, "x"))
                return
            if probe:
                out.append(Leaf(u, "x"))
                return
            raise Refused(f"{_name(u)} (from {_base.node_label(node) if node else 'a graph input'}) is neither the "
                          "dense vector nor an embedding lookup", u)

        walk(v, 0)
        return out

    def _stack(self, m: _Match, v: ir.Value, leaves: list[Leaf]) -> Abs:
        """Run the data movement from the leaves to `v`; leaf j is labelled j (its elements j*d + c)."""
        label = {id(l.value): j for j, l in enumerate(leaves)}
        d = m.d

        def ev(u: ir.Value) -> Abs:
            if id(u) in m.abs:
                return m.abs[id(u)]
            if id(u) in label:
                a = Abs([BATCH, d], 0, label[id(u)] * d + np.arange(d, dtype=np.int64))
            else:
                node = u.producer()
                ins = [ev(i) for i in (node.inputs if node.op_type == "Concat" else node.inputs[:1])]
                a = m.run(node, ins)
            m.abs[id(u)] = a
            return a

        return ev(v)

    def _vectors(self, m: _Match, leaves: list[Leaf], content: np.ndarray, n: int) -> list[Leaf]:
        """The leaves in the order the content holds them ([n, d] rows of j*d + c); refuses any other layout."""
        d = m.d
        rows = content.reshape(n, d)
        order = rows[:, 0] // d
        if sorted(order.tolist()) != list(range(n)) or not np.array_equal(
                rows, order[:, None] * d + np.arange(d)[None, :]):
            raise Refused("the vectors are not laid out whole, one after the other")
        vecs = [leaves[j] for j in order]
        if vecs[0].kind != "x":
            raise Refused("the dense vector is not the first of the interaction's vectors", vecs[0].value)
        return vecs

    def _check_leaves(self, m: _Match, leaves: list[Leaf]) -> None:
        xs = [l for l in leaves if l.kind == "x"]
        if len(xs) != 1:
            raise Refused(f"{len(xs)} vectors are neither embeddings nor the dense vector "
                          f"({', '.join(_name(l.value) for l in xs)})")
        m.set_x(xs[0].value)
        kinds = {l.kind for l in leaves if l.kind != "x"}
        if len(kinds) != 1:
            raise Refused("the embeddings mix single-id lookups and bags")
        for l in leaves:
            if l.kind == "x":
                continue
            td = l.table.const_value.shape
            if int(td[1]) != m.d:
                raise Refused(f"the table {_name(l.table)} is {int(td[1])} wide, the dense vector {m.d}: the op "
                              "needs one width", l.table)
            if l.table.dtype != m.x.dtype:
                raise Refused(f"the table {_name(l.table)} is {l.table.dtype.name.lower()}, the dense vector "
                              f"{m.x.dtype.name.lower() if m.x.dtype else '?'}", l.table)

    def _dot(self, graph, final: ir.Node, gram, m: _Match) -> Found:
        gram_node, t_val, path, transpose = gram
        x = final.inputs[0]
        m.set_x(x)
        if _int_attr(final, "axis", 0) not in (1, -1):
            raise Refused(f"{_base.node_label(final)} does not concatenate along the features")
        if gram_node.op_type == "FusedMatMul":
            a = gram_node.attributes
            if a.get("alpha") is not None and a.get("alpha").value != 1.0 or any(
                    _int_attr(gram_node, k, 0) != want for k, want in
                    (("transA", 0), ("transB", 1), ("transBatchA", 0), ("transBatchB", 0))):
                raise Refused(f"{_base.node_label(gram_node)} is not T @ T^T (FusedMatMul transB=1, alpha=1)")
        elif list(_int_attr(transpose, "perm", [])) != [0, 2, 1]:
            raise Refused(f"{_base.node_label(transpose)} does not swap the last two axes of the stacked vectors")
        m.read(final)
        m.read(gram_node)
        if transpose is not None:
            m.read(transpose)
            m.keep_private(transpose.outputs[0])
        m.keep_private(t_val)
        m.keep_private(gram_node.outputs[0])
        for node in path:
            m.read(node)
            m.keep_private(node.outputs[0])
        leaves = self._leaves(m, t_val, x)
        self._check_leaves(m, leaves)
        n = len(leaves)
        t_abs = self._stack(m, t_val, leaves)
        if t_abs.dims != [BATCH, n, m.d] or t_abs.bax != 0:
            raise Refused(f"the stacked vectors {_name(t_val)} are {t_abs.dims}, not [batch, {n}, {m.d}]", t_val)
        vecs = self._vectors(m, leaves, t_abs.content, n)
        z = Abs([BATCH, n, n], 0, np.arange(n * n, dtype=np.int64).reshape(n, n))
        m.abs[id(gram_node.outputs[0])] = z
        for node in reversed(path):
            z = m.run(node, [z])
            m.abs[id(node.outputs[0])] = z
        li, lj = np.tril_indices(n, -1)
        want = li * n + lj
        if z.bax != 0 or len(z.dims) != 2:
            raise Refused(f"the selected products {_name(final.inputs[1])} are {z.dims}, not [batch, pairs]",
                          final.inputs[1])
        if not np.array_equal(z.content, want):
            got = [(int(c) // n, int(c) % n) for c in z.content.reshape(-1)[:6]]
            raise Refused(f"the selected products are not the strict lower triangle i > j in row-major order "
                          f"(first pairs {got}; DLRM's arch_interaction_itself or another selection is not fused)",
                          final.inputs[1])
        return self._finish(Found("dot", final, vecs, m))

    def _cat(self, graph, final: ir.Node, m: _Match) -> Found:
        out = final.outputs[0]
        leaves = self._leaves(m, out, None)
        self._check_leaves(m, leaves)
        m.read(final)
        n = len(leaves)
        a = self._stack(m, out, leaves)
        if a.dims != [BATCH, n * m.d] or a.bax != 0:
            raise Refused(f"{_name(out)} is {a.dims}, not the [batch, {n * m.d}] concatenation of the vectors", out)
        vecs = self._vectors(m, leaves, a.content, n)
        return self._finish(Found("cat", final, vecs, m))

    # -------------------------------------------------------------------------------------- features, hash
    def _finish(self, f: Found) -> Found:
        m = f.match
        feats = f.leaves[1:]
        kind = feats[0].kind
        ids = {id(l.ids) for l in feats}
        if len(ids) != 1 or (kind == "bag" and len({id(l.offsets) for l in feats}) != 1):
            raise Refused("the features are not columns of one id matrix (and one offsets matrix)")
        cols = [l.column for l in feats]
        n_feat = len(feats)
        if cols != list(range(n_feat)):
            raise Refused(f"feature f must read id column f: the vectors read columns {cols}")
        src = feats[0].ids
        sd = _base.dims(src)
        axis = 1 if kind == "onehot" else 0
        if sd is None or len(sd) != 2 or sd[axis] != n_feat:
            raise Refused(f"the id matrix {_name(src)} has shape {sd}: it must have exactly {n_feat} features", src)
        if src.dtype != ir.DataType.INT64:
            raise Refused(f"the ids {_name(src)} are {src.dtype.name.lower() if src.dtype else '?'}, not int64", src)
        if kind == "bag":
            od = _base.dims(feats[0].offsets)
            if od is None or len(od) != 2 or od[0] != n_feat or feats[0].offsets.dtype != ir.DataType.INT64:
                raise Refused(f"the offsets {_name(feats[0].offsets)} are not int64 [{n_feat}, batch]",
                              feats[0].offsets)
        rows = np.array([int(l.table.const_value.shape[0]) for l in feats], dtype=np.int64)
        f.ids, f.cardinality = src, rows
        if kind == "onehot":
            self._hash(f, rows)
        return f

    def _hash(self, f: Found, rows: np.ndarray) -> None:
        """Absorb (ids + 1) mod cardinality when spelled exactly so; otherwise the op takes the id matrix as it is."""
        m = f.match
        mod = _op(f.ids, "Mod")
        if mod is None or _int_attr(mod, "fmod", 0) != 0:
            return
        add = _op(mod.inputs[0], "Add")
        if add is None:
            return
        for a, b in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
            one = _base.const(b)
            if one is None or one.dtype.kind not in "iu" or one.ndim > 2 or not np.all(one == 1):
                continue
            card = _base.const(mod.inputs[1])
            ad = _base.dims(a)
            if card is None or card.dtype.kind not in "iu" or ad is None or len(ad) != 2 or card.ndim > 2 \
                    or (card.ndim >= 1 and card.shape[-1] not in (1, len(rows))) or \
                    (card.ndim == 2 and card.shape[0] != 1) or a.dtype != ir.DataType.INT64:
                return
            per = np.broadcast_to(card.reshape(-1) if card.ndim else card.reshape(1), (len(rows),)).astype(np.int64)
            if np.any(per <= 0) or np.any(per > rows):
                return  # the unfused Gather would fail (or read another table): keep the hash in the graph
            users = {id(n) for n in m.nodes.values()}
            if f.ids.is_graph_output() or any(id(u.node) not in users for u in f.ids.uses()) or \
                    add.outputs[0].is_graph_output() or len(add.outputs[0].uses()) != 1:
                return  # the hashed ids are needed elsewhere: the op takes them as they are
            m.read(add)
            m.read(mod)
            m.keep_private(f.ids)
            m.keep_private(add.outputs[0])
            f.hash_nodes = [add, mod]
            f.ids, f.cardinality, f.hash = a, per, "mod"
            return

    # -------------------------------------------------------------------------------------- rewrite
    def _removable(self, graph: ir.Graph, f: Found) -> list[ir.Node]:
        """The matched nodes whose outputs are only used inside the match: a fixpoint (shape helpers and constants
        shared with the rest of the graph stay)."""
        m = f.match
        cand = {k: n for k, n in m.nodes.items() if n.graph is graph}
        outputs = set(id(v) for v in graph.outputs)

        def inside(keep: dict) -> set[int]:
            """ids of the nodes of `keep` and of every node in their Loop/If bodies."""
            out = set(keep)
            stack = [a.value for n in keep.values() for a in n.attributes.values() if a.type == ir.AttributeType.GRAPH]
            while stack:
                g = stack.pop()
                for inner in g:
                    out.add(id(inner))
                    stack += [a.value for a in inner.attributes.values() if a.type == ir.AttributeType.GRAPH]
            return out

        changed = True
        while changed:
            changed = False
            internal = inside(cand)
            for k, n in list(cand.items()):
                if n is f.final:
                    continue
                if any(id(v) in outputs or any(id(u.node) not in internal for u in v.uses()) for v in n.outputs):
                    del cand[k]
                    changed = True
        # name the root cause: a private value that is a graph output or read outside the whole match, before the
        # values that only lost their consumers to it
        everything = inside({k: n for k, n in m.nodes.items() if n.graph is graph})
        ordered = sorted(m.data.values(), key=lambda v: not (v.is_graph_output() or any(
            id(u.node) not in everything for u in v.uses())))
        for v in ordered:
            p = v.producer()
            if p is None or id(p) not in cand:
                internal = inside(cand)
                users = [u.node for u in v.uses() if id(u.node) not in internal]
                other = "a graph output" if v.is_graph_output() else \
                    ", ".join(sorted({_base.node_label(u) for u in users})) or "another node"
                raise Refused(f"{_name(v)} is also used by {other}: it must stay in memory, so the lookups and the "
                              "interaction are not fused", v)
        return list(cand.values())

    def _rewrite(self, model: ir.Model, graph: ir.Graph, f: Found) -> None:
        m, final = f.match, f.final
        feats = f.leaves[1:]
        op_type = "EmbeddingInteraction" if feats[0].kind == "onehot" else "EmbeddingBagInteraction"
        removable = self._removable(graph, f)
        # one concatenated table; a table several features share is stored once
        blocks, starts, offsets = [], {}, []
        total = 0
        for l in feats:
            if id(l.table) not in starts:
                arr = l.table.const_value.numpy()
                starts[id(l.table)] = total
                blocks.append(arr)
                total += arr.shape[0]
            offsets.append(starts[id(l.table)])
        table = np.ascontiguousarray(np.concatenate(blocks, axis=0))
        x = m.x
        dtype = x.dtype
        n = len(f.leaves)
        width = interaction_width(n, m.d, f.interaction)
        tbl = self._initializer(graph, "embedding_table", table)
        toff = self._initializer(graph, "embedding_table_offsets", np.asarray(offsets, dtype=np.int64))
        card = self._initializer(graph, "embedding_cardinality", np.asarray(f.cardinality, dtype=np.int64))
        attrs = [ir.AttrString("interaction", f.interaction), ir.AttrString("backend", "auto")]
        if op_type == "EmbeddingInteraction":
            attrs.insert(1, ir.AttrString("hash", f.hash))
            inputs = [x, f.ids, tbl, toff, card]
            overload = embedding_overload(op_type, f.interaction, f.hash)
        else:
            inputs = [x, feats[0].ids, feats[0].offsets, tbl, toff, card]
            overload = embedding_overload(op_type, f.interaction)
        node = ir.Node(DOMAIN, op_type, inputs, attrs, overload=overload, num_outputs=1)
        old_out = final.outputs[0]
        node.outputs[0].dtype = dtype
        od = _base.dims(old_out)
        xd = _base.dims(x)
        node.outputs[0].shape = old_out.shape if od is not None else ir.Shape([xd[0], width])
        replaced = [(nd.name or "?", nd.op_type) for nd in removable]
        batch = xd[0] if isinstance(xd[0], int) else None
        flops = None if batch is None or f.interaction != "dot" else batch * (n * (n - 1) // 2) * 2 * m.d
        shapes = {"X": xd, "ids" if op_type == "EmbeddingInteraction" else "indices": _base.dims(inputs[1]),
                  "table": [int(table.shape[0]), m.d], "Y": [xd[0], width]}
        extra = (f"features: {len(feats)} ({len(blocks)} tables, {int(table.shape[0])} rows)",
                 f"interaction: {f.interaction}",
                 f"hash: {'(id + 1) mod cardinality' if f.hash == 'mod' else 'none'}", *EMBEDDING_DOC)
        _base.annotate(node, self.recorder, PATTERN, f"{PATTERN}/{f.interaction}", op_type,
                       _base.module_path(removable), replaced, shapes, dtype, flops, extra_doc=extra)
        graph.insert_before(final, node)
        node.outputs[0].name = old_out.name
        ir.convenience.replace_all_uses_with([old_out], [node.outputs[0]], replace_graph_outputs=True)
        _detach_and_remove(graph, removable)

    def _initializer(self, graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
        name = self.recorder.unique(name)
        v = ir.Value(name=name, const_value=ir.tensor(array, name=name))
        graph.register_initializer(v)
        return v


def _detach_and_remove(graph: ir.Graph, nodes: list[ir.Node]) -> None:
    """Remove `nodes` from `graph`, first detaching them (and the nodes of their Loop bodies) from their inputs, so
    that no removed node still counts as a use of a table or of a graph input."""

    def detach(node: ir.Node) -> None:
        for a in node.attributes.values():
            if a.type == ir.AttributeType.GRAPH:
                for inner in list(a.value):
                    detach(inner)
        for i in range(len(node.inputs)):
            node.replace_input_with(i, None)

    for node in nodes:
        detach(node)
    graph.remove(nodes, safe=False)


def rules(recorder):
    return EmbeddingInteractionPass(recorder)
