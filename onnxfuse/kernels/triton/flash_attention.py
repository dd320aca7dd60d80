"""Triton kernels for FlashAttention (onnxfuse.schema): a flash-attention forward over the key tiles the bias leaves
live, and the two passes that make skipping the others exact.

Compiled ahead of time by `aot.py`; the launcher (cuda/flash_attention.cu, onnxfuse_triton_flash_attention) runs
`flash_attention_bias` (the largest bias value of each BLOCK_M x BLOCK_N tile of each bias plane, and the bias
copied padded to whole tiles), then
`flash_attention_keys` (per batch, head and key tile: the largest |k| of its keys, +inf where a key or value of the
tile is not finite), then `flash_attention` on query tiles x batch x heads. A query tile takes, in one pipelined
loop, the key tiles from the first to the last whose largest bias is above MASKED (-30000: the exporters' masks are
-65504 or the type's lowest), then checks each tile it skipped: the tile's terms are exactly 0 in the reference's
softmax when max |q| of the query tile x max |k| of the key tile x scale + the tile's largest bias - the query
tile's smallest row maximum is below -110 (exp underflows to 0 in fp32); a tile where that does not hold (a row with
every key masked: left padding; huge scores; a non-finite key or value, which the reference's output shows) is
taken after all. So the skip never changes the result beyond the rounding of the terms it adds.

The size class is the head dimension's (small D = 64, medium and large D = 128; the config's BLOCK_K is D):
cuda/flash_attention.cu AttentionClass.
"""
import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
MASKED = tl.constexpr(-30000.0)  # a bias tile whose values are all at or below this is skipped (then checked)
UNDERFLOW = tl.constexpr(-110.0)  # a term exp(x) with x below this adds exactly 0 in fp32 (2^-149 is e^-103.3)


@triton.jit
def _flash_attention_bias_kernel(b_ptr, bmax_ptr, pb_ptr, S, SKV, SBB, SBH, SBS, HB, TILES_M, TILES_N,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """bmax[plane, tm, tn] = the largest value of the bias tile (NaN counts as +inf), plane = pb HB + ph; and the
    tile copied into pb, the bias padded to whole tiles ([planes, TILES_M BLOCK_M, TILES_N BLOCK_N], -inf outside
    S x S_kv): rows a multiple of 16 elements whatever S_kv is, which the flash loop's bias loads need to be vectorised
    (an unhinted row stride measured 11x slower on an H100), and no mask on them."""
    pid = tl.program_id(0)
    tn = pid % TILES_N
    rest = pid // TILES_N
    tm = rest % TILES_M
    plane = rest // TILES_M
    rows = tm * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (rows < S)[:, None] & (cols < SKV)[None, :]
    base = b_ptr + (plane // HB).to(tl.int64) * SBB + (plane % HB).to(tl.int64) * SBH
    x = tl.load(base + rows[:, None].to(tl.int64) * SBS + cols[None, :], mask=ok, other=float("-inf"))
    xf = x.to(tl.float32)
    tl.store(bmax_ptr + pid, tl.max(tl.max(tl.where(xf != xf, float("inf"), xf), 1), 0))
    padded = TILES_N * BLOCK_N
    dst = pb_ptr + plane.to(tl.int64) * (TILES_M * BLOCK_M) * padded + rows[:, None].to(tl.int64) * padded
    tl.store(dst + cols[None, :], x)


@triton.jit
def _flash_attention_keys_kernel(k_ptr, v_ptr, kinfo_ptr, SKV, H, HD, SKB, TILES_N, BLOCK_N: tl.constexpr,
                                 BLOCK_K: tl.constexpr):
    """kinfo[b H + h, tn] = the largest |k_j| of the tile's keys, +inf where a key or value of it is not finite."""
    pid = tl.program_id(0)
    tn = pid % TILES_N
    bh = pid // TILES_N
    b = bh // H
    h = bh % H
    rows = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    ok = (rows < SKV)[:, None]
    off = b.to(tl.int64) * SKB + rows[:, None].to(tl.int64) * HD + h * BLOCK_K + cols[None, :]
    k = tl.load(k_ptr + off, mask=ok, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + off, mask=ok, other=0.0).to(tl.float32)
    # 0 where every key and value of the tile is finite, NaN otherwise (x * 0 is NaN for NaN and +-inf)
    check = tl.sum(tl.sum(k * 0.0 + v * 0.0, 1), 0)
    norm = tl.sqrt(tl.max(tl.sum(k * k, 1), 0))
    tl.store(kinfo_ptr + pid, tl.where(check == 0.0, norm, float("inf")))


@triton.jit
def _attend(acc, l_i, m_i, q, k_ptr, v_ptr, b_row_ptr, offs_m, row_ok, start, SKV, HD, SBS, qk_scale,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One key tile of the online softmax. Scores and maxima in natural units, as the reference rounds them (a bias
    of -65504 plus a score rounds there, and only the difference to the row's maximum is scaled to log2); a row
    whose maximum is still -inf adds nothing."""
    cols = start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_K)
    col_ok = cols < SKV
    k = tl.load(k_ptr + cols[None, :].to(tl.int64) * HD + offs_d[:, None], mask=col_ok[None, :], other=0.0)
    s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
    bias = tl.load(b_row_ptr + offs_m[:, None].to(tl.int64) * SBS + cols[None, :]).to(tl.float32)  # padded
    s = tl.where(col_ok[None, :], s + bias, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2((m_i - m_safe) * LOG2E)
    p = tl.math.exp2((s - m_safe[:, None]) * LOG2E)
    v = tl.load(v_ptr + cols[:, None].to(tl.int64) * HD + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def _attend_full(acc, l_i, m_i, q, k, v, bias, qk_scale, DOT_PRECISION: tl.constexpr):
    """_attend on a tile wholly inside S_kv, its K, V and bias loaded by the caller (no masks)."""
    s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale + bias.to(tl.float32)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2((m_i - m_safe) * LOG2E)
    p = tl.math.exp2((s - m_safe[:, None]) * LOG2E)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def _live_tiles(bmax_row, TILES_N):
    """The live key tiles of a query block, [lo, hi): from the first to the last whose largest bias is above MASKED
    (none: [0, 0))."""
    lo = TILES_N
    hi = 0
    for c in range(0, TILES_N, 64):
        idx = c + tl.arange(0, 64)
        f = tl.load(bmax_row + idx, mask=idx < TILES_N, other=float("-inf"))
        live = f > MASKED
        lo = tl.minimum(lo, tl.min(tl.where(live, idx, TILES_N), 0))
        hi = tl.maximum(hi, tl.max(tl.where(live, idx + 1, 0), 0))
    return tl.where(hi == 0, 0, lo), hi


@triton.jit
def _flash_attention_kernel(q_ptr, k_ptr, v_ptr, b_ptr, y_ptr, kinfo_ptr, bmax_ptr, S, SKV, H, HD, SQB, SKB, SBB,
                            SBH, SBS, BPB, BPH, TILES_M, TILES_N, qk_scale, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """PyTorch: ``softmax(q @ k.T * qk_scale + bias) @ v`` per batch b and head h (D = BLOCK_K), fp32 softmax.

    Q, K, V, Y rows of HD elements (head h at column h D); batch strides SQB (Q, Y) and SKB (K, V); b_ptr the bias
    padded to whole tiles (_flash_attention_bias_kernel's copy), the plane of (b, h) at b SBB + h SBH (0 where it
    broadcasts), rows of SBS = TILES_N BLOCK_N; its tiles' maxima at plane b BPB + h BPH of bmax [planes, TILES_M,
    TILES_N], the key tiles' |k| bounds at kinfo [B H, TILES_N]. Offsets are 64-bit.
    """
    # the query blocks with the most key tiles first (a causal bias's last blocks): the grid's last wave then holds
    # short blocks (H100, causal, 2048 tokens: 111 against 131 us in the order of the blocks)
    pid = tl.program_id(0)
    programs_bh = tl.num_programs(0) // TILES_M
    pid_m = TILES_M - 1 - pid // programs_bh
    bh = pid % programs_bh
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_K)
    row_ok = offs_m < S
    q_base = q_ptr + b.to(tl.int64) * SQB + h * BLOCK_K
    k_base = k_ptr + b.to(tl.int64) * SKB + h * BLOCK_K
    v_base = v_ptr + b.to(tl.int64) * SKB + h * BLOCK_K
    b_row = b_ptr + b.to(tl.int64) * SBB + h.to(tl.int64) * SBH
    q = tl.load(q_base + offs_m[:, None].to(tl.int64) * HD + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    bmax_row = bmax_ptr + ((b * BPB + h * BPH) * TILES_M + pid_m).to(tl.int64) * TILES_N
    kinfo_row = kinfo_ptr + bh.to(tl.int64) * TILES_N
    lo, hi = _live_tiles(bmax_row, TILES_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    # the tiles wholly inside S_kv with pointers advanced a tile a step (32-bit offsets inside the (b, h) slice: the
    # launcher keeps S_kv H D and the padded plane below 2^31), then the last one, masked, where S_kv ends inside it
    # (H100, causal, 2048 tokens: 131 against 142 us with every element's 64-bit address computed each tile)
    full_hi = tl.minimum(hi, SKV // BLOCK_N)
    offs_n = lo * BLOCK_N + tl.arange(0, BLOCK_N)
    k_ptrs = k_base + offs_n[None, :] * HD + offs_d[:, None]
    v_ptrs = v_base + offs_n[:, None] * HD + offs_d[None, :]
    b_ptrs = b_row + offs_m[:, None] * SBS + offs_n[None, :]
    for _ in range(lo, full_hi):
        acc, l_i, m_i = _attend_full(acc, l_i, m_i, q, tl.load(k_ptrs), tl.load(v_ptrs), tl.load(b_ptrs), qk_scale,
                                     DOT_PRECISION)
        k_ptrs += BLOCK_N * HD
        v_ptrs += BLOCK_N * HD
        b_ptrs += BLOCK_N
    if hi > full_hi:
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, b_row, offs_m, row_ok,
                                tl.maximum(full_hi, lo) * BLOCK_N, SKV, HD, SBS, qk_scale, BLOCK_N, BLOCK_K,
                                DOT_PRECISION)
    if (lo > 0) | (hi < TILES_N):
        # the skipped tiles: each is taken unless its terms underflow to exactly 0 in every row of the block, i.e.
        # max |q| x max |k| x scale + the tile's largest bias - the block's smallest row maximum < UNDERFLOW
        # (natural units; NaN: taken). Checked 64 tiles a step; the tiles to take, if any, one by one after.
        qf = q.to(tl.float32)
        qmax = tl.max(tl.where(row_ok, tl.sqrt(tl.sum(qf * qf, 1)), 0.0), 0)
        mmin = tl.min(tl.where(row_ok, m_i, float("inf")), 0)
        need = 0
        for c in range(0, TILES_N, 64):
            idx = c + tl.arange(0, 64)
            in_row = idx < TILES_N
            kmax = tl.load(kinfo_row + idx, mask=in_row, other=0.0)
            bmx = tl.load(bmax_row + idx, mask=in_row, other=float("-inf"))
            bound = qmax * kmax * qk_scale + bmx - mmin
            take = in_row & ((idx < lo) | (idx >= hi)) & ((bound >= UNDERFLOW) | (bound != bound))
            need += tl.sum(take.to(tl.int32), 0)
        if need > 0:
            for t in range(0, TILES_N):
                if (t < lo) | (t >= hi):
                    bound = qmax * tl.load(kinfo_row + t) * qk_scale + tl.load(bmax_row + t) - mmin
                    if (bound >= UNDERFLOW) | (bound != bound):
                        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, b_row, offs_m, row_ok,
                                                t * BLOCK_N, SKV, HD, SBS, qk_scale, BLOCK_N, BLOCK_K, DOT_PRECISION)
    y = acc / l_i[:, None]
    tl.store(y_ptr + b.to(tl.int64) * SQB + offs_m[:, None].to(tl.int64) * HD + h * BLOCK_K + offs_d[None, :],
             y.to(y_ptr.dtype.element_ty), mask=row_ok[:, None])


# The row and batch strides of Q, K, V (HD, S HD, S_kv HD) and the padded bias's strides carry the divisibility hint
# in the aligned specialisation (HD a multiple of 16): without it on the batch strides the loads were not vectorised
# and the kernel ran 2-3x slower on an H100 than the same source compiled by Triton's JIT (which infers it).
KERNELS = {
    "flash_attention": (_flash_attention_kernel,
                        [("q_ptr", "*T"), ("k_ptr", "*T"), ("v_ptr", "*T"), ("b_ptr", "*T"), ("y_ptr", "*T"),
                         ("kinfo_ptr", "*fp32"), ("bmax_ptr", "*fp32"), ("S", "i32"), ("SKV", "i32"), ("H", "i32"),
                         ("HD", "i32:16"), ("SQB", "i32:16"), ("SKB", "i32:16"), ("SBB", "i32:16"), ("SBH", "i32:16"),
                         ("SBS", "i32:16"), ("BPB", "i32"), ("BPH", "i32"), ("TILES_M", "i32"), ("TILES_N", "i32"),
                         ("qk_scale", "fp32")]),
    "flash_attention_bias": (_flash_attention_bias_kernel,
                             [("b_ptr", "*T"), ("bmax_ptr", "*fp32"), ("pb_ptr", "*T"), ("S", "i32"), ("SKV", "i32"),
                              ("SBB", "i32"), ("SBH", "i32"), ("SBS", "i32"), ("HB", "i32"), ("TILES_M", "i32"),
                              ("TILES_N", "i32")]),
    "flash_attention_keys": (_flash_attention_keys_kernel,
                             [("k_ptr", "*T"), ("v_ptr", "*T"), ("kinfo_ptr", "*fp32"), ("SKV", "i32"), ("H", "i32"),
                              ("HD", "i32:16"), ("SKB", "i32:16"), ("TILES_N", "i32")]),
}

# Tile configs: (query rows, keys per tile, D, -, warps, stages), one per head dim (the size class: small D = 64,
# medium and large D = 128). H100, fp16, one Llama-2-7B layer at 2048 tokens with a causal bias
# (scripts/flash_attention_probe.py, benchmarks/results/h100-2026-11-27/attention/): 128 x 64 with 8 warps and 3
# stages 146 us, 4 stages 148, 2 stages 182, 4 warps 264, 64 x 64 with 4 warps 176. fp32 (exact dots): 64 x 32.
# The three kernels share a config, so the passes' tiles are the main kernel's.
_H = {"small": (128, 64, 64, 1, 4, 3), "medium": (128, 64, 128, 1, 8, 3), "large": (128, 64, 128, 1, 8, 3)}
_F = {"small": (64, 32, 64, 1, 4, 2), "medium": (64, 32, 128, 1, 4, 2), "large": (64, 32, 128, 1, 4, 2)}
CONFIGS = {arch: {k: {"h": _H, "f": _F} for k in KERNELS} for arch in ("90", "80")}
