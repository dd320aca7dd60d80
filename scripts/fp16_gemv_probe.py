"""Issue 27, decode: a fp16 GEMV (scripts/fp16_gemv_probe.cu) against cuBLAS (torch.mm) on a Llama-2-7B layer's
projections and lm_head at M = 1 and 8 rows, with the copy rate (a device-to-device copy of the largest weight) as
the bandwidth beside them: what a decode step's GEMVs could gain over genai's cuBLAS ones (GPU machine, torch; no
onnxruntime). CUDA graphs of 20 launches, round-robin (scripts/lora_mlp_fold_probe.py), medians.

    python scripts/fp16_gemv_probe.py PROBE.so [--rows 1,8] [--rounds 7] [--reps 20]
"""
from __future__ import annotations

import argparse
import ctypes
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_mlp_fold_probe import round_robin  # noqa: E402

SHAPES = {"qkv": (4096, 12288), "o": (4096, 4096), "gate+up": (4096, 22016), "down": (11008, 4096),
          "lm_head": (4096, 49152)}
LAUNCHES = 20


def copy_rate(reps: int, rounds: int) -> float:
    """GB/s (read + write) of a device-to-device copy of lm_head's size."""
    src = torch.empty(4096 * 49152, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    us = round_robin({"copy": lambda: dst.copy_(src)}, reps, rounds, LAUNCHES)["copy"] / LAUNCHES
    return 2 * src.numel() * 2 / us / 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    lib = ctypes.CDLL(args.lib)
    lib.probe_gemv.restype = ctypes.c_int
    p = ctypes.c_void_p
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    rate = copy_rate(args.reps, args.rounds)
    print(f"{torch.cuda.get_device_name()}: copy {rate:.0f} GB/s (read + write); us per GEMV (CUDA graphs of "
          f"{LAUNCHES}, median of {args.rounds} rounds), GB/s of W read, % of the copy rate")
    part = torch.empty(64 * 8 * 49152, dtype=torch.float32, device="cuda")
    for m in (int(r) for r in args.rows.split(",")):
        for name, (k, n) in SHAPES.items():
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            w = torch.randn(k, n, device="cuda", dtype=torch.float16) / k ** 0.5
            y = torch.empty(m, n, device="cuda", dtype=torch.float16)
            ref = (x.float() @ w.float())
            cols = (n + 255) // 256
            fns = {"cuBLAS": lambda: torch.mm(x, w, out=y)}
            for waves in (2, 4, 8):
                splits = max(1, min(64, round(waves * sms / cols), k // 64))
                for unroll in ((4, 8) if m == 1 else (4,)):
                    def run(splits=splits, unroll=unroll):
                        err = lib.probe_gemv(m, unroll, p(x.data_ptr()), p(w.data_ptr()), p(y.data_ptr()),
                                             p(part.data_ptr()), k, n, splits,
                                             p(torch.cuda.current_stream().cuda_stream))
                        assert err == 0, err
                    fns[f"probe splits {splits} unroll {unroll}"] = run
            for label, fn in fns.items():
                fn()
                torch.cuda.synchronize()
                e = float((y.float() - ref).abs().max() / ref.abs().max())
                assert e < 5e-3, (name, label, e)
            med = round_robin(fns, args.reps, args.rounds, LAUNCHES)
            print(f"M={m} {name} K{k} N{n} ({k * n * 2 / 1e6:.1f} MB):")
            for label, us in med.items():
                us /= LAUNCHES
                gbs = k * n * 2 / us / 1e3
                print(f"    {label:28s} {us:8.2f} us  {gbs:6.0f} GB/s  {100 * gbs / rate:5.1f} %  "
                      f"{med['cuBLAS'] / LAUNCHES / us:.3f}x cuBLAS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
