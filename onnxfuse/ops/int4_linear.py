"""Int4Linear: a linear layer over block-quantized 4-bit weights, and Int4SwiGLU: the gate and up projections of a gated
MLP over such weights with act(gate) * up (rules: onnxfuse/rewrites/int4_linear.py).

The weights are what onnxruntime's `com.microsoft.MatMulNBits` (bits 4) takes and what onnxruntime-genai's builder
writes with `-p int4`: Wq uint8 [N, n_blocks, block / 2], two 4-bit values per byte (the element of even k in the low
nibble), column n's K values in blocks of `block` values (the last block padded past K), and one scale per block,
scales [N, n_blocks] in X's type; optionally one 4-bit zero point per block, zero_points uint8 [N, ceil(n_blocks / 2)]
(two blocks a byte, the even block in the low nibble: MatMulNBits' packed form, which the builder writes for an
asymmetric quantization and for AWQ/GPTQ checkpoints); without them the zero point is 8 (symmetric):

    W[n, k] = (nibble(Wq, n, k) - zp[n, k // block]) * scales[n, k // block]          Y = X @ W^T      (k < K)

K is X's last dim, N and the block size come from Wq's shape. The GPU kernels stream the packed weights once and
dequantize in registers (decode) or into the GEMM's tile (prefill); the CPU kernel dequantizes a block at a time.
Int4SwiGLU takes two such weights of one shape (the gate's and the up projection's) and computes
act(X @ W_gate^T) * (X @ W_up^T) with SwiGLU's activations: its decode kernel reads both packed rows of an output
column in one pass and writes the product once.

SkipRMSNormInt4Linear and SkipRMSNormInt4SwiGLU put onnxruntime's residual add and RMS norm (SkipSimplifiedLayer-
Normalization, as genai's builder writes it before qkv, gate/up and lm_head) in front of those two: inputs X, skip and
gamma, then the projection's; outputs Y and sum (X + skip rounded to T; the projection takes that sum's norm times
gamma, rounded to T).

All four carry MatMulNBits' accuracy_level (the rule copies it; absent is 0). At 4 the CUDA backend's one-row fp16
GEMV rounds X to int8 per 32 values of K (scale max |x| / 127 each) and sums with integer dot products, as
onnxruntime's MatMulNBits may at that level; every other kernel, and every other level, computes in X's type as the
reference does (the reference and the function bodies ignore the attribute).
"""
from __future__ import annotations

from ._family import (BACKEND, Attr, OpDef, OpFamily, OpSchema, skip_norm_node, skip_rms_norm,
                      split_optional_overload)
from .swiglu import GATE_ACTIVATIONS, gate_activation, swiglu_body

# The levels MatMulNBits defines (0: unset, 4: X may be quantized to int8).
ACCURACY_LEVELS = range(5)
ACCURACY_LEVEL = Attr("accuracy_level", "int", 0,
                      "MatMulNBits' accuracy_level (0-4), carried by the rule: 4 lets the CUDA backend's one-row fp16 "
                      "GEMV round X to int8 per 32 values of K (scale max |x| / 127 each) and sum with integer dot "
                      "products; every other kernel, and every other level, computes in X's type as the reference "
                      "does")

INT4_LINEAR = OpSchema(
    "Int4Linear", ("X", "Wq", "scales", "zero_points"), ("Y",),
    "Y = X @ W^T, W[n, k] = (nibble(Wq, n, k) - zp[n, k // block]) * scales[n, k // block], zp 8 without zero_points",
    (BACKEND, ACCURACY_LEVEL),
    "A linear layer over block-quantized int4 weights (MatMulNBits with bits 4): X [..., K] of type T, Wq uint8 [N, "
    "n_blocks, block / 2] (two values per byte, the lower k in the low nibble), scales [N, n_blocks] of type T, "
    "n_blocks = ceil(K / block), block a power of two >= 16; optional zero_points uint8 [N, ceil(n_blocks / 2)] (two "
    "4-bit zero points a byte, the even block in the low nibble; absent: 8, symmetric); Y = X.shape[:-1] + [N]. A node "
    "with zero points carries the overload zp.",
    optional=("zero_points",))
INT4_SWIGLU = OpSchema(
    "Int4SwiGLU", ("X", "Wq_gate", "scales_gate", "Wq_up", "scales_up", "zero_points_gate", "zero_points_up"), ("Y",),
    "Y = act(X @ W_gate^T) * (X @ W_up^T), each W dequantized as Int4Linear's",
    (Attr("activation", "string", "silu", "the gate's activation: " + "|".join(GATE_ACTIVATIONS) + " (as SwiGLU's); "
          "absent means silu"), BACKEND, ACCURACY_LEVEL),
    "The gate and up projections of a gated MLP over block-quantized int4 weights (two MatMulNBits of one shape and "
    "block size, as genai's builder writes them with -p int4) with act(gate) * up in their epilogue: Wq_gate and Wq_up "
    "uint8 [N, n_blocks, block / 2], scales_gate and scales_up [N, n_blocks] of type T, optional zero_points_gate and "
    "zero_points_up uint8 [N, ceil(n_blocks / 2)] (both or neither), as Int4Linear's; Y = X.shape[:-1] + [N]. The "
    "node's function overload names the activation (empty: silu), with .zp after it (zp alone for silu) when the "
    "zero points are there.",
    optional=("zero_points_gate", "zero_points_up"))
EPSILON = Attr("epsilon", "float", 1e-5, "added to the mean square before the square root (the norm's epsilon)")
_NORM_MATH = ("sum = X + skip (rounded to T); Xn = sum * rsqrt(mean(sum^2 over the last dim) + epsilon) * gamma "
              "(rounded to T); ")
_NORM_DOC = ("onnxruntime's residual add and RMS norm (com.microsoft SkipSimplifiedLayerNormalization, as genai's "
             "builder writes it before each layer's qkv and gate/up projections) and the projection after it as one "
             "op: X and skip [..., K] of type T, gamma [K]; sum (the residual for the next layer) is X + skip rounded "
             "to T, and the projection takes the norm of that rounded sum, rounded to T, as onnxruntime's kernels "
             "compute it. On the CUDA EP a norm kernel writes sum and the normed rows, then the projection's own path "
             "runs on them, both launched as programmatic dependents outside a CUDA graph. ")
SKIP_RMS_NORM_INT4_LINEAR = OpSchema(
    "SkipRMSNormInt4Linear", ("X", "skip", "gamma", "Wq", "scales", "zero_points"), ("Y", "sum"),
    _NORM_MATH + "Y = Xn @ W^T, W dequantized as Int4Linear's",
    (EPSILON, BACKEND, ACCURACY_LEVEL),
    _NORM_DOC + "The weights are Int4Linear's (Wq, scales, optional zero_points; a node with them carries the "
    "overload zp).",
    optional=("zero_points",))
SKIP_RMS_NORM_INT4_SWIGLU = OpSchema(
    "SkipRMSNormInt4SwiGLU",
    ("X", "skip", "gamma", "Wq_gate", "scales_gate", "Wq_up", "scales_up", "zero_points_gate", "zero_points_up"),
    ("Y", "sum"),
    _NORM_MATH + "Y = act(Xn @ W_gate^T) * (Xn @ W_up^T), each W dequantized as Int4Linear's",
    (Attr("activation", "string", "silu", "the gate's activation: " + "|".join(GATE_ACTIVATIONS) + " (as SwiGLU's); "
          "absent means silu"), EPSILON, BACKEND, ACCURACY_LEVEL),
    _NORM_DOC + "The weights and the activation are Int4SwiGLU's (the overload names the activation, with .zp "
    "after it when the zero points are there).",
    optional=("zero_points_gate", "zero_points_up"))
# The overload suffix of a node with zero points (ops._family.overload_with_optional).
ZP_OVERLOAD = "zp"
# The body uses CastLike: opset 15 (the nibbles come from Mod and BitShift, not opset 18's BitwiseAnd, so that a model
# at opset 15-17 is not upgraded for a pattern it may not have).
MIN_OPSET = 15
# The block sizes the kernels take (MatMulNBits allows any power of two >= 16).
BLOCK_SIZES = (16, 32, 64, 128, 256)


def zero_points_shape(n: int, nb: int) -> list[int]:
    """The zero points' shape the ops take, [N, ceil(n_blocks / 2)]."""
    return [n, (nb + 1) // 2]


def dequantize(wq, scales, k: int, zero_points=None):
    """W [N, K] in fp32 from Wq uint8 [N, n_blocks, block / 2], scales [N, n_blocks] and, when given, zero_points
    uint8 [N, ceil(n_blocks / 2)] (torch tensors; without them the zero point is 8)."""
    import torch

    n, nb, half = wq.shape
    q = wq.to(torch.int32)
    vals = torch.stack((q & 15, q >> 4), dim=-1).reshape(n, nb, 2 * half).float()
    if zero_points is None:
        vals = vals - 8.0
    else:
        z = zero_points.to(torch.int32)
        zp = torch.stack((z & 15, z >> 4), dim=-1).reshape(n, -1)[:, :nb].float()
        vals = vals - zp.reshape(n, nb, 1)
    return (vals * scales.float().reshape(n, nb, 1)).reshape(n, nb * 2 * half)[:, :k]


def quantize(w, block: int, symmetric: bool = True):
    """Block-wise round-to-nearest of W [K, N] (numpy) in MatMulNBits' layout, as genai's builder's RTN does it:
    symmetric, (Wq uint8 [N, n_blocks, block / 2], scales float32 [N, n_blocks]) with the zero point 8; else
    (Wq, scales, zero_points uint8 [N, ceil(n_blocks / 2)]) over each block's [min, max] (0 inside it). The last block
    padded with zeros. For tests and benchmarks: real models come quantized from the builder."""
    import numpy as np

    k, n = w.shape
    nb = -(-k // block)
    padded = np.zeros((n, nb * block), np.float32)
    padded[:, :k] = w.T
    blocks = padded.reshape(n, nb, block)
    if symmetric:
        scales = np.abs(blocks).max(-1) / 7.0
        scales[scales == 0] = 1.0
        zp = np.full((n, nb), 8.0, np.float32)
    else:
        lo, hi = np.minimum(blocks.min(-1), 0.0), np.maximum(blocks.max(-1), 0.0)
        scales = (hi - lo) / 15.0
        scales[scales == 0] = 1.0
        zp = np.clip(np.rint(-lo / scales), 0, 15)
    q = np.clip(np.rint(blocks / scales[..., None]) + zp[..., None], 0, 15).astype(np.uint8)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    if symmetric:
        return packed, scales.astype(np.float32)
    z = np.zeros((n, 2 * ((nb + 1) // 2)), np.uint8)
    z[:, :nb] = zp.astype(np.uint8)
    return packed, scales.astype(np.float32), (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)


# The values of K that share one int8 scale on the CUDA backend's accuracy_level-4 path (Int4RowGemvI8).
INT8_X_UNIT = 32


def int8_x_product(x, wq, scales, k: int, block: int, unit: int = INT8_X_UNIT):
    """X @ W^T (symmetric weights) with X rounded to int8 as the accuracy_level-4 path does it, in float64: each `unit`
    values of a row share the scale sx = max |x| / 127, the value rounded is x * (127 / max |x|) in fp32 (half to
    even), and each unit's integer sum with the centred nibbles is scaled by its block's scale and sx. Also the bound
    on its distance from the exact product (each rounded value within sx / 2 of x): sum over units of sx / 2 times the
    unit's sum of |w|. x [M, K] (K a multiple of unit), wq uint8 [N, n_blocks, block / 2], scales [N, n_blocks]
    (torch), block a multiple of unit. The CUDA kernel's units are 32 values; onnxruntime's CPU MatMulNBits rounds per
    quantization block (unit = block), so at block 32 the two are the same rounding
    (tests/rewrites/test_int4_linear.py checks it)."""
    import torch

    m, n = x.shape[0], wq.shape[0]
    xb = x.float().reshape(m, -1, unit)
    mx = xb.abs().amax(-1, keepdim=True)
    q = torch.round(xb * torch.where(mx > 0, torch.tensor(127.0) / mx, torch.zeros_like(mx))).double()
    sx = (mx / 127.0).double()[..., 0]  # [M, units]
    packed = wq.reshape(n, -1).long()
    nib = torch.stack([packed & 15, packed >> 4], -1).reshape(n, -1)[:, :k].reshape(n, -1, unit).double() - 8
    if block % unit:
        raise ValueError(f"int8_x_product: a block of {block} is not whole units of {unit}")
    s_unit = scales.double().reshape(n, -1).repeat_interleave(block // unit, dim=1)  # a unit's block scale [N, units]
    y = (torch.einsum("rui,cui->rcu", q, nib) * s_unit[None] * sx[:, None]).sum(-1)
    bound = torch.einsum("ru,cu->rc", sx / 2, nib.abs().sum(-1) * s_unit.abs())
    return y, bound


def reference(inputs, attrs: dict):
    x, wq, scales = inputs[:3]
    w = dequantize(wq, scales, x.shape[-1], inputs[3] if len(inputs) > 3 else None)
    return (x.float() @ w.T).to(x.dtype)


def swiglu_reference(inputs, attrs: dict):
    x, wq_g, s_g, wq_u, s_u = inputs[:5]
    zg, zu = (inputs[5], inputs[6]) if len(inputs) > 5 else (None, None)
    k = x.shape[-1]
    xf = x.float()
    g, u = xf @ dequantize(wq_g, s_g, k, zg).T, xf @ dequantize(wq_u, s_u, k, zu).T
    return (gate_activation(str(attrs.get("activation", "silu") or "silu"), g) * u).to(x.dtype)


def skip_norm(x, skip, gamma, eps: float):
    """(Xn, sum) of the norm ops: sum = X + skip rounded to X's type, Xn its RMS norm times gamma in fp32 math,
    rounded to X's type (onnxruntime's SkipSimplifiedLayerNormalization)."""
    return skip_rms_norm(x.float(), skip, gamma, eps, x.dtype)


def skip_norm_reference(inputs, attrs: dict):
    """SkipRMSNormInt4Linear: (Y, sum)."""
    xn, s = skip_norm(*inputs[:3], float(attrs.get("epsilon", 1e-5)))
    return reference([xn, *inputs[3:]], attrs), s


def skip_norm_swiglu_reference(inputs, attrs: dict):
    """SkipRMSNormInt4SwiGLU: (Y, sum)."""
    xn, s = skip_norm(*inputs[:3], float(attrs.get("epsilon", 1e-5)))
    return swiglu_reference([xn, *inputs[3:]], attrs), s


def _dequantize_nodes(wq: str, scales: str, out: str, p: str, zero_points: str | None = None) -> list:
    """Nodes computing `out` = W^T [K, N] in X's type from `wq` [N, nb, block / 2] and `scales` [N, nb] (standard
    ONNX, opset 15: the nibbles unpacked with Mod / BitShift, minus the zero point (8, or each block's of
    `zero_points` [N, ceil(nb / 2)], unpacked the same way), times the block scales, cut to K, X's last dim); every
    intermediate's name starts with `p`."""
    from onnx import TensorProto, helper

    mk = helper.make_node

    def ints(name, *vals):
        return mk("Constant", [], [p + name], value=helper.make_tensor(name, TensorProto.INT64, [len(vals)],
                                                                       list(vals)))

    return [
        mk("Constant", [], [p + "sixteen"], value=helper.make_tensor("sixteen", TensorProto.UINT8, [], [16])),
        mk("Constant", [], [p + "four"], value=helper.make_tensor("four", TensorProto.UINT8, [], [4])),
        mk("Constant", [], [p + "eight"], value=helper.make_tensor("eight", TensorProto.FLOAT, [], [8.0])),
        ints("last", -1), ints("zero", 0), ints("one", 1), ints("end", 2**63 - 1),
        mk("Mod", [wq, p + "sixteen"], [p + "lo"]),
        mk("BitShift", [wq, p + "four"], [p + "hi"], direction="RIGHT"),
        mk("Unsqueeze", [p + "lo", p + "last"], [p + "lo1"]), mk("Unsqueeze", [p + "hi", p + "last"], [p + "hi1"]),
        mk("Concat", [p + "lo1", p + "hi1"], [p + "pairs"], axis=-1),             # [N, nb, block / 2, 2]
        mk("Shape", [wq], [p + "wq_shape"]),
        mk("Slice", [p + "wq_shape", p + "zero", p + "last", p + "zero"], [p + "n_nb"]),  # [N, nb]
        mk("Concat", [p + "n_nb", p + "last"], [p + "blocks_shape"], axis=0),
        mk("Reshape", [p + "pairs", p + "blocks_shape"], [p + "q"]),               # [N, nb, block]
        mk("Cast", [p + "q"], [p + "qf"], to=TensorProto.FLOAT),
        *(_zero_point_nodes(zero_points, p) if zero_points else []),
        mk("Sub", [p + "qf", p + "zpf" if zero_points else p + "eight"], [p + "centred"]),
        mk("CastLike", [p + "centred", "X"], [p + "centred_t"]),
        mk("Unsqueeze", [scales, p + "last"], [p + "scales1"]),
        mk("Mul", [p + "centred_t", p + "scales1"], [p + "wb"]),
        mk("Slice", [p + "n_nb", p + "zero", p + "one", p + "zero"], [p + "n"]),
        mk("Concat", [p + "n", p + "last"], [p + "rows_shape"], axis=0),
        mk("Reshape", [p + "wb", p + "rows_shape"], [p + "w_pad"]),               # [N, nb * block]
        mk("Shape", ["X"], [p + "x_shape"]),
        mk("Slice", [p + "x_shape", p + "last", p + "end", p + "zero"], [p + "k"]),  # [K]
        mk("Slice", [p + "w_pad", p + "zero", p + "k", p + "one"], [p + "w"]),    # [N, K]
        mk("Transpose", [p + "w"], [out], perm=[1, 0]),                            # [K, N]
    ]


def _zero_point_nodes(zero_points: str, p: str) -> list:
    """`p + "zpf"` [N, nb, 1] in float from `zero_points` [N, ceil(nb / 2)] (the low nibble the even block), nb
    being the blocks of `p + "n_nb"` (the packed weights' first two dims)."""
    from onnx import TensorProto, helper

    mk = helper.make_node
    return [
        mk("Mod", [zero_points, p + "sixteen"], [p + "zlo"]),
        mk("BitShift", [zero_points, p + "four"], [p + "zhi"], direction="RIGHT"),
        mk("Unsqueeze", [p + "zlo", p + "last"], [p + "zlo1"]), mk("Unsqueeze", [p + "zhi", p + "last"], [p + "zhi1"]),
        mk("Concat", [p + "zlo1", p + "zhi1"], [p + "zpairs"], axis=-1),          # [N, ceil(nb / 2), 2]
        mk("Slice", [p + "n_nb", p + "zero", p + "one", p + "zero"], [p + "zn"]),
        mk("Concat", [p + "zn", p + "last"], [p + "zrows"], axis=0),
        mk("Reshape", [p + "zpairs", p + "zrows"], [p + "zrow"]),                 # [N, 2 ceil(nb / 2)]
        mk("Slice", [p + "n_nb", p + "one", p + "end", p + "zero"], [p + "nb"]),
        mk("Slice", [p + "zrow", p + "zero", p + "nb", p + "one"], [p + "zcut"]),  # [N, nb]
        mk("Cast", [p + "zcut"], [p + "zcutf"], to=TensorProto.FLOAT),
        mk("Unsqueeze", [p + "zcutf", p + "last"], [p + "zpf"]),                  # [N, nb, 1]
    ]


def _has_zero_points(overload: str) -> tuple[str, bool]:
    return split_optional_overload(overload, ZP_OVERLOAD)


def body(overload: str):
    """Standard ONNX (opset 15): the weights dequantized (_dequantize_nodes), then one MatMul; the zp overload takes
    zero_points."""
    from onnx import helper

    _, zp = _has_zero_points(overload)
    nodes = _dequantize_nodes("Wq", "scales", "wt", "q_", "zero_points" if zp else None) + \
        [helper.make_node("MatMul", ["X", "wt"], ["Y"])]
    return list(INT4_LINEAR.inputs[:4 if zp else 3]), nodes


def swiglu_body_nodes(overload: str):
    """Both weights dequantized as Int4Linear's body does, then SwiGLU's body for the overload's activation (the
    empty overload is silu; ".zp" after it, or zp alone, takes the zero points)."""
    act, zp = _has_zero_points(overload)
    nodes = _dequantize_nodes("Wq_gate", "scales_gate", "W_gate", "qg_", "zero_points_gate" if zp else None) + \
        _dequantize_nodes("Wq_up", "scales_up", "W_up", "qu_", "zero_points_up" if zp else None) + \
        swiglu_body(act or "silu")
    return list(INT4_SWIGLU.inputs[:7 if zp else 5]), nodes


def _with_skip_norm(inputs: list, nodes: list) -> tuple[list, list]:
    """A projection body's (inputs, nodes) behind onnxruntime's com.microsoft SkipSimplifiedLayerNormalization (the
    nodes the rule replaced): the projection reads the norm's output where it read X; epsilon passed through."""
    norm = skip_norm_node(["X", "skip", "gamma"], "Xn")
    for node in nodes:
        for i, name in enumerate(node.input):
            if name == "X":
                node.input[i] = "Xn"
    return ["X", "skip", "gamma", *inputs[1:]], [norm, *nodes]


def skip_norm_body(overload: str):
    """onnxruntime's norm, then Int4Linear's body on its output."""
    return _with_skip_norm(*body(overload))


def skip_norm_swiglu_body(overload: str):
    """onnxruntime's norm, then Int4SwiGLU's body on its output."""
    return _with_skip_norm(*swiglu_body_nodes(overload))


def out_shape(shapes: dict, attrs: dict) -> list:
    wq = shapes["Wq"] if "Wq" in shapes else shapes["Wq_gate"]
    return list(shapes["X"][:-1]) + [wq[0]]


def doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(M, K, N, block[, "zp"]): X [M, K], Wq [N, ceil(K / block), block / 2], scales [N, ceil(K / block)]; "zp":
    zero_points [N, ceil(n_blocks / 2)] too."""
    m, k, n, block = entry[:4]
    zp = entry[4:] == ("zp",)
    nb = -(-k // block)
    shapes = {"X": [m, k], "Wq": [n, nb, block // 2], "scales": [n, nb]}
    if zp:
        shapes["zero_points"] = zero_points_shape(n, nb)
    return shapes, {}, (m, k, n, block, f"block {block}" + (" zp" if zp else ""))


def swiglu_doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(M, K, N, block, activation[, "zp"]): Int4Linear's shapes for both weights."""
    m, k, n, block, act = entry[:5]
    zp = entry[5:] == ("zp",)
    nb = -(-k // block)
    shapes = {"X": [m, k], "Wq_gate": [n, nb, block // 2], "scales_gate": [n, nb], "Wq_up": [n, nb, block // 2],
              "scales_up": [n, nb]}
    if zp:
        shapes["zero_points_gate"] = shapes["zero_points_up"] = zero_points_shape(n, nb)
    return shapes, {"activation": act}, (m, k, n, block, f"block {block} {act}" + (" zp" if zp else ""))


def two_outputs(shapes: dict, attrs: dict) -> list:
    """The norm ops' Y and sum: X's leading dims then N, and X's shape."""
    return [out_shape(shapes, attrs), list(shapes["X"])]


def _with_norm_inputs(projection_entry):
    """A norm op's doctor entry from its projection's: skip [M, K] and gamma [K] after X."""
    def entry_fn(entry) -> tuple[dict, dict, tuple]:
        shapes, attrs, row = projection_entry(entry)
        m, k = shapes["X"]
        return {"X": [m, k], "skip": [m, k], "gamma": [k], **{n: v for n, v in shapes.items() if n != "X"}}, attrs, row
    return entry_fn


skip_norm_doctor_entry = _with_norm_inputs(doctor_entry)
skip_norm_swiglu_doctor_entry = _with_norm_inputs(swiglu_doctor_entry)


def doctor_inputs(op, dtype, shapes: dict, seed: int, device: str = "cpu") -> list:
    """X ~ N(0, 1); every byte of the packed weights uniform (the padding past K too: the kernels must ignore it);
    scales of both signs sized so that each product stays O(1) (a centred nibble has variance about 21)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for name, shp in shapes.items():
        if name.startswith("Wq") or name.startswith("zero_points"):
            out.append(torch.randint(0, 256, tuple(shp), generator=g, device=device, dtype=torch.uint8))
        elif name.startswith("scales"):
            k = shapes["X"][-1] if "X" in shapes else shp[1] * 32
            s = torch.rand(*shp, generator=g, device=device) + 0.5
            sign = torch.randint(0, 2, tuple(shp), generator=g, device=device) * 2 - 1
            out.append((s * sign / (21.0 * max(k, 1)) ** 0.5).to(dtype))
        else:
            out.append(torch.randn(*shp, generator=g, device=device, dtype=torch.float32).to(dtype))
    return out


# Doctor shapes (M, K, N, block[, "zp"]): decode and prefill rows, ragged K (a padded last block) and N, every block
# size, one Llama-2-7B projection; a wide N, odd (the GEMV's last warp has one column of its pair); with zero points
# on every path (the GEMV, the tensor-core rows, dequantization + GEMM), an odd block count among them (the last
# byte's high nibble is padding). Special rows without the type's max (OpDef.special_type_max): in fp32 the GEMV's
# lanes sum FLT_MAX-sized products in another order than the reference, so which outputs overflow to +-Inf differs
# (the CUDA backend at 7-16 rows on an H100); NaN, +-Inf, -0 and subnormals are checked.
FAMILY = OpFamily("int4_linear", (
    OpDef(10, INT4_LINEAR, reference, body, out_shape,
          ((1, 256, 256, 32), (3, 200, 67, 16), (7, 1000, 130, 64), (16, 512, 384, 128), (64, 256, 520, 256),
           (200, 520, 264, 32), (1, 4096, 4096, 32), (3, 128, 16901, 64),
           (1, 256, 256, 32, "zp"), (2, 200, 67, 16, "zp"), (7, 1000, 130, 64, "zp"), (16, 160, 384, 32, "zp"),
           (64, 256, 520, 256, "zp"), (40, 520, 264, 128, "zp"),
           (20, 203, 67, 16), (20, 203, 67, 16, "zp"),  # past 16 rows, K % 8 != 0: the scalar dequantization
           # past 16 rows, symmetric, a block of 64 or more dividing K and N % 8 == 0: CUTLASS's mixed-input GEMM on
           # sm_90 past the rows path's 64 rows (each of its tiles: the small one at 128 rows, the 128 x 128 one at
           # 96 x 10496, whose N fills 0.6 of a wave of 132 SMs, the wide one at 512 x 8448); with zero points, the
           # dequantization + GEMM
           (128, 512, 264, 64), (96, 256, 10496, 64), (512, 256, 8448, 128), (300, 1024, 1032, 128, "zp"),
           (24, 256, 136, 256, "zp"),
           # the rows path (Int4MmaGemm: 17-128 rows, symmetric, K a multiple of 64; blocks of 64 or more to 64 rows
           # on sm_90): its 32-row tile with ragged N and a K split, a block of 128; blocks of 32 from 65 to 192 rows
           # on a 9.0 device its sm_90a form (Int4WgmmaGemm; elsewhere the 64- and 96-row tiles to 128 rows, then the
           # dequantization + GEMM): the 128-row tile with a K split, the 96-row tile with ragged N and a K split, the
           # 128-row tile with ragged N whole, the 160-row tile with ragged rows and a K split, the 192-row tile with
           # ragged rows and a K split, and whole
           (24, 576, 1000, 32), (100, 1024, 520, 32), (64, 640, 264, 128), (72, 4096, 1000, 32),
           (120, 256, 4100, 32), (150, 2048, 1000, 32), (180, 1024, 264, 32), (192, 256, 264, 32)),
          doctor_entry, min_opset=MIN_OPSET, byte_inputs=("Wq", "zero_points"), doctor_inputs=doctor_inputs,
          optional_overload=ZP_OVERLOAD, special_type_max=False),
    # Int4SwiGLU: decode rows (the GEMV), 5-16 (Triton), past 16 (the rows path, CUTLASS's on sm_90, dequantization +
    # GEMMs), ragged K and N; every activation at one and at 7 rows; zero points on each path. One-node models carry
    # the empty overload (zp with zero points), as SwiGLU's do.
    OpDef(11, INT4_SWIGLU, swiglu_reference, swiglu_body_nodes, out_shape,
          tuple([(1, 256, 256, 32, "silu"), (2, 200, 67, 16, "silu"), (12, 1000, 130, 64, "silu"),
                 (40, 520, 264, 128, "silu"), (1, 4096, 1024, 32, "silu")]
                + [(m, 96, 40, 32, act) for act in GATE_ACTIVATIONS[1:] for m in (1, 7)]
                + [(1, 256, 256, 32, "silu", "zp"), (9, 200, 67, 16, "silu", "zp"), (40, 520, 264, 128, "silu", "zp"),
                   (2, 96, 40, 32, "gelu", "zp"), (20, 203, 40, 16, "silu"), (20, 203, 40, 16, "silu", "zp"),
                   # CUTLASS's GEMM on sm_90 (gate and up side by side in its output; the 128 x 128 tile at 96 x
                   # 10240); with zero points not
                   (160, 512, 264, 64, "silu"), (96, 256, 10240, 64, "silu"), (300, 1024, 520, 128, "gelu"),
                   (300, 1024, 520, 128, "gelu", "zp"),
                   # the rows path (Int4MmaGemm; blocks of 32 from 65 to 192 rows on a 9.0 device its sm_90a form),
                   # gate and up side by side in its output: blocks of 32 at 96, 144 and 176 rows, of 64 at 40
                   (96, 512, 264, 32, "silu"), (144, 256, 264, 32, "silu"), (176, 512, 264, 32, "silu"),
                   (40, 256, 1000, 64, "gelu")]),
          swiglu_doctor_entry, overload_attr="activation", min_opset=MIN_OPSET,
          byte_inputs=("Wq_gate", "Wq_up", "zero_points_gate", "zero_points_up"), doctor_inputs=doctor_inputs,
          optional_overload=ZP_OVERLOAD, special_type_max=False),
    # The norm ops: the norm kernel, then one and two rows (the GEMVs in fp16; bf16: the tensor cores), 3-16 rows (the
    # tensor cores), past 16 (the rows path, CUTLASS's on sm_90 or the dequantization + GEMM); ragged K and N, zero
    # points, a K past the GEMV's one-row staging and the vector norm kernel's reach (their element-by-element forms),
    # a 7B qkv at one row.
    OpDef(21, SKIP_RMS_NORM_INT4_LINEAR, skip_norm_reference, skip_norm_body, out_shape,
          ((1, 256, 256, 32), (2, 200, 67, 16), (7, 1000, 130, 64), (40, 520, 264, 128), (128, 512, 264, 64),
           (1, 4096, 12288, 32), (1, 256, 256, 32, "zp"), (2, 200, 67, 16, "zp"), (9, 200, 67, 16, "zp"),
           (1, 24608, 24, 32), (48, 512, 264, 32)),
          skip_norm_doctor_entry, min_opset=MIN_OPSET, byte_inputs=("Wq", "zero_points"), doctor_inputs=doctor_inputs,
          optional_overload=ZP_OVERLOAD, special_type_max=False, out_shapes=two_outputs),
    OpDef(22, SKIP_RMS_NORM_INT4_SWIGLU, skip_norm_swiglu_reference, skip_norm_swiglu_body, out_shape,
          ((1, 256, 256, 32, "silu"), (2, 200, 67, 16, "silu"), (12, 1000, 130, 64, "silu"),
           (40, 520, 264, 128, "silu"), (160, 512, 264, 64, "silu"), (1, 4096, 1024, 32, "silu"),
           (1, 96, 40, 32, "gelu"), (1, 256, 256, 32, "silu", "zp"), (2, 96, 40, 32, "gelu", "zp"),
           (7, 200, 67, 16, "silu", "zp"), (48, 512, 264, 32, "silu")),
          skip_norm_swiglu_doctor_entry, overload_attr="activation", min_opset=MIN_OPSET,
          byte_inputs=("Wq_gate", "Wq_up", "zero_points_gate", "zero_points_up"), doctor_inputs=doctor_inputs,
          optional_overload=ZP_OVERLOAD, special_type_max=False, out_shapes=two_outputs),
))
