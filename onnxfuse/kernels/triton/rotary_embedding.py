"""Triton kernel for RotaryEmbedding (onnxfuse.schema): Y = X * cos + rotate_half(X) * sin in one pass.

Compiled ahead of time by `aot.py`; the launcher (cuda/rotary_embedding.cu,
onnxfuse_triton_rotary_embedding) passes the arguments in the order of KERNELS below and launches row tiles x
half-column tiles (the GEMM launcher's grid with M = rows and N = D/2).
"""
import triton
import triton.language as tl


@triton.jit
def _rotary_embedding_kernel(x_ptr, cos_ptr, sin_ptr, y_ptr, ROWS, HALF, D1, D2, CS0, CS1, CS2, SS0, SS1, SS2,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """PyTorch: ``lo, hi = x[..., :h], x[..., h:]; y = cat(lo*cos_lo - hi*sin_lo, hi*cos_hi + lo*sin_hi)`` in fp32.

    X is ROWS rows of D = 2 * HALF contiguous elements, seen as [d0, D1, D2, D] (row r -> i0, i1, i2); the cos row of
    r starts at (i0 * CS0 + i1 * CS1 + i2 * CS2) * D (strides 0 where cos broadcasts; a head's rows share it), sin
    likewise. Each program owns BLOCK_M rows x BLOCK_N pairs (j, j + HALF). Offsets are 64-bit.
    """
    pid = tl.program_id(0)
    num_n = tl.cdiv(HALF, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < ROWS)[:, None] & (cols < HALF)[None, :]
    r = rows.to(tl.int64)
    d = 2 * HALF.to(tl.int64)
    i2 = r % D2
    i1 = (r // D2) % D1
    i0 = r // (D2 * D1)
    x_off = (r * d)[:, None] + cols[None, :]
    c_off = ((i0 * CS0 + i1 * CS1 + i2 * CS2) * d)[:, None] + cols[None, :]
    s_off = ((i0 * SS0 + i1 * SS1 + i2 * SS2) * d)[:, None] + cols[None, :]
    lo = tl.load(x_ptr + x_off, mask=mask, other=0.0).to(tl.float32)
    hi = tl.load(x_ptr + x_off + HALF, mask=mask, other=0.0).to(tl.float32)
    c_lo = tl.load(cos_ptr + c_off, mask=mask, other=0.0).to(tl.float32)
    c_hi = tl.load(cos_ptr + c_off + HALF, mask=mask, other=0.0).to(tl.float32)
    s_lo = tl.load(sin_ptr + s_off, mask=mask, other=0.0).to(tl.float32)
    s_hi = tl.load(sin_ptr + s_off + HALF, mask=mask, other=0.0).to(tl.float32)
    out_t = y_ptr.dtype.element_ty
    tl.store(y_ptr + x_off, (lo * c_lo - hi * s_lo).to(out_t), mask=mask)
    tl.store(y_ptr + x_off + HALF, (hi * c_hi + lo * s_hi).to(out_t), mask=mask)


# HALF carries the divisibility hint in the aligned specialisation (D/2 a multiple of 16: 16-byte row segments).
KERNELS = {
    "rotary_embedding": (_rotary_embedding_kernel,
                         [("x_ptr", "*T"), ("cos_ptr", "*T"), ("sin_ptr", "*T"), ("y_ptr", "*T"), ("ROWS", "i32"),
                          ("HALF", "i32:16"), ("D1", "i32"), ("D2", "i32"), ("CS0", "i32"), ("CS1", "i32"),
                          ("CS2", "i32"), ("SS0", "i32"), ("SS1", "i32"), ("SS2", "i32")]),
}

# Tile configs: (rows per program, half-columns per program, -, -, warps, stages), memory bound: 16 rows x 64 pairs
# (a head dim of 128 in one column tile: 16 x 128 elements of X, cos and sin per program), the same for every size.
_TILES = {size: (16, 64, 16, 1, 4, 1) for size in ("small", "medium", "large")}
CONFIGS = {arch: {"rotary_embedding": {"h": _TILES, "f": _TILES}} for arch in ("90", "80")}
