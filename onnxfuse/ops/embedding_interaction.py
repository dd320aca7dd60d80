"""EmbeddingInteraction, EmbeddingBagInteraction: DLRM's embedding lookups and feature interaction in one op (rules:
onnxfuse/rewrites/embedding_interaction.py)."""
from __future__ import annotations

from ._family import BACKEND, Attr, OpDef, OpFamily, OpSchema

# How EmbeddingInteraction / EmbeddingBagInteraction combine the dense vector with the embeddings (attribute
# `interaction`): "dot" is DLRM's pairwise dot products (strict lower triangle, after the dense vector), "cat" the
# plain concatenation of all vectors. Codes are the index.
INTERACTIONS = ("dot", "cat")
# The categorical-id hash of EmbeddingInteraction (attribute `hash`): "none" looks the id up as it is, "mod" is
# onnxfuse's DLRM hash (id + 1) mod cardinality (Python's modulus: always in [0, cardinality)). Codes are the index.
HASHES = ("none", "mod")
# Inputs fed as int64 (never cast to T): the ids, bags and table layout.
INT_INPUTS = ("ids", "indices", "offsets", "table_offsets", "cardinality")
# The bodies use CastLike and Shape's start/end attributes: opset 15.
MIN_OPSET = 15

_INTERACTION = Attr("interaction", "string", "dot",
                    "dot (pairwise dot products of the n vectors, strict lower triangle i > j in row-major order, "
                    "after the dense vector: d + n(n-1)/2 columns) or cat (the n vectors concatenated: n*d columns)")
_EMBEDDING_DOC = (
    "table is every embedding table of the model concatenated at fuse time ([R, d], R = the sum of their rows); "
    "table_offsets[f] is the first row of feature f's table and cardinality[f] its number of rows (the modulus "
    "of the hash). A negative id counts from the end of its table, as ONNX Gather does (id + cardinality[f]); an "
    "id still outside [0, cardinality[f]), or a row outside the table, contributes a zero vector (where the "
    "unfused graph fails, and PyTorch raises): never an out-of-bounds read. Embeddings are rounded to T (as the "
    "unfused graph stores them); dot products accumulate in fp32. "
    "The vectors are v_0 = X[b] and v_{f+1} = the embedding of feature f, so n = F + 1.")
EMBEDDING_INTERACTION = OpSchema(
    "EmbeddingInteraction", ("X", "ids", "table", "table_offsets", "cardinality"), ("Y",),
    "e_f = table[table_offsets[f] + h(ids[:, f])]; Y = interaction(X, e_0..e_{F-1})",
    (_INTERACTION,
     Attr("hash", "string", "none", "none (h(id) = id) or mod (h(id) = (id + 1) mod cardinality[f], Python's "
                                    "modulus: onnxfuse's DLRM)"),
     BACKEND),
    "DLRM's embedding lookups and feature interaction in one op (one id per feature and sample): X [B, d] the "
    "bottom MLP's output, ids [B, F] int64. " + _EMBEDDING_DOC)
EMBEDDING_BAG_INTERACTION = OpSchema(
    "EmbeddingBagInteraction", ("X", "indices", "offsets", "table", "table_offsets", "cardinality"), ("Y",),
    "e_f[b] = sum_{p in bag(f, b)} table[table_offsets[f] + indices[f or 0, p]]; Y = interaction(X, e_0..e_{F-1})",
    (_INTERACTION, BACKEND),
    "The original DLRM's nn.EmbeddingBag(mode='sum') lookups (multi-hot bags given by offsets) and its feature "
    "interaction in one op: X [B, d], indices [F, N] int64 (row f: feature f's) or [1, N] (one row every feature's "
    "bags index into: per-table indices concatenated), offsets [F, B] or [F, B + 1] int64; bag(f, b) is the "
    "positions [offsets[f, b], offsets[f, b + 1]) (with B columns the last bag ends at N; with B + 1 the last "
    "column is each feature's end), clamped to [0, N], empty when the end is not past the start. " + _EMBEDDING_DOC)
# The hashed op (one id per feature) and the bag op: the rules pick one by the lookups they found.
OPS = (EMBEDDING_INTERACTION, EMBEDDING_BAG_INTERACTION)


def embedding_overload(op: str, interaction: str, hash_: str = "none") -> str:
    """The function overload of an embedding op node: 'dot.mod', 'cat.none' (EmbeddingInteraction), 'dot' / 'cat'
    (EmbeddingBagInteraction)."""
    if interaction not in INTERACTIONS or hash_ not in HASHES:
        raise ValueError(f"{op}: interaction {interaction!r} / hash {hash_!r} not in {INTERACTIONS} / {HASHES}")
    return f"{interaction}.{hash_}" if op == EMBEDDING_INTERACTION.name else interaction


def interaction_width(n_vectors: int, dim: int, interaction: str) -> int:
    """Columns of an embedding op's output: d + n(n-1)/2 for dot, n*d for cat."""
    return dim + n_vectors * (n_vectors - 1) // 2 if interaction == "dot" else n_vectors * dim


def _lookup_hashed(inputs, attrs: dict):
    """EmbeddingInteraction's looked-up rows [B, F, d] (fp32; zero where the id or the row is out of range)."""
    import torch

    ids, table, toff, card = inputs[1:5]
    ids = ids.long()
    h = ids if attrs.get("hash", "none") == "none" else torch.remainder(ids + 1, card.clamp(min=1))
    h = torch.where(h < 0, h + card, h)  # ONNX Gather's negative ids
    rows = toff + h
    valid = (h >= 0) & (h < card) & (rows >= 0) & (rows < table.shape[0])
    return table[torch.where(valid, rows, 0)].float() * valid[..., None]       # [B, F, d]


def _lookup_bags(inputs, attrs: dict):
    """EmbeddingBagInteraction's pooled rows [B, F, d] (fp32 sums of each bag)."""
    import torch

    indices, offsets, table, toff, card = inputs[1:6]
    n_idx = indices.shape[1]
    f_count, batch = offsets.shape[0], inputs[0].shape[0]
    # the ends: the next offset, then N (offsets [F, B]) or offsets' own last column ([F, B + 1])
    ends = torch.cat([offsets[:, 1:], torch.full((f_count, 1), n_idx, dtype=offsets.dtype)], 1)[:, :batch]
    start, end = offsets[:, :batch].clamp(0, n_idx), ends.clamp(0, n_idx)
    indices = indices.expand(f_count, n_idx)  # one shared row [1, N]: every feature indexes into it
    indices = torch.where(indices < 0, indices + card[:, None], indices)
    rows = toff[:, None] + indices
    valid = (indices >= 0) & (indices < card[:, None]) & (rows >= 0) & (rows < table.shape[0])
    g = table[torch.where(valid, rows, 0)].float() * valid[..., None]         # [F, N, d]
    p = torch.arange(n_idx)
    member = (start[..., None] <= p) & (p < end[..., None])                  # [F, B, N]
    return (member.double() @ g.double()).float().transpose(0, 1)            # [B, F, d]


def _reference(lookup):
    def reference(inputs, attrs):
        import torch

        x = inputs[0]
        emb = lookup(inputs, attrs)
        emb = emb.to(x.dtype).float()  # the unfused graph stores the looked-up (pooled) rows in T
        t = torch.cat([x.float()[:, None], emb], 1)                                  # [B, n, d]
        if attrs.get("interaction", "dot") == "dot":
            n = t.shape[1]
            li, lj = torch.tril_indices(n, n, offset=-1)
            y = torch.cat([x.float(), (t @ t.transpose(1, 2))[:, li, lj]], 1)
        else:
            y = t.reshape(t.shape[0], -1)
        return y.to(x.dtype)
    return reference


def _body(schema: OpSchema):
    def body(overload: str):
        parts = overload.split(".")
        interaction, hash_ = parts[0], (parts[1] if len(parts) > 1 else "none")
        if interaction not in INTERACTIONS or hash_ not in HASHES or \
                embedding_overload(schema.name, interaction, hash_) != overload:
            raise ValueError(f"{schema.name}: function overload {overload!r} does not name the interaction"
                             + (" and hash" if schema is EMBEDDING_INTERACTION else ""))
        return list(schema.inputs), embedding_body(schema is EMBEDDING_INTERACTION, interaction, hash_)
    return body


def _overload(schema: OpSchema):
    return lambda attrs: embedding_overload(schema.name, attrs["interaction"], attrs.get("hash", "none"))


def out_shape(shapes: dict, attrs: dict) -> list:
    """[B, interaction width] (`attrs` names the interaction; dot without it)."""
    f = shapes["table_offsets"][0]
    return [shapes["X"][0], interaction_width(f + 1, shapes["X"][1], attrs.get("interaction", "dot"))]


def embedding_table_sizes(features: int) -> list[int]:
    """Rows of each feature's table in the doctor's embedding models: small, uneven, deterministic."""
    return [(7 * f + 3) % 50 + 1 for f in range(features)]


def _doctor_entry(schema: OpSchema):
    def doctor_entry(entry) -> tuple[dict, dict, tuple]:
        """(B, d, features, interaction, hash or mean bag length[, "flat": indices [1, N] with offsets [F, B + 1]])."""
        b, d, f, interaction, extra = entry[:5]
        flat = entry[5:] == ("flat",)
        rows = sum(embedding_table_sizes(f))
        width = interaction_width(f + 1, d, interaction)
        if schema is EMBEDDING_INTERACTION:
            shapes = {"X": [b, d], "ids": [b, f]}
            attrs, label = {"interaction": interaction, "hash": extra}, f"F{f} {interaction} hash={extra}"
        else:
            shapes = {"X": [b, d], "indices": [1, f * b * int(extra)], "offsets": [f, b + 1]} if flat else \
                {"X": [b, d], "indices": [f, b * int(extra)], "offsets": [f, b]}
            attrs, label = {"interaction": interaction}, f"F{f} {interaction} bags~{extra}" + (" flat" if flat else "")
        shapes.update({"table": [rows, d], "table_offsets": [f], "cardinality": [f]})
        return shapes, attrs, (b, d, width, 0, label)
    return doctor_entry


def doctor_inputs(op: OpDef, tdt, shapes: dict[str, list[int]], seed: int, device: str = "cpu") -> list:
    """On the CPU (small; the reference indexes with them): X and the table ~N(0, 1/2) (dot products of 16 stay
    O(1)); ids spread over [-card, 2 card) with one id at INT64_MAX (the hash wraps there), so negative ids, ids past
    the table and zero vectors are all exercised; for bags sorted offsets over [0, N] with empty bags, and indices the
    same way. `shapes` may name X alone (the doctor's second X)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    b, d = shapes["X"]
    if "table_offsets" not in shapes:
        return [torch.randn(b, d, generator=g).mul(0.7).to(tdt)]
    f = shapes["table_offsets"][0]
    sizes = torch.tensor(embedding_table_sizes(f), dtype=torch.int64)
    toff = torch.cumsum(sizes, 0) - sizes

    def ids(shape, per_feature_axis):
        u = torch.rand(*shape, generator=g)
        card = sizes.reshape([-1 if i == per_feature_axis else 1 for i in range(len(shape))])
        return (u * 3 * card).long() - card

    out = {"X": torch.randn(b, d, generator=g).mul(0.7).to(tdt),
           "table": torch.randn(*shapes["table"], generator=g).mul(0.7).to(tdt),
           "table_offsets": toff, "cardinality": sizes}
    if op.schema is EMBEDDING_INTERACTION:
        out["ids"] = ids(shapes["ids"], 1)
        if out["ids"].numel():
            out["ids"][0, 0] = 2 ** 63 - 1
    else:
        n_idx = shapes["indices"][1]
        if shapes["indices"][0] == 1 and f > 1:  # one shared row: feature f's bags index into its own stretch
            out["indices"] = (torch.rand(1, n_idx, generator=g) * 3 * sizes.max()).long() - sizes.max()
        else:
            out["indices"] = ids(shapes["indices"], 0)
        cols = shapes["offsets"][1]
        # [F, B]: each feature's bags cut its row; [F, B + 1]: feature f's bags cut its stretch of the shared row
        span = n_idx if cols == b else n_idx // max(f, 1)
        cuts = torch.randint(0, span + 1, (f, cols), generator=torch.Generator().manual_seed(b + f))
        out["offsets"] = torch.sort(cuts, dim=1).values
        out["offsets"][:, 0] = 0
        if cols != b:
            out["offsets"] += torch.arange(f)[:, None] * span
    return [out[name] for name in shapes]


def _op(index: int, schema: OpSchema, lookup, doctor_shapes) -> OpDef:
    return OpDef(index, schema, _reference(lookup), _body(schema), out_shape, tuple(doctor_shapes),
                 _doctor_entry(schema), overload=_overload(schema), min_opset=MIN_OPSET,
                 int_inputs=INT_INPUTS, doctor_inputs=doctor_inputs,
                 weighted=False)


# Doctor shapes: (B, d, features, interaction, hash or mean bag length). DLRM's 26 features of 16 at batch 1 and 128
# (dot, the hash) and cat; 40 features of 20 (the 64-vector, 32-wide Triton tile) without the hash.
FAMILY = OpFamily("embedding_interaction", (
    _op(8, EMBEDDING_INTERACTION, _lookup_hashed, [(1, 16, 26, "dot", "mod"), (128, 16, 26, "dot", "mod"),
                                                   (37, 16, 26, "cat", "none"), (33, 20, 40, "dot", "none")]),
    _op(9, EMBEDDING_BAG_INTERACTION, _lookup_bags, [(1, 16, 26, "dot", 2), (129, 16, 26, "dot", 3),
                                                     (37, 8, 5, "cat", 1), (65, 16, 26, "dot", 2, "flat"),
                                                     (9, 8, 5, "cat", 1, "flat")]),
))


# ------------------------------------------------------------------------------------------------ function bodies
def _const(out: str, value, dtype=None):
    """A Constant of `value` (int64 unless `dtype` says otherwise) named `out`."""
    import numpy as np
    from onnx import helper, numpy_helper

    array = np.asarray(value, dtype=np.int64 if dtype is None else dtype)
    return helper.make_node("Constant", [], [out], value=numpy_helper.from_array(array, out))


def embedding_body(hashed: bool, interaction: str, hash_: str) -> list:
    """The embedding ops' bodies, with the kernels' semantics (schema.py): a negative id counts from its table's end, an
    id still outside [0, cardinality[f]) or a row outside the table gives a zero vector (a Where, so an inf/NaN in the
    table never leaks into it); bags are a 0/1 membership matrix [F, B, N] times the looked-up rows (exact for any
    offsets, and only the fallback path: it costs F*B*N elements); the strict lower triangle is selected with Compress
    over a Less(j, i) mask."""
    import numpy as np
    from onnx import helper

    mk = helper.make_node
    nodes = [_const("zero", 0), _const("one", 1), _const("axis0", [0]), _const("axis1", [1]), _const("axis_last", [-1]),
             _const("zero_f", 0.0, np.float32), mk("CastLike", ["zero_f", "X"], ["zero_t"]),
             mk("Shape", ["table"], ["table_rows"], start=0, end=1)]

    def lookup(ids: str, card: str, offs: str, out: str) -> None:
        """out = table rows of ids (+ their table's offset), zero where the id or the row is out of range."""
        nodes.extend([
            # a negative id counts from the end of its table (ONNX Gather)
            mk("Less", [ids, "zero"], [f"{out}_neg"]), mk("Add", [ids, card], [f"{out}_wrapped"]),
            mk("Where", [f"{out}_neg", f"{out}_wrapped", ids], [f"{out}_id"]),
            mk("Add", [f"{out}_id", offs], [f"{out}_row"]),
            mk("GreaterOrEqual", [f"{out}_id", "zero"], [f"{out}_v1"]), mk("Less", [f"{out}_id", card], [f"{out}_v2"]),
            mk("GreaterOrEqual", [f"{out}_row", "zero"], [f"{out}_v3"]),
            mk("Less", [f"{out}_row", "table_rows"], [f"{out}_v4"]),
            mk("And", [f"{out}_v1", f"{out}_v2"], [f"{out}_v12"]),
            mk("And", [f"{out}_v3", f"{out}_v4"], [f"{out}_v34"]),
            mk("And", [f"{out}_v12", f"{out}_v34"], [f"{out}_ok"]),
            mk("Where", [f"{out}_ok", f"{out}_row", "zero"], [f"{out}_safe"]),
            mk("Gather", ["table", f"{out}_safe"], [f"{out}_g"], axis=0),
            mk("Unsqueeze", [f"{out}_ok", "axis_last"], [f"{out}_oku"]),
            mk("Where", [f"{out}_oku", f"{out}_g", "zero_t"], [out])])

    if hashed:  # EmbeddingInteraction
        ids = "ids"
        if hash_ == "mod":
            nodes += [mk("Add", ["ids", "one"], ["ids1"]), mk("Mod", ["ids1", "cardinality"], ["hashed"], fmod=0)]
            ids = "hashed"
        lookup(ids, "cardinality", "table_offsets", "emb")                     # [B, F, d]
    else:
        nodes += [
            # bag(f, b) = [clamp(offsets[f, b]), clamp(end[f, b])), end = the next offset, then N: the first B of
            # each (offsets [F, B + 1] carries its own ends)
            mk("Shape", ["indices"], ["n_idx1"], start=1, end=2), mk("Squeeze", ["n_idx1", "axis0"], ["n_idx"]),
            mk("Shape", ["offsets"], ["n_feat1"], start=0, end=1),
            mk("Shape", ["X"], ["n_batch1"], start=0, end=1),
            mk("Concat", ["n_feat1", "axis1"], ["col_shape"], axis=0),
            mk("Reshape", ["n_idx1", _c(nodes, "shape11", [1, 1])], ["n_idx11"]),
            mk("Expand", ["n_idx11", "col_shape"], ["last_end"]),
            mk("Slice", ["offsets", "axis1", _c(nodes, "big", [2 ** 62]), "axis1"], ["next_off"]),
            mk("Concat", ["next_off", "last_end"], ["all_ends"], axis=1),
            mk("Slice", ["all_ends", "axis0", "n_batch1", "axis1"], ["ends"]),
            mk("Slice", ["offsets", "axis0", "n_batch1", "axis1"], ["begins"]),
            mk("Max", ["begins", "zero"], ["s0"]), mk("Min", ["s0", "n_idx"], ["starts"]),
            mk("Max", ["ends", "zero"], ["e0"]), mk("Min", ["e0", "n_idx"], ["stops"]),
            mk("Range", ["zero", "n_idx", "one"], ["pos"]),
            mk("Unsqueeze", ["starts", "axis_last"], ["starts3"]), mk("Unsqueeze", ["stops", "axis_last"], ["stops3"]),
            mk("LessOrEqual", ["starts3", "pos"], ["m1"]), mk("Less", ["pos", "stops3"], ["m2"]),
            mk("And", ["m1", "m2"], ["member"]),                                  # [F, B, N]
            mk("CastLike", ["member", "X"], ["member_t"]),
            mk("Unsqueeze", ["cardinality", "axis_last"], ["card_col"]),
            mk("Unsqueeze", ["table_offsets", "axis_last"], ["offs_col"])]
        lookup("indices", "card_col", "offs_col", "rows")                         # [F, N, d]
        nodes += [mk("MatMul", ["member_t", "rows"], ["pooled"]),                # [F, B, d]
                  mk("Transpose", ["pooled"], ["emb"], perm=[1, 0, 2])]           # [B, F, d]
    nodes += [mk("Unsqueeze", ["X", "axis1"], ["x3"]), mk("Concat", ["x3", "emb"], ["vectors"], axis=1)]  # [B, n, d]
    if interaction == "cat":
        nodes.append(mk("Flatten", ["vectors"], ["Y"], axis=1))
        return nodes
    nodes += [
        mk("Transpose", ["vectors"], ["vectors_t"], perm=[0, 2, 1]), mk("MatMul", ["vectors", "vectors_t"], ["gram"]),
        mk("Flatten", ["gram"], ["gram_flat"], axis=1),                           # [B, n*n]
        mk("Shape", ["vectors"], ["n_vec1"], start=1, end=2), mk("Squeeze", ["n_vec1", "axis0"], ["n_vec"]),
        mk("Range", ["zero", "n_vec", "one"], ["r"]),
        mk("Unsqueeze", ["r", "axis1"], ["ri"]), mk("Unsqueeze", ["r", "axis0"], ["rj"]),
        mk("Less", ["rj", "ri"], ["below"]), mk("Mul", ["ri", "n_vec"], ["ri_n"]), mk("Add", ["ri_n", "rj"], ["flat"]),
        mk("Reshape", ["flat", "axis_last"], ["flat1"]), mk("Reshape", ["below", "axis_last"], ["below1"]),
        mk("Compress", ["flat1", "below1"], ["pairs"], axis=0),                   # i > j, i-major
        mk("Gather", ["gram_flat", "pairs"], ["tri"], axis=1),
        mk("Concat", ["X", "tri"], ["Y"], axis=1)]
    return nodes


def _c(nodes: list, name: str, value) -> str:
    """A named int64 Constant appended to `nodes` (for the bag body's shapes); returns its name."""
    nodes.append(_const(name, value))
    return name
