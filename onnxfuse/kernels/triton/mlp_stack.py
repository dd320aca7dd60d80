"""Triton kernel for MLPStack (onnxfuse.schema): up to four Linear+activation layers in ONE launch.

    h_0 = x;  h_i = act_i(h_{i-1} @ w_i + b_i);  y = h_L           (L <= 4, act_i: 1 = relu, 2 = sigmoid)

Each program owns BLOCK_M rows and runs them through every layer: per layer it walks the output columns in
BLOCK_N tiles, each a K loop of tl.dot with the bias and activation in the epilogue (gemm_loop.py's _rows_dot
and _bias_act). The intermediate h_i of its rows goes to a scratch row block that only this program
touches ([2, M, SW] ping-pong in the op's type, so it is rounded exactly as the unfused graph stores it) and is read
back by the next layer after a CTA barrier (__syncthreads orders the global writes of the block's threads before its
later reads). The scratch is a few KB per program and stays in L1/L2: what the stack saves over one kernel per layer
is the launch per layer, the HBM round trip of every intermediate and the tail of each small grid.

Compiled ahead of time by `aot.py`; the launcher (cuda/mlp_stack.cu) picks BLOCK_M so the grid covers the
SMs, and runs wide or long-M stacks as one linear_act launch per layer instead.

_mlp_stack_grid_kernel is the small-M form: with few rows a block of rows per program leaves most SMs idle (DLRM's
top MLP at M = 128 ran on 8 programs), so there every layer is split into tiles across the SMs instead, with a
software grid barrier on a counter between layers; triton/table.py's thresholds choose between them per shape.
"""
import triton
import triton.language as tl

from .gemm_loop import _bias_act, _rows_dot


@triton.jit
def _stack_layer(in_ptr, in_ld, out_ptr, out_ld, w_ptr, b_ptr, K, N, ACT, rows, offs_m, m_ok,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr):
    """out[rows, :N] = act(in[rows, :K] @ w[K, N] + b[N]); rows past M were clamped to a valid row of this
    program on load and are masked on store."""
    offs_k = tl.arange(0, BLOCK_K)
    for n0 in range(0, N, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        acc = _rows_dot(in_ptr, in_ld, rows, w_ptr, K, N, offs_k, offs_n, n_ok, BLOCK_M, BLOCK_N, BLOCK_K,
                        DOT_PRECISION, "")
        z = _bias_act(acc, b_ptr, offs_n, n_ok, ACT)
        tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * out_ld + offs_n[None, :], z.to(out_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _mlp_stack_kernel(x_ptr, y_ptr, s_ptr, M, K0, SW, L,
                      w1, b1, n1, a1, w2, b2, n2, a2, w3, b3, n3, a3, wf, bf, nf, af,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      DOT_PRECISION: tl.constexpr):
    """PyTorch: ``h = x; for w, b, act in layers: h = act(h.float() @ w.float() + b.float()).to(x.dtype)``.

    L layers (1..4): L - 1 hidden layers (w_i [n_{i-1}, n_i] with n_0 = K0, b_i [n_i]) then the final layer
    (wf [n_{L-1}, nf], bf [nf]) that writes y [M, nf]. Scratch s is [2, M, SW] with SW >= every hidden width.
    Hidden layers past L - 1 are never touched (the launcher passes null pointers and zeros). The hidden widths and
    SW carry the aligned build's divisibility hints; K0 and nf (13 dense features, a 1-wide prediction head) do not.
    """
    pid = tl.program_id(0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    rows = tl.where(m_ok, offs_m, pid * BLOCK_M).to(tl.int64)  # pid * BLOCK_M < M: a row this program owns
    s0 = s_ptr
    s1 = s_ptr + M.to(tl.int64) * SW
    in_ptr = x_ptr
    in_ld = K0
    k = K0
    if L >= 2:
        _stack_layer(x_ptr, K0, s0, SW, w1, b1, K0, n1, a1, rows, offs_m, m_ok, BLOCK_N, BLOCK_K, DOT_PRECISION,
                     BLOCK_M)
        tl.debug_barrier()
        in_ptr = s0
        in_ld = SW
        k = n1
    if L >= 3:
        _stack_layer(s0, SW, s1, SW, w2, b2, n1, n2, a2, rows, offs_m, m_ok, BLOCK_N, BLOCK_K, DOT_PRECISION,
                     BLOCK_M)
        tl.debug_barrier()
        in_ptr = s1
        k = n2
    if L >= 4:
        _stack_layer(s1, SW, s0, SW, w3, b3, n2, n3, a3, rows, offs_m, m_ok, BLOCK_N, BLOCK_K, DOT_PRECISION,
                     BLOCK_M)
        tl.debug_barrier()
        in_ptr = s0
        k = n3
    _stack_layer(in_ptr, in_ld, y_ptr, nf, wf, bf, k, nf, af, rows, offs_m, m_ok, BLOCK_N, BLOCK_K, DOT_PRECISION,
                 BLOCK_M)


@triton.jit
def _grid_sync(bar_ptr, target):
    """Every program of the grid waits here until `target` arrivals have been counted at bar_ptr (the launcher
    zeroes the counter in-stream before the launch; barrier k of a launch waits for k x programs). The CTA barrier
    orders the block's stores before one thread's release add at GPU scope (Triton runs a scalar atomic on one
    thread and broadcasts its result), the acquire reads make the other programs' stores visible, and the readers
    load the intermediates with .cg (L2, not a stale L1 line). Needs every program resident: the launcher starts at
    most one per SM, cooperatively."""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _grid_layer(in_ptr, in_ld, out_ptr, out_ld, w_ptr, b_ptr, M, K, N, ACT, pid, nprog,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """out[:M, :N] = act(in[:M, :K] @ w[K, N] + b[N]), its BLOCK_M x BLOCK_N tiles dealt round-robin to the nprog
    programs (program pid takes tiles pid, pid + nprog, ...; consecutive tiles share a column block of w)."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles = tiles_m * tl.cdiv(N, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    t = pid
    while t < tiles:  # (not range(): Triton's interpreter, which the CPU tests run this kernel in, cannot step by it)
        offs_m = (t % tiles_m) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = (t // tiles_m) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = offs_m < M
        n_ok = offs_n < N
        rows = tl.where(m_ok, offs_m, 0).to(tl.int64)
        acc = _rows_dot(in_ptr, in_ld, rows, w_ptr, K, N, offs_k, offs_n, n_ok, BLOCK_M, BLOCK_N, BLOCK_K,
                        DOT_PRECISION, ".cg")
        z = _bias_act(acc, b_ptr, offs_n, n_ok, ACT)
        tl.store(out_ptr + offs_m.to(tl.int64)[:, None] * out_ld + offs_n[None, :], z.to(out_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & n_ok[None, :])
        t += nprog


@triton.jit
def _mlp_stack_grid_kernel(x_ptr, y_ptr, s_ptr, bar_ptr, M, K0, SW, L,
                           w1, b1, n1, a1, w2, b2, n2, a2, w3, b3, n3, a3, wf, bf, nf, af,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           DOT_PRECISION: tl.constexpr):
    """The same stack as _mlp_stack_kernel (same arguments, plus the barrier counter bar_ptr), for small M: instead
    of a block of rows per program, every layer is split into tiles over all the programs (at most one per SM) and
    the programs meet at a grid barrier before the next layer reads the intermediate ([2, M, SW] ping-pong scratch;
    the barrier after layer i also ends every read of the buffer layer i + 1 overwrites)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    s0 = s_ptr
    s1 = s_ptr + M.to(tl.int64) * SW
    in_ptr = x_ptr
    in_ld = K0
    k = K0
    if L >= 2:
        _grid_layer(x_ptr, K0, s0, SW, w1, b1, M, K0, n1, a1, pid, nprog, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION)
        _grid_sync(bar_ptr, nprog)
        in_ptr = s0
        in_ld = SW
        k = n1
    if L >= 3:
        _grid_layer(s0, SW, s1, SW, w2, b2, M, n1, n2, a2, pid, nprog, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION)
        _grid_sync(bar_ptr, 2 * nprog)
        in_ptr = s1
        k = n2
    if L >= 4:
        _grid_layer(s1, SW, s0, SW, w3, b3, M, n2, n3, a3, pid, nprog, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION)
        _grid_sync(bar_ptr, 3 * nprog)
        in_ptr = s0
        k = n3
    _grid_layer(in_ptr, in_ld, y_ptr, nf, wf, bf, M, k, nf, af, pid, nprog, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PRECISION)


# "i32:16": an int that gets the aligned build's divisibility-by-16 hint (aot.py).
_LAYER_PARAMS = []
for _i in range(1, 4):
    _LAYER_PARAMS += [(f"w{_i}", "*T"), (f"b{_i}", "*T"), (f"n{_i}", "i32:16"), (f"a{_i}", "i32")]
_LAYER_PARAMS += [("wf", "*T"), ("bf", "*T"), ("nf", "i32"), ("af", "i32")]

KERNELS = {
    "mlp_stack": (_mlp_stack_kernel, [("x_ptr", "*T"), ("y_ptr", "*T"), ("s_ptr", "*T"), ("M", "i32"),
                                      ("K0", "i32"), ("SW", "i32:16"), ("L", "i32")] + _LAYER_PARAMS),
    "mlp_stack_grid": (_mlp_stack_grid_kernel, [("x_ptr", "*T"), ("y_ptr", "*T"), ("s_ptr", "*T"), ("bar_ptr", "*i32"),
                                                ("M", "i32"), ("K0", "i32"), ("SW", "i32:16"), ("L", "i32")]
                       + _LAYER_PARAMS),
}

# Tile configs (the same on every arch). mlp_stack: the size class is BLOCK_M (the rows one program carries through
# every layer), picked by the launcher so that the grid covers the SMs: "small" 16 rows, "medium" 32, "large" 64.
# GROUP_M is unused. BLOCK_N = 128 is the best of 64 / 128 / 256 measured on the H100 for DLRM's bottom and top MLPs
# at M = 128 and 16384 (the 2026-11-22 run, in git history).
# mlp_stack_grid (the persistent small-M stack): the size class by M picks the tile every layer is split into; the
# grid is min(SMs, the most tiles of any layer). 16 x 32 tiles at M <= 128 put DLRM's 512-wide layers on 128 SMs
# (8 row x 16 column tiles); 64 x 64 above (M = 2048: 256 tiles of a 512-wide layer, two rounds per SM).
_H_STACK = {"small": (16, 128, 64, 1, 4, 3), "medium": (32, 128, 64, 1, 4, 3), "large": (64, 128, 64, 1, 4, 3)}
_F_STACK = {"small": (16, 64, 32, 1, 4, 2), "medium": (32, 64, 32, 1, 4, 2), "large": (64, 64, 32, 1, 4, 2)}
_H_GRID = {"small": (16, 32, 64, 1, 4, 3), "medium": (16, 32, 64, 1, 4, 3), "large": (64, 64, 64, 1, 4, 3)}
_F_GRID = {"small": (16, 32, 32, 1, 4, 2), "medium": (16, 32, 32, 1, 4, 2), "large": (32, 64, 32, 1, 4, 2)}
CONFIGS = {arch: {"mlp_stack": {"h": _H_STACK, "f": _F_STACK}, "mlp_stack_grid": {"h": _H_GRID, "f": _F_GRID}}
           for arch in ("90", "80")}
