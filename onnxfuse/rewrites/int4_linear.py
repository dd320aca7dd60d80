"""int4_linear: onnxruntime's 4-bit `com.microsoft.MatMulNBits` -> `Int4Linear`, and a gated MLP over two of them
-> `Int4SwiGLU`.

    Y = X @ W^T,  W[n, k] = (nibble(B, n, k) - zp[n, k // block_size]) * scales[n, k // block_size]

What onnxruntime-genai's builder writes for every projection (qkv, o, gate, up, down, lm_head) with `-p int4`:
MatMulNBits(X, B, scales) with bits 4, a block size of 32 (its default), B uint8 [N, n_blocks, block / 2] and no
zero points (symmetric: the zero point is 8); with zero points (an asymmetric quantization, `int4_is_symmetric=false`,
or an AWQ/GPTQ checkpoint) the fourth input, uint8 [N, ceil(n_blocks / 2)] (or flat), two 4-bit zero points a
byte. onnxruntime's CUDA kernel for it reads the packed weights at about a
third of the memory bandwidth at decode (H100, Llama-2-7B shapes: 3.59 ms per token where the weights take 1.3 ms);
onnxfuse's streams them once and dequantizes in registers.

Refused, each with its reason in --explain: g_idx or a bias (inputs 4-5), zero points in X's type (MatMulNBits'
other form) or of the wrong shape, bits other than 4, a block size the kernels do not take, an accuracy_level outside
0-4, B prepacked into onnxruntime's CUDA fpA_intB layout (`weight_prepacked` 1 or 2, what the builder writes with
`matmulnbits_weights_prepacked`: the same shape as the blockwise layout, other bytes), an attribute MatMulNBits did
not have when this rule was written (its meaning unknown here), weights, scales or zero points that are not true
constants (a graph input, an overridable initializer), scales of another element type than X, shapes that disagree
with the node's K and N attributes.

The node's accuracy_level goes onto the fused op (none at 0 or absent, so that level-0 models fuse as before):
Int4SwiGLU takes the lower of its gate's and up's, the norm ops their projection's. At 4 the CUDA backend's one-row
fp16 GEMV may round X to int8 (ops/int4_linear.py); everything else computes in X's type.

A gated MLP whose gate and up projections are such MatMulNBits of one X (K, N and block size equal), meeting in
act(gate) * up with any of SwiGLU's activations in any of its spellings (genai writes SiLU as QuickGelu(alpha=1)),
becomes one `Int4SwiGLU` node (with both projections' zero points, or none): the swiglu pass's matcher
(rewrites/swiglu.py) with MatMulNBits as the projection, run before the Int4Linear rule so that the projections are
still there. A candidate it refuses (zero points on one projection only, two block sizes, an activation SwiGLU does
not compute, an intermediate with another use) keeps its
projections for Int4Linear and is named with the reason in --explain. At decode the op reads both packed rows of an
output column in one pass and writes act(g) * u once: one kernel instead of two GEMVs and the activation's.

Then onnxruntime's residual add and RMS norm (com.microsoft SkipSimplifiedLayerNormalization, what genai's builder
writes before each layer's qkv and gate/up projections and before lm_head) whose normed output is X of one Int4Linear
or Int4SwiGLU and nothing else: SkipRMSNormInt4Linear / SkipRMSNormInt4SwiGLU, with the norm's sum as the op's second
output (used or not). On the CUDA EP the op's norm kernel and the projection launch as programmatic dependents where
onnxruntime's norm kernel signals none: genai's int4 7B model decoded 1.07x faster at batch 8 and 1.05x at batch 1
without a graph, the same in genai's graph (benchmarks/results/h200-2026-11-30/int4/genai-int4-skipnorm-twokernel.*).
Refused with the reason: a norm with a bias or without an epsilon attribute or with other attributes, a residual of
another shape than X (a broadcast), a gamma that is not a constant [K]; normed rows used elsewhere are onnxscript's
"other uses".
"""
from __future__ import annotations

import numpy as np
from onnxscript import ir
from onnxscript.rewriter import MatchResult

from ..ops._family import overload_with_optional
from ..ops.int4_linear import (ACCURACY_LEVEL, ACCURACY_LEVELS, BLOCK_SIZES, INT4_LINEAR, INT4_SWIGLU,
                                SKIP_RMS_NORM_INT4_LINEAR, SKIP_RMS_NORM_INT4_SWIGLU, ZP_OVERLOAD, zero_points_shape)
from ..schema import DOMAIN, swiglu_overload
from . import _base
from ._base import FusionRule, check_float_dtypes, dims, gemm_flops, new_initializer, rule_set
from .swiglu import Candidate, Projection, SwiGLUPass, _Shim

MS_DOMAIN = "com.microsoft"


def zero_points_of(node: ir.Node) -> ir.Value | None:
    """A MatMulNBits' zero points (input 3), or None."""
    return node.inputs[3] if len(node.inputs) > 3 else None


def accuracy_level(node: ir.Node) -> int:
    """A MatMulNBits' accuracy_level (absent: 0)."""
    return node.attributes.get_int(ACCURACY_LEVEL.name, 0)


def accuracy_attrs(level: int) -> dict:
    """The fused node's accuracy_level attribute: none at 0, so that the fused graph of a model without it is what it
    was before the ops carried it."""
    return {ACCURACY_LEVEL.name: level} if level else {}


# MatMulNBits' attributes in onnxruntime 1.31 (weight_prepacked: 0, or absent, is the blockwise layout).
KNOWN_ATTRIBUTES = frozenset({"K", "N", "bits", "block_size", ACCURACY_LEVEL.name, "weight_prepacked"})


def check_form(node: ir.Node, result: MatchResult) -> bool:
    """The parts of a MatMulNBits the kernels take that need no constant: no g_idx or bias, 4 bits, a block size of
    BLOCK_SIZES, an accuracy_level MatMulNBits defines (zero points are checked with the weights). Records the
    reason; False then."""
    label = node.name or "the MatMulNBits"
    extra = [i for i, v in enumerate(node.inputs) if i >= 4 and v is not None]
    if extra:
        names = {4: "g_idx", 5: "a bias"}
        result.fail(f"{label} has {', '.join(names.get(i, f'input {i}') for i in extra)}: the int4 ops take the "
                    "weights, scales and zero points that genai's builder writes (no g_idx, no bias)",
                    node.inputs[extra[0]])
        return False
    attr = node.attributes
    unknown = sorted(set(attr) - KNOWN_ATTRIBUTES)
    if unknown:
        result.fail(f"{label} has attribute {', '.join(unknown)}, which MatMulNBits did not have when the int4 rule "
                    "was written: what it changes is unknown here", node.outputs[0])
        return False
    prepacked = attr.get_int("weight_prepacked", 0)
    if prepacked:
        result.fail(f"{label} has weight_prepacked {prepacked}: B is in onnxruntime's CUDA fpA_intB layout, not the "
                    "blockwise one the int4 ops read (the builder's matmulnbits_weights_prepacked=0, its default, "
                    "writes that)", node.outputs[0])
        return False
    bits, block = attr.get_int("bits", 4), attr.get_int("block_size", 0)
    if bits != 4:
        result.fail(f"{label} has {bits}-bit weights: the int4 ops take 4 bits", node.outputs[0])
        return False
    if block not in BLOCK_SIZES:
        result.fail(f"{label} has block size {block}: the kernels take {', '.join(map(str, BLOCK_SIZES))}",
                    node.outputs[0])
        return False
    level = accuracy_level(node)
    if level not in ACCURACY_LEVELS:
        result.fail(f"{label} has accuracy_level {level}: MatMulNBits defines {ACCURACY_LEVELS[0]} to "
                    f"{ACCURACY_LEVELS[-1]}", node.outputs[0])
        return False
    return True


def check_weights(node: ir.Node, result: MatchResult) -> tuple[int, int, int, int] | None:
    """(K, N, n_blocks, block) of a MatMulNBits whose packed weights and scales are constants (the shared guard ran):
    scales in X's type, uint8 weights, the shapes the node's K, N and block size give, X ending in K. Records the
    reason; None then."""
    x, b, scales = node.inputs[0], node.inputs[1], node.inputs[2]
    attr = node.attributes
    block, k_attr, n_attr = attr.get_int("block_size", 0), attr.get_int("K", 0), attr.get_int("N", 0)
    dtype = check_float_dtypes(result, X=x, scales=scales)
    if dtype is None and not result:
        return None
    if b.dtype != ir.DataType.UINT8:
        result.fail(f"the packed weights {b.name} are {b.dtype.name.lower()}, not uint8", b)
        return None
    nb = -(-k_attr // block)
    want_b = [n_attr, nb, block // 2]
    b_shape = [int(d) for d in b.const_value.shape]
    if b_shape != want_b:
        result.fail(f"the packed weights {b.name} have shape {b_shape}, not [N, ceil(K / block), block / 2] = "
                    f"{want_b} for K {k_attr}, N {n_attr}, block {block}", b)
        return None
    s_shape = [int(d) for d in scales.const_value.shape]
    if s_shape not in ([n_attr, nb], [n_attr * nb]):
        result.fail(f"the scales {scales.name} have shape {s_shape}, not [N, n_blocks] = [{n_attr}, {nb}]", scales)
        return None
    zp = zero_points_of(node)
    if zp is not None:
        if zp.dtype != ir.DataType.UINT8:
            result.fail(f"the zero points {zp.name} are {zp.dtype.name.lower()}: the int4 ops take MatMulNBits' packed "
                        "uint8 zero points (two 4-bit values a byte)", zp)
            return None
        z_shape = [int(d) for d in zp.const_value.shape]
        want_z = zero_points_shape(n_attr, nb)
        if z_shape not in (want_z, [want_z[0] * want_z[1]]):
            result.fail(f"the zero points {zp.name} have shape {z_shape}, not [N, ceil(n_blocks / 2)] = {want_z} for "
                        f"N {n_attr} and {nb} blocks", zp)
            return None
    xd = dims(x)  # unknown (after a contrib op shape inference does not know): the kernels check K at run time
    if xd is not None and (not xd or (isinstance(xd[-1], int) and xd[-1] != k_attr)):
        result.fail(f"X {x.name} has shape {xd}: its last dim must be the node's K = {k_attr}", x)
        return None
    return k_attr, n_attr, nb, block


def scales_2d(op, recorder, scales: ir.Value, n: int, nb: int) -> ir.Value:
    """The scales as the ops take them, [N, n_blocks] (MatMulNBits also allows [N * n_blocks])."""
    if len(scales.const_value.shape) == 2:
        return scales
    arr = np.asarray(scales.const_value.numpy()).reshape(n, nb)
    return new_initializer(op, recorder, f"{scales.name}_2d", arr)


def zero_points_2d(op, recorder, node: ir.Node, n: int, nb: int) -> list[ir.Value]:
    """The node's zero points as the ops take them, [N, ceil(n_blocks / 2)] (MatMulNBits also allows them flat), in a
    list of one; [] without them."""
    zp = zero_points_of(node)
    if zp is None:
        return []
    if len(zp.const_value.shape) == 2:
        return [zp]
    arr = np.asarray(zp.const_value.numpy()).reshape(zero_points_shape(n, nb))
    return [new_initializer(op, recorder, f"{zp.name}_2d", arr)]


class Int4Linear(FusionRule):
    op = INT4_LINEAR.name
    pattern_name = "int4_linear"
    naming_ops = ("MatMulNBits",)

    def __init__(self, recorder):
        super().__init__(recorder, "matmulnbits")

    def pattern(self, op, x, b, scales):
        return op.MatMulNBits(x, b, scales, _domain=MS_DOMAIN, _allow_other_inputs=True, _outputs=["y"])

    def check(self, context, x, b, scales, y, **_):
        self.remember(context)
        result = MatchResult()
        node = y.producer()
        if not check_form(node, result):
            return result
        if not self.guard(context, result, x):  # the packed weights and scales are true constants
            return result
        found = check_weights(node, result)
        if found is None:
            return result
        k, n, nb, block = found
        if not self.guard_output(context, result, x, n):
            return result
        self._k, self._n, self._nb, self._block = k, n, nb, block
        return result

    def rewrite(self, op, x, b, scales, y, **_):
        s = scales_2d(op, self.recorder, scales, self._n, self._nb)
        zp = zero_points_2d(op, self.recorder, y.producer(), self._n, self._nb)
        shapes = {"X": dims(x), "Wq": [self._n, self._nb, self._block // 2], "scales": [self._n, self._nb]}
        if zp:
            shapes["zero_points"] = zero_points_shape(self._n, self._nb)
        attrs = {"backend": "auto", **accuracy_attrs(accuracy_level(y.producer()))}
        out = self.emit(op, self.op, [x, b, s, *zp], attrs, shapes, x.dtype, gemm_flops(x, self._k, self._n))
        if zp:
            out.producer().overload = ZP_OVERLOAD  # the function body that takes the zero points
        return out


class Int4SwiGLUPass(SwiGLUPass):
    """The swiglu pass's matcher over MatMulNBits projections: each gated MLP over int4 gate and up weights becomes
    one Int4SwiGLU node; its refusals say why one did not (its projections then fuse as Int4Linear)."""

    op = INT4_SWIGLU.name
    pattern = "int4_linear"
    rule_prefix = "int4_linear/int4_swiglu"

    def projection_of(self, value: ir.Value, graph: ir.Graph) -> Projection | None:
        node = value.producer()
        if node is None or node.graph is not graph or node.domain != MS_DOMAIN or node.op_type != "MatMulNBits" \
                or len(node.inputs) < 3 or None in node.inputs[:3]:
            return None
        return Projection(value, node)

    def _projections(self, cand: Candidate, result: MatchResult) -> bool:
        if not (check_form(cand.gate.gemm, result) and check_form(cand.up.gemm, result)):
            return False
        zg, zu = zero_points_of(cand.gate.gemm), zero_points_of(cand.up.gemm)
        if (zg is None) != (zu is None):
            which, other = (cand.gate, "up") if zg is not None else (cand.up, "gate")
            result.fail(f"only the {'gate' if zg is not None else 'up'} projection {which.value.name} has zero points "
                        f"(the {other} projection has none): Int4SwiGLU takes both or neither",
                        zero_points_of(which.gemm))
            return False
        return True

    def _weights(self, cand: Candidate, result: MatchResult) -> bool:
        g = check_weights(cand.gate.gemm, result)
        u = check_weights(cand.up.gemm, result) if g is not None else None
        if g is None or u is None:
            return False
        if g != u:
            result.fail(f"the gate {cand.gate.value.name} and up {cand.up.value.name} projections differ in (K, N, "
                        f"n_blocks, block): {g} against {u}; Int4SwiGLU takes two weights of one shape",
                        cand.up.value)
            return False
        cand.int4, cand.kn = g, g[:2]
        return True

    def _replace(self, graph: ir.Graph, cand: Candidate) -> None:
        gate, up, rec = cand.gate, cand.up, self.recorder
        shim = _Shim(graph)
        x = gate.x
        k, n, nb, block = cand.int4
        sg = scales_2d(shim, rec, gate.gemm.inputs[2], n, nb)
        su = scales_2d(shim, rec, up.gemm.inputs[2], n, nb)
        zg = zero_points_2d(shim, rec, gate.gemm, n, nb)
        zu = zero_points_2d(shim, rec, up.gemm, n, nb)
        act = cand.activation
        overload = overload_with_optional(swiglu_overload(act), ZP_OVERLOAD) if zg else swiglu_overload(act)
        # the lower of the two levels: int8 rounding of X only where both projections allow it
        level = min(accuracy_level(gate.gemm), accuracy_level(up.gemm))
        attrs = [ir.AttrString("activation", act), ir.AttrString("backend", "auto")] + \
            [ir.AttrInt64(name, v) for name, v in accuracy_attrs(level).items()]
        node = ir.Node(DOMAIN, self.op, [x, gate.gemm.inputs[1], sg, up.gemm.inputs[1], su, *zg, *zu], attrs,
                       overload=overload, num_outputs=1)
        old_out = cand.mul.outputs[0]
        # shape inference stops at contrib ops (QuickGelu; a norm before X): the product's type and shape may be
        # unknown; the op's are X's type (the scales', where X's is unknown too) and X's leading dims, then N
        xd = dims(x)
        node.outputs[0].dtype = old_out.dtype or x.dtype or sg.dtype
        node.outputs[0].shape = old_out.shape if old_out.shape is not None or xd is None else ir.Shape(xd[:-1] + [n])
        flops = gemm_flops(x, k, n)
        shapes = {"X": dims(x), "Wq_gate": [n, nb, block // 2], "scales_gate": [n, nb], "Wq_up": [n, nb, block // 2],
                  "scales_up": [n, nb]}
        if zg:
            shapes["zero_points_gate"] = shapes["zero_points_up"] = zero_points_shape(n, nb)
        extra = [f"activation: {act}", f"  spelled: {cand.spelling}"[:64],
                 f"int4 block {block}" + (", zero points" if zg else "")]
        _base.annotate(node, rec, self.pattern, f"{self.rule_prefix}/{act}", self.op,
                       _base.module_path([gate.gemm, up.gemm]), [(m.name or "?", m.op_type) for m in cand.nodes],
                       shapes, x.dtype, None if flops is None else 2 * flops, extra_doc=tuple(extra), detail=act)
        node.metadata_props["onnxfuse.activation"] = act
        ir.convenience.replace_nodes_and_values(graph, cand.mul, cand.nodes, [node], [old_out], [node.outputs[0]])


class SkipRMSNormInt4(FusionRule):
    """onnxruntime's SkipSimplifiedLayerNormalization (with `outputs` outputs: 4, the sum used or not, or 1, the final
    norm's) whose normed output is X of one Int4Linear (gated False) or Int4SwiGLU (gated True) and nothing else:
    SkipRMSNormInt4Linear / SkipRMSNormInt4SwiGLU, the projection's weights, attributes and overload kept."""
    pattern_name = "int4_linear"
    naming_ops = (INT4_LINEAR.name, INT4_SWIGLU.name)

    def __init__(self, recorder, gated: bool, outputs: int):
        super().__init__(recorder, f"skip_rms_norm_{'int4_swiglu' if gated else 'int4_linear'}/{outputs}")
        self.gated, self.n_outputs = gated, outputs
        self.op = (SKIP_RMS_NORM_INT4_SWIGLU if gated else SKIP_RMS_NORM_INT4_LINEAR).name

    def pattern(self, op, a, b, gamma, wq, scales):
        if self.n_outputs == 1:
            y = op.SkipSimplifiedLayerNormalization(a, b, gamma, _domain=MS_DOMAIN, _allow_other_inputs=True,
                                                    _allow_other_attributes=True, _outputs=["y"])
        else:
            y, _mean, _inv, s = op.SkipSimplifiedLayerNormalization(
                a, b, gamma, _domain=MS_DOMAIN, _allow_other_inputs=True, _allow_other_attributes=True,
                _outputs=["y", "mean", "inv_std_var", "s"])
        proj = op.Int4SwiGLU if self.gated else op.Int4Linear
        out = proj(y, wq, scales, _domain=DOMAIN, _allow_other_inputs=True, _allow_other_attributes=True,
                   _outputs=["out"])
        return out if self.n_outputs == 1 else (out, s)

    def check(self, context, a, b, gamma, wq, scales, y, out=None, **_):
        self.remember(context)
        result = MatchResult()
        # (a one-output pattern binds no name to its output: its root is the projection)
        norm, proj = y.producer(), out.producer() if out is not None else context.root
        self._proj = proj
        if len(context.output_values) != (2 if self.n_outputs == 4 else 1) or len(norm.outputs) != self.n_outputs:
            return result.fail(_base.NOT_A_CANDIDATE, a)  # the other variant's form
        # gamma a true constant (the norm's guard), and the projection's weights (its rule checked their shapes)
        if not _base.guard_nodes([norm], context.model, result, a, self.op, runtime=(b,)):
            return result
        for i, v in enumerate(proj.inputs[1:], 1):
            reason = _base.not_constant(v, f"input {i} of {_base.node_label(proj)}") if v is not None else None
            if reason:
                return result.fail(reason, v)
        other = sorted(set(norm.attributes) - {"epsilon"})
        if other:
            return result.fail(f"{norm.name} has attributes {other} the op does not know", y)
        if "epsilon" not in norm.attributes:
            return result.fail(f"{norm.name} has no epsilon attribute: the op takes the norm's epsilon as written "
                               "(onnxruntime's default for it is its own)", y)
        if len(norm.inputs) > 3 and norm.inputs[3] is not None:
            return result.fail(f"{norm.name} has a bias (its fourth input): the op adds none", norm.inputs[3])
        if check_float_dtypes(result, X=a, skip=b, gamma=gamma, scales=scales) is None and not result:
            return result
        ad, bd = dims(a), dims(b)
        if ad is None or bd is None or ad != bd or not ad:
            return result.fail(f"the norm's inputs {a.name} {ad} and {b.name} {bd} differ in shape (or are unknown): "
                               "the op adds two rows of one shape", b)
        k = int(wq.const_value.shape[1]) * int(wq.const_value.shape[2]) * 2  # padded K; the exact K is X's
        gd = [int(d) for d in gamma.const_value.shape]
        if len(gd) != 1 or (isinstance(ad[-1], int) and gd[0] != ad[-1]) or gd[0] > k:
            return result.fail(f"gamma {gamma.name} has shape {gd}, the op takes [K] (X ends in {ad[-1]})", gamma)
        self._eps = norm.attributes.get_float("epsilon", 0.0)
        self._k, self._n = gd[0], int(wq.const_value.shape[0])
        return result

    def rewrite(self, op, a, b, gamma, wq, scales, y, out=None, **_):
        proj = self._proj
        attrs = {"epsilon": self._eps, "backend": proj.attributes.get_string("backend", "auto")}
        if self.gated:
            attrs["activation"] = proj.attributes.get_string("activation", "silu")
        attrs.update(accuracy_attrs(accuracy_level(proj)))
        rest = list(proj.inputs[1:])
        shapes = {"X": dims(a), "skip": dims(b), "gamma": [self._k]}
        schema = SKIP_RMS_NORM_INT4_SWIGLU if self.gated else SKIP_RMS_NORM_INT4_LINEAR
        for name, value in zip(schema.inputs[3:], rest):
            shapes[name] = [int(d) for d in value.const_value.shape]
        flops = gemm_flops(a, self._k, self._n)
        fused = self.emit(op, self.op, [a, b, gamma, *rest], attrs, shapes, a.dtype,
                          None if flops is None else (2 if self.gated else 1) * flops, outputs=2)
        fused[0].producer().overload = proj.overload  # the activation's and the zero points' function body
        return fused[0] if self.n_outputs == 1 else fused


def rules(recorder):
    """The gated MLPs over int4 weights first (Int4SwiGLU takes both projections), then every MatMulNBits left, then
    onnxruntime's residual add and RMS norm before each of them (SkipRMSNormInt4Linear, SkipRMSNormInt4SwiGLU)."""
    return [Int4SwiGLUPass(recorder), rule_set([(Int4Linear, (recorder,))]),
            rule_set([(SkipRMSNormInt4, (recorder, gated, outputs)) for gated in (True, False) for outputs in (4, 1)])]
