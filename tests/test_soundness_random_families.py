"""Differential fuzzing of the rule families that are not GEMMs (test_soundness_random.py has those): random graphs
that hold the spelling a rule fuses or one of its near misses, fused, and compared with the original in onnxruntime
(the kernel library, and for the lookups also the function fallbacks) on feeds with NaN, +-Inf, -0 and subnormal
rows, and with every overridable initializer fed a new value (tests/fuzzing.py: the comparison and the counts).

  * rotary_embedding: rotate_half in any layout of rank 2-5, with or without head Transposes of any permutation,
    cos/sin as inputs, constants, overridable initializers or computed from angles, one or two tensors (q, k) on
    them, intermediates that are outputs; near misses: interleaved, partial or overlapping halves, Neg on the other
    half, the halves swapped, the rotation on another axis, Transposes that are not inverse or move the last axis,
    cos/sin that grow X or broadcast its last axis;
  * embedding: Gather on tables with special-value rows, as constants, Constant nodes, overridable initializers or
    graph inputs, int64 or int32 ids of rank 0-3 (negative ids included), axis 0 or 1, two lookups on one table;
  * embedding_interaction: the DLRM spelling with 1-4 features, tables of any size (shared, of other widths, as
    inputs or overridable), the (id + 1) mod rows hash right or wrong (another constant, fmod=1, a cardinality
    below the rows) or absent, ids anywhere in int64 (negative, huge), any pair selection (the strict lower
    triangle, with the diagonal, the upper one, shuffled, a pair missing), symbolic batch, a Gram of something
    else, an embedding that is also an output;
  * bags: the original DLRM (onnxfuse/upstream_dlrm.py: EmbeddingBag Loops, both MLPs) with random tables, bag
    lengths (empty bags included), dot or cat, with the diagonal or not, sum/mean/max bags.
"""
from __future__ import annotations

import pathlib
import tempfile

import numpy as np
import onnx
import torch
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from onnxfuse import testing

from fuzzing import compare_fused, fuzz_settings

mk = helper.make_node
I64_MAX = 2**63 - 1
TYPES = {"fp32": (TensorProto.FLOAT, np.float32, 1e-4), "fp16": (TensorProto.FLOAT16, np.float16, 2e-2)}


def _special(a: np.ndarray, first: int = 0) -> np.ndarray:
    """`a` with rows of NaN, +-Inf, -0 and subnormals (testing.with_special_rows; the type's max left out)."""
    if a.ndim == 0 or a.size == 0:
        return a
    return testing.with_special_rows(torch.from_numpy(a.copy()), first=first, type_max=False)[0].numpy()


class Graph:
    """Nodes, initializers, inputs and outputs being built; named values; feeds for each graph input."""

    def __init__(self, draw, np_type):
        self.draw, self.np_type = draw, np_type
        self.et = helper.np_dtype_to_tensor_dtype(np.dtype(np_type))
        self.nodes, self.inits, self.inputs, self.outputs = [], [], [], []
        self.feed: dict[str, np.ndarray] = {}      # the plain feeds
        self.special: dict[str, np.ndarray] = {}   # the same with special-value rows (float inputs)
        self.overridable: dict[str, np.ndarray] = {}
        self.n = 0

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}{self.n}"

    def i64(self, values) -> str:
        name = self.name("i")
        self.inits.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def node(self, op: str, inputs: list[str], n_out: int = 1, **attrs):
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(mk(op, inputs, outs, **attrs))
        return outs[0] if n_out == 1 else outs

    def input(self, base: str, value: np.ndarray, special: bool = True, dims=None) -> str:
        name = self.name(base)
        et = helper.np_dtype_to_tensor_dtype(value.dtype)
        self.inputs.append(helper.make_tensor_value_info(name, et, list(dims or value.shape)))
        self.feed[name] = value
        self.special[name] = _special(value) if special and np.issubdtype(value.dtype, np.floating) else value
        return name

    def tensor(self, base: str, value: np.ndarray, hows=("init", "constant", "overridable", "input")) -> str:
        """A float tensor: an initializer, a Constant node, an initializer that is also a graph input, or an input."""
        how = self.draw(st.sampled_from(hows))
        if how == "input":
            return self.input(base, value)
        name = self.name(base)
        if how == "constant":
            self.nodes.append(mk("Constant", [], [name], value=numpy_helper.from_array(value, name + "_value")))
            return name
        self.inits.append(numpy_helper.from_array(value, name))
        if how == "overridable":
            self.inputs.append(helper.make_tensor_value_info(name, self.et, list(value.shape)))
            self.overridable[name] = value
        return name

    def model(self, opset: int = 18) -> tuple[onnx.ModelProto, list[dict]]:
        outputs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in dict.fromkeys(self.outputs)]
        graph = helper.make_graph(self.nodes, "fuzz", self.inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
        known = {vi.name: vi for vi in model.graph.value_info}
        for o in model.graph.output:  # the checker needs typed outputs
            if o.name in known:
                o.CopyFrom(known[o.name])
        feeds = [self.feed, self.special]
        if self.overridable:
            rng = np.random.default_rng(2)
            new = {n: (rng.standard_normal(a.shape) + 0.5).astype(a.dtype) for n, a in self.overridable.items()}
            feeds.append({**self.feed, **new})
        return model, feeds


def _rng(draw) -> np.random.Generator:
    return np.random.default_rng(draw(st.integers(0, 2**31 - 1)))


# ------------------------------------------------------------------------------------------------ rotary
ROTARY_MISSES = ["none"] * 6 + ["interleaved", "partial", "overlap", "neg_first", "swap_concat", "other_axis",
                                "perm_out", "perm_last", "cos_grows", "cos_last_1", "rank5"]


@st.composite
def rotary_graphs(draw):
    dtype = draw(st.sampled_from(["fp32", "fp32", "fp16"]))
    et, np_type, tol = TYPES[dtype]
    g, rng = Graph(draw, np_type), _rng(draw)
    miss = draw(st.sampled_from(ROTARY_MISSES))
    rank = 5 if miss == "rank5" else draw(st.sampled_from([2, 3, 4, 4, 4]))
    half = draw(st.integers(1, 6))
    d = 2 * half
    t_shape = [draw(st.integers(1, 4)) for _ in range(rank - 1)] + [d]   # the rotary's layout
    transposed = rank >= 3 and (miss in ("perm_out", "perm_last") or draw(st.booleans()))
    perm = list(range(rank))
    if transposed:
        lead = list(draw(st.permutations(list(range(rank - 1)))))
        perm = lead + [rank - 1]
        if miss == "perm_last":
            i = draw(st.integers(0, rank - 2))
            perm[i], perm[-1] = perm[-1], perm[i]
    inverse = [perm.index(i) for i in range(rank)]
    x_shape = [t_shape[inverse[i]] for i in range(rank)]  # Transpose(X, perm) has t_shape
    # cos/sin: each leading dim 1 or the rotary layout's; fewer dims only without the transposes
    c_rank = rank if transposed else draw(st.integers(1, rank))
    c_shape = [draw(st.sampled_from([1, t])) for t in t_shape[rank - c_rank:-1]] + [d]
    if miss == "cos_grows" and c_rank >= 2:  # X's dim 1 where cos/sin have 3: the original's output grows
        t_shape[rank - c_rank], c_shape[0] = 1, 3
        x_shape = [t_shape[inverse[i]] for i in range(rank)]
    if miss == "cos_last_1":
        c_shape[-1] = 1
    source = draw(st.sampled_from(["input", "input", "computed", "init", "overridable"]))
    if source == "computed":
        angles = g.input("angles", rng.uniform(-4, 4, c_shape).astype(np_type))
        cos, sin = g.node("Cos", [angles]), g.node("Sin", [angles])
    else:
        hows = ("input",) if source == "input" else (source,)
        cos = g.tensor("cos", rng.uniform(-1, 1, c_shape).astype(np_type), hows)
        sin = g.tensor("sin", rng.uniform(-1, 1, c_shape).astype(np_type), hows)
    for _ in range(draw(st.integers(1, 2))):  # q, and k on the same cos/sin
        x = g.input("X", rng.standard_normal(x_shape).astype(np_type))
        t = g.node("Transpose", [x], perm=perm) if transposed else x
        ax = -1
        (s0, e0), (s1, e1), steps = (0, half), (half, draw(st.sampled_from([I64_MAX, d, d + 5]))), (1, 1)
        if miss == "interleaved":
            (s0, e0), (s1, e1), steps = (0, I64_MAX), (1, I64_MAX), (2, 2)
        elif miss == "partial":
            p = draw(st.sampled_from([p for p in range(1, d) if p != half] or [0]))
            (s0, e0), (s1, e1) = (0, p), (p, I64_MAX)
        elif miss == "overlap":
            (s0, e0), (s1, e1) = (0, half), (half - 1, d - 1)
        elif miss == "other_axis":
            ax = draw(st.integers(0, rank - 2))
            n = t_shape[ax]
            (s0, e0), (s1, e1) = (0, n // 2), (n // 2, I64_MAX)
        first = g.node("Slice", [t, g.i64([s0]), g.i64([e0]), g.i64([ax]), g.i64([steps[0]])])
        second = g.node("Slice", [t, g.i64([s1]), g.i64([e1]), g.i64([ax]), g.i64([steps[1]])])
        if miss == "neg_first":
            rot = g.node("Concat", [g.node("Neg", [first]), second], axis=ax)
        else:
            neg = g.node("Neg", [second])
            rot = g.node("Concat", [first, neg] if miss == "swap_concat" else [neg, first], axis=ax)
        xc = g.node("Mul", [t, cos] if draw(st.booleans()) else [cos, t])
        rs = g.node("Mul", [rot, sin] if draw(st.booleans()) else [sin, rot])
        y = g.node("Add", [xc, rs] if draw(st.booleans()) else [rs, xc])
        if transposed:
            perm_out = inverse if miss != "perm_out" else list(draw(st.permutations(list(range(rank)))))
            y = g.node("Transpose", [y], perm=perm_out)
        g.outputs.append(y)
        exposed = draw(st.sampled_from([None] * 6 + ["rot", "xc", "first"]))
        if exposed:
            g.outputs.append({"rot": rot, "xc": xc, "first": first}[exposed])
    model, feeds = g.model()
    return model, feeds, tol


@fuzz_settings("rotary")
@given(rotary_graphs())
def test_rotary_graphs_fuse_soundly(case):
    model, feeds, tol = case
    compare_fused(model, feeds, tol)


# ------------------------------------------------------------------------------------------------ embedding
@st.composite
def embedding_graphs(draw):
    dtype = draw(st.sampled_from(["fp32", "fp32", "fp16"]))
    et, np_type, tol = TYPES[dtype]
    g, rng = Graph(draw, np_type), _rng(draw)
    v = draw(st.integers(1, 40))
    width = draw(st.sampled_from([8, 64, 72, 128, 136]))  # rows of 32 to 544 bytes: narrow ones are left alone
    table = _special(rng.standard_normal((v, width)).astype(np_type), first=draw(st.integers(0, v)))
    if draw(st.integers(0, 5)) == 0:
        table = table.reshape(1, v, width)  # a 3-D table: not a lookup the op does
    tname = g.tensor("table", table, ("init", "init", "init", "constant", "overridable", "input"))
    for _ in range(draw(st.integers(1, 2))):  # a token lookup, and a second one on the same table
        axis = draw(st.sampled_from([0, 0, 0, 1, -table.ndim]))
        n = table.shape[axis]
        ids_shape = [draw(st.integers(1, 5)) for _ in range(draw(st.integers(0, 3)))]
        ids_type = draw(st.sampled_from([np.int64, np.int64, np.int32]))
        ids = g.input("ids", rng.integers(-n, n, ids_shape).astype(ids_type))
        y = g.node("Gather", [tname, ids], axis=axis)
        if draw(st.booleans()):
            g.outputs.append(y)
        else:
            g.outputs.append(g.node(draw(st.sampled_from(["Relu", "Neg", "Sigmoid"])), [y]))
    model, feeds = g.model()
    return model, feeds, tol


@fuzz_settings("embedding")
@given(embedding_graphs())
def test_embedding_graphs_fuse_soundly(case):
    model, feeds, tol = case
    compare_fused(model, feeds, tol, function_bodies=True)


# ------------------------------------------------------------------------------------------------ DLRM interaction
PAIRS = ["strict_lower"] * 5 + ["with_diagonal", "upper", "shuffled", "missing", "transposed_pairs"]


@st.composite
def interaction_graphs(draw):
    """The dynamo spelling of onnxfuse's DLRM interaction (tests/rewrites/test_embedding_interaction.py's
    _interaction_graph), every knob drawn."""
    g, rng = Graph(draw, np.float32), _rng(draw)
    n_feat, d, batch = draw(st.integers(1, 4)), draw(st.integers(1, 6)), draw(st.integers(1, 7))
    n = n_feat + 1
    symbolic = draw(st.booleans())
    x = g.input("X", rng.standard_normal((batch, d)).astype(np.float32), dims=["batch" if symbolic else batch, d])
    sizes = [draw(st.integers(1, 9)) for _ in range(n_feat)]
    hash_ = draw(st.sampled_from(["exact"] * 4 + ["none", "add2", "fmod", "small_card"]))
    if hash_ == "none":  # ids used as they are: valid ones, negative from the end included
        ids = np.stack([rng.integers(-s, s, batch) for s in sizes], 1).astype(np.int64)
    else:
        ids = rng.integers(-2**40, 2**40, (batch, n_feat)).astype(np.int64)
    sparse = g.input("sparse", ids, dims=["batch" if symbolic else batch, n_feat])
    hashed = sparse
    if hash_ != "none":
        card = [max(1, s - 1) if hash_ == "small_card" else s for s in sizes]
        # fmod=1 keeps the sign (C's fmod): negative ids then index from the end, still in range
        hashed = g.node("Mod", [g.node("Add", [sparse, g.i64(2 if hash_ == "add2" else 1)]), g.i64(card)],
                        fmod=int(hash_ == "fmod"))
    shared = n_feat > 1 and draw(st.integers(0, 4)) == 0
    other_width = n_feat > 1 and draw(st.integers(0, 8)) == 0
    tables = []
    for f in range(n_feat):
        if shared and f == n_feat - 1 and sizes[f] == sizes[0]:
            tables.append(tables[0])
            continue
        w = d + 1 if other_width and f == n_feat - 1 else d
        table = _special(rng.standard_normal((sizes[f], w)).astype(np.float32), first=draw(st.integers(0, 8)))
        tables.append(g.tensor("W", table, ("init",) * 6 + ("overridable", "input")))
    stack, emb_out = [x], None
    for f in range(n_feat):
        e = g.node("Gather", [tables[f], g.node("Gather", [hashed, g.i64(f)], axis=1)])
        stack.append(e)
        if draw(st.integers(0, 9)) == 0:
            emb_out = e
    if other_width:  # a cat of mixed widths, no product
        g.outputs.append(g.node("Concat", stack, axis=1))
    else:
        axis1 = g.i64([1])
        t = g.node("Concat", [g.node("Unsqueeze", [v, axis1]) for v in stack], axis=1)
        gram_of = g.node("Neg", [t]) if draw(st.integers(0, 9)) == 0 else t
        z = g.node("MatMul", [t, g.node("Transpose", [gram_of], perm=[0, 2, 1])])
        zt = g.node("Transpose", [z], perm=[1, 2, 0])
        kind = draw(st.sampled_from(PAIRS))
        li, lj = np.tril_indices(n, 0 if kind == "with_diagonal" else -1)
        pairs = np.stack([li, lj], 1)
        if kind == "upper" or kind == "transposed_pairs":
            pairs = pairs[:, ::-1]
        if kind == "shuffled" and len(pairs) > 1:
            pairs = pairs[rng.permutation(len(pairs))]
        if kind == "missing" and len(pairs) > 1:
            pairs = np.delete(pairs, draw(st.integers(0, len(pairs) - 1)), 0)
        if len(pairs):
            sel = g.node("GatherND", [zt, g.i64(np.ascontiguousarray(pairs))])
            g.outputs.append(g.node("Concat", [x, g.node("Transpose", [sel], perm=[1, 0])], axis=1))
        else:
            g.outputs.append(g.node("Identity", [x]))
    if emb_out is not None:
        g.outputs.append(emb_out)
    model, feeds = g.model()
    return model, feeds, 1e-4


@fuzz_settings("interaction")
@given(interaction_graphs())
def test_interaction_graphs_fuse_soundly(case):
    model, feeds, tol = case
    compare_fused(model, feeds, tol, function_bodies=True)


# ------------------------------------------------------------------------------------------------ bags
from onnxfuse import upstream_dlrm as dlrm_original  # noqa: E402


@fuzz_settings("bags")
@given(ln_emb=st.lists(st.integers(1, 9), min_size=1, max_size=4), d=st.integers(2, 5),
       interaction=st.sampled_from(["dot", "dot", "cat"]), itself=st.sampled_from([False, False, True]),
       mode=st.sampled_from(["sum", "sum", "sum", "mean", "max"]), bags=st.lists(st.integers(0, 3), min_size=1,
                                                                              max_size=4),
       batch=st.integers(1, 7), seed=st.integers(0, 1000))
def test_original_dlrm_bags_fuse_soundly(ln_emb, d, interaction, itself, mode, bags, batch, seed):
    top = dlrm_original.top_width(d, len(ln_emb), interaction, itself)
    module = dlrm_original.OriginalDLRM(d, ln_emb, [13, 8, d], [top, 8, 1], interaction, itself, mode).eval()
    dense, offsets, indices = dlrm_original.make_batch(ln_emb, batch, bags, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "m.onnx"
        dlrm_original.export_torchscript(module, (dense, offsets, indices), path)
        model = onnx.load(str(path))
    feed = {"dense_x": dense.numpy(), "offsets": offsets.numpy(), "indices": indices.numpy()}
    special = {**feed, "dense_x": _special(feed["dense_x"])}
    other = dlrm_original.make_batch(ln_emb, batch + 2, list(reversed(bags)), seed=seed + 1)  # another batch
    feed2 = {"dense_x": other[0].numpy(), "offsets": other[1].numpy(), "indices": other[2].numpy()}
    compare_fused(model, [feed, special, feed2], 1e-4, function_bodies=True)
