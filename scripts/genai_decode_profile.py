"""Per-kernel GPU time of one onnxruntime-genai decode step, by kernel name, for each folder given (issues 27 and 28).

A prompt of PROMPT tokens, then STEPS decode steps under torch.profiler (CUDA activity: CUPTI sees onnxruntime's
kernels in the same process); each kernel's time is divided by STEPS, so the table is one step's GPU time, and the
wall time per step beside it. No CUDA graph (genai's graph would hide the kernels from the profiler's names).

    python scripts/genai_decode_profile.py OUT.txt DIR [DIR ...] [--prompt 128] [--steps 16]
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def profile_folder(folder: pathlib.Path, prompt: int, steps: int) -> tuple[float, list[tuple[str, float, int]]]:
    """(wall ms per decode step, [(kernel name, GPU us per step, calls per step)] by time, largest first)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from onnxfuse.genai import folder as gf
    from onnxfuse.genai.generate import kv_length, load_model
    og, model = load_model(folder, "cuda", False)
    config = gf.read_config(folder)
    vocab = int(config["model"]["vocab_size"])
    ids = np.random.default_rng(0).integers(min(100, vocab // 2), vocab - 1, prompt).tolist()
    for attempt in range(2):  # the first round warms up
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=kv_length(config, prompt + steps + 1), do_sample=False,
                                  min_length=prompt + steps + 1)
        gen = og.Generator(model, params)
        gen.append_tokens(ids)
        gen.get_logits()
        gen.generate_next_token()
        torch.cuda.synchronize()
        if attempt == 0:
            for _ in range(steps):
                gen.generate_next_token()
            del gen
            continue
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(steps):
                gen.generate_next_token()
            gen.get_next_tokens()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) * 1e3 / steps
        del gen
    times, calls = collections.defaultdict(float), collections.Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            times[e.name[:90]] += e.device_time / steps
            calls[e.name[:90]] += 1
    del model
    return wall, sorted(((n, t, calls[n] // steps) for n, t in times.items()), key=lambda r: -r[1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("folders", nargs="+", type=pathlib.Path)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args(argv)
    lines = [f"# {__doc__.splitlines()[0]}", f"# prompt {args.prompt} tokens, {args.steps} decode steps profiled"]
    for folder in args.folders:
        wall, rows = profile_folder(folder, args.prompt, args.steps)
        total = sum(t for _, t, _ in rows)
        lines += ["", f"## {folder}: wall {wall:.3f} ms per step, GPU kernels {total / 1e3:.3f} ms per step",
                  f"{'us/step':>9} {'share':>6} {'calls':>5}  kernel"]
        lines += [f"{t:9.1f} {100 * t / total:5.1f}% {c:5d}  {n}" for n, t, c in rows[:25]]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
