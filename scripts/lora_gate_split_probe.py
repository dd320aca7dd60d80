"""LoRASwiGLU's large-M path: phase 1's K split (lora_xa) against lora_gate's sum of the partials, timed on the GPU.

For 1, 2, 3, 4, 5 and 8 slices of K, lora_xa (both stacks, 64-row tiles) and a lora_gate pass that sums the
partials in a loop (gemm_loop._rank_t, the library's before) or in one [S_PAD, BLOCK_M, R_PAD] load (as
_rank_t_chunked, now _rank_t2; padded here to the next power of two), on three tiles: each alone and both in one CUDA
graph replayed back to back (us per replay, best of 5), the output checked against the first form's. H100 results:
benchmarks/results/h100-2026-11-27/lora/lora-gate-split-probe.txt (triton/table.py LORA_GATE_MAX_SPLIT). Needs a
CUDA GPU, torch and triton; nothing of onnxruntime.

    python scripts/lora_gate_split_probe.py
"""
from __future__ import annotations

import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_pdl_probe import steady  # noqa: E402  (one CUDA graph replayed back to back, best of rounds)

from onnxfuse.kernels.build import aot_module  # noqa: E402

aot_module()._kernel_modules()  # the kernel files as one package (aot.py's loader)
LO = sys.modules["_onnxfuse_triton_kernels.lora_linear"]
SW = sys.modules["_onnxfuse_triton_kernels.swiglu"]
GL = sys.modules["_onnxfuse_triton_kernels.gemm_loop"]


@triton.jit
def _rank_t_at_once(rows, t_ptr, M, SPLIT, BLOCK_M: tl.constexpr, R_PAD: tl.constexpr, S_PAD: tl.constexpr):
    """T's row tile: the SPLIT partials in one [S_PAD, BLOCK_M, R_PAD] load, summed."""
    offs_s = tl.arange(0, S_PAD)
    p = t_ptr + (offs_s.to(tl.int64)[:, None, None] * M + rows[None, :, None]) * R_PAD \
        + tl.arange(0, R_PAD)[None, None, :]
    return tl.sum(tl.load(p, mask=(offs_s < SPLIT)[:, None, None], other=0.0), axis=0)


@triton.jit
def _gate_at_once(g_ptr, u_ptr, tg_ptr, bg_ptr, tu_ptr, bu_ptr, y_ptr, M, N, RG, RU, SPLIT, scale_gate, scale_up, ACT,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, R_PAD: tl.constexpr,
                  S_PAD: tl.constexpr):
    """_lora_gate_kernel with _rank_t_at_once."""
    pid_m, pid_n = GL._tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    n_ok = offs_n < N
    zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    dg = GL._rank_dot(zero, _rank_t_at_once(rows, tg_ptr, M, SPLIT, BLOCK_M, R_PAD, S_PAD),
                      GL._rank_b(bg_ptr, offs_n, n_ok, N, RG, R_PAD), scale_gate, "tf32")
    du = GL._rank_dot(zero, _rank_t_at_once(rows, tu_ptr, M, SPLIT, BLOCK_M, R_PAD, S_PAD),
                      GL._rank_b(bu_ptr, offs_n, n_ok, N, RU, R_PAD), scale_up, "tf32")
    offs = rows[:, None] * N + offs_n[None, :]
    gate = tl.load(g_ptr + offs, mask=n_ok[None, :], other=0.0).to(tl.float32) + dg
    up = tl.load(u_ptr + offs, mask=n_ok[None, :], other=0.0).to(tl.float32) + du
    GL._store_tile(y_ptr, N, SW._gate_activation(gate, ACT) * up, offs_m, offs_m < M, offs_n, n_ok)


def main() -> int:
    dev, dt = "cuda", torch.float16
    m, h, i, r = 2048, 4096, 11008, 16
    x = torch.randn(m, h, device=dev, dtype=dt)
    ag, au = (torch.randn(h, r, device=dev, dtype=dt) / 64 for _ in range(2))
    bg, bu = (torch.randn(r, i, device=dev, dtype=dt) / 4 for _ in range(2))
    g, u = (torch.randn(m, i, device=dev, dtype=dt) for _ in range(2))
    y = torch.empty_like(g)
    tg, tu = (torch.zeros(16, m, 16, device=dev) for _ in range(2))
    print(f"lora_gate split probe on {torch.cuda.get_device_name()}: M {m}, K {h}, N {i}, rank {r}, fp16")
    bm, bk = 64, 64  # lora_xa's large-class tile
    k_blocks = triton.cdiv(h, bk)
    ref = None
    for split in (1, 2, 3, 4, 5, 8):
        kb = triton.cdiv(k_blocks, split)
        s = triton.cdiv(k_blocks, kb)

        def xa(kb=kb, s=s):
            LO._lora_xa_kernel[(triton.cdiv(m, bm) * s,)](x, ag, au, tg, tu, m, h, r, r, 2, kb, tg, 0, BLOCK_M=bm,
                                                          BLOCK_K=bk, R_PAD=16, DOT_PRECISION="tf32", num_warps=4,
                                                          num_stages=4)
        for form in ("loop", "at once"):
            for bmg, bng in ((16, 256), (16, 128), (32, 128)):
                grid = (triton.cdiv(m, bmg) * triton.cdiv(i, bng),)
                tile = dict(BLOCK_M=bmg, BLOCK_N=bng, GROUP_M=8, R_PAD=16, num_warps=4, num_stages=1)

                def gate(grid=grid, tile=tile, s=s, form=form):
                    if form == "loop":
                        SW._lora_gate_kernel[grid](g, u, tg, bg, tu, bu, y, m, i, r, r, s, 0.5, 0.5, 0, ag, tg,
                                                   0, DOT_PRECISION="tf32", **tile)
                    else:
                        _gate_at_once[grid](g, u, tg, bg, tu, bu, y, m, i, r, r, s, 0.5, 0.5, 0,
                                            S_PAD=triton.next_power_of_2(s), **tile)

                def both(xa=xa, gate=gate):
                    xa()
                    gate()
                a, c, d = steady(xa), steady(gate), steady(both)
                torch.cuda.synchronize()
                if ref is None:
                    ref = y.clone()
                err = float((y.float() - ref.float()).abs().max())
                print(f"split {s} ({kb} blocks) gate {form} {bmg}x{bng}: xa {a:6.1f} us, lora_gate {c:6.1f}, "
                      f"both {d:6.1f}  (diff {err:.1e})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
