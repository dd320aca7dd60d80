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
    shape inputs) are run by a small abstract interpreter over index arrays (_index_interpreter.py): every element
    of a value is labelled with the source element it holds, the batch axis is tracked symbolically, and a Reshape
    that would mix the batch axis with another refuses. The stacked vectors must come out as [B, n, d] holding
    v_0..v_F in order, and the selected products as [B, n(n-1)/2] holding (i, j) for i > j in row-major order:
    exactly the op's output.
    Whatever the exporter (dynamo's GatherND, TorchScript's Flatten + Gather of i*n + j with Shape arithmetic,
    onnxruntime's folded constants), only the index arrays matter;
  * the product is MatMul(T, Transpose(T, [0, 2, 1])) or onnxruntime's FusedMatMul(T, T, transB=1, alpha=1)
    (fuse's stage 1 makes it);
  * each embedding is Gather(table, column f of one id matrix) with a constant table [R_f, d], or TorchScript's
    EmbeddingBag Loop (slice indices[offsets[b] : offsets[b+1]], gather, ReduceSum over the bag) checked node by
    node (_embedding_leaves.py), its indices and offsets rows of stacked [F, N] / [F, B] matrices or one tensor per
    table (DLRM_Net called with lists: the rewrite concatenates them before the op, _embedding_leaves.bag_inputs).
    The hash (id + 1) mod cardinality is absorbed when spelled exactly so (Mod with
    fmod=0, the constant 1, a per-feature constant 0 < cardinality <= rows); any other id computation stays in the
    graph and the op looks the ids up as they come (sound: the op indexes exactly like Gather, negative ids
    included).

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

import numpy as np
from onnxscript import ir

from ..ops.embedding_interaction import EMBEDDING_BAG_INTERACTION, EMBEDDING_INTERACTION, OPS
from ..schema import DOMAIN, embedding_overload, interaction_width
from . import _base
from ._embedding_leaves import Leaf, bag_inputs, bag_leaf, onehot_leaf
from ._index_interpreter import (BATCH, MAX_DEPTH, MOVES, Abs, Match, Refused, int_attr, is_default, made_by,
                                 value_name)

PATTERN = "embedding_interaction"
EMBEDDING_DOC = ("GPU: one kernel (hash, every lookup,",
                 "  the pairwise dots or the concat);",
                 "  CPU: one pass per sample")


# ------------------------------------------------------------------------------------------------ the pass
@dataclasses.dataclass
class Found:
    interaction: str
    final: ir.Node
    leaves: list[Leaf]      # v_0 (X) then the features in order
    match: Match
    hash_nodes: list[ir.Node] = dataclasses.field(default_factory=list)
    ids: ir.Value | None = None
    cardinality: np.ndarray | None = None
    hash: str = "none"
    # bags: whether the indices / offsets are one stacked matrix (else one tensor per feature, of its own length)
    stacked_indices: bool = True
    stacked_offsets: bool = True


class EmbeddingInteractionPass(_base.GraphPass):
    """The graph pass. Refusals of candidates are kept for --explain."""

    def __init__(self, recorder: _base.Recorder):
        super().__init__(recorder)
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
            if node.graph is not graph or node.op_type != "Concat" or not is_default(node):
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
        need = max(_base.MIN_OPSET[s.name] for s in OPS)
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
            m = Match(graph, None)
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
            leaves = self._leaves(Match(graph, None), out, None, probe=True)
        except Refused:
            return None
        if not any(l.kind != "x" for l in leaves):
            return None
        m = Match(graph, None)
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
        for _ in range(MAX_DEPTH):
            node = v.producer() if v is not None else None
            if node is None:
                return None
            if node.op_type == "MatMul" and is_default(node):
                tr = made_by(node.inputs[1], "Transpose")
                if tr is not None and tr.inputs[0] is node.inputs[0]:
                    return node, node.inputs[0], path, tr
                return None
            if node.op_type == "FusedMatMul" and node.domain == "com.microsoft":
                if node.inputs[0] is node.inputs[1]:
                    return node, node.inputs[0], path, None
                return None
            if not is_default(node) or node.op_type not in MOVES or node.op_type == "Concat":
                return None
            path.append(node)
            v = node.inputs[0]
        return None

    def _leaves(self, m: Match, v: ir.Value, x: ir.Value | None, probe: bool = False) -> list[Leaf]:
        """The vectors a stacking/concatenation is made of, walking back through data-movement nodes: X, then the
        embeddings. With `probe` nothing is refused: non-embedding leaves are reported as 'x'."""
        out: list[Leaf] = []
        seen: set[int] = set()

        def walk(u: ir.Value, depth: int) -> None:
            if id(u) in seen:
                raise Refused(f"{value_name(u)} is stacked twice", u)
            seen.add(id(u))
            if depth > MAX_DEPTH:
                raise Refused("the stacking of the vectors is too deep", u)
            if x is not None and u is x:
                out.append(Leaf(u, "x"))
                return
            try:
                leaf = onehot_leaf(m, u) or bag_leaf(m, u)
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
            if is_default(node) and node.op_type in MOVES and node.op_type != "Gather":
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
            raise Refused(f"{value_name(u)} (from {_base.node_label(node) if node else 'a graph input'}) "
                          "is neither the dense vector nor an embedding lookup", u)

        walk(v, 0)
        return out

    def _stack(self, m: Match, v: ir.Value, leaves: list[Leaf]) -> Abs:
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

    def _vectors(self, m: Match, leaves: list[Leaf], content: np.ndarray, n: int) -> list[Leaf]:
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

    def _check_leaves(self, m: Match, leaves: list[Leaf]) -> None:
        xs = [l for l in leaves if l.kind == "x"]
        if len(xs) != 1:
            raise Refused(f"{len(xs)} vectors are neither embeddings nor the dense vector "
                          f"({', '.join(value_name(l.value) for l in xs)})")
        m.set_x(xs[0].value)
        kinds = {l.kind for l in leaves if l.kind != "x"}
        if len(kinds) != 1:
            raise Refused("the embeddings mix single-id lookups and bags")
        for l in leaves:
            if l.kind == "x":
                continue
            td = l.table.const_value.shape
            if int(td[1]) != m.d:
                raise Refused(f"the table {value_name(l.table)} is {int(td[1])} wide, the dense vector {m.d}: the op "
                              "needs one width", l.table)
            if l.table.dtype != m.x.dtype:
                raise Refused(f"the table {value_name(l.table)} is {l.table.dtype.name.lower()}, the dense vector "
                              f"{m.x.dtype.name.lower() if m.x.dtype else '?'}", l.table)

    def _dot(self, graph, final: ir.Node, gram, m: Match) -> Found:
        gram_node, t_val, path, transpose = gram
        x = final.inputs[0]
        m.set_x(x)
        if int_attr(final, "axis", 0) not in (1, -1):
            raise Refused(f"{_base.node_label(final)} does not concatenate along the features")
        if gram_node.op_type == "FusedMatMul":
            a = gram_node.attributes
            if a.get("alpha") is not None and a.get("alpha").value != 1.0 or any(
                    int_attr(gram_node, k, 0) != want for k, want in
                    (("transA", 0), ("transB", 1), ("transBatchA", 0), ("transBatchB", 0))):
                raise Refused(f"{_base.node_label(gram_node)} is not T @ T^T (FusedMatMul transB=1, alpha=1)")
        elif list(int_attr(transpose, "perm", [])) != [0, 2, 1]:
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
            raise Refused(f"the stacked vectors {value_name(t_val)} are {t_abs.dims}, not [batch, {n}, {m.d}]", t_val)
        vecs = self._vectors(m, leaves, t_abs.content, n)
        z = Abs([BATCH, n, n], 0, np.arange(n * n, dtype=np.int64).reshape(n, n))
        m.abs[id(gram_node.outputs[0])] = z
        for node in reversed(path):
            z = m.run(node, [z])
            m.abs[id(node.outputs[0])] = z
        li, lj = np.tril_indices(n, -1)
        want = li * n + lj
        if z.bax != 0 or len(z.dims) != 2:
            raise Refused(f"the selected products {value_name(final.inputs[1])} are {z.dims}, not [batch, pairs]",
                          final.inputs[1])
        if not np.array_equal(z.content, want):
            got = [(int(c) // n, int(c) % n) for c in z.content.reshape(-1)[:6]]
            raise Refused(f"the selected products are not the strict lower triangle i > j in row-major order "
                          f"(first pairs {got}; DLRM's arch_interaction_itself or another selection is not fused)",
                          final.inputs[1])
        return self._finish(Found("dot", final, vecs, m))

    def _cat(self, graph, final: ir.Node, m: Match) -> Found:
        out = final.outputs[0]
        leaves = self._leaves(m, out, None)
        self._check_leaves(m, leaves)
        m.read(final)
        n = len(leaves)
        a = self._stack(m, out, leaves)
        if a.dims != [BATCH, n * m.d] or a.bax != 0:
            raise Refused(f"{value_name(out)} is {a.dims}, not the [batch, {n * m.d}] concatenation of the "
                          "vectors", out)
        vecs = self._vectors(m, leaves, a.content, n)
        return self._finish(Found("cat", final, vecs, m))

    # -------------------------------------------------------------------------------------- features, hash
    def _finish(self, f: Found) -> Found:
        feats = f.leaves[1:]
        rows = np.array([int(l.table.const_value.shape[0]) for l in feats], dtype=np.int64)
        f.cardinality = rows
        if feats[0].kind == "bag":
            self._bags(f, feats)
            return f
        if len({id(l.ids) for l in feats}) != 1:
            raise Refused("the features are not columns of one id matrix")
        f.ids = self._stacked(feats, [l.column for l in feats], feats[0].ids, 1, "id matrix")
        self._hash(f, rows)
        return f

    def _stacked(self, feats: list[Leaf], cols: list[int], src: ir.Value, axis: int, role: str) -> ir.Value:
        """`src`, the matrix whose slices along `axis` the features read, after checking that feature f reads slice
        f of exactly as many, int64."""
        n_feat = len(feats)
        if cols != list(range(n_feat)):
            raise Refused(f"feature f must read id column f: the vectors read columns {cols}" if axis == 1 else
                          f"feature f must read row f of the {role}: the bags read rows {cols}")
        sd = _base.dims(src)
        if sd is None or len(sd) != 2 or sd[axis] != n_feat:
            raise Refused(f"the {role} {value_name(src)} has shape {sd}: it must have exactly {n_feat} features", src)
        if src.dtype != ir.DataType.INT64:
            raise Refused(f"the {role} {value_name(src)} are {src.dtype.name.lower() if src.dtype else '?'}, not "
                          "int64", src)
        return src

    def _bags(self, f: Found, feats: list[Leaf]) -> None:
        """The bags' indices and offsets: each either one stacked [F, N] / [F, B] matrix (row f is feature f's) or one
        1-D tensor per feature (the per-table form, which the rewrite concatenates in the graph)."""
        for role, rows, values in (("indices", [l.column for l in feats], [l.ids for l in feats]),
                                   ("offsets", [l.offset_row for l in feats], [l.offsets for l in feats])):
            stacked = all(r >= 0 for r in rows)
            if not stacked and any(r >= 0 for r in rows):
                raise Refused(f"the bags' {role} mix rows of a stacked matrix and tensors of their own")
            if stacked:
                if len({id(v) for v in values}) != 1:
                    raise Refused(f"the features' {role} are rows of different matrices")
                self._stacked(feats, rows, values[0], 0, role)
            if role == "indices":
                f.stacked_indices = stacked
                f.ids = values[0]
            else:
                f.stacked_offsets = stacked

    def _hash(self, f: Found, rows: np.ndarray) -> None:
        """Absorb (ids + 1) mod cardinality when spelled exactly so; otherwise the op takes the id matrix as it is."""
        m = f.match
        mod = made_by(f.ids, "Mod")
        if mod is None or int_attr(mod, "fmod", 0) != 0:
            return
        add = made_by(mod.inputs[0], "Add")
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
                raise Refused(f"{value_name(v)} is also used by {other}: it must stay in memory, so the lookups "
                              "and the interaction are not fused", v)
        return list(cand.values())

    def _rewrite(self, model: ir.Model, graph: ir.Graph, f: Found) -> None:
        m, final = f.match, f.final
        feats = f.leaves[1:]
        hashed = feats[0].kind == "onehot"
        op_type = (EMBEDDING_INTERACTION if hashed else EMBEDDING_BAG_INTERACTION).name
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
        made: list[ir.Node] = []
        if hashed:
            attrs.insert(1, ir.AttrString("hash", f.hash))
            inputs = [x, f.ids, tbl, toff, card]
            overload = embedding_overload(op_type, f.interaction, f.hash)
        else:
            indices, bag_offsets, made = self._bag_inputs(graph, f, final)
            inputs = [x, indices, bag_offsets, tbl, toff, card]
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
        shapes = {"X": xd, "ids" if hashed else "indices": _base.dims(inputs[1]),
                  "table": [int(table.shape[0]), m.d], "Y": [xd[0], width]}
        per_table = ("stack the offsets)" if f.stacked_indices else "concatenate the indices, move the offsets)")
        bags = () if hashed else (
            "bags: " + ("stacked indices and offsets" if f.stacked_indices and f.stacked_offsets else
                        f"per table ({len(made)} nodes before the op {per_table}"),)
        extra = (f"features: {len(feats)} ({len(blocks)} tables, {int(table.shape[0])} rows)",
                 f"interaction: {f.interaction}",
                 f"hash: {'(id + 1) mod cardinality' if f.hash == 'mod' else 'none'}", *bags, *EMBEDDING_DOC)
        _base.annotate(node, self.recorder, PATTERN, f"{PATTERN}/{f.interaction}", op_type,
                       _base.module_path(removable), replaced, shapes, dtype, flops, extra_doc=extra,
                       added=1 + len(made))
        graph.insert_before(final, node)
        node.outputs[0].name = old_out.name
        ir.convenience.replace_all_uses_with([old_out], [node.outputs[0]], replace_graph_outputs=True)
        _detach_and_remove(graph, removable)

    def _bag_inputs(self, graph: ir.Graph, f: Found, before: ir.Node) -> tuple[ir.Value, ir.Value, list[ir.Node]]:
        """The op's indices and offsets (_embedding_leaves.bag_inputs), any nodes they need inserted before it."""
        indices, offsets, made = bag_inputs(f.leaves[1:], f.stacked_indices, f.stacked_offsets,
                                            lambda name, a: self._initializer(graph, name, a), self.recorder.unique)
        for node in made:
            graph.insert_before(before, node)
        return indices, offsets, made

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
