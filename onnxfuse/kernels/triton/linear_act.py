"""Triton kernels for LinearRelu and LinearSigmoid (onnxfuse.schema): one GEMM with bias and activation in its epilogue.

Compiled ahead of time by `aot.py` (never JIT-launched from Python); the C launchers it generates pass the arguments
in this order. ``ACT`` is a run-time flag (1 = relu, 2 = sigmoid) so one cubin serves both ops.
"""
import triton
import triton.language as tl


@triton.jit
def _tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row tiles share each column tile while it is still in L2."""
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _linear_act_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, ACT,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
    """PyTorch: ``z = x.float() @ w.float() + bias.float(); y = (relu(z) if ACT == 1 else sigmoid(z)).to(x.dtype)``.

    x [M, K], w [K, N], bias [N], y [M, N], all row-major contiguous. fp32 accumulation, sigmoid in fp32; row and
    column offsets are 64-bit so M*N and K*N may pass 2**31. Rows past M are clamped to row 0 on load (their results
    are never stored), so only K and N are masked; with the aligned specialisation (K, N multiples of 16) those
    masks are constant over 16 elements and the loads stay vectorised.
    """
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    n_ok = offs_n < N
    x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
    w_ptrs = w_ptr + offs_k.to(tl.int64)[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        k_ok = (k0 + offs_k) < K
        x = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K * N.to(tl.int64)
    z = acc + tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        z = tl.maximum(z, 0.0)
    else:
        z = 1.0 / (1.0 + tl.exp(-z))
    y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(y_ptrs, z.to(y_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & n_ok[None, :])


# name -> (kernel, ordered non-constexpr parameters with their Triton types; "*T" is the op's element type)
KERNELS = {
    "linear_act": (_linear_act_kernel, [("x_ptr", "*T"), ("w_ptr", "*T"), ("bias_ptr", "*T"), ("y_ptr", "*T"),
                                        ("M", "i32"), ("N", "i32"), ("K", "i32"), ("ACT", "i32")]),
}
