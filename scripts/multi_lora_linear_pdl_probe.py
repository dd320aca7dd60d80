"""MultiLoRALinear (a mixed batch's LoRA projection: each decode row with its own adapter) with multi_lora_main as a
programmatic dependent of its phase 1 (multi_lora_xa), timed on the GPU beside the base projection.

The projections of a Llama-2-7B decoder layer that carry adapters besides the MLP (packed q/k/v 4096 -> 12288, o
4096 -> 4096), 8 decode rows each on its own of 8 rank-16 adapters (scale 0.5), the library's Triton kernels (JIT,
the AOT tile configs of sm_90, lora_pdl_probe.aot_like): the base GEMM (cuBLAS, no adapter), phase 1 then the main
kernel launched the usual way (phase 1 in at most 16 slices: the library before this probe) and as its programmatic
dependent with phase 1 in at most S slices. Round-robin (each form's CUDA graph replayed in turn, `--rounds`
rounds), outputs checked against PyTorch.

    python scripts/multi_lora_linear_pdl_probe.py [--rounds 9] [--reps 200] [--splits 1,2,4,16]

Needs a CUDA GPU (sm_90), torch and triton; nothing of onnxruntime.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_mlp_fold_probe import checked_rounds  # noqa: E402
from lora_pdl_probe import LO, H, R, cfg, plan, xa_cfg  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--splits", default="1,2,4,16")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    dev, dt = "cuda", torch.float16
    m, na = 8, 8
    splits = [int(v) for v in args.splits.split(",")]
    print(f"MultiLoRALinear PDL probe on {torch.cuda.get_device_name()}, fp16, {m} rows, {na} rank-{R} adapters; us "
          f"per run (CUDA graph, {args.reps} replays, median of {args.rounds} rounds, round-robin)")
    for name, n in (("q/k/v 4096 -> 12288", 3 * H), ("o 4096 -> 4096", H)):
        x = torch.randn(m, H, device=dev, dtype=dt)
        w = torch.randn(H, n, device=dev, dtype=dt) / H ** 0.5
        a = torch.randn(na, H, R, device=dev, dtype=dt) / H ** 0.5
        b = torch.randn(na, R, n, device=dev, dtype=dt) / 4
        sc = torch.full((na,), 0.5, device=dev, dtype=dt)
        idx = torch.arange(m, device=dev, dtype=torch.int64) % na
        zb = torch.zeros(n, device=dev, dtype=dt)
        y = torch.empty(m, n, device=dev, dtype=dt)
        cx, cmain = xa_cfg("multi_lora_xa", m), cfg("multi_lora_main", m)
        gmain = (triton.cdiv(m, cmain["BLOCK_M"]) * triton.cdiv(n, cmain["BLOCK_N"]),)
        t = torch.empty(16, m, 16, device=dev)
        xf = x.float()
        ref = xf @ w.float() + ((torch.einsum("mk,mkr->mr", xf, a[idx].float()) * 0.5).half().float().unsqueeze(1)
                                @ b[idx].float()).squeeze(1)

        def multi(max_split, pdl, x=x, w=w, a=a, b=b, sc=sc, idx=idx, zb=zb, y=y, n=n, cx=cx, cmain=cmain,
                  gmain=gmain, t=t):
            s, kb, g = plan(m, H, na, cx, max_split)
            extra = {"PDL": True, "launch_pdl": True} if pdl else {}

            def run():
                LO._multi_lora_xa_kernel[(g,)](x, a, a, idx, t, t, m, H, R, R, 1, na, 1, kb, t, 0, R_PAD=16,
                                               DOT_PRECISION="tf32", **({"PDL": True} if pdl else {}), **cx)
                LO._multi_lora_main_kernel[gmain](x, w, t, b, zb, sc, idx, y, m, n, H, R, na, 1, s, R_PAD=16,
                                                  DOT_PRECISION="tf32", **extra, **cmain)
                return y
            return run

        fns = {"cuBLAS (no adapter)": lambda x=x, w=w, y=y: torch.mm(x, w, out=y),
               "multi, phase 1 <= 16 slices (before)": multi(16, False)}
        fns.update({f"multi, PDL, phase 1 <= {s} slices": multi(s, True) for s in splits})
        checked_rounds(name, fns, ref, "cuBLAS (no adapter)", args.reps, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
