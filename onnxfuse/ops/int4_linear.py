"""Int4Linear: a linear layer over block-quantized 4-bit weights, and Int4SwiGLU: the gate and up projections of a gated
MLP over such weights with act(gate) * up (rules: onnxfuse/rewrites/int4_linear.py).

The weights are what onnxruntime's `com.microsoft.MatMulNBits` (bits 4, no zero points: symmetric, the zero point is 8)
takes and what onnxruntime-genai's builder writes with `-p int4`: Wq uint8 [N, n_blocks, block / 2], two 4-bit values
per byte (the element of even k in the low nibble), column n's K values in blocks of `block` values (the last block
padded past K), and one scale per block, scales [N, n_blocks] in X's type:

    W[n, k] = (nibble(Wq, n, k) - 8) * scales[n, k // block]          Y = X @ W^T      (k < K)

K is X's last dim, N and the block size come from Wq's shape. The GPU kernels stream the packed weights once and
dequantize in registers (decode) or into the GEMM's tile (prefill); the CPU kernel dequantizes a block at a time.
Int4SwiGLU takes two such weights of one shape (the gate's and the up projection's) and computes
act(X @ W_gate^T) * (X @ W_up^T) with SwiGLU's activations: its decode kernel reads both packed rows of an output
column in one pass and writes the product once.
"""
from __future__ import annotations

from ._family import BACKEND, Attr, OpDef, OpFamily, OpSchema
from .swiglu import GATE_ACTIVATIONS, gate_activation, swiglu_body

INT4_LINEAR = OpSchema(
    "Int4Linear", ("X", "Wq", "scales"), ("Y",),
    "Y = X @ W^T, W[n, k] = (nibble(Wq, n, k) - 8) * scales[n, k // block]", (BACKEND,),
    "A linear layer over symmetric block-quantized int4 weights (MatMulNBits with bits 4 and no zero points): X "
    "[..., K] of type T, Wq uint8 [N, n_blocks, block / 2] (two values per byte, the lower k in the low nibble), "
    "scales [N, n_blocks] of type T, n_blocks = ceil(K / block), block a power of two >= 16; Y = X.shape[:-1] + [N].")
INT4_SWIGLU = OpSchema(
    "Int4SwiGLU", ("X", "Wq_gate", "scales_gate", "Wq_up", "scales_up"), ("Y",),
    "Y = act(X @ W_gate^T) * (X @ W_up^T), each W dequantized as Int4Linear's",
    (Attr("activation", "string", "silu", "the gate's activation: " + "|".join(GATE_ACTIVATIONS) + " (as SwiGLU's); "
          "absent means silu"), BACKEND),
    "The gate and up projections of a gated MLP over symmetric block-quantized int4 weights (two MatMulNBits of one "
    "shape and block size, as genai's builder writes them with -p int4) with act(gate) * up in their epilogue: Wq_gate "
    "and Wq_up uint8 [N, n_blocks, block / 2], scales_gate and scales_up [N, n_blocks] of type T, as Int4Linear's; "
    "Y = X.shape[:-1] + [N]. The node's function overload names the activation (empty: silu).")
# The body uses CastLike: opset 15 (the nibbles come from Mod and BitShift, not opset 18's BitwiseAnd, so that a model
# at opset 15-17 is not upgraded for a pattern it may not have).
MIN_OPSET = 15
# The block sizes the kernels take (MatMulNBits allows any power of two >= 16).
BLOCK_SIZES = (16, 32, 64, 128, 256)


def dequantize(wq, scales, k: int):
    """W [N, K] in fp32 from Wq uint8 [N, n_blocks, block / 2] and scales [N, n_blocks] (torch tensors)."""
    import torch

    n, nb, half = wq.shape
    q = wq.to(torch.int32)
    vals = torch.stack((q & 15, q >> 4), dim=-1).reshape(n, nb, 2 * half).float() - 8.0
    return (vals * scales.float().reshape(n, nb, 1)).reshape(n, nb * 2 * half)[:, :k]


def quantize(w, block: int):
    """Symmetric block-wise round-to-nearest of W [K, N] (numpy) in MatMulNBits' layout, as genai's builder's RTN
    does it: (Wq uint8 [N, n_blocks, block / 2], scales float32 [N, n_blocks]); the zero point 8, the last block padded
    with zeros. For tests and benchmarks: real models come quantized from the builder."""
    import numpy as np

    k, n = w.shape
    nb = -(-k // block)
    padded = np.zeros((n, nb * block), np.float32)
    padded[:, :k] = w.T
    blocks = padded.reshape(n, nb, block)
    scales = np.abs(blocks).max(-1) / 7.0
    scales[scales == 0] = 1.0
    q = np.clip(np.rint(blocks / scales[..., None]) + 8, 0, 15).astype(np.uint8)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8), scales.astype(np.float32)


def reference(inputs, attrs: dict):
    x, wq, scales = inputs
    w = dequantize(wq, scales, x.shape[-1])
    return (x.float() @ w.T).to(x.dtype)


def swiglu_reference(inputs, attrs: dict):
    x, wq_g, s_g, wq_u, s_u = inputs
    k = x.shape[-1]
    xf = x.float()
    g, u = xf @ dequantize(wq_g, s_g, k).T, xf @ dequantize(wq_u, s_u, k).T
    return (gate_activation(str(attrs.get("activation", "silu") or "silu"), g) * u).to(x.dtype)


def _dequantize_nodes(wq: str, scales: str, out: str, p: str) -> list:
    """Nodes computing `out` = W^T [K, N] in X's type from `wq` [N, nb, block / 2] and `scales` [N, nb] (standard
    ONNX, opset 15: the nibbles unpacked with Mod / BitShift, minus 8, times the block scales, cut to K, X's last
    dim); every intermediate's name starts with `p`."""
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
        mk("Sub", [p + "qf", p + "eight"], [p + "centred"]),
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


def body(overload: str):
    """Standard ONNX (opset 15): the weights dequantized (_dequantize_nodes), then one MatMul."""
    from onnx import helper

    nodes = _dequantize_nodes("Wq", "scales", "wt", "q_") + [helper.make_node("MatMul", ["X", "wt"], ["Y"])]
    return list(INT4_LINEAR.inputs), nodes


def swiglu_body_nodes(overload: str):
    """Both weights dequantized as Int4Linear's body does, then SwiGLU's body for the overload's activation (the
    empty overload is silu)."""
    nodes = _dequantize_nodes("Wq_gate", "scales_gate", "W_gate", "qg_") + \
        _dequantize_nodes("Wq_up", "scales_up", "W_up", "qu_") + swiglu_body(overload or "silu")
    return list(INT4_SWIGLU.inputs), nodes


def out_shape(shapes: dict, attrs: dict) -> list:
    wq = shapes["Wq"] if "Wq" in shapes else shapes["Wq_gate"]
    return list(shapes["X"][:-1]) + [wq[0]]


def doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(M, K, N, block): X [M, K], Wq [N, ceil(K / block), block / 2], scales [N, ceil(K / block)]."""
    m, k, n, block = entry
    nb = -(-k // block)
    return ({"X": [m, k], "Wq": [n, nb, block // 2], "scales": [n, nb]}, {},
            (m, k, n, block, f"block {block}"))


def swiglu_doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(M, K, N, block, activation): Int4Linear's shapes for both weights."""
    m, k, n, block, act = entry
    nb = -(-k // block)
    shapes = {"X": [m, k], "Wq_gate": [n, nb, block // 2], "scales_gate": [n, nb], "Wq_up": [n, nb, block // 2],
              "scales_up": [n, nb]}
    return shapes, {"activation": act}, (m, k, n, block, f"block {block} {act}")


def doctor_inputs(op, dtype, shapes: dict, seed: int, device: str = "cpu") -> list:
    """X ~ N(0, 1); every byte of the packed weights uniform (the padding past K too: the kernels must ignore it);
    scales of both signs sized so that each product stays O(1) (a centred nibble has variance about 21)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for name, shp in shapes.items():
        if name.startswith("Wq"):
            out.append(torch.randint(0, 256, tuple(shp), generator=g, device=device, dtype=torch.uint8))
        elif name.startswith("scales"):
            k = shapes["X"][-1] if "X" in shapes else shp[1] * 32
            s = torch.rand(*shp, generator=g, device=device) + 0.5
            sign = torch.randint(0, 2, tuple(shp), generator=g, device=device) * 2 - 1
            out.append((s * sign / (21.0 * max(k, 1)) ** 0.5).to(dtype))
        else:
            out.append(torch.randn(*shp, generator=g, device=device, dtype=torch.float32).to(dtype))
    return out


# Doctor shapes (M, K, N, block): decode and prefill rows, ragged K (a padded last block) and N, every block size,
# one Llama-2-7B projection; a wide N, odd (the GEMV's last warp has one column of its pair).
FAMILY = OpFamily("int4_linear", (
    OpDef(10, INT4_LINEAR, reference, body, out_shape,
          ((1, 256, 256, 32), (3, 200, 67, 16), (7, 1000, 130, 64), (16, 512, 384, 128), (64, 256, 520, 256),
           (200, 520, 264, 32), (1, 4096, 4096, 32), (3, 128, 16901, 64)),
          doctor_entry, min_opset=MIN_OPSET, byte_inputs=("Wq",), doctor_inputs=doctor_inputs),
    # Int4SwiGLU: decode rows (the GEMV), 5-16 (Triton), past 16 (dequantization + GEMMs), ragged K and N; every
    # activation at one and at 7 rows. One-node models carry the empty overload, as SwiGLU's do.
    OpDef(11, INT4_SWIGLU, swiglu_reference, swiglu_body_nodes, out_shape,
          tuple([(1, 256, 256, 32, "silu"), (2, 200, 67, 16, "silu"), (12, 1000, 130, 64, "silu"),
                 (40, 520, 264, 128, "silu"), (1, 4096, 1024, 32, "silu")]
                + [(m, 96, 40, 32, act) for act in GATE_ACTIVATIONS[1:] for m in (1, 7)]),
          swiglu_doctor_entry, overload_attr="activation", min_opset=MIN_OPSET, byte_inputs=("Wq_gate", "Wq_up"),
          doctor_inputs=doctor_inputs),
))
