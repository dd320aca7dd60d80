"""Two fused models timed round-robin in one process by steady-state GPU time per run (CUDA-graph replays back to
back, onnxruntime not synchronising after each run, so the host's per-run floor overlaps the GPU work): a LoRA MLP
against its base MLP, say, where a bench run's variants, timed one after another, drift with the GPU's clocks by
more than the ratio's goal leaves. Each round times A then B; prints every round and the median of B / A.

    python3 scripts/ab_models.py A.fused.onnx B.fused.onnx [--backend auto] [--rounds 9] [--reps 300] [--out F.json]
                                 [--adapters N] [--profile RUNS]

--adapters N fills the int64 inputs (a mixed batch's adapter index per row) with 0, 1, ..., N-1, 0, ... (row i uses
adapter i mod N, as the bench's multi-lora-mlp case does); without it they are zeros. --profile RUNS: after the rounds,
each model's RUNS replays back to back under torch.profiler: the window's wall time per run beside the GPU's busy time
(any kernel running), its kernels' summed time and its top kernels, so idle gaps and slower kernels show apart.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def _bound(path: str, backend: str, adapters: int = 0):
    """A CUDA-graph session of `path` with every input bound to random fp16 (int64: zeros, or i mod `adapters` when
    given) and every output bound."""
    import numpy as np
    import torch

    from onnxfuse import runtime

    sess = runtime.session(path, "cuda", library=True, backend=backend, cuda_graph=True)
    io = sess.io_binding()
    keep = []
    for arg in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        if "int64" in arg.type:
            t = torch.zeros(*shape, device="cuda", dtype=torch.int64)
            if adapters:
                t = (torch.arange(t.numel(), device="cuda", dtype=torch.int64) % adapters).reshape(t.shape)
            np_type = np.int64
        else:
            t, np_type = torch.randn(*shape, device="cuda", dtype=torch.float16), np.float16
        keep.append(t)
        io.bind_input(arg.name, "cuda", 0, np_type, list(t.shape), t.data_ptr())
    for arg in sess.get_outputs():
        y = torch.empty(*arg.shape, device="cuda", dtype=torch.float16)
        keep.append(y)
        io.bind_output(arg.name, "cuda", 0, np.float16, list(y.shape), y.data_ptr())
    return sess, io, keep


def _profiled(run, runs: int) -> dict:
    """`runs` runs back to back under torch.profiler (CUPTI sees onnxruntime's and the library's kernels): per run, the
    wall time of that window, the GPU's span from the first kernel's start to the last one's end, the time some kernel
    ran (the union of their intervals: idle gaps excluded, overlaps counted once), the kernels' summed time, and the
    kernels by summed time."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(runs):
            run()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    spans = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                   if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
    busy, end, by_name = 0.0, float("-inf"), {}
    for start, stop, name in spans:
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
        by_name[name] = by_name.get(name, 0.0) + (stop - start)
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {"runs": runs, "wall_us": round(wall / runs * 1e6, 2),
            "gpu_span_us": round((spans[-1][1] - spans[0][0]) / runs, 2) if spans else None,
            "busy_us": round(busy / runs, 2), "kernel_sum_us": round(sum(by_name.values()) / runs, 2),
            "kernels_per_run": round(len(spans) / runs, 2),
            "top_kernels": [{"name": n[:100], "us_per_run": round(t / runs, 2)} for n, t in top]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--out")
    ap.add_argument("--adapters", type=int, default=0, help="int64 inputs = row index mod N (a mixed batch)")
    ap.add_argument("--profile", type=int, default=0, metavar="RUNS",
                    help="then each model's kernels over RUNS replays (torch.profiler)")
    args = ap.parse_args(argv)
    import torch

    from onnxfuse import runtime

    opts = runtime.ort().RunOptions()
    opts.add_run_config_entry("disable_synchronize_execution_providers", "1")
    models = {"a": _bound(args.a, args.backend, args.adapters), "b": _bound(args.b, args.backend, args.adapters)}
    for sess, io, _ in models.values():
        for _ in range(10):  # warm-up; the CUDA graph is captured
            sess.run_with_iobinding(io)
    torch.cuda.synchronize()

    def steady(sess, io) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            sess.run_with_iobinding(io, opts)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / args.reps * 1e6

    rows = []
    for rnd in range(args.rounds):
        row = {"round": rnd, **{k: round(steady(s, io), 2) for k, (s, io, _) in models.items()}}
        row["b_over_a"] = round(row["b"] / row["a"], 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {"a": args.a, "b": args.b, "backend": args.backend, "reps": args.reps, "adapters": args.adapters,
               "device": torch.cuda.get_device_name(),
               "median_a_us": statistics.median(r["a"] for r in rows),
               "median_b_us": statistics.median(r["b"] for r in rows),
               "median_b_over_a": statistics.median(r["b_over_a"] for r in rows),
               "min_b_over_a": min(r["b_over_a"] for r in rows), "max_b_over_a": max(r["b_over_a"] for r in rows)}
    if args.profile:
        for k, (sess, io, _) in models.items():
            summary[f"profile_{k}"] = _profiled(lambda sess=sess, io=io: sess.run_with_iobinding(io, opts),
                                                args.profile)
    print(json.dumps(summary, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
