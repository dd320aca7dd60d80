"""GPU A/B of kernel libraries on one fused model by steady-state time per run: N CUDA-graph replays back to back
(onnxruntime not synchronising after each run), so the per-run host floor overlaps the GPU work and the time is
the GPU's own (kernels, gaps between them and any overlap PDL gives), next to torch.matmul of the model's GEMM
shape timed the same way in the same process. Each (library, round) runs in its own process, libraries alternate.

    python3 scripts/ab_throughput.py MODEL.fused.onnx --lib base=/root/lib-base.so --lib new=/root/lib.so \
        [--backend triton] [--gemm 2048,4096,4096] [--rounds 3] [--reps 300] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _one(model: str, lib: str, backend: str, gemm: str, reps: int) -> dict:
    import numpy as np
    import torch

    from onnxfuse import runtime

    rt = runtime.ort()
    sess = runtime.session(model, "cuda", library=lib, backend=backend, cuda_graph=True)
    io = sess.io_binding()
    keep = []
    for arg in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        x = torch.randn(*shape, device="cuda", dtype=torch.float16)
        keep.append(x)
        io.bind_input(arg.name, "cuda", 0, np.float16, list(x.shape), x.data_ptr())
    for arg in sess.get_outputs():
        if all(isinstance(d, int) for d in arg.shape):  # fixed addresses for the CUDA graph
            y = torch.empty(*arg.shape, device="cuda", dtype=torch.float16)
            keep.append(y)
            io.bind_output(arg.name, "cuda", 0, np.float16, list(y.shape), y.data_ptr())
        else:
            io.bind_output(arg.name, "cuda", 0)
    opts = rt.RunOptions()
    opts.add_run_config_entry("disable_synchronize_execution_providers", "1")
    for _ in range(10):
        sess.run_with_iobinding(io)
    torch.cuda.synchronize()

    def steady(fn) -> float:
        best = float("inf")
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / reps * 1e6)
        return best

    fused_us = steady(lambda: sess.run_with_iobinding(io, opts))
    m, k, n = (int(v) for v in gemm.split(","))
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(k, n, device="cuda", dtype=torch.float16)
    y = torch.empty(m, n, device="cuda", dtype=torch.float16)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.matmul(a, w, out=y)
        with torch.cuda.graph(g):
            torch.matmul(a, w, out=y)
    gemm_us = steady(g.replay)
    return {"fused_us": round(fused_us, 2), "gemm_us": round(gemm_us, 2), "ratio": round(fused_us / gemm_us, 4),
            "device": torch.cuda.get_device_name()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--lib", action="append", required=True, help="NAME=PATH (repeat)")
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--gemm", default="2048,4096,4096", help="M,K,N of the torch.matmul reference")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--out")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_one(args.model, args.child, args.backend, args.gemm, args.reps)))
        return 0
    libs = [tuple(spec.split("=", 1)) for spec in args.lib]
    rows = []
    for rnd in range(args.rounds):
        for name, path in libs:
            p = subprocess.run([sys.executable, __file__, args.model, "--lib", f"{name}={path}", "--child", path,
                                "--backend", args.backend, "--gemm", args.gemm, "--reps", str(args.reps)],
                               capture_output=True, text=True)
            if p.returncode != 0:
                print(p.stderr[-2000:], file=sys.stderr)
                return 1
            row = dict(json.loads(p.stdout.strip().splitlines()[-1]), lib=name, round=rnd)
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = {}
    for name, _ in libs:
        mine = sorted(rows, key=lambda r: r["ratio"])
        mine = [r for r in mine if r["lib"] == name]
        summary[name] = {"median_ratio": mine[len(mine) // 2]["ratio"],
                         "median_fused_us": sorted(r["fused_us"] for r in mine)[len(mine) // 2],
                         "median_gemm_us": sorted(r["gemm_us"] for r in mine)[len(mine) // 2]}
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "backend": args.backend, "gemm": args.gemm, "reps": args.reps,
                       "rows": rows, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
