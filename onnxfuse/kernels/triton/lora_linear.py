"""Triton kernel for LoRALinear and LoRALinearRelu (onnxfuse.schema): base GEMM and rank-r branch in one kernel.

Each program computes its row tile of ``T = X @ A`` in the same K loop as ``X @ W`` (the X tile is loaded once for
both), then adds ``(scale * T) @ B`` for its column tile. T never leaves registers, so the op needs no scratch
memory; the price is recomputing T once per column tile, r / BLOCK_N extra tensor-core work (12.5 % at r=16,
BLOCK_N=128). ``R_PAD`` is r rounded up to a tensor-core friendly size (16, 32 or 64); ``RELU`` is a run-time flag.
"""
import triton
import triton.language as tl

from .linear_act import _tile_ids


@triton.jit
def _lora_linear_kernel(x_ptr, w_ptr, a_ptr, b_ptr, bias_ptr, y_ptr, M, N, K, R, scale, RELU,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """PyTorch: ``y = x @ w + bias + scale * ((x @ a) @ b)``, then ``relu(y)`` when RELU; all in fp32, cast to x.dtype.

    x [M, K], w [K, N], a [K, R], b [R, N], bias [N], y [M, N], row-major contiguous, R <= R_PAD. ``scale * T`` is
    rounded to the input type before the second small GEMM (as a 16-bit PyTorch LoRA would), accumulation is fp32.
    """
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, R_PAD)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    n_ok = offs_n < N
    r_ok = offs_r < R
    x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
    w_ptrs = w_ptr + offs_k.to(tl.int64)[:, None] * N + offs_n[None, :]
    a_ptrs = a_ptr + offs_k.to(tl.int64)[:, None] * R + offs_r[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    t = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        k_ok = (k0 + offs_k) < K
        x = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        a = tl.load(a_ptrs, mask=k_ok[:, None] & r_ok[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
        t = tl.dot(x, a, t, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * N.to(tl.int64)
        a_ptrs += BLOCK_K * R
    b = tl.load(b_ptr + offs_r[:, None] * N + offs_n[None, :], mask=r_ok[:, None] & n_ok[None, :], other=0.0)
    acc = tl.dot((t * scale).to(b.dtype), b, acc, input_precision=DOT_PRECISION)
    acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if RELU != 0:
        acc = tl.maximum(acc, 0.0)
    y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & n_ok[None, :])


KERNELS = {
    "lora_linear": (_lora_linear_kernel, [("x_ptr", "*T"), ("w_ptr", "*T"), ("a_ptr", "*T"), ("b_ptr", "*T"),
                                          ("bias_ptr", "*T"), ("y_ptr", "*T"), ("M", "i32"), ("N", "i32"),
                                          ("K", "i32"), ("R", "i32"), ("scale", "fp32"), ("RELU", "i32")]),
}
