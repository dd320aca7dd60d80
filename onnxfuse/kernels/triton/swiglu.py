"""Triton kernel for SwiGLU (onnxfuse.schema): the gate and up GEMMs of a Llama MLP sharing each X tile, with
silu(gate) * up in the epilogue, so neither [M, N] intermediate touches device memory.

Compiled ahead of time by `aot.py`; the generated C launchers pass the arguments in this order.
"""
import triton
import triton.language as tl

from .linear_act import _tile_ids


@triton.jit
def _swiglu_kernel(x_ptr, wg_ptr, wu_ptr, y_ptr, M, N, K,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    """PyTorch: ``g = x.float() @ wg.float(); u = x.float() @ wu.float(); y = (silu(g) * u).to(x.dtype)``.

    x [M, K], wg and wu [K, N], y [M, N], row-major contiguous; fp32 accumulation, silu in fp32, 64-bit offsets.
    """
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    n_ok = offs_n < N
    x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
    w_off = offs_k.to(tl.int64)[:, None] * N + offs_n[None, :]
    wg_ptrs = wg_ptr + w_off
    wu_ptrs = wu_ptr + w_off
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        k_ok = (k0 + offs_k) < K
        w_mask = k_ok[:, None] & n_ok[None, :]
        x = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
        wg = tl.load(wg_ptrs, mask=w_mask, other=0.0)
        wu = tl.load(wu_ptrs, mask=w_mask, other=0.0)
        gate = tl.dot(x, wg, gate, input_precision=DOT_PRECISION)
        up = tl.dot(x, wu, up, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        step = BLOCK_K * N.to(tl.int64)
        wg_ptrs += step
        wu_ptrs += step
    y = gate / (1.0 + tl.exp(-gate)) * up
    y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & n_ok[None, :])


KERNELS = {
    "swiglu": (_swiglu_kernel, [("x_ptr", "*T"), ("wg_ptr", "*T"), ("wu_ptr", "*T"), ("y_ptr", "*T"),
                                ("M", "i32"), ("N", "i32"), ("K", "i32")]),
}
