"""Triton kernel for CachedAttention (onnxfuse.schema): the split-KV partials of decode attention over the KV cache.

Compiled ahead of time by `aot.py`; the launcher (cuda/cached_attention.cu, onnxfuse_triton_cached_attention) runs
the CUDA kernels' prepare step (present from past, the new rows rotated and stored, the queries rotated into fp32
scratch), this kernel, then the CUDA combine, and passes the arguments in the order of KERNELS below: one program per
(sequence, KV head, query row, key split) x query head of the group (the GEMM launcher's grid with M = programs,
N = 1, BLOCK_M = 1).
"""
import triton
import triton.language as tl


@triton.jit
def _cached_attention_kernel(q_ptr, seqlens_ptr, k_ptr, v_ptr, part_ptr, S, H, HKV, D, L, SPLITS, FIRST, SCALE,
                             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """PyTorch, per program: ``p = softmax_j(SCALE * q . K[j]) over its split's keys j; part = (max, sum, p-weighted
    sum of V)`` before normalisation (flash-decoding), fp32.

    q: the rotated query head [D] (fp32 scratch [B, S, H, D]); K, V: the KV head's present rows [L, D]; the keys of
    row s are 0 .. p_b + s (p_b from seqlens_k and FIRST, as the CUDA kernels' RowsOf), cut into SPLITS equal spans.
    NaN-propagating max; exp(score - max) as written, so a NaN or +Inf score makes the result NaN (softmax's); -Inf
    scores add nothing. Writes part[((task * SPLITS + split) * G + g) * (2 + D) + (0, 1, 2..)].
    """
    pid = tl.program_id(0)
    G = H // HKV
    g = pid % G
    t = pid // G
    split = t % SPLITS
    task = t // SPLITS
    s = task % S
    kvh = (task // S) % HKV
    b = task // (S * HKV)
    total = tl.load(seqlens_ptr + b) + 1
    if FIRST:
        past = total * 0
        valid = total
        ok = (total >= 1) & (total <= S)
    else:
        past = total - S
        valid = total * 0 + S
        ok = (past >= 0) & (total <= L)
    n = tl.where(ok & (s < valid), past + s + 1, 0)
    per = (n + SPLITS - 1) // SPLITS
    j0 = split * per
    j1 = tl.minimum(j0 + per, n)
    offs_d = tl.arange(0, BLOCK_N)
    dmask = offs_d < D
    q_row = ((b * S + s) * H + kvh * G + g).to(tl.int64) * D
    q = tl.load(q_ptr + q_row + offs_d, mask=dmask, other=0.0)
    base = (b * HKV + kvh).to(tl.int64) * L * D
    m_i = tl.full((), float("-inf"), tl.float32)
    l_i = tl.full((), 0.0, tl.float32)
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for j in range(j0, j1, BLOCK_K):
        offs_k = j + tl.arange(0, BLOCK_K)
        kmask = offs_k < j1
        rows = base + offs_k.to(tl.int64)[:, None] * D + offs_d[None, :]
        mask = kmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + rows, mask=mask, other=0.0).to(tl.float32)
        sc = tl.sum(k * q[None, :], axis=1) * SCALE
        sc = tl.where(kmask, sc, float("-inf"))
        nan = tl.sum(tl.where(sc != sc, 1, 0), axis=0) > 0
        m_blk = tl.where(nan, float("nan"), tl.max(sc, axis=0))
        m_new = tl.where((m_i != m_i) | (m_blk != m_blk), float("nan"), tl.maximum(m_i, m_blk))
        live = m_new != float("-inf")
        corr = tl.where(m_i == float("-inf"), 0.0, tl.exp(m_i - m_new))
        p = tl.where(live, tl.exp(sc - m_new), 0.0)
        v = tl.load(v_ptr + rows, mask=mask, other=0.0).to(tl.float32)
        l_i = tl.where(live, l_i * corr + tl.sum(p, axis=0), l_i)
        acc = tl.where(live, acc * corr + tl.sum(p[:, None] * v, axis=0), acc)
        m_i = tl.where(live, m_new, m_i)
    out = part_ptr + ((task * SPLITS + split) * G + g).to(tl.int64) * (2 + D)
    tl.store(out, m_i)
    tl.store(out + 1, l_i)
    tl.store(out + 2 + offs_d, acc, mask=dmask)


KERNELS = {
    "cached_attention": (_cached_attention_kernel,
                         [("q_ptr", "*fp32"), ("seqlens_ptr", "*i32"), ("k_ptr", "*T"), ("v_ptr", "*T"),
                          ("part_ptr", "*fp32"), ("S", "i32"), ("H", "i32"), ("HKV", "i32"), ("D", "i32"),
                          ("L", "i32"), ("SPLITS", "i32"), ("FIRST", "i32"), ("SCALE", "fp32")]),
}

# Tile configs: (programs per row tile: 1, head-size tile 128 (D <= 128), keys per step 32, -, warps, stages): a
# program streams its split's K and V rows 32 at a time; the same for every size class.
_TILES = {size: (1, 128, 32, 1, 4, 2) for size in ("small", "medium", "large")}
CONFIGS = {arch: {"cached_attention": {"h": _TILES, "f": _TILES}} for arch in ("90", "80")}
