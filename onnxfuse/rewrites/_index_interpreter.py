"""The abstract interpreter of the embedding_interaction pass: it proves what a chain of data-movement nodes does.

Every element of a value is labelled with the source element it holds (an index array over the non-batch axes);
the batch axis is tracked symbolically (BATCH) and must never mix with another axis. `Match.run` applies one
data-movement node (Identity, Unsqueeze, Squeeze, Reshape, Flatten, Transpose, Gather / GatherND with constant
indices, Concat) to such values; `Match.ints` evaluates the small integer tensors (constants and Shape arithmetic)
that feed their shape and index inputs. Anything it cannot evaluate exactly raises Refused with the reason, which
`onnxfuse fuse --explain` prints. A `Match` also records the nodes a candidate read and the values that must have no
use outside it.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from onnxscript import ir

from . import _base

DEFAULT_DOMAINS = ("", "ai.onnx")
# Data-movement ops the interpreter runs (input 0 is the data, Concat takes several).
MOVES = ("Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Transpose", "Gather", "GatherND", "Concat")
MAX_DEPTH = 64


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


def prod(values) -> int:
    return math.prod(int(v) for v in values)


@dataclasses.dataclass
class Abs:
    """A value as the interpreter sees it: its dims (ints, and BATCH at axis `bax`) and, for every element of the
    non-batch axes, the label of the source element it holds."""
    dims: list
    bax: int
    content: np.ndarray


def value_name(v: ir.Value | None) -> str:
    return "?" if v is None else (v.name or "?")


def is_default(node: ir.Node | None) -> bool:
    return node is not None and node.domain in DEFAULT_DOMAINS


def made_by(v: ir.Value | None, *types: str) -> ir.Node | None:
    """The producer of `v` if it is a default-domain node of one of `types`."""
    node = v.producer() if v is not None else None
    return node if is_default(node) and node.op_type in types else None


def int_attr(node: ir.Node, name: str, default):
    a = node.attributes.get(name)
    return default if a is None else a.value


class Match:
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
            raise Refused(f"the dense vector {value_name(x)} has shape {xd}: a [batch, d] tensor with a static d is "
                          "needed", x)
        self.x = x
        self.d = xd[1]
        self.bsize = xd[0] if isinstance(xd[0], int) else None
        self.bname = xd[0] if isinstance(xd[0], str) else None
        if self.bsize is None and self.bname is None:
            raise Refused(f"the batch dimension of {value_name(x)} is unknown", x)

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
            raise Refused(f"the shape of {value_name(v)} is unknown", v)
        out = []
        for s in d:
            if isinstance(s, int):
                out.append(s)
            elif s == self.bname:
                out.append(BATCH)
            else:
                raise Refused(f"{value_name(v)} has a symbolic dimension {s!r} other than the batch", v)
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
        if depth > MAX_DEPTH:
            raise Refused(f"{value_name(v)}: shape computation too deep", v)
        c = _base.const(v)
        if c is not None:
            if c.dtype.kind not in "iu":
                raise Refused(f"{value_name(v)} is a {c.dtype} constant where integers are needed", v)
            return np.asarray(c, dtype=np.int64).astype(object)
        node = v.producer()
        if not is_default(node):
            raise Refused(f"{value_name(v)} is neither a constant nor computed from shapes", v)
        self.read(node)
        op = node.op_type
        if op == "Shape":
            dims = self.shape_of(node.inputs[0])
            r = len(dims)
            start, end = int_attr(node, "start", 0), int_attr(node, "end", r)
            start, end = (start + r if start < 0 else start), (end + r if end < 0 else end)
            return np.array(dims[max(0, min(start, r)):max(0, min(end, r))], dtype=object)
        if op in ("Identity", "Cast"):
            return self.ints(node.inputs[0], depth + 1)
        if op == "Gather":
            data, idx = self.ints(node.inputs[0], depth + 1), self.ints(node.inputs[1], depth + 1)
            axis = int_attr(node, "axis", 0)
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
            return np.concatenate(parts, axis=int_attr(node, "axis", 0))
        if op in ("Add", "Sub", "Mul"):
            a, b = self.ints(node.inputs[0], depth + 1), self.ints(node.inputs[1], depth + 1)
            if any(x is BATCH for x in [*a.ravel(), *b.ravel()]):
                raise Refused(f"{_base.node_label(node)}: arithmetic on the batch size", v)
            a, b = a.astype(np.int64), b.astype(np.int64)
            return ({"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op](a, b)).astype(object)
        raise Refused(f"{value_name(v)} is computed by {_base.node_label(node)} ({op}), which the index check does not "
                      "evaluate", v)

    # ------------------------------------------------------------------------------------------ data movement
    def run(self, node: ir.Node, ins: list[Abs]) -> Abs:
        """What `node` computes from its inputs' abstract values (the ops of MOVES, one method each)."""
        op = node.op_type
        if op == "Identity":
            return ins[0]
        method = self._METHODS.get(op)
        if method is None:
            raise Refused(f"{_base.node_label(node)}: {op} is not a data-movement op the index check runs")
        return getattr(self, method)(node, ins, ins[0], op, _base.node_label(node))

    # op -> the method that moves its indices (the ops of MOVES; Identity passes its input through)
    _METHODS = {"Transpose": "_op_transpose", "Reshape": "_op_reshape", "Flatten": "_op_flatten",
                "Unsqueeze": "_op_unsqueeze", "Squeeze": "_op_unsqueeze", "Gather": "_op_gather",
                "GatherND": "_op_gathernd", "Concat": "_op_concat"}

    def _op_transpose(self, node: ir.Node, ins: list[Abs], a: Abs, op: str, label: str) -> Abs:
        rank = len(a.dims)
        perm = list(int_attr(node, "perm", list(range(rank))[::-1]))
        if sorted(perm) != list(range(rank)):
            raise Refused(f"{label}: bad perm {perm}")
        old_nb = [i for i in range(rank) if i != a.bax]
        order = [old_nb.index(p) for p in perm if p != a.bax]
        return Abs([a.dims[p] for p in perm], perm.index(a.bax), a.content.transpose(order))

    def _op_reshape(self, node: ir.Node, ins: list[Abs], a: Abs, op: str, label: str) -> Abs:
        return self._reshape(a, list(self.ints(node.inputs[1]).ravel()), int_attr(node, "allowzero", 0), label)

    def _op_flatten(self, node: ir.Node, ins: list[Abs], a: Abs, op: str, label: str) -> Abs:
        rank = len(a.dims)
        axis = int_attr(node, "axis", 1)
        axis = axis + rank if axis < 0 else axis
        left = [s for i, s in enumerate(a.dims[:axis]) if i != a.bax]
        right = [s for i, s in enumerate(a.dims[axis:], start=axis) if i != a.bax]
        if a.bax < axis:
            target = [BATCH if prod(left) == 1 else -2, prod(right)]
        else:
            target = [prod(left), BATCH if prod(right) == 1 else -2]
        if -2 in target:
            raise Refused(f"{label}: Flatten merges the batch axis with other axes")
        return self._reshape(a, target, 1, label)

    def _op_unsqueeze(self, node: ir.Node, ins: list[Abs], a: Abs, op: str, label: str) -> Abs:
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

    def _op_gather(self, node: ir.Node, ins: list[Abs], a: Abs, op: str, label: str) -> Abs:
        rank = len(a.dims)
        axis = int_attr(node, "axis", 0)
        axis = axis + rank if axis < 0 else axis
        if axis == a.bax:
            raise Refused(f"{label}: gathers along the batch axis")
        idx = self._indices(node.inputs[1], a.dims[axis], label)
        ax = axis if axis < a.bax else axis - 1
        dims = a.dims[:axis] + list(idx.shape) + a.dims[axis + 1:]
        bax = a.bax if a.bax < axis else a.bax + idx.ndim - 1
        return Abs(dims, bax, np.take(a.content, idx, axis=ax))

    def _op_gathernd(self, node: ir.Node, ins: list[Abs], a: Abs, op: str, label: str) -> Abs:
        if int_attr(node, "batch_dims", 0) != 0:
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

    def _op_concat(self, node: ir.Node, ins: list[Abs], a: Abs, op: str, label: str) -> Abs:
        rank = len(a.dims)
        axis = int_attr(node, "axis", 0)
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
        pre, post = prod(a.dims[:a.bax]), prod(a.dims[a.bax + 1:])
        if any(v is not BATCH and v < -1 for v in t) or sum(1 for v in t if v is not BATCH and v == -1) > 1:
            raise Refused(f"{label}: invalid target shape {t}")
        if self.bsize is not None:  # static batch: plain ints, then find the axis that is the batch
            t = [self.bsize if v is BATCH else int(v) for v in t]
            total = pre * self.bsize * post
            if -1 in t:
                known = prod(v for v in t if v != -1)
                if known == 0 or total % known:
                    raise Refused(f"{label}: target shape {t} does not fit {total} elements")
                t[t.index(-1)] = total // known
            if prod(t) != total:
                raise Refused(f"{label}: target shape {t} does not fit {total} elements")
            q = next((q for q in range(len(t)) if prod(t[:q]) == pre and t[q] == self.bsize
                      and prod(t[q + 1:]) == post), None)
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
                        known = prod(v for v in side if v != -1)
                        if known == 0 or want % known:
                            raise Refused(f"{label}: the reshape mixes the batch axis with other axes")
                        side[side.index(-1)] = want // known
                    if prod(side) != want:
                        raise Refused(f"{label}: the reshape mixes the batch axis with other axes")
                t = left + [BATCH] + right
            else:
                if -1 not in t:
                    raise Refused(f"{label}: the target shape {t} fixes the batch size of a dynamic batch")
                q = t.index(-1)
                if prod(v for v in t if v != -1) != pre * post or prod(t[:q]) != pre:
                    raise Refused(f"{label}: the reshape to {t} mixes the batch axis with other axes")
        dims = [BATCH if i == q else int(v) for i, v in enumerate(t)]
        return Abs(dims, q, a.content.reshape([v for i, v in enumerate(dims) if i != q]))
