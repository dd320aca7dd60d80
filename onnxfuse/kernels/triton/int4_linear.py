"""Triton kernels for Int4Linear and Int4SwiGLU (onnxfuse.schema): one GEMM whose K loop loads the packed 4-bit weight
tile, unpacks and scales it in registers and feeds it to tl.dot, so the weights cross memory once, as bytes of int4;
Int4SwiGLU's loads the gate's and the up tile of the same columns, keeps two accumulators and writes act(g) * u
(swiglu.py's activation, by run-time code).

Compiled ahead of time by `aot.py`; the launcher (cuda/int4_linear.cu, onnxfuse_triton_int4_linear) passes the
arguments in the order of KERNELS and launches row tiles x column tiles (runtime.h Launch).
"""
import triton
import triton.language as tl

from .gemm_loop import _store_tile, _tile_ids
from .swiglu import _gate_activation


@triton.jit
def _tile(M, N, K, RB, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """The program's tile: its rows and columns (offs_m, offs_n, n_ok, cols), and the offsets of a K step's X tile and
    packed weight tile from the first step's (rows past M and columns past N clamped to 0: loaded, never stored)."""
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    n_ok = offs_n < N
    cols = tl.where(n_ok, offs_n, 0).to(tl.int64)
    x_off = rows[:, None] * K + tl.arange(0, BLOCK_K)[None, :]
    w_off = cols[:, None] * RB + tl.arange(0, BLOCK_K // 2)[None, :]
    return offs_m, offs_n, n_ok, cols, x_off, w_off


@triton.jit
def _per_16(t16, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_K / 16] values broadcast over their 16 columns: [BLOCK_N, BLOCK_K]."""
    return tl.reshape(tl.broadcast_to(t16[:, :, None], (BLOCK_N, BLOCK_K // 16, 16)), (BLOCK_N, BLOCK_K))


@triton.jit
def _weight_tile(w_ptrs, s_row, z_row, k0, RB, NB, BS, ZP: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, T: tl.constexpr):
    """The [BLOCK_N, BLOCK_K] weight tile in T: the packed bytes at w_ptrs (both nibbles, minus the zero point: 8, or
    with ZP each block's from the packed zero points at z_row, two a byte) times each 16 values' block scale (one
    gather of [BLOCK_N, BLOCK_K / 16] scales and zero points, broadcast over its 16)."""
    offs_b = tl.arange(0, BLOCK_K // 2)
    offs_g = tl.arange(0, BLOCK_K // 16)
    q = tl.load(w_ptrs, mask=((k0 // 2 + offs_b) < RB)[None, :], other=0)
    lo = (q & 15).to(T)
    hi = (q >> 4).to(T)
    v = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K))
    grp = tl.minimum((k0 + offs_g * 16) // BS, NB - 1)
    s16 = tl.load(s_row + grp[None, :])
    if ZP:
        zbyte = tl.load(z_row + (grp // 2)[None, :]).to(tl.int32)
        v = v - _per_16((zbyte >> ((grp % 2) * 4)[None, :]) & 15, BLOCK_N, BLOCK_K).to(T)
    else:
        v = v - 8.0
    return (v * _per_16(s16, BLOCK_N, BLOCK_K)).to(T)


@triton.jit
def _int4_linear_kernel(x_ptr, wq_ptr, s_ptr, z_ptr, y_ptr, M, N, K, RB, NB, BS, ZP: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        DOT_PRECISION: tl.constexpr):
    """PyTorch: ``w = ((nibbles(wq) - zp) * scales.repeat_interleave(BS, 1))[:, :K]; y = (x.float() @ w.T).to(x.dtype)``
    with zp 8, or with ZP each block's zero point from z_ptr uint8 [N, (NB + 1) / 2] (two a byte, the even block in
    the low nibble; z_ptr is not read without ZP). ZP is compiled in (aot.py: both builds, the launcher's r_pad slot
    picks one), so the symmetric build is the kernel it was without zero points.

    x [M, K], y [M, N] row-major; wq uint8 [N, RB] (RB = NB * BS / 2 bytes per column, the lower k of a byte in its
    low nibble), scales [N, NB] of x's type. Per K step a [BLOCK_N, BLOCK_K / 2] byte tile: both nibbles joined into
    [BLOCK_N, BLOCK_K] in x's type (q - zp is exact in fp16 and bf16), times the scale of each 16 values (BS >= 16:
    one gather of [BLOCK_N, BLOCK_K / 16] scales, broadcast over its 16), transposed into the dot. X is masked past K
    (the last block's padding contributes zero); rows past M are clamped to row 0 on load and never stored.
    """
    offs_m, offs_n, n_ok, cols, x_off, w_off = _tile(M, N, K, RB, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + x_off
    w_ptrs = wq_ptr + w_off
    s_row = s_ptr + cols[:, None] * NB
    z_row = z_ptr + cols[:, None] * ((NB + 1) // 2)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        x = tl.load(x_ptrs, mask=((k0 + offs_k) < K)[None, :], other=0.0)
        w = _weight_tile(w_ptrs, s_row, z_row, k0, RB, NB, BS, ZP, BLOCK_N, BLOCK_K, x_ptr.dtype.element_ty)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K // 2
    _store_tile(y_ptr, N, acc, offs_m, offs_m < M, offs_n, n_ok)


@triton.jit
def _int4_swiglu_kernel(x_ptr, wg_ptr, sg_ptr, zg_ptr, wu_ptr, su_ptr, zu_ptr, y_ptr, M, N, K, RB, NB, BS, ACT,
                        ZP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """PyTorch: ``g = x.float() @ w_gate.T; u = x.float() @ w_up.T; y = (act(g) * u).to(x.dtype)``, each w as
    _int4_linear_kernel dequantizes it (both of one shape: RB, NB, BS shared; ZP: both with zero points); each X
    tile serves both dots."""
    offs_m, offs_n, n_ok, cols, x_off, w_off = _tile(M, N, K, RB, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + x_off
    wg_ptrs = wg_ptr + w_off
    wu_ptrs = wu_ptr + w_off
    sg_row = sg_ptr + cols[:, None] * NB
    su_row = su_ptr + cols[:, None] * NB
    zg_row = zg_ptr + cols[:, None] * ((NB + 1) // 2)
    zu_row = zu_ptr + cols[:, None] * ((NB + 1) // 2)
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        x = tl.load(x_ptrs, mask=((k0 + offs_k) < K)[None, :], other=0.0)
        wg = _weight_tile(wg_ptrs, sg_row, zg_row, k0, RB, NB, BS, ZP, BLOCK_N, BLOCK_K, x_ptr.dtype.element_ty)
        gate = tl.dot(x, tl.trans(wg), gate, input_precision=DOT_PRECISION)
        wu = _weight_tile(wu_ptrs, su_row, zu_row, k0, RB, NB, BS, ZP, BLOCK_N, BLOCK_K, x_ptr.dtype.element_ty)
        up = tl.dot(x, tl.trans(wu), up, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        wg_ptrs += BLOCK_K // 2
        wu_ptrs += BLOCK_K // 2
    y = _gate_activation(gate, ACT) * up
    _store_tile(y_ptr, N, y, offs_m, offs_m < M, offs_n, n_ok)


# name -> (kernel, ordered non-constexpr parameters with their Triton types; "*T" is the op's element type). RB (the
# packed row's bytes) carries the divisibility hint in the aligned specialisation. The ZP constexpr: aot.py compiles
# both (r_pad 0 and 1).
KERNELS = {
    "int4_linear": (_int4_linear_kernel, [("x_ptr", "*T"), ("wq_ptr", "*u8"), ("s_ptr", "*T"), ("z_ptr", "*u8"),
                                          ("y_ptr", "*T"), ("M", "i32"), ("N", "i32"), ("K", "i32"), ("RB", "i32:16"),
                                          ("NB", "i32"), ("BS", "i32")]),
    "int4_swiglu": (_int4_swiglu_kernel, [("x_ptr", "*T"), ("wg_ptr", "*u8"), ("sg_ptr", "*T"), ("zg_ptr", "*u8"),
                                          ("wu_ptr", "*u8"), ("su_ptr", "*T"), ("zu_ptr", "*u8"), ("y_ptr", "*T"),
                                          ("M", "i32"), ("N", "i32"), ("K", "i32"), ("RB", "i32:16"), ("NB", "i32"),
                                          ("BS", "i32"), ("ACT", "i32")]),
}

# Tile configs (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages) per size class: "small" (M <= 16) narrow column
# tiles so that the packed weights of all columns stream at once; the others the GEMM tiles of gemm_loop.py. BLOCK_K
# is a multiple of 32 (whole 16-value scale groups, 16-byte rows of packed bytes). "small": BLOCK_K 256 and 3 stages
# measured 40.5 against 42.9 us for (16, 32, 128, 1, 4, 4) at 16 rows of a 4096 -> 11008 projection (H100, the best
# of 8; sweep-triton-int4.txt in benchmarks/results/h100-2026-11-26/int4/).
_H = {"small": (16, 32, 256, 1, 4, 3), "medium": (64, 128, 64, 8, 4, 3), "large": (128, 128, 64, 8, 8, 3)}
_F = {"small": (16, 32, 32, 1, 4, 3), "medium": (64, 64, 32, 8, 4, 2), "large": (128, 64, 32, 8, 8, 2)}
# Int4SwiGLU: the same tiles (two accumulators and two weight tiles per step; "large" halves BLOCK_N to keep them in
# registers).
_H2 = dict(_H, large=(128, 64, 64, 8, 8, 3))
CONFIGS = {arch: {"int4_linear": {"h": _H, "f": _F}, "int4_swiglu": {"h": _H2, "f": _F}} for arch in ("90", "80")}
