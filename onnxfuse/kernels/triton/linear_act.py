"""Triton kernels for LinearRelu and LinearSigmoid (onnxfuse.schema): one GEMM with bias and activation in its epilogue.

The tile, the K loop and the epilogue are gemm_loop.py's.

Compiled ahead of time by `aot.py` (never JIT-launched from Python); the C launchers it generates pass the arguments
in this order. ``ACT`` is a run-time flag (1 = relu, 2 = sigmoid) so one cubin serves both ops.
"""
import triton
import triton.language as tl

from .gemm_loop import GEMM_TILES_F, GEMM_TILES_H, _bias_act, _gemm_main, _gemm_tile_tma, _store_tile, _tma_descs


@triton.jit
def _linear_act_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, ACT, NPROG,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                       DOT_PRECISION: tl.constexpr, TMA: tl.constexpr):
    """PyTorch: ``z = x.float() @ w.float() + bias.float(); y = (relu(z) if ACT == 1 else sigmoid(z)).to(x.dtype)``.

    x [M, K], w [K, N], bias [N], y [M, N], all row-major contiguous. fp32 accumulation, sigmoid in fp32; row and
    column offsets are 64-bit so M*N and K*N may pass 2**31. Rows past M are clamped to row 0 on load (by
    _gemm_main; their results are never stored), so only K and N are masked; with the aligned specialisation (K, N
    multiples of 16) those masks are constant over 16 elements and the loads stay vectorised.
    """
    if TMA:
        # persistent: NPROG programs walk the tiles (gemm_loop._gemm_tile_tma)
        xd, wd = _tma_descs(x_ptr, w_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
        for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), NPROG):
            acc, offs_m, offs_n, _, n_ok = _gemm_tile_tma(xd, wd, tile, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                                                          DOT_PRECISION)
            _store_tile(y_ptr, N, _bias_act(acc, bias_ptr, offs_n, n_ok, ACT), offs_m, offs_m < M, offs_n, n_ok)
    else:
        acc, _, offs_m, offs_n, _, n_ok = _gemm_main(x_ptr, w_ptr, w_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
                                                     GROUP_M, False, DOT_PRECISION)
        _store_tile(y_ptr, N, _bias_act(acc, bias_ptr, offs_n, n_ok, ACT), offs_m, offs_m < M, offs_n, n_ok)


# name -> (kernel, ordered non-constexpr parameters with their Triton types; "*T" is the op's element type)
KERNELS = {
    "linear_act": (_linear_act_kernel, [("x_ptr", "*T"), ("w_ptr", "*T"), ("bias_ptr", "*T"), ("y_ptr", "*T"),
                                        ("M", "i32"), ("N", "i32"), ("K", "i32"), ("ACT", "i32"),
                                        ("NPROG", "i32")]),
}

# Tile configs per arch (gemm_loop.GEMM_TILES_*): on sm_90 a 128 x 256 large tile.
CONFIGS = {
    "90": {"linear_act": {"h": dict(GEMM_TILES_H, large=(128, 256, 64, 8, 8, 3)), "f": GEMM_TILES_F}},
    "80": {"linear_act": {"h": GEMM_TILES_H, "f": GEMM_TILES_F}},
}
