"""Phase 1 of the LoRA MLP at 2048 tokens (lora_xa: T = X @ A of the gate and up adapters from one read of X, fp32
partials per K slice) at other tile configs and K splits, against a plain read of X, timed on the GPU.

On LoRASwiGLU's cuBLASLt path (from 2048 rows) the launcher splits K in at most 4 slices (table.py
LORA_GATE_MAX_SPLIT: the gate pass sums them in one load), and lora_xa's "large" config is a 64-row tile: 32 row tiles
x 4 slices = 128 programs of 4 warps, one an SM, each walking 16 steps of K. The fold probe had it at 24.6 us on an
H200 (lora-mlp-fold-probe profile) where X's 16.8 MB take about 4 at the read rate. The forms:

  read X                 X.sum over rows into fp32 (torch), one read of X: the floor
  BMxBK wW sS split P    lora_xa as aot.py compiles it (aot_like), that tile, warps, stages and K slices

Outputs (the partials' sum) checked against PyTorch. Time: each form's CUDA graph (20 launches) replayed in turn,
`--rounds` rounds of `--reps` replays, medians, us per launch. X's 16.8 MB stay in the H200's 60 MB L2 from one
launch to the next, where in the MLP the GEMMs between them have evicted it: --flush writes a 256 MB buffer before
each launch (every form, the floor too, so the differences are the forms' own time on an X read from DRAM; the
times printed include the write). Needs a CUDA GPU (sm_90), torch and triton.

    python scripts/lora_xa_probe.py [--rounds 9] [--reps 20] [--m 2048] [--k 4096] [--flush]
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_mlp_fold_probe import report_over, round_robin  # noqa: E402
from lora_pdl_probe import LO, R, cfg  # noqa: E402

FORMS = ("64x64w4s4p4", "32x64w4s4p4", "16x64w4s4p4", "16x128w4s3p4", "32x128w4s3p4", "16x64w2s4p4",
         "32x64w2s4p4", "64x64w4s4p16", "16x128w4s3p2", "32x64w4s4p8")


def parse(f: str):
    tile, rest = f.split("w")
    bm, bk = (int(v) for v in tile.split("x"))
    warps, rest = rest.split("s")
    stages, split = rest.split("p")
    return dict(BLOCK_M=bm, BLOCK_K=bk, num_warps=int(warps), num_stages=int(stages)), int(split)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--m", type=int, default=2048)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--flush", action="store_true", help="write 256 MB before each launch (X out of L2)")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    dev, dt, m, k = "cuda", torch.float16, args.m, args.k
    x = torch.randn(m, k, device=dev, dtype=dt)
    ag = torch.randn(k, R, device=dev, dtype=dt) / k ** 0.5
    au = torch.randn(k, R, device=dev, dtype=dt) / k ** 0.5
    tg = torch.empty(16, m, 16, device=dev)
    tu = torch.empty(16, m, 16, device=dev)
    col = torch.empty(k, device=dev)
    ref_g, ref_u = x.float() @ ag.float(), x.float() @ au.float()
    lib = cfg("lora_xa", m)
    print(f"lora_xa on {torch.cuda.get_device_name()}: X [{m}, {k}] fp16 @ A_gate, A_up [{k}, {R}]; the library's "
          f"large config {lib}; us per launch (CUDA graph of 20, {args.reps} replays, median of {args.rounds} rounds)")

    junk = torch.empty(64 << 20, device=dev) if args.flush else None

    def flush():
        if junk is not None:
            junk.fill_(1.0)

    def read_x():
        flush()
        torch.sum(x, dim=0, dtype=torch.float32, out=col)
        return None

    def form(c: dict, split: int):
        k_blocks = triton.cdiv(k, c["BLOCK_K"])
        kb = triton.cdiv(k_blocks, split)
        split = triton.cdiv(k_blocks, kb)
        grid = triton.cdiv(m, c["BLOCK_M"]) * split

        def run():
            flush()
            LO._lora_xa_kernel[(grid,)](x, ag, au, tg, tu, m, k, R, R, 2, kb, tg, 0, R_PAD=16, DOT_PRECISION="tf32",
                                        **c)
            return split
        return run

    fns = {"read X (torch sum)": read_x}
    if args.flush:
        fns["the 256 MB write alone"] = flush
    for f in args.forms.split(","):
        c, split = parse(f)
        fns[f"{f} ({triton.cdiv(m, c['BLOCK_M']) * split} programs)"] = form(c, split)
    for name, fn in fns.items():
        if fn is read_x or fn is flush:
            continue
        split = fn()
        torch.cuda.synchronize()
        err = max(float((tg[:split].sum(0) - ref_g).abs().max() / ref_g.abs().max()),
                  float((tu[:split].sum(0) - ref_u).abs().max() / ref_u.abs().max()))
        print(f"  {name:36s} rel err {err:.1e}")
        assert err < 1e-2, (name, err)
    report_over(round_robin(fns, args.reps, args.rounds, launches=20), "read X (torch sum)", "reading X", per=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
