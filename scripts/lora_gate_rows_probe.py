"""The gated LoRA pass at 2048 tokens with each program looping over row tiles of one column tile (its B tiles and the
down adapter's A rows loaded once), against the library's Triton `lora_gate` (a program a 16 x 128 tile) and a plain
act(g) * u pass, timed on the GPU.

Why: the library's pass costs about +20-27 us over the plain pass at 2048 x 11008 (H100, CUDA graphs,
scripts/lora_gate_mma_probe.py), and a program of 16 rows reads, besides its 8 KB of g and u, 12 KB of B tiles and A
rows and 8 KB of phase 1's partials from L2. A CUDA form with the tiles in the mma fragments left parts out one at a
time (--skips there) and put B's staging at about 12 us, the partials at 4, the atomics at 3. Here a program loads
its column tile's B tiles and A rows once and walks ROW_PROGS-th of the row tiles, so only the partials and g and u
are read per tile; `--partials 1` times the pass with phase 1's partials summed beforehand.

    python scripts/lora_gate_rows_probe.py [--rounds 9] [--reps 20] [--partials 4]
                                           [--variants 8x128x4x1,16x128x4x1,...]  (ROW_PROGS x BLOCK_N x warps x stages)

Needs a CUDA GPU (sm_90), torch and triton; nothing of onnxruntime.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_gate_mma_probe import M, SG, SU, gate_inputs, library_gate  # noqa: E402
from lora_mlp_fold_probe import _silu_mul_kernel, report_over, round_robin  # noqa: E402
from lora_pdl_probe import SW, I, R, cfg  # noqa: E402

GL = sys.modules["_onnxfuse_triton_kernels.gemm_loop"]
_rank_t2, _rank_b, _down_a, _down_xa, _rank_dot = GL._rank_t2, GL._rank_b, GL._down_a, GL._down_xa, GL._rank_dot
_gate_activation, _store_tile = SW._gate_activation, SW._store_tile


@triton.jit
def _lora_gate_rows_kernel(g_ptr, u_ptr, tg_ptr, bg_ptr, tu_ptr, bu_ptr, y_ptr, M, N, RG, RU, SPLIT, scale_gate,
                           scale_up, ACT, ad_ptr, td_ptr, RD, ROW_PROGS, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr, CH: tl.constexpr,
                           STAGES: tl.constexpr):
    pid = tl.program_id(0)
    pid_n = pid // ROW_PROGS
    pid_r = pid % ROW_PROGS
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    bg = _rank_b(bg_ptr, offs_n, n_ok, N, RG, R_PAD)
    bu = _rank_b(bu_ptr, offs_n, n_ok, N, RU, R_PAD)
    ad = _down_a(ad_ptr, offs_n, n_ok, RD, R_PAD)
    m_blocks = tl.cdiv(M, BLOCK_M)
    per = tl.cdiv(m_blocks, ROW_PROGS)
    first = pid_r * per
    last = tl.minimum(first + per, m_blocks)
    zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for mb in tl.range(first, last, num_stages=STAGES):
        offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
        tg, tu = _rank_t2(rows, tg_ptr, tu_ptr, M, SPLIT, BLOCK_M, R_PAD, CH)
        offs = rows[:, None] * N + offs_n[None, :]
        g = tl.load(g_ptr + offs, mask=n_ok[None, :], other=0.0)
        u = tl.load(u_ptr + offs, mask=n_ok[None, :], other=0.0)
        gate = g.to(tl.float32) + _rank_dot(zero, tg, bg, scale_gate, DOT_PRECISION)
        up = u.to(tl.float32) + _rank_dot(zero, tu, bu, scale_up, DOT_PRECISION)
        y = _gate_activation(gate, ACT) * up
        _store_tile(y_ptr, N, y, offs_m, offs_m < M, offs_n, n_ok)
        _down_xa(y, ad, offs_m, td_ptr, M, RD, R_PAD, DOT_PRECISION)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--partials", type=int, default=4)
    ap.add_argument("--variants", default="4x128x4x1,8x128x4x1,16x128x4x1,8x128x4x2,8x256x8x1,16x64x4x1")
    args = ap.parse_args(argv)
    S = args.partials
    dev, dt = "cuda", torch.float16
    print(f"lora_gate walking row tiles on {torch.cuda.get_device_name()}: {M} x {I}, rank {R}, {S} partials, fp16; "
          f"us per launch (CUDA graph of 20, {args.reps} replays, median of {args.rounds} rounds)")
    ins = gate_inputs(S, dev, dt)
    g, u, tg, tu, bg, bu, ad, y_ref, td_ref = ins
    c = cfg("lora_gate", M)

    def library(y, td, rd):
        return library_gate(ins, S, y, td, rd)

    def rows(y, td, rd, progs, bn, warps, stages):
        grid_r = (triton.cdiv(I, bn) * progs,)
        return lambda: _lora_gate_rows_kernel[grid_r](g, u, tg, bg, tu, bu, y, M, I, R, R, S, SG, SU, 0, ad, td, rd,
                                                      progs, BLOCK_M=c["BLOCK_M"], BLOCK_N=bn, R_PAD=16,
                                                      DOT_PRECISION="tf32", CH=4, STAGES=stages, num_warps=warps)

    variants = [tuple(int(v) for v in s.split("x")) for s in args.variants.split(",") if s]
    makers = {"library": lambda y, td, rd: library(y, td, rd)}
    for v in variants:
        makers["rows %dx%dx%dx%d" % v] = lambda y, td, rd, v=v: rows(y, td, rd, *v)
    for name, make in makers.items():
        y, td = torch.empty(M, I, device=dev, dtype=dt), torch.zeros(M, 16, device=dev)
        make(y, td, R)()
        torch.cuda.synchronize()
        ey = float((y.float() - y_ref.float()).abs().max() / y_ref.float().abs().max())
        et = float((td - td_ref).abs().max() / td_ref.abs().max())
        print(f"  {name:22s} y rel err {ey:.1e}, down sum rel err {et:.1e}")
        assert ey < 1e-2 and et < 1e-2, (name, ey, et)

    y, td = torch.empty(M, I, device=dev, dtype=dt), torch.zeros(M, 16, device=dev)
    fns = {"plain act(g) * u (Triton)": lambda: _silu_mul_kernel[(triton.cdiv(M * I, 4096),)](
        g, u, y, M * I, BLOCK=4096, num_warps=8)}
    for name, make in makers.items():
        fns[f"{name}, folded"] = make(y, td, R)
        fns[f"{name}, no down"] = make(y, td, 0)
    report_over(round_robin(fns, args.reps, args.rounds, launches=20), "plain act(g) * u (Triton)", "the plain pass",
                per=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
