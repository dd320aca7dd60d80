"""LoRASwiGLU's large-M epilogue pass (triton/swiglu.py `_lora_gate_kernel`) in forms and tiles, timed alone on the GPU.

From triton/table.py LORA_SWIGLU_CUBLAS's shapes LoRASwiGLU's Triton launcher runs the base GEMMs on cuBLASLt and then
one pass ``y = act(g + (sg tg) @ bg) * (u + (su tu) @ bu)``: memory bound (it reads two [M, N] and writes one), so its
floor is that traffic at the copy bandwidth. This probe JIT-compiles the library's kernel and two other ways to add the
rank-r terms (the loaded tile as the dot's accumulator, and FMAs over the rank), each on a few tiles, checks them
against PyTorch and prints the median time of each (triton.testing.do_bench), beside a device-to-device copy of the
same bytes and PyTorch's act(g) * u. Needs a CUDA GPU, torch and triton; nothing of onnxruntime.

    python scripts/lora_gate_probe.py [--m 2048] [--n 11008] [--rank 16] [--split 3]
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from onnxfuse.kernels.build import aot_module  # noqa: E402

aot_module()._kernel_modules()  # the kernel files as one package (aot.py's loader), gemm_loop.py with them
sw = sys.modules["_onnxfuse_triton_kernels.swiglu"]
gl = sys.modules["_onnxfuse_triton_kernels.gemm_loop"]


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's tile as _lora_gate_kernel makes it: offs_m, offs_n, rows (clamped), n_ok, the [M, N] offsets."""
    pid_m, pid_n = gl._tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    return offs_m, offs_n, rows, offs_n < N, rows[:, None] * N + offs_n[None, :]


@triton.jit
def _gate_dot_acc(g_ptr, u_ptr, tg_ptr, bg_ptr, tu_ptr, bu_ptr, y_ptr, M, N, RG, RU, SPLIT, scale_gate, scale_up, ACT,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, R_PAD: tl.constexpr):
    """The loaded tiles as the rank-r dots' accumulators (gemm_loop._rank_dot on them, as the GEMM kernels' epilogues
    do): the tiles move into the dot's layout."""
    offs_m, offs_n, rows, n_ok, offs = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    gate = tl.load(g_ptr + offs, mask=n_ok[None, :], other=0.0).to(tl.float32)
    up = tl.load(u_ptr + offs, mask=n_ok[None, :], other=0.0).to(tl.float32)
    gate = gl._rank_dot(gate, gl._rank_t(rows, tg_ptr, M, SPLIT, BLOCK_M, R_PAD),
                        gl._rank_b(bg_ptr, offs_n, n_ok, N, RG, R_PAD), scale_gate, "tf32")
    up = gl._rank_dot(up, gl._rank_t(rows, tu_ptr, M, SPLIT, BLOCK_M, R_PAD),
                      gl._rank_b(bu_ptr, offs_n, n_ok, N, RU, R_PAD), scale_up, "tf32")
    gl._store_tile(y_ptr, N, sw._gate_activation(gate, ACT) * up, offs_m, offs_m < M, offs_n, n_ok)


@triton.jit
def _rank_fma(acc, rows, offs_n, n_ok, t_ptr, b_ptr, M, N, R, SPLIT, scale, R_PAD: tl.constexpr):
    """acc + (scale * T).to(b.dtype) @ b by FMAs over the rank: T's column r (the SPLIT partials summed) times B's row
    r, in acc's own layout."""
    for r in range(0, R):
        t = tl.zeros_like(rows).to(tl.float32)
        for s in range(0, SPLIT):
            t += tl.load(t_ptr + (s * M.to(tl.int64) + rows) * R_PAD + r)
        t = (t * scale).to(b_ptr.dtype.element_ty).to(tl.float32)
        b = tl.load(b_ptr + r * N + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        acc += t[:, None] * b[None, :]
    return acc


@triton.jit
def _gate_fma(g_ptr, u_ptr, tg_ptr, bg_ptr, tu_ptr, bu_ptr, y_ptr, M, N, RG, RU, SPLIT, scale_gate, scale_up, ACT,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, R_PAD: tl.constexpr):
    """The rank-r terms by FMAs in the loaded tiles' layout (no tensor cores, no layout conversion)."""
    offs_m, offs_n, rows, n_ok, offs = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    gate = tl.load(g_ptr + offs, mask=n_ok[None, :], other=0.0).to(tl.float32)
    up = tl.load(u_ptr + offs, mask=n_ok[None, :], other=0.0).to(tl.float32)
    gate = _rank_fma(gate, rows, offs_n, n_ok, tg_ptr, bg_ptr, M, N, RG, SPLIT, scale_gate, R_PAD)
    up = _rank_fma(up, rows, offs_n, n_ok, tu_ptr, bu_ptr, M, N, RU, SPLIT, scale_up, R_PAD)
    gl._store_tile(y_ptr, N, sw._gate_activation(gate, ACT) * up, offs_m, offs_m < M, offs_n, n_ok)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--n", type=int, default=11008)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--split", type=int, default=3)
    args = ap.parse_args(argv)
    m, n, r, split, rp = args.m, args.n, args.rank, args.split, 16
    dev, dt = "cuda", torch.float16
    g0 = torch.randn(m, n, device=dev, dtype=dt)
    u = torch.randn(m, n, device=dev, dtype=dt)
    tg = torch.zeros(split, m, rp, device=dev)
    tu = torch.zeros(split, m, rp, device=dev)
    tg[:, :, :r] = torch.randn(split, m, r, device=dev) / split
    tu[:, :, :r] = torch.randn(split, m, r, device=dev) / split
    bg = torch.randn(r, n, device=dev, dtype=dt) / 4
    bu = torch.randn(r, n, device=dev, dtype=dt) / 4
    sg, su = 0.5, 2.0
    gate = g0.float() + (tg.sum(0)[:, :r] * sg).to(dt).float() @ bg.float()
    up = u.float() + (tu.sum(0)[:, :r] * su).to(dt).float() @ bu.float()
    ref = (torch.nn.functional.silu(gate) * up).to(dt)
    y = torch.empty_like(g0)
    byts = 3 * m * n * 2  # the pass reads g and u and writes y
    print(f"lora_gate probe: M {m}, N {n}, rank {r}, split {split}, fp16, {torch.cuda.get_device_name()}")
    src = torch.empty(2 * m * n, device=dev, dtype=dt)
    dst = torch.empty(2 * m * n, device=dev, dtype=dt)  # a copy of the pass's traffic (reads 2, writes 1) ~ 4 MN bytes
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200)
    print(f"  d2d copy, {4 * m * n * 2 / 1e6:.0f} MB moved            {ms * 1e3:8.1f} us  "
          f"({4 * m * n * 2 / (ms * 1e-3) / 1e9:.0f} GB/s)")
    ms = triton.testing.do_bench(lambda: torch.mul(torch.nn.functional.silu(g0), u, out=y), warmup=25, rep=200)
    print(f"  torch silu(g) * u                  {ms * 1e3:8.1f} us")
    rows = []
    for name, fn in (("library (dot, added)", sw._lora_gate_kernel), ("dot, accumulator", _gate_dot_acc),
                     ("fma over the rank", _gate_fma)):
        for bm, bn, warps in ((64, 128, 4), (64, 128, 8), (32, 128, 4), (32, 256, 8), (16, 256, 4), (128, 64, 8)):
            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
            lib = fn is sw._lora_gate_kernel
            extra = dict(DOT_PRECISION="tf32") if lib else {}
            down = (bg, tg, 0) if lib else ()  # the library kernel's down-projection arguments (none: RD 0)

            def launch():
                fn[grid](g0, u, tg, bg, tu, bu, y, m, n, r, r, split, sg, su, 0, *down, BLOCK_M=bm, BLOCK_N=bn,
                         GROUP_M=8, R_PAD=rp, num_warps=warps, num_stages=1, **extra)
            try:
                launch()
                torch.cuda.synchronize()
                err = float((y.float() - ref.float()).abs().max() / ref.float().abs().max())
                ms = triton.testing.do_bench(launch, warmup=25, rep=200)
            except Exception as e:  # a tile that does not compile: say so, go on
                print(f"  {name:20s} {bm}x{bn} w{warps}: {type(e).__name__}: {str(e)[:80]}")
                continue
            rows.append((ms, name, bm, bn, warps))
            gbs = byts / (ms * 1e-3) / 1e9
            print(f"  {name:20s} {bm:3d}x{bn:3d} w{warps}      {ms * 1e3:8.1f} us  ({gbs:.0f} GB/s)  rel err {err:.1e}")
    best = min(rows)
    print(f"  best: {best[1]} {best[2]}x{best[3]} w{best[4]} {best[0] * 1e3:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
