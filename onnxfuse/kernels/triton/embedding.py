"""Triton kernel for Embedding (onnxfuse.schema): Y = table[ids], BLOCK_M ids x BLOCK_N columns per program.

Compiled ahead of time by `aot.py`; the launcher (cuda/embedding.cu, onnxfuse_triton_embedding) passes the
arguments in the order of KERNELS and launches id tiles x column tiles (the GEMM launcher's grid with M = ids, N = D).
"""
import triton
import triton.language as tl


@triton.jit
def _embedding_kernel(table_ptr, ids_ptr, y_ptr, NIDS, VOCAB, D, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """PyTorch: ``y = table[ids + (ids < 0) * V]``; ids outside [-V, V) give rows of zeros. Offsets are 64-bit."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(D, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    r_ok = rows < NIDS
    ids = tl.load(ids_ptr + rows, mask=r_ok, other=0)
    ids = tl.where(ids < 0, ids + VOCAB, ids)
    valid = r_ok & (ids >= 0) & (ids < VOCAB)
    safe = tl.where(valid, ids, 0).to(tl.int64)
    d64 = D.to(tl.int64)
    c_ok = cols < D
    vals = tl.load(table_ptr + (safe * d64)[:, None] + cols[None, :], mask=valid[:, None] & c_ok[None, :], other=0.0)
    tl.store(y_ptr + (rows.to(tl.int64) * d64)[:, None] + cols[None, :], vals, mask=r_ok[:, None] & c_ok[None, :])


# D carries the divisibility hint in the aligned specialisation (rows of 16-byte multiples).
KERNELS = {
    "embedding": (_embedding_kernel, [("table_ptr", "*T"), ("ids_ptr", "*i64"), ("y_ptr", "*T"), ("NIDS", "i32"),
                                      ("VOCAB", "i64"), ("D", "i32:16")]),
}

# Tile configs: (ids per program, columns per program, -, -, warps, stages): a copy, 8 rows x 512 columns.
_TILES = {size: (8, 512, 16, 1, 4, 1) for size in ("small", "medium", "large")}
CONFIGS = {arch: {"embedding": {"h": _TILES, "f": _TILES}} for arch in ("90", "80")}
