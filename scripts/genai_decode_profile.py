"""Per-kernel GPU time of one onnxruntime-genai decode step, by kernel name, for each folder given (issues 27 and 28).

A prompt of PROMPT tokens for each of BATCH sequences, then STEPS decode steps (a token for every sequence) timed on
the wall clock and STEPS more under torch.profiler (bench.harness.profile_kernels: CUDA activity, CUPTI sees
onnxruntime's kernels in the same process), per step. No CUDA graph (genai's graph would hide the kernels from the
profiler's names; genai 0.18's graph mode refuses a batched prompt anyway). Then the GPU's busy time per step: the
union of the profiled kernels' intervals (a kernel that overlaps another, as a programmatic dependent does, counts
once), beside the span from a step's first kernel to its last and the wall time: what the step spends outside its
kernels (genai's host work between steps, launch gaps).

    python scripts/genai_decode_profile.py OUT.txt DIR [DIR ...] [--prompt 128] [--steps 16] [--batch 1]
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def busy(fn, steps: int) -> tuple[float, float]:
    """(GPU busy ms per call of fn: the union of its kernels' intervals; ms per call from the first kernel's start
    to the last one's end), over `steps` calls under torch.profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA)
    if not spans:
        return 0.0, 0.0
    total, (lo, hi) = 0.0, spans[0]
    for a, b in spans[1:]:
        if a > hi:
            total, lo = total + hi - lo, a
        hi = max(hi, b)
    total += hi - lo
    return total / 1e3 / steps, (max(b for _, b in spans) - spans[0][0]) / 1e3 / steps


def profile_folder(folder: pathlib.Path, prompt: int, steps: int, batch: int = 1) -> tuple[float, dict, tuple]:
    """(wall ms per decode step, bench.harness.profile_kernels' table of one step's kernels, busy()'s pair)."""
    from onnxfuse.bench.harness import Device, profile_kernels
    from onnxfuse.genai import folder as gf
    from onnxfuse.genai.generate import kv_length, load_model
    og, model = load_model(folder, "cuda", False)
    config = gf.read_config(folder)
    vocab = int(config["model"]["vocab_size"])
    rng = np.random.default_rng(0)
    ids = rng.integers(min(100, vocab // 2), vocab - 1, prompt).tolist() if batch == 1 else \
        rng.integers(min(100, vocab // 2), vocab - 1, (batch, prompt)).astype(np.int32)  # as genai/timing.py
    new_tokens = 3 * steps + 8  # the timed steps, profile_kernels' 3 warm-up steps and its profiled ones, busy()'s
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=kv_length(config, prompt + new_tokens), do_sample=False,
                              min_length=prompt + new_tokens, batch_size=batch)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    gen.get_logits()
    dev = Device("cuda")
    for _ in range(2):
        gen.generate_next_token()
    dev.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        gen.generate_next_token()
    dev.sync()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    table = profile_kernels(gen.generate_next_token, dev, runs=steps, top=25)
    gpu = busy(gen.generate_next_token, steps)
    del gen, model
    return wall, table, gpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("folders", nargs="+", type=pathlib.Path)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1, help="sequences decoded together (a decode step: one token each)")
    args = ap.parse_args(argv)
    lines = [f"# {__doc__.splitlines()[0]}",
             f"# batch {args.batch}, prompt {args.prompt} tokens, {args.steps} decode steps profiled"]
    for folder in args.folders:
        wall, table, (gpu_busy, span) = profile_folder(folder, args.prompt, args.steps, args.batch)
        total = table["gpu_kernel_us"]
        lines += ["", f"## {folder}: wall {wall:.3f} ms per step, GPU kernels {total / 1e3:.3f} ms per step",
                  f"# GPU busy {gpu_busy:.3f} ms per step (the kernels' intervals' union, profiled), first kernel to "
                  f"last {span:.3f} ms per step: {wall - gpu_busy:.3f} ms of the wall step without a kernel running",
                  f"{'us/step':>9} {'share':>6} {'calls':>5}  kernel"]
        lines += [f"{k['us_per_run']:9.1f} {100 * k['us_per_run'] / total:5.1f}% {k['calls_per_run']:5.0f}  "
                  f"{k['name'][:90]}" for k in table["top_kernels"]]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
