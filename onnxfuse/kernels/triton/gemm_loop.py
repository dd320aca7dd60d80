"""The GEMM main loop of every Triton GEMM kernel, as @triton.jit helpers (no kernel here; aot.py compiles the
kernels that call them, and Triton inlines a helper into each):

* ``_tile_ids``: the grouped tile order (GROUP_M row tiles share each column tile while it is still in L2);
* ``_gemm_main``: one output tile of ``X @ W`` (and, with DUAL, of ``X @ W2`` in the same K loop) up to the
  epilogue: the tile, the pointers and the K loop (masked loads, one tl.dot per product per K block, fp32
  accumulators). linear_act.py, lora_linear.py's main phase and swiglu.py (DUAL: gate and up) run on it;
* ``_tma_descs`` and ``_gemm_tile_tma``: the same tile on TMA loads, for persistent kernels whose programs walk the
  tiles (``_tile_of``): linear_act's and lora_main's aligned fp16/bf16 large-class builds on sm_90 (triton/table.py
  TMA_*). H100, 2048 x 4096 x 4096: 97.7 us against 104.9 us for ``_gemm_main``'s cp.async loop (cuBLAS 93.0);
  SwiGLU's dual loop measured slower on it (699.7 against 669.1 us at 2048 x 4096 x 11008) and stays on
  ``_gemm_main``. Without loop flattening: lora_main's rank-r epilogue made the flattened loop 20 % slower;
* ``_rows_dot``: the K loop of one ``[BLOCK_M, BLOCK_N]`` tile of rows already chosen by the caller (MLPStack, whose
  programs walk the column tiles and layers themselves);
* ``_bias_act``: the bias + relu/sigmoid epilogue of LinearRelu, LinearSigmoid and MLPStack;
* ``_store_tile``: the masked store of a GEMM tile (linear_act, swiglu, lora_linear).

Warp specialisation (tl.range(warp_specialize=True)) measured no gain over the TMA loop on the H100 (Triton 3.6).

aot.py compiles without line info (``disable_line_info``): with it, an inlined helper changes only the PTX's debug
scopes, yet ptxas schedules some cubins differently around them. Without it, the move of the loops into these
helpers was checked per specialisation (all 580 of the sm_80 and sm_90 specialisations of that time, nvdisasm of
each cubin before and after): 541 have the same SASS; the 39 others are swiglu's, whose W mask is now built after
the X load as linear_act's always was (same register counts, the instructions reordered or slightly changed), timed
on the GPU before it landed.

aot.py imports the kernel files as one package, so they import this module relatively; build.py's cache key hashes
every triton/*.py and cuda/cuda.cmake lists this file among the AOT step's inputs.
"""
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _tile_ids(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Grouped tile order: GROUP_M row tiles share each column tile while it is still in L2."""
    return _tile_of(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)


@triton.jit
def _tile_of(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of tile number pid in the grouped order of _tile_ids."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _gemm_main(x_ptr, w_ptr, w2_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               GROUP_M: tl.constexpr, DUAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``acc, acc2, offs_m, offs_n, rows, n_ok``: this program's tile of ``x.float() @ w.float()`` in fp32 (acc
    [BLOCK_M, BLOCK_N]) and, when DUAL, of ``x.float() @ w2.float()`` (acc2; without DUAL it is zeros and w2_ptr is
    never read: pass w_ptr), the tile's row and column offsets, the rows clamped to row 0 past M (64-bit) and the
    column mask.

    x [M, K], w and w2 [K, N], row-major contiguous; 64-bit row and column offsets, so M*K and K*N may pass 2**31.
    Rows past M are clamped to row 0 on load (their results must not be stored: mask the store with offs_m < M), so
    only K and N are masked; with the aligned specialisation (K, N multiples of 16) those masks are constant over 16
    elements and the loads stay vectorised. One tl.dot per product per K step, so Hopper keeps its wgmma pipeline.
    """
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    n_ok = offs_n < N
    x_ptrs = x_ptr + rows[:, None] * K + offs_k[None, :]
    w_off = offs_k.to(tl.int64)[:, None] * N + offs_n[None, :]
    w_ptrs = w_ptr + w_off
    w2_ptrs = w2_ptr + w_off
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = kb * BLOCK_K
        k_ok = (k0 + offs_k) < K
        x = tl.load(x_ptrs, mask=k_ok[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if DUAL:
            w2 = tl.load(w2_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
        if DUAL:
            acc2 = tl.dot(x, w2, acc2, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K
        step = BLOCK_K * N.to(tl.int64)
        w_ptrs += step
        if DUAL:
            w2_ptrs += step
    return acc, acc2, offs_m, offs_n, rows, n_ok


@triton.jit
def _tma_descs(x_ptr, w_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """TMA descriptors (built on the device, in Triton's global scratch) of x [M, K] and w [K, N], row-major: tiles
    [BLOCK_M, BLOCK_K] of x and [BLOCK_K, BLOCK_N] of w; the hardware fills reads past the edges with zeros, so no
    masks. Needs 16-byte aligned bases and row strides (the aligned specialisation) and sm_90."""
    xd = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
    wd = tl.make_tensor_descriptor(w_ptr, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
    return xd, wd


@triton.jit
def _gemm_tile_tma(xd, wd, tile, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``acc, offs_m, offs_n, rows, n_ok`` as _gemm_main's (without DUAL) for tile number ``tile`` (grouped order)
    of a persistent kernel, the K loop on TMA loads through _tma_descs' descriptors."""
    pid_m, pid_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        acc = tl.dot(xd.load([pid_m * BLOCK_M, kb * BLOCK_K]), wd.load([kb * BLOCK_K, pid_n * BLOCK_N]), acc,
                     input_precision=DOT_PRECISION)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    return acc, offs_m, offs_n, rows, offs_n < N


@triton.jit
def _rows_dot(in_ptr, in_ld, rows, w_ptr, K, N, offs_k, offs_n, n_ok, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr, CACHE: tl.constexpr):
    """``in[rows, :K] @ w[:K, offs_n]`` in fp32 ([BLOCK_M, BLOCK_N]): rows (64-bit) are valid rows chosen by the
    caller, in has leading dimension in_ld, w is [K, N] row-major; K and N masked. CACHE is the cache modifier of
    the loads of ``in`` ("" or ".cg" for data another program wrote in this launch); offs_k is
    ``tl.arange(0, BLOCK_K)``, made by the caller outside its own loops (made in here, inside them, the cubins
    come out differently)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_ok = kk < K
        a = tl.load(in_ptr + rows[:, None] * in_ld + kk[None, :], mask=k_ok[None, :], other=0.0,
                    cache_modifier=CACHE)
        w = tl.load(w_ptr + kk.to(tl.int64)[:, None] * N + offs_n[None, :], mask=k_ok[:, None] & n_ok[None, :],
                    other=0.0)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def _relu(z):
    """relu that keeps NaN, like torch.relu and ONNX's Relu (``tl.maximum(z, 0.0)`` is PTX max, which returns 0)."""
    return tl.where(z > 0.0, z, tl.where(z != z, z, 0.0))


@triton.jit
def _bias_act(acc, bias_ptr, offs_n, n_ok, ACT):
    """``act(acc + bias[offs_n])`` in fp32: ACT 1 = relu, anything else sigmoid (LinearRelu / LinearSigmoid)."""
    z = acc + tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:
        z = _relu(z)
    else:
        z = 1.0 / (1.0 + tl.exp(-z))
    return z


@triton.jit
def _store_tile(y_ptr, ld, z, offs_m, m_ok, offs_n, n_ok):
    """``y[offs_m, offs_n] = z`` cast to y's type, masked to the valid rows and columns; y has leading dimension ld."""
    y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * ld + offs_n[None, :]
    tl.store(y_ptrs, z.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])

# ------------------------------------------------------------------------------------------------ tile configs
# The GEMM kernels' tile configs start from these (each kernel file's CONFIGS, per arch; aot.py compiles them, and
# triton/tuned.json, written by `onnxfuse tune` on the GPU, overrides entries). A config is (BLOCK_M, BLOCK_N,
# BLOCK_K, GROUP_M, num_warps, num_stages) per size class; "h" = fp16 and bf16, "f" = fp32. Shared memory per config
# stays below 160 KB so sm_80 fits as well.
#
# "small" (M <= 16, decode) is memory bound: the goal is streaming the weights once at full bandwidth with every
# program resident in ONE wave (no tail) and enough bytes in flight (~3 TB/s x ~0.7 us ~ 2-3 MB over the chip).
# H100: 132 SMs, 228 KB shared memory per SM. Per K step a program loads W BLOCK_K x BLOCK_N (x2 for SwiGLU) and
# X 16 x BLOCK_K (from L2; re-read by every column tile, 16 / BLOCK_N of the W bytes).
# (compiled.metadata.shared shows num_stages - 1 buffers for these mma.sync pipelines.)
#   * linear_act / LoRA, N=4096: BLOCK_N=32, BLOCK_K=128, 5 stages -> 128 programs (one per SM), 12 KB per stage,
#     48 KB of shared memory, ~3 stages in flight each (~4.6 MB); with N=11008, 344 programs: 3-4 per SM, one wave.
GEMM_TILES_H = {"small": (16, 32, 128, 1, 4, 5), "medium": (64, 128, 64, 8, 4, 4), "large": (128, 128, 64, 8, 8, 4)}
GEMM_TILES_F = {"small": (16, 32, 64, 1, 4, 3), "medium": (64, 64, 32, 8, 4, 3), "large": (128, 64, 32, 8, 8, 3)}


@triton.jit
def _pdl_trigger(PDL: tl.constexpr):
    """Programmatic dependent launch (PDL, sm_90+; aot.py compiles PDL=True there): let the kernel launched after
    this one as its programmatic dependent start now, beside this one's programs (a hint; a no-op without PDL)."""
    if PDL:
        gdc_launch_dependents()


@triton.jit
def _pdl_wait(PDL: tl.constexpr):
    """PDL: wait until the kernel this one was launched as a programmatic dependent of has finished and its writes are
    visible (LoRA's main kernels before they read phase 1's partials). Returns at once in a kernel launched the
    usual way, and compiles to nothing without PDL."""
    if PDL:
        gdc_wait()


@triton.jit
def _rank_b(b_ptr, offs_n, n_ok, N, R, R_PAD: tl.constexpr):
    """A LoRA B's column tile [R_PAD, BLOCK_N] (zero past R; b [R, N])."""
    offs_r = tl.arange(0, R_PAD)
    return tl.load(b_ptr + offs_r[:, None] * N + offs_n[None, :], mask=(offs_r < R)[:, None] & n_ok[None, :],
                   other=0.0)


@triton.jit
def _rank_t(rows, t_ptr, M, SPLIT, BLOCK_M: tl.constexpr, R_PAD: tl.constexpr):
    """T's row tile: the sum of the SPLIT fp32 partials of X @ A ([SPLIT, M, R_PAD], lora_linear.py's phase 1)."""
    offs_r = tl.arange(0, R_PAD)
    t_ptrs = t_ptr + rows[:, None] * R_PAD + offs_r[None, :]
    t = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    for s in range(0, SPLIT):
        t += tl.load(t_ptrs)
        t_ptrs += M.to(tl.int64) * R_PAD
    return t


@triton.jit
def _rank_t2(rows, t_ptr, t2_ptr, M, SPLIT, BLOCK_M: tl.constexpr, R_PAD: tl.constexpr, CH: tl.constexpr):
    """``(_rank_t(t_ptr), _rank_t(t2_ptr))``, LoRASwiGLU's two adapters, with CH slices of both buffers loaded at once
    (one [CH, BLOCK_M, R_PAD] load per buffer per chunk; CH 4 in lora_gate and the 16-row tiles, 1 past them, whose
    accumulators leave fewer registers). One loop over the slices, so the loads of both buffers are in flight
    together: two _rank_t loops wait for the first one's loads before the second's. lora_gate before it, with one
    chunked load per buffer (H100, LoRASwiGLU's pass at 2048 x 11008, scripts/lora_gate_split_probe.py, table.py
    LORA_GATE_MAX_SPLIT): 4 partials 63.5 -> 57.4 us on the 16 x 256 tile against _rank_t's loop."""
    offs_s = tl.arange(0, CH)
    offs = (offs_s.to(tl.int64)[:, None, None] * M + rows[None, :, None]) * R_PAD + tl.arange(0, R_PAD)[None, None, :]
    t = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    t2 = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
    for s0 in range(0, SPLIT, CH):
        mask = (s0 + offs_s < SPLIT)[:, None, None]
        step = s0 * M.to(tl.int64) * R_PAD
        part = tl.load(t_ptr + step + offs, mask=mask, other=0.0)
        part2 = tl.load(t2_ptr + step + offs, mask=mask, other=0.0)
        t += tl.sum(part, axis=0)
        t2 += tl.sum(part2, axis=0)
    return t, t2


@triton.jit
def _rank_dot(acc, t, b, scale, DOT_PRECISION: tl.constexpr):
    """``acc + (scale * t).to(b.dtype) @ b``: a LoRA branch's rank-r term on the tile after the main loop, t the row
    tile of X @ A in fp32 (padded columns zero: _rank_t's sum of phase 1's partials), b the B column tile
    (_rank_b), the scaled T rounded to the input type (as a 16-bit PyTorch LoRA would), one tl.dot. Loading the B
    tile before the main loop measured the same as after it on an H100 (LoRASwiGLU at 16 rows 69.4 against 69.0 us;
    MultiLoRASwiGLU's first chunk the same way 77.2 against 74.7); after the loop, with the tail's other loads
    (lora_swiglu, lora_main), it is."""
    return tl.dot((t * scale).to(b.dtype), b, acc, input_precision=DOT_PRECISION)


@triton.jit
def _row_adapters(index_ptr, offs_m, M, RPI):
    """The adapter of each row of a tile (``adapter_index[row // RPI]``; -1 past M): MultiLoRALinear's and
    MultiLoRASwiGLU's rows."""
    m_ok = offs_m < M
    aid = tl.load(index_ptr + tl.where(m_ok, offs_m // RPI, 0), mask=m_ok, other=-1)
    return tl.where(m_ok, aid, -1)


@triton.jit
def _multi_rank_b(b_ptr, j0, offs_n, n_ok, N, R, NA, R_PAD: tl.constexpr):
    """The B tiles of adapters j0 .. j0 + CH - 1 stacked ([CH * R_PAD, BLOCK_N], CH = 128 / R_PAD; zero past R and
    past NA; b [NA, R, N]): one chunk of _multi_rank_term's adapters."""
    CH: tl.constexpr = 128 // R_PAD
    offs_c = tl.arange(0, CH * R_PAD)  # a row of the chunk: adapter j0 + offs_c // R_PAD, rank offs_c % R_PAD
    c_rank = offs_c % R_PAD
    c_adapter = j0 + offs_c // R_PAD
    return tl.load(b_ptr + (c_adapter.to(tl.int64) * R + c_rank)[:, None] * N + offs_n[None, :],
                   mask=((c_adapter < NA) & (c_rank < R))[:, None] & n_ok[None, :], other=0.0)


@triton.jit
def _multi_chunk(acc, aid, t, b, scales_ptr, j0, NA, BLOCK_M: tl.constexpr, R_PAD: tl.constexpr,
                 DOT_PRECISION: tl.constexpr):
    """``acc + T_chunk @ b``: T spread over the chunk's column blocks (row m's scaled T in the block of its adapter,
    zeros elsewhere), b the chunk's stacked B tiles (_multi_rank_b), one dot of K = 128."""
    CH: tl.constexpr = 128 // R_PAD
    js = j0 + tl.arange(0, CH)
    scale = tl.load(scales_ptr + js, mask=js < NA, other=0.0).to(tl.float32)
    t3 = tl.where((aid[:, None] == js[None, :])[:, :, None], t[:, None, :] * scale[None, :, None], 0.0)
    return tl.dot(tl.reshape(t3, (BLOCK_M, CH * R_PAD)).to(b.dtype), b, acc, input_precision=DOT_PRECISION)


@triton.jit
def _multi_rank_term(acc, aid, rows, offs_n, n_ok, t_ptr, b_ptr, scales_ptr, M, N, R, NA, SPLIT,
                     BLOCK_M: tl.constexpr, R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``acc + (scales[j] * sum_s t[s, rows]).to(b.dtype) @ b[j][:, cols]`` for each row's adapter j (`aid`): a mixed
    batch's rank-r terms, t the fp32 partials of each row's X @ A[j] (lora_linear.py's _multi_lora_xa_kernel), b
    [NA, R, N]. The adapters go CH = 128 / R_PAD at a time through one dot of K = 128 (_multi_chunk, the chunk's B
    tiles stacked by _multi_rank_b: one load, its latency paid once); a chunk no row of the tile uses is skipped (a
    decode tile of 8 rows with 8 rank-16 adapters: one dot; a prefill tile, one or two sequences: one dot per chunk
    its rows use). A non-finite B value of one adapter meets the zeros of the tile's other rows (0 * Inf): those rows
    come out NaN too (the CUDA backend reads only each row's own adapter)."""
    CH: tl.constexpr = 128 // R_PAD
    t = _rank_t(rows, t_ptr, M, SPLIT, BLOCK_M, R_PAD)
    for j0 in range(0, NA, CH):
        if tl.max(((aid >= j0) & (aid < j0 + CH)).to(tl.int32), axis=0) > 0:
            b = _multi_rank_b(b_ptr, j0, offs_n, n_ok, N, R, NA, R_PAD)
            acc = _multi_chunk(acc, aid, t, b, scales_ptr, j0, NA, BLOCK_M, R_PAD, DOT_PRECISION)
    return acc


@triton.jit
def _zero_rank_rows(t_ptr, offs_m, M, BLOCK_M: tl.constexpr, R_PAD: tl.constexpr):
    """``t[offs_m, :] = 0`` for the rows below M, t fp32 [M, R_PAD]: a gated LoRA MLP's phase 1 clears the down
    projection's X @ A accumulator (_down_xa's) before the gated kernel adds to it."""
    offs = offs_m.to(tl.int64)[:, None] * R_PAD + tl.arange(0, R_PAD)[None, :]
    tl.store(t_ptr + offs, tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32), mask=(offs_m < M)[:, None])


@triton.jit
def _down_a(ad_ptr, offs_n, n_ok, RD, R_PAD: tl.constexpr):
    """The down adapter's A rows of this column tile, [BLOCK_N, R_PAD] (ad [N, RD]; zero past RD, and nothing read
    when RD = 0): _down_xa's operand, loaded with the epilogue's other loads."""
    offs_r = tl.arange(0, R_PAD)
    return tl.load(ad_ptr + offs_n.to(tl.int64)[:, None] * RD + offs_r[None, :],
                   mask=n_ok[:, None] & (offs_r < RD)[None, :], other=0.0)


@triton.jit
def _down_xa(y, a, offs_m, td_ptr, M, RD, R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """A gated LoRA MLP's down-projection phase 1 in the gated kernel's epilogue: ``td[rows, :RD] += y.to(T) @
    a``, y the finished [BLOCK_M, BLOCK_N] tile of the MLP activation (rounded to the input type, as it is
    stored), a the down adapter's A rows of the tile's columns (_down_a), td fp32 [M, R_PAD] (zeroed by phase 1:
    _zero_rank_rows); one thin dot and fp32 atomics, one contribution per column tile (their order varies from run
    to run: the sum's last bits may too). RD = 0: nothing (LoRASwiGLU alone)."""
    if RD > 0:
        offs_r = tl.arange(0, R_PAD)
        t = tl.dot(y.to(a.dtype), a, input_precision=DOT_PRECISION)
        # padded rank columns hold y @ 0, NaN in a row with an infinite y: never added
        tl.atomic_add(td_ptr + offs_m.to(tl.int64)[:, None] * R_PAD + offs_r[None, :], t,
                      mask=(offs_m < M)[:, None] & (offs_r < RD)[None, :], sem="relaxed")


@triton.jit
def _multi_down_a(ad_ptr, j0, offs_n, n_ok, N, RD, NA, R_PAD: tl.constexpr):
    """The down adapters' A tiles of adapters j0 .. j0 + CH - 1 side by side, [BLOCK_N, CH * R_PAD] (CH = 128 / R_PAD;
    zero past RD and past NA, nothing read where RD is 0; ad [NA, N, RD]): one chunk of _multi_down_xa's adapters."""
    CH: tl.constexpr = 128 // R_PAD
    offs_c = tl.arange(0, CH * R_PAD)
    c_rank = offs_c % R_PAD
    c_adapter = j0 + offs_c // R_PAD
    col = (c_adapter.to(tl.int64) * N)[None, :] * RD + c_rank[None, :]
    return tl.load(ad_ptr + offs_n.to(tl.int64)[:, None] * RD + col,
                   mask=n_ok[:, None] & ((c_adapter < NA) & (c_rank < RD))[None, :], other=0.0)


@triton.jit
def _multi_down_chunk(t, yq, a, aid, j0, BLOCK_M: tl.constexpr, R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``t + (each row's block of yq @ a)``: one dot of the tile with a chunk's A tiles (_multi_down_a), each row
    keeping the block of its own adapter."""
    CH: tl.constexpr = 128 // R_PAD
    p = tl.reshape(tl.dot(yq, a, input_precision=DOT_PRECISION), (BLOCK_M, CH, R_PAD))
    js = j0 + tl.arange(0, CH)
    return t + tl.sum(tl.where((aid[:, None] == js[None, :])[:, :, None], p, 0.0), axis=1)


@triton.jit
def _multi_down_add(td_ptr, t, aid, offs_m, M, RD, NA, R_PAD: tl.constexpr):
    """``td[m, :RD] += t[m]`` (fp32 atomics) for the tile's rows below M that have an adapter below NA."""
    offs_r = tl.arange(0, R_PAD)
    ok = (offs_m < M) & (aid >= 0) & (aid < NA)
    tl.atomic_add(td_ptr + offs_m.to(tl.int64)[:, None] * R_PAD + offs_r[None, :], t,
                  mask=ok[:, None] & (offs_r < RD)[None, :], sem="relaxed")


@triton.jit
def _multi_down_xa(y, aid, offs_m, offs_n, n_ok, ad_ptr, td_ptr, M, N, RD, NA, BLOCK_M: tl.constexpr,
                   R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """_down_xa for a mixed batch: ``td[m, :RD] += y[m].to(T) @ ad[j_m][cols, :RD]``, j_m the row's adapter (`aid`;
    rows without one, or past NA, add nothing), ad [NA, N, RD]. The adapters go CH = 128 / R_PAD at a time: their A
    tiles side by side ([BLOCK_N, CH * R_PAD], one load), one dot, then each row keeps the block of its own adapter;
    a chunk no row of the tile uses is skipped (as _multi_rank_term's)."""
    if RD > 0:
        CH: tl.constexpr = 128 // R_PAD
        yq = y.to(ad_ptr.dtype.element_ty)
        t = tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32)
        for j0 in range(0, NA, CH):
            if tl.max(((aid >= j0) & (aid < j0 + CH)).to(tl.int32), axis=0) > 0:
                a = _multi_down_a(ad_ptr, j0, offs_n, n_ok, N, RD, NA, R_PAD)
                t = _multi_down_chunk(t, yq, a, aid, j0, BLOCK_M, R_PAD, DOT_PRECISION)
        _multi_down_add(td_ptr, t, aid, offs_m, M, RD, NA, R_PAD)
