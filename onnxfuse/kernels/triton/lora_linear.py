"""Triton kernels for LoRALinear and LoRALinearRelu (onnxfuse.schema): base GEMM plus the rank-r branch.

Two phases, launched by cuda/lora_linear.cu on one stream: ``_lora_xa_kernel`` writes fp32 partial sums of
``T = X @ A`` into a scratch buffer ``[SPLIT, M, R_PAD]`` (grid: row tiles x SPLIT slices of K, no atomics, so the
result is deterministic; padded columns r..R_PAD are written as zeros), then ``_lora_main_kernel`` runs the GEMM
main loop (gemm_loop.py's ``_gemm_main``; one tl.dot per K step, so Hopper keeps its wgmma pipeline) and after the
loop sums the SPLIT partials of its row tile, rounds ``scale * T`` to the input type (as a 16-bit PyTorch LoRA
would) and adds ``T @ B`` with one more tl.dot before the bias (+ relu) epilogue; fp32 accumulation. The scratch
comes from onnxruntime's allocator (cuda/lora_linear.cu). ``R_PAD`` is r rounded up to 16, 32 or 64; ``RELU`` is a
run-time flag. ``_lora_xa_kernel`` serves LoRASwiGLU too, both adapters in one launch whose programs do both from each X
tile (NS = 2). To triton/table.py LORA_PDL_MAX_M rows the main kernel starts as phase 1's programmatic dependent (PDL,
sm_90): its K loop runs beside phase 1, and it waits for the partials (gemm_loop._pdl_wait) before the rank-r term.
Computing X @ A inside the main kernels' K loop instead (one thin dot more per K step, no phase-1 launch) measured
slower on an H100 at 16 rows: lora_main 60 against 35 us, lora_swiglu 75.5 against 64 (255 registers, spilling), so
phase 1 stays a launch.

LoRAGatedMLP's down projection runs ``_lora_main_kernel`` alone on partials the gated kernel made (SPLIT 1: the fp32 sum
of H @ A_down that its epilogue adds up, gemm_loop._down_xa), which phase 1 of the gate and up adapters zeroes first
(ZERO3).

MultiLoRALinear (a stack of NA adapters, one per batch row: ``adapter_index[row // RPI]``) runs the same two phases:
``_multi_lora_xa_kernel`` writes the partials of each row's ``X @ A[j]``, ``_multi_lora_main_kernel`` adds each
row's ``scales[j] * T @ B[j]`` after the main loop. Both walk the adapters and do the dots only for those that rows
of the tile use (a scalar branch per adapter: a decode tile of 8 rows with 8 adapters does 8 thin dots, a prefill
tile, whose rows are one or two sequences, one or two); rows with an index < 0 get no adapter, rows whose index is
>= NA are written as NaN (the kernel cannot report an error).
"""
import triton
import triton.language as tl

from .gemm_loop import (GEMM_TILES_F, GEMM_TILES_H, _gemm_main, _gemm_tile_tma, _multi_rank_term, _pdl_trigger,
                        _pdl_wait, _rank_b, _rank_dot, _rank_t, _relu, _row_adapters, _store_tile, _tma_descs,
                        _zero_rank_rows)


@triton.jit
def _xa_slice(x_ptr, a_ptr, a2_ptr, rows, sel, K, R, R2, k_begin, n_blocks, BLOCK_M: tl.constexpr,
              BLOCK_K: tl.constexpr, R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``(x[rows, ks] @ a[ks, :R], x[rows, ks] @ a2[ks, :R2])`` in fp32 ([BLOCK_M, R_PAD] each, zero past the rank)
    over the K slice ``ks`` of n_blocks blocks of BLOCK_K from k_begin (a multiple of BLOCK_K, known to the compiler:
    vectorised X loads), each X tile loaded once for both stacks; R2 = 0: a2 is never read (its loads are all masked
    off) and the second product is zeros. X rows where ``sel`` is False read as zeros (a ``[BLOCK_M]`` mask, or a
    scalar True). a is [K, R] and a2 [K, R2], row-major."""
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, R_PAD)
    r_ok = offs_r < R
    r2_ok = offs_r < R2
    x_ptrs = x_ptr + rows[:, None] * K + (k_begin + offs_k)[None, :]
    k_rows = (k_begin + offs_k).to(tl.int64)[:, None]
    a_ptrs = a_ptr + k_rows * R + offs_r[None, :]
    a2_ptrs = a2_ptr + k_rows * R2 + offs_r[None, :]
    t = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    t2 = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    for kb in range(0, n_blocks):
        # Only the last block of K is partial: masking by K (divisibility hint in the aligned build) keeps the loads
        # vectorised.
        k_ok = (k_begin + kb * BLOCK_K + offs_k) < K
        x = tl.load(x_ptrs, mask=sel[:, None] & k_ok[None, :], other=0.0)
        a = tl.load(a_ptrs, mask=k_ok[:, None] & r_ok[None, :], other=0.0)
        a2 = tl.load(a2_ptrs, mask=k_ok[:, None] & r2_ok[None, :], other=0.0)
        t = tl.dot(x, a, t, input_precision=DOT_PRECISION)
        t2 = tl.dot(x, a2, t2, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        a_ptrs += BLOCK_K * R
        a2_ptrs += BLOCK_K * R2
    # The padded columns hold x @ 0, which is NaN (not 0) in a row with an infinite x: zero them, or the epilogue's
    # T @ B would add NaN to every output of that row where the reference has +-Inf.
    return tl.where(r_ok[None, :], t, 0.0), tl.where(r2_ok[None, :], t2, 0.0)


@triton.jit
def _xa_program(pid, M, K, KB_PER_SPLIT, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, R_PAD: tl.constexpr):
    """Where phase-1 program ``pid`` works: ``offs_m, rows, t_offs, k_begin, n_blocks``, the row tile (rows clamped
    to row 0 past M), t_offs the offsets of its [BLOCK_M, R_PAD] block of partials in a [SPLIT, M, R_PAD] buffer
    (its K slice's), and the slice's first element and blocks."""
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m
    split = pid // num_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    t_offs = (split.to(tl.int64) * M + offs_m.to(tl.int64))[:, None] * R_PAD + tl.arange(0, R_PAD)[None, :]
    k_begin = split * KB_PER_SPLIT * BLOCK_K
    n_blocks = tl.minimum(KB_PER_SPLIT, tl.cdiv(K, BLOCK_K) - split * KB_PER_SPLIT)
    return offs_m, rows, t_offs, k_begin, n_blocks


@triton.jit
def _lora_xa_kernel(x_ptr, a_ptr, a2_ptr, t_ptr, t2_ptr, M, K, R, R2, NS, KB_PER_SPLIT, t3_ptr, ZERO3,
                    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    PDL: tl.constexpr = False):
    """Phase 1: ``t[s, m, :R] = x[m, ks] @ a[ks, :]`` in fp32 over the K slice ``ks`` of split s (KB_PER_SPLIT blocks
    of BLOCK_K), zeros in columns R..R_PAD; with NS = 2 also ``t2 = x @ a2`` (rank R2) from the same X tiles
    (LoRASwiGLU's gate and up adapters: X is read once for both). Grid: (cdiv(M, BLOCK_M) * SPLIT,), program id =
    split * num_m + m tile. t and t2 are [SPLIT, M, R_PAD] fp32, row-major. With PDL the main kernel launched after
    it as its programmatic dependent may start at once (gemm_loop._pdl_trigger). ZERO3 != 0 (LoRAGatedMLP): the
    programs of the first K slice also zero their rows of t3 ([M, R_PAD] fp32, the down adapter's X @ A, which the
    gated kernel adds to)."""
    _pdl_trigger(PDL)
    offs_m, rows, t_offs, k_begin, n_blocks = _xa_program(tl.program_id(0), M, K, KB_PER_SPLIT, BLOCK_M, BLOCK_K,
                                                          R_PAD)
    t, t2 = _xa_slice(x_ptr, a_ptr, a2_ptr, rows, offs_m >= 0, K, R, tl.where(NS > 1, R2, 0), k_begin, n_blocks,
                      BLOCK_M, BLOCK_K, R_PAD, DOT_PRECISION)
    tl.store(t_ptr + t_offs, t, mask=(offs_m < M)[:, None])
    if NS > 1:
        tl.store(t2_ptr + t_offs, t2, mask=(offs_m < M)[:, None])
    if ZERO3 != 0:
        if k_begin == 0:
            _zero_rank_rows(t3_ptr, offs_m, M, BLOCK_M, R_PAD)


@triton.jit
def _lora_main_kernel(x_ptr, w_ptr, t_ptr, b_ptr, bias_ptr, y_ptr, M, N, K, R, SPLIT, scale, RELU, NPROG,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                      R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
                      PDL: tl.constexpr = False):
    """Phase 2: ``y = [relu](x @ w + bias + (scale * sum_s t[s]).to(x.dtype) @ b)``; t from _lora_xa_kernel.

    The tile and K loop are gemm_loop's (_gemm_main, or with TMA the persistent _gemm_tile_tma, NPROG programs
    walking the tiles); the rank-r term is one extra dot after it (_lora_epilogue). With PDL (launched as
    lora_xa's programmatic dependent) the K loop runs beside phase 1 and the epilogue waits for its partials.
    """
    if TMA:
        xd, wd = _tma_descs(x_ptr, w_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
        for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), NPROG):
            acc, offs_m, offs_n, rows, n_ok = _gemm_tile_tma(xd, wd, tile, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
                                                             GROUP_M, DOT_PRECISION)
            _lora_epilogue(acc, rows, offs_m, offs_n, n_ok, t_ptr, b_ptr, bias_ptr, y_ptr, M, N, R, SPLIT, scale,
                           RELU, BLOCK_M, R_PAD, DOT_PRECISION, PDL)
    else:
        acc, _, offs_m, offs_n, rows, n_ok = _gemm_main(x_ptr, w_ptr, w_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
                                                        GROUP_M, False, DOT_PRECISION)
        _lora_epilogue(acc, rows, offs_m, offs_n, n_ok, t_ptr, b_ptr, bias_ptr, y_ptr, M, N, R, SPLIT, scale, RELU,
                       BLOCK_M, R_PAD, DOT_PRECISION, PDL)


@triton.jit
def _lora_epilogue(acc, rows, offs_m, offs_n, n_ok, t_ptr, b_ptr, bias_ptr, y_ptr, M, N, R, SPLIT, scale, RELU,
                   BLOCK_M: tl.constexpr, R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr):
    """``y[tile] = [relu](acc + bias + (scale * sum_s t[s, rows]).to(b.dtype) @ b[:, cols])``."""
    # The B tile and the bias before the wait (phase 1 does not write them): their loads and the partials' go out
    # together. Rank-r term: T row tile (sum of the SPLIT fp32 partials; padded columns are zero) times the B tile.
    b = _rank_b(b_ptr, offs_n, n_ok, N, R, R_PAD)
    bias = tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
    _pdl_wait(PDL)
    acc = _rank_dot(acc, _rank_t(rows, t_ptr, M, SPLIT, BLOCK_M, R_PAD), b, scale, DOT_PRECISION)
    acc += bias[None, :]
    if RELU != 0:
        acc = _relu(acc)
    _store_tile(y_ptr, N, acc, offs_m, offs_m < M, offs_n, n_ok)


@triton.jit
def _multi_lora_xa_kernel(x_ptr, a_ptr, a2_ptr, index_ptr, t_ptr, t2_ptr, M, K, R, R2, NS, NA, RPI, KB_PER_SPLIT,
                          t3_ptr, ZERO3,
                          BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, R_PAD: tl.constexpr,
                          DOT_PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    """Phase 1 of MultiLoRALinear: ``t[s, m, :R] = x[m, ks] @ a[j_m, ks, :]`` (fp32, j_m the row's adapter; zeros for
    rows without one); with NS = 2 also a2's partials into t2 from the same X tiles (MultiLoRASwiGLU's gate and up
    stacks). Layout as _lora_xa_kernel's (a is [NA, K, R], a2 [NA, K, R2]); grid: row tiles x SPLIT x NA, one
    program per row tile, K slice and adapter j (j fastest), which stores the rows of adapter j (program j = 0 also
    the rows without a valid adapter, as zeros) and does nothing when no row of its tile uses j: a decode batch of 8
    rows with 8 adapters runs 8 programs per K slice instead of one doing the 8 one after another. ZERO3 != 0: the
    programs of adapter 0 and the first K slice zero their rows of t3, as _lora_xa_kernel's."""
    _pdl_trigger(PDL)
    pid = tl.program_id(0)
    n_adapters = tl.maximum(NA, 1)  # an empty stack (NA 0): one program per tile and slice, storing the zeros
    j = pid % n_adapters
    offs_m, rows, t_offs, k_begin, n_blocks = _xa_program(pid // n_adapters, M, K, KB_PER_SPLIT, BLOCK_M, BLOCK_K,
                                                          R_PAD)
    aid = _row_adapters(index_ptr, offs_m, M, RPI)
    sel = (aid == j) & (j < NA)
    none = ((aid < 0) | (aid >= NA)) & (offs_m < M)  # _row_adapters gives -1 past M: never store there
    if j == 0:
        zeros = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
        tl.store(t_ptr + t_offs, zeros, mask=none[:, None])
        if NS > 1:
            tl.store(t2_ptr + t_offs, zeros, mask=none[:, None])
        if ZERO3 != 0:
            if k_begin == 0:
                _zero_rank_rows(t3_ptr, offs_m, M, BLOCK_M, R_PAD)
    if tl.max(sel.to(tl.int32), axis=0) > 0:
        r2 = tl.where(NS > 1, R2, 0)
        t, t2 = _xa_slice(x_ptr, a_ptr + j * K.to(tl.int64) * R, a2_ptr + j * K.to(tl.int64) * r2, rows, sel, K, R,
                          r2, k_begin, n_blocks, BLOCK_M, BLOCK_K, R_PAD, DOT_PRECISION)
        tl.store(t_ptr + t_offs, t, mask=sel[:, None])
        if NS > 1:
            tl.store(t2_ptr + t_offs, t2, mask=sel[:, None])


@triton.jit
def _multi_lora_main_kernel(x_ptr, w_ptr, t_ptr, b_ptr, bias_ptr, scales_ptr, index_ptr, y_ptr, M, N, K, R, NA, RPI,
                            SPLIT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            GROUP_M: tl.constexpr, R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
                            PDL: tl.constexpr = False):
    """Phase 2 of MultiLoRALinear: ``y = x @ w + bias + (scales[j] * sum_s t[s]).to(x.dtype) @ b[j]`` per row (j its
    adapter; NaN where j >= NA); b is [NA, R, N] (gemm_loop._multi_rank_term). With PDL (launched as multi_lora_xa's
    programmatic dependent) the K loop runs beside phase 1 and the rank-r terms wait for its partials."""
    acc, _, offs_m, offs_n, rows, n_ok = _gemm_main(x_ptr, w_ptr, w_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                                                    False, DOT_PRECISION)
    aid = _row_adapters(index_ptr, offs_m, M, RPI)
    _pdl_wait(PDL)
    acc = _multi_rank_term(acc, aid, rows, offs_n, n_ok, t_ptr, b_ptr, scales_ptr, M, N, R, NA, SPLIT, BLOCK_M, R_PAD,
                           DOT_PRECISION)
    acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    acc = tl.where((aid >= NA)[:, None], float("nan"), acc)
    _store_tile(y_ptr, N, acc, offs_m, offs_m < M, offs_n, n_ok)


KERNELS = {
    # t_ptr is fp32 scratch whatever T is: "*fp32".
    "lora_xa": (_lora_xa_kernel, [("x_ptr", "*T"), ("a_ptr", "*T"), ("a2_ptr", "*T"), ("t_ptr", "*fp32"),
                                  ("t2_ptr", "*fp32"), ("M", "i32"), ("K", "i32"), ("R", "i32"), ("R2", "i32"),
                                  ("NS", "i32"), ("KB_PER_SPLIT", "i32"), ("t3_ptr", "*fp32"), ("ZERO3", "i32")]),
    "lora_main": (_lora_main_kernel, [("x_ptr", "*T"), ("w_ptr", "*T"), ("t_ptr", "*fp32"), ("b_ptr", "*T"),
                                      ("bias_ptr", "*T"), ("y_ptr", "*T"), ("M", "i32"), ("N", "i32"), ("K", "i32"),
                                      ("R", "i32"), ("SPLIT", "i32"), ("scale", "fp32"), ("RELU", "i32"),
                                      ("NPROG", "i32")]),
    "multi_lora_xa": (_multi_lora_xa_kernel, [("x_ptr", "*T"), ("a_ptr", "*T"), ("a2_ptr", "*T"),
                                              ("index_ptr", "*i64"), ("t_ptr", "*fp32"), ("t2_ptr", "*fp32"),
                                              ("M", "i32"), ("K", "i32"), ("R", "i32"), ("R2", "i32"), ("NS", "i32"),
                                              ("NA", "i32"), ("RPI", "i32"), ("KB_PER_SPLIT", "i32"),
                                              ("t3_ptr", "*fp32"), ("ZERO3", "i32")]),
    "multi_lora_main": (_multi_lora_main_kernel, [("x_ptr", "*T"), ("w_ptr", "*T"), ("t_ptr", "*fp32"),
                                                  ("b_ptr", "*T"), ("bias_ptr", "*T"), ("scales_ptr", "*T"),
                                                  ("index_ptr", "*i64"), ("y_ptr", "*T"), ("M", "i32"), ("N", "i32"),
                                                  ("K", "i32"), ("R", "i32"), ("NA", "i32"), ("RPI", "i32"),
                                                  ("SPLIT", "i32")]),
}

# Tile configs per arch. lora_xa: (BLOCK_M, unused, BLOCK_K, unused, warps, stages). Grid = row tiles x SPLIT slices
# of K (the launcher picks SPLIT so that about one program per SM runs); memory bound (reads X once, A per program
# from L2). lora_main: the GEMM tiles (gemm_loop.GEMM_TILES_*), on sm_90 a 128 x 256 large tile.
_H_XA = {"small": (16, 0, 128, 1, 4, 3), "medium": (16, 0, 128, 1, 4, 3), "large": (64, 0, 64, 1, 4, 4)}
# sm_90's lora_xa past 128 rows: steps of 128 values of K. At 2048 rows, both adapters of a 7B MLP (K 4096 in 4
# slices, LoRASwiGLU's cuBLASLt path; 128 programs) on an H200, X read from DRAM as in the MLP: 16.6 us against 23.5
# for steps of 64 (10.3 against 12.9 with X in L2), the best at 4 slices with 64x256 on 8 warps (16.0)
# (benchmarks/results/h200-2026-12-01/lora/lora-xa-probe.txt).
_H_XA_90 = dict(_H_XA, large=(64, 0, 128, 1, 4, 4))
_F_XA = {"small": (16, 0, 64, 1, 4, 3), "medium": (16, 0, 64, 1, 4, 3), "large": (64, 0, 32, 1, 4, 3)}
# multi_lora_xa / multi_lora_main: lora_xa's tiles and lora_main's tuned ones (triton/tuned.json; the adapters' dots
# of a decode tile are thin).
_H_MULTI_MAIN = {"small": (16, 64, 256, 1, 4, 5), "medium": (64, 128, 64, 8, 4, 4), "large": (128, 256, 64, 8, 8, 3)}
CONFIGS = {
    "90": {"lora_xa": {"h": _H_XA_90, "f": _F_XA},
           "lora_main": {"h": dict(GEMM_TILES_H, large=(128, 256, 64, 8, 8, 3)), "f": GEMM_TILES_F},
           "multi_lora_xa": {"h": _H_XA, "f": _F_XA}, "multi_lora_main": {"h": _H_MULTI_MAIN, "f": GEMM_TILES_F}},
    "80": {"lora_xa": {"h": _H_XA, "f": _F_XA}, "lora_main": {"h": GEMM_TILES_H, "f": GEMM_TILES_F},
           "multi_lora_xa": {"h": _H_XA, "f": _F_XA}, "multi_lora_main": {"h": GEMM_TILES_H, "f": GEMM_TILES_F}},
}
