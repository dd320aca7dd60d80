"""Triton kernel for Linear (onnxfuse.schema): Y = X @ W, gemm_loop.py's tile and K loop with a plain store.

Compiled ahead of time by `aot.py` (never JIT-launched from Python); the C launcher (cuda/linear.cu,
onnxfuse_triton_linear) passes the arguments in this order.
"""
import triton
import triton.language as tl

from .gemm_loop import GEMM_TILES_F, GEMM_TILES_H, _gemm_main, _store_tile


@triton.jit
def _linear_kernel(x_ptr, w_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """PyTorch: ``y = (x.float() @ w.float()).to(x.dtype)``; x [M, K], w [K, N], y [M, N], row-major contiguous, fp32
    accumulation, 64-bit offsets (gemm_loop._gemm_main: rows past M clamped on load, never stored)."""
    acc, _, offs_m, offs_n, _, n_ok = _gemm_main(x_ptr, w_ptr, w_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                                                 False, DOT_PRECISION)
    _store_tile(y_ptr, N, acc, offs_m, offs_m < M, offs_n, n_ok)


# name -> (kernel, ordered non-constexpr parameters with their Triton types; "*T" is the op's element type)
KERNELS = {
    "linear": (_linear_kernel, [("x_ptr", "*T"), ("w_ptr", "*T"), ("y_ptr", "*T"), ("M", "i32"), ("N", "i32"),
                                ("K", "i32")]),
}

# Tile configs per arch (gemm_loop.GEMM_TILES_*), as linear_act's cp.async build.
CONFIGS = {
    "90": {"linear": {"h": dict(GEMM_TILES_H, large=(128, 256, 64, 8, 8, 3)), "f": GEMM_TILES_F}},
    "80": {"linear": {"h": GEMM_TILES_H, "f": GEMM_TILES_F}},
}
