"""Triton kernel for EmbeddingInteraction and EmbeddingBagInteraction (onnxfuse.schema): DLRM's hash, every
embedding lookup (or sum-pooled bag), and the feature interaction, in ONE launch.

    t[b, 0] = x[b];  t[b, f + 1] = table[row(b, f)]  (or the bag sum, rounded to T)
    dot: y[b] = [x[b], (t[b] @ t[b]^T)[i, j] for i > j (i-major)]      cat: y[b] = [t[b, 0], ..., t[b, F]]

Each program owns BLOCK_M samples and holds their vectors as one [BLOCK_M, NP, DP] register tile (NP >= F + 1
vectors, DP >= d components, powers of two, zero padded): the ids of the block are read with one load, the rows
with one gathered load (bags: one per position of the longest bag of the block), the pairwise products are one
batched tl.dot with fp32 accumulation, and the strict lower triangle is stored straight from the accumulator with
a mask. Rows and output offsets are 64-bit; an id outside its table gives a zero vector (common/embedding_row.h
spells the same rule in C).

Compiled ahead of time by `aot.py` per dtype and (NP, DP) (the launcher in cuda/embedding_interaction.cu picks
the smallest that fits); BAG, HASH and DOT are run-time flags so one cubin serves both ops and both interactions.
"""
import triton
import triton.language as tl


@triton.jit
def _table_row(ids, HASH, card, toff, R):
    """(row, valid): the hash ((id + 1) mod card when HASH == 1, Python's modulus), a negative id counted from the
    end of its table, then the row of the concatenated table; valid is False (a zero vector) outside it."""
    safe = tl.where(card > 0, card, 1)
    h = (ids + 1) % safe
    h = tl.where(h < 0, h + safe, h)
    v = tl.where(HASH == 1, h, ids)
    v = tl.where(v < 0, v + card, v)
    ok = (card > 0) & (v >= 0) & (v < card)
    ok = ok & ~((toff > 0) & (v > 9223372036854775807 - toff))
    row = toff + v
    ok = ok & (row >= 0) & (row < R)
    return tl.where(ok, row, 0), ok


@triton.jit
def _embedding_interaction_kernel(x_ptr, ids_ptr, offs_ptr, table_ptr, toff_ptr, card_ptr, y_ptr,
                                  B, F, N, IS, OC, D, WIDTH, R, BAG, HASH, DOT,
                                  BLOCK_M: tl.constexpr, NP: tl.constexpr, DP: tl.constexpr,
                                  DOT_PRECISION: tl.constexpr):
    """PyTorch: onnxfuse.schema.reference("EmbeddingInteraction" / "EmbeddingBagInteraction").

    x [B, D]; ids [B, F] (BAG == 0) or indices [F, N] (IS = N) or [1, N] (IS = 0) with offsets [F, OC] (BAG == 1;
    OC = B: the last bag ends at N, or B + 1); table [R, D]; toff, card [F] int64; y [B, WIDTH]. HASH: 0 none,
    1 (id + 1) mod card. DOT: 1 dot interaction, 0 cat.
    """
    pid = tl.program_id(0)
    offs_b = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    b_ok = offs_b < B
    rows_b = tl.where(b_ok, offs_b, 0).to(tl.int64)
    vi = tl.arange(0, NP)
    f_ok = (vi >= 1) & (vi <= F)
    fc = tl.where(f_ok, vi - 1, 0).to(tl.int64)
    card = tl.load(card_ptr + fc, mask=f_ok, other=0)[None, :]
    toff = tl.load(toff_ptr + fc, mask=f_ok, other=0)[None, :]
    c = tl.arange(0, DP)
    c_ok = c < D
    m2 = b_ok[:, None] & f_ok[None, :]
    if BAG == 0:
        ids = tl.load(ids_ptr + rows_b[:, None] * F + fc[None, :], mask=m2, other=0)
        row, ok = _table_row(ids, HASH, card, toff, R)
        ok = ok & m2
        emb = tl.load(table_ptr + row[:, :, None] * D + c[None, None, :], mask=ok[:, :, None] & c_ok[None, None, :],
                      other=0.0)
    else:
        o_ptr = offs_ptr + fc[None, :] * OC + rows_b[:, None]
        start = tl.load(o_ptr, mask=m2, other=0)
        end = tl.load(o_ptr + 1, mask=m2 & (rows_b[:, None] + 1 < OC), other=N)
        start = tl.minimum(tl.maximum(start, 0), N)
        end = tl.minimum(tl.maximum(end, 0), N)
        length = tl.where(m2, tl.maximum(end - start, 0), 0)
        acc = tl.zeros((BLOCK_M, NP, DP), dtype=tl.float32)
        longest = tl.max(tl.reshape(length, (BLOCK_M * NP,)), axis=0)
        p = 0
        while p < longest:  # (a while loop: Triton's interpreter cannot range() over a reduction's result)
            in_bag = p < length
            idx = tl.load(ids_ptr + fc[None, :] * IS + start + p, mask=in_bag, other=0)
            row, ok = _table_row(idx, 0, card, toff, R)
            ok = ok & in_bag
            e = tl.load(table_ptr + row[:, :, None] * D + c[None, None, :], mask=ok[:, :, None] & c_ok[None, None, :],
                        other=0.0)
            acc += e.to(tl.float32)
            p += 1
        emb = acc.to(y_ptr.dtype.element_ty)  # a bag is stored in T by the unfused graph
    xb = tl.load(x_ptr + rows_b[:, None] * D + c[None, :], mask=b_ok[:, None] & c_ok[None, :], other=0.0)
    out = y_ptr + rows_b * WIDTH
    tl.store(out[:, None] + c[None, :], xb, mask=b_ok[:, None] & c_ok[None, :])
    t = tl.where((vi == 0)[None, :, None], xb[:, None, :], emb)
    if DOT == 1:
        z = tl.dot(t, tl.permute(t, (0, 2, 1)), input_precision=DOT_PRECISION)
        i = vi[:, None]
        j = vi[None, :]
        pair_col = D + i * (i - 1) // 2 + j
        keep = (j < i) & (i <= F)
        tl.store(out[:, None, None] + pair_col[None, :, :], z.to(y_ptr.dtype.element_ty),
                 mask=b_ok[:, None, None] & keep[None, :, :])
    else:
        vec_col = vi[:, None] * D + c[None, :]
        tl.store(out[:, None, None] + vec_col[None, :, :], t,
                 mask=b_ok[:, None, None] & f_ok[None, :, None] & c_ok[None, None, :])


KERNELS = {
    "embedding_interaction": (_embedding_interaction_kernel, [
        ("x_ptr", "*T"), ("ids_ptr", "*i64"), ("offs_ptr", "*i64"), ("table_ptr", "*T"), ("toff_ptr", "*i64"),
        ("card_ptr", "*i64"), ("y_ptr", "*T"), ("B", "i32"), ("F", "i32"), ("N", "i32"), ("IS", "i32"),
        ("OC", "i32"), ("D", "i32"),
        ("WIDTH", "i32"), ("R", "i64"), ("BAG", "i32"), ("HASH", "i32"), ("DOT", "i32")]),
}

# Tile configs by shape, not size class: one cubin per dtype and (NP, DP) of table.py's EMBED_NPS x EMBED_DPS (the
# padded vector count and embedding dim); (BLOCK_M samples per program, 0, 0, 1, warps, stages). A program holds
# [BLOCK_M, NP, DP] vectors and the [BLOCK_M, NP, NP] fp32 products: BLOCK_M keeps both near 8K and 16K elements
# (64 + 128 registers over 128 threads). DLRM (27 vectors of 16): NP = 32, DP = 16, 8 samples per program (16
# programs at batch 128).
SHAPE_CONFIGS = {(32, 16): (8, 0, 0, 1, 4, 1), (32, 32): (4, 0, 0, 1, 4, 1), (32, 64): (2, 0, 0, 1, 4, 1),
                 (32, 128): (1, 0, 0, 1, 4, 1), (64, 16): (2, 0, 0, 1, 4, 1), (64, 32): (2, 0, 0, 1, 4, 1),
                 (64, 64): (1, 0, 0, 1, 4, 1), (64, 128): (1, 0, 0, 1, 8, 1)}
