"""Int4Linear: a linear layer over block-quantized 4-bit weights (rules: onnxfuse/rewrites/int4_linear.py).

The weights are what onnxruntime's `com.microsoft.MatMulNBits` (bits 4, no zero points: symmetric, the zero point is 8)
takes and what onnxruntime-genai's builder writes with `-p int4`: Wq uint8 [N, n_blocks, block / 2], two 4-bit values
per byte (the element of even k in the low nibble), column n's K values in blocks of `block` values (the last block
padded past K), and one scale per block, scales [N, n_blocks] in X's type:

    W[n, k] = (nibble(Wq, n, k) - 8) * scales[n, k // block]          Y = X @ W^T      (k < K)

K is X's last dim, N and the block size come from Wq's shape. The GPU kernels stream the packed weights once and
dequantize in registers (decode) or into the GEMM's tile (prefill); the CPU kernel dequantizes a block at a time.
"""
from __future__ import annotations

from ._family import BACKEND, OpDef, OpFamily, OpSchema

INT4_LINEAR = OpSchema(
    "Int4Linear", ("X", "Wq", "scales"), ("Y",),
    "Y = X @ W^T, W[n, k] = (nibble(Wq, n, k) - 8) * scales[n, k // block]", (BACKEND,),
    "A linear layer over symmetric block-quantized int4 weights (MatMulNBits with bits 4 and no zero points): X "
    "[..., K] of type T, Wq uint8 [N, n_blocks, block / 2] (two values per byte, the lower k in the low nibble), "
    "scales [N, n_blocks] of type T, n_blocks = ceil(K / block), block a power of two >= 16; Y = X.shape[:-1] + [N].")
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


def body(overload: str):
    """Standard ONNX (opset 15): the nibbles unpacked with Mod / BitShift, minus 8, times the block scales, cut to K
    (X's last dim), then one MatMul."""
    from onnx import TensorProto, helper

    mk = helper.make_node

    def ints(name, *vals):
        return mk("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(vals)], list(vals)))

    nodes = [
        mk("Constant", [], ["sixteen"], value=helper.make_tensor("sixteen", TensorProto.UINT8, [], [16])),
        mk("Constant", [], ["four"], value=helper.make_tensor("four", TensorProto.UINT8, [], [4])),
        mk("Constant", [], ["eight"], value=helper.make_tensor("eight", TensorProto.FLOAT, [], [8.0])),
        ints("last", -1), ints("zero", 0), ints("one", 1), ints("end", 2**63 - 1),
        mk("Mod", ["Wq", "sixteen"], ["lo"]),
        mk("BitShift", ["Wq", "four"], ["hi"], direction="RIGHT"),
        mk("Unsqueeze", ["lo", "last"], ["lo1"]), mk("Unsqueeze", ["hi", "last"], ["hi1"]),
        mk("Concat", ["lo1", "hi1"], ["pairs"], axis=-1),            # [N, nb, block / 2, 2]
        mk("Shape", ["Wq"], ["wq_shape"]),
        mk("Slice", ["wq_shape", "zero", "last", "zero"], ["n_nb"]),  # [N, nb]
        mk("Concat", ["n_nb", "last"], ["blocks_shape"], axis=0),
        mk("Reshape", ["pairs", "blocks_shape"], ["q"]),              # [N, nb, block]
        mk("Cast", ["q"], ["qf"], to=TensorProto.FLOAT),
        mk("Sub", ["qf", "eight"], ["centred"]),
        mk("CastLike", ["centred", "X"], ["centred_t"]),
        mk("Unsqueeze", ["scales", "last"], ["scales1"]),
        mk("Mul", ["centred_t", "scales1"], ["wb"]),
        mk("Slice", ["n_nb", "zero", "one", "zero"], ["n"]),
        mk("Concat", ["n", "last"], ["rows_shape"], axis=0),
        mk("Reshape", ["wb", "rows_shape"], ["w_pad"]),              # [N, nb * block]
        mk("Shape", ["X"], ["x_shape"]),
        mk("Slice", ["x_shape", "last", "end", "zero"], ["k"]),      # [K]
        mk("Slice", ["w_pad", "zero", "k", "one"], ["w"]),            # [N, K]
        mk("Transpose", ["w"], ["wt"], perm=[1, 0]),
        mk("MatMul", ["X", "wt"], ["Y"]),
    ]
    return list(INT4_LINEAR.inputs), nodes


def out_shape(shapes: dict, attrs: dict) -> list:
    return list(shapes["X"][:-1]) + [shapes["Wq"][0]]


def doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(M, K, N, block): X [M, K], Wq [N, ceil(K / block), block / 2], scales [N, ceil(K / block)]."""
    m, k, n, block = entry
    nb = -(-k // block)
    return ({"X": [m, k], "Wq": [n, nb, block // 2], "scales": [n, nb]}, {},
            (m, k, n, block, f"block {block}"))


def doctor_inputs(op, dtype, shapes: dict, seed: int, device: str = "cpu") -> list:
    """X ~ N(0, 1); every byte of Wq uniform (the padding past K too: the kernels must ignore it); scales of both
    signs sized so that Y stays O(1) (a centred nibble has variance about 21)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for name, shp in shapes.items():
        if name == "Wq":
            out.append(torch.randint(0, 256, tuple(shp), generator=g, device=device, dtype=torch.uint8))
        elif name == "scales":
            k = shapes["X"][-1] if "X" in shapes else shp[1] * 32
            s = torch.rand(*shp, generator=g, device=device) + 0.5
            sign = torch.randint(0, 2, tuple(shp), generator=g, device=device) * 2 - 1
            out.append((s * sign / (21.0 * max(k, 1)) ** 0.5).to(dtype))
        else:
            out.append(torch.randn(*shp, generator=g, device=device, dtype=torch.float32).to(dtype))
    return out


# Doctor shapes (M, K, N, block): decode and prefill rows, ragged K (a padded last block) and N, every block size,
# one Llama-2-7B projection.
FAMILY = OpFamily("int4_linear", (
    OpDef(10, INT4_LINEAR, reference, body, out_shape,
          ((1, 256, 256, 32), (3, 200, 67, 16), (7, 1000, 130, 64), (16, 512, 384, 128), (64, 256, 520, 256),
           (200, 520, 264, 32), (1, 4096, 4096, 32)),
          doctor_entry, min_opset=MIN_OPSET, byte_inputs=("Wq",), doctor_inputs=doctor_inputs),
))
