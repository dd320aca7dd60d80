"""Issue 27, decode: a fp16 GEMV (scripts/fp16_gemv_probe.cu) against cuBLAS (torch.mm) on a Llama-2-7B layer's
projections and lm_head at M = 1 and 8 rows, with the copy rate (a device-to-device copy of the largest weight) as
the bandwidth beside them: what a decode step's GEMVs could gain over genai's cuBLAS ones (GPU machine, torch; no
onnxruntime). CUDA graphs of 20 launches, round-robin (scripts/lora_mlp_fold_probe.py), medians; the launches of a graph
cycle through copies of W that together exceed the L2 (as a decode step's layers do: no launch finds W in the L2).
Form 1 (probe_gemv, any M) and, at M = 1, form 2 (probe_gemv2: loads a step ahead, split-K summed in the kernel)
and form 3 (probe_gemv3: form 2 with a column tile's K slices one thread-block cluster, sm_90).

    python scripts/fp16_gemv_probe.py PROBE.so [--rows 1,8] [--rounds 7] [--reps 20] [--shapes o,down]
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
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--splits", default="", help="form 2's K slices, e.g. 8,16,24 (default: 2, 4, 8 blocks an SM)")
    ap.add_argument("--unrolls", default="4,8,16", help="form 2's rows in flight a lane")
    ap.add_argument("--no-form1", action="store_true")
    ap.add_argument("--zeroed", action="store_true", help="form 2 also with its counters zeroed before each launch")
    ap.add_argument("--clusters", default="", help="form 3's cluster sizes (K slices), e.g. 8,16 (sm_90)")
    args = ap.parse_args(argv)
    lib = ctypes.CDLL(args.lib)
    lib.probe_gemv.restype = ctypes.c_int
    lib.probe_gemv2.restype = ctypes.c_int
    lib.probe_gemv3.restype = ctypes.c_int
    p = ctypes.c_void_p
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    torch.manual_seed(0)
    rate = copy_rate(args.reps, args.rounds)
    print(f"{torch.cuda.get_device_name()}: copy {rate:.0f} GB/s (read + write); us per GEMV (CUDA graphs of "
          f"{LAUNCHES}, median of {args.rounds} rounds), GB/s of W read, % of the copy rate")
    part = torch.empty(64 * 8 * 49152, dtype=torch.float32, device="cuda")
    counters = torch.zeros(4096, dtype=torch.int32, device="cuda")
    for m in (int(r) for r in args.rows.split(",")):
        for name in args.shapes.split(","):
            k, n = SHAPES[name]
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            copies = max(1, -(-256 * 2 ** 20 // (k * n * 2)))  # > 256 MB in all: past the L2
            ws = [torch.randn(k, n, device="cuda", dtype=torch.float16) / k ** 0.5 for _ in range(copies)]
            turn = [0]

            def next_w():
                turn[0] += 1
                return ws[turn[0] % copies]
            y = torch.empty(m, n, device="cuda", dtype=torch.float16)
            ref = [(x.float() @ wc.float()) for wc in ws]
            cols = (n + 255) // 256
            fns = {"cuBLAS": lambda: torch.mm(x, next_w(), out=y)}
            if m == 1:
                choices = [int(v) for v in args.splits.split(",")] if args.splits else [
                    max(1, min(64, round(per_sm * sms / cols), k // 64)) for per_sm in (2, 4, 8)]
                for splits in choices:
                    for unroll in (int(u) for u in args.unrolls.split(",")):
                        def run2(splits=splits, unroll=unroll):
                            err = lib.probe_gemv2(unroll, p(x.data_ptr()), p(next_w().data_ptr()), p(y.data_ptr()),
                                                  p(part.data_ptr()), p(counters.data_ptr()), k, n, splits,
                                                  p(torch.cuda.current_stream().cuda_stream))
                            assert err == 0, err
                        fns[f"form2 splits {splits} unroll {unroll}"] = run2
                        if args.zeroed:
                            def run2z(run2=run2):
                                counters.zero_()  # a memset-like node before each launch
                                run2()
                            fns[f"form2 splits {splits} unroll {unroll} zeroed"] = run2z
                for splits in (int(v) for v in args.clusters.split(",") if v):
                    for unroll in (4, 8):
                        def run3(splits=splits, unroll=unroll):
                            err = lib.probe_gemv3(unroll, p(x.data_ptr()), p(next_w().data_ptr()), p(y.data_ptr()),
                                                  k, n, splits, p(torch.cuda.current_stream().cuda_stream))
                            assert err == 0, err
                        fns[f"form3 cluster {splits} unroll {unroll}"] = run3
            for waves in () if args.no_form1 else (2, 4, 8):
                splits = max(1, min(64, round(waves * sms / cols), k // 64))
                for unroll in ((4, 8) if m == 1 else (4,)):
                    def run(splits=splits, unroll=unroll):
                        err = lib.probe_gemv(m, unroll, p(x.data_ptr()), p(next_w().data_ptr()), p(y.data_ptr()),
                                             p(part.data_ptr()), k, n, splits,
                                             p(torch.cuda.current_stream().cuda_stream))
                        assert err == 0, err
                    fns[f"probe splits {splits} unroll {unroll}"] = run
            for label, fn in fns.items():
                fn()
                torch.cuda.synchronize()
                r = ref[turn[0] % copies]
                e = float((y.float() - r).abs().max() / r.abs().max())
                assert e < 5e-3, (name, label, e)
            med = round_robin(fns, args.reps, args.rounds, LAUNCHES)
            print(f"M={m} {name} K{k} N{n} ({k * n * 2 / 1e6:.1f} MB):")
            for label, us in med.items():
                us /= LAUNCHES
                gbs = k * n * 2 / us / 1e3
                print(f"    {label:30s} {us:8.2f} us  {gbs:6.0f} GB/s  {100 * gbs / rate:5.1f} %  "
                      f"{med['cuBLAS'] / LAUNCHES / us:.3f}x cuBLAS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
