"""Is a 2D-tiled act(g) * u pass slower than a flat one at 2048 x 11008 (fp16)? CUDA graphs of 20 launches,
round-robin, 9 rounds: the question behind lora_gate's cost over the plain pass (its 16 x 128 tiles, or its LoRA
work). Needs a CUDA GPU, torch and triton:

    python scripts/silu_mul_tile_probe.py
"""
from __future__ import annotations

import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_mlp_fold_probe import _silu_mul_kernel, round_robin  # noqa: E402

M, N = 2048, 11008


@triton.jit
def _silu_mul_2d(g_ptr, u_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    nb = tl.cdiv(N, BN)
    pid_m = tl.program_id(0) // nb
    pid_n = tl.program_id(0) % nb
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    ok = (rm < M)[:, None] & (rn < N)[None, :]
    off = rm.to(tl.int64)[:, None] * N + rn[None, :]
    g = tl.load(g_ptr + off, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + off, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + off, (g / (1.0 + tl.exp(-g)) * u).to(y_ptr.dtype.element_ty), mask=ok)


def main() -> int:
    g, u = (torch.randn(M, N, device="cuda", dtype=torch.float16) for _ in range(2))
    y = torch.empty_like(g)
    fns = {"flat 4096": lambda: _silu_mul_kernel[(triton.cdiv(M * N, 4096),)](g, u, y, M * N, BLOCK=4096,
                                                                              num_warps=8)}
    for bm, bn, w in [(16, 128, 4), (16, 256, 4), (8, 512, 4), (4, 1024, 4), (2, 2048, 8), (64, 64, 4), (32, 128, 4),
                      (16, 128, 8)]:
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        fns[f"2d {bm}x{bn} w{w}"] = (lambda grid=grid, bm=bm, bn=bn, w=w: _silu_mul_2d[grid](
            g, u, y, M, N, BM=bm, BN=bn, num_warps=w))
    med = round_robin(fns, 20, 9, launches=20)
    for k, v in med.items():
        print(f"  {k:20s} {v / 20:7.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
