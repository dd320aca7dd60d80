"""Where onnxruntime-genai's own decoder session spends a decode step on the CPU, op type by op type, for one or more
folders in turn (issue 27: CachedAttention against genai's GroupQueryAttention in the session genai runs).

    python scripts/genai_session_profile.py DIR [DIR ...] [--context 2048] [--steps 40] [--rounds 2] [--threads 2]

Each round loads each folder with onnxruntime's profiler on (genai's Config.overlay of the decoder's session options,
so the folder is unchanged), appends a prompt of --context random ids, generates --steps tokens, and sums the
profiler's kernel times per op type over the decode steps after the first six. Folders alternate within a round, so
a host whose speed drifts moves them alike. Unlike scripts/decode_profile.py (the decoder alone, past and present in
separate buffers) this is genai's own run: its KV buffer shared between past and present, its inputs.
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import subprocess
import sys
import tempfile

import numpy as np


def generate(folder: str, context: int, steps: int, threads: int, prefix: str) -> None:
    """The profiled run (in a process of its own: genai writes the trace when the process ends its session)."""
    import onnxruntime_genai as og
    cfg = og.Config(folder)
    cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "enable_profiling": prefix, "intra_op_num_threads": threads}}}}))
    model = og.Model(cfg)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=context + steps + 1, min_length=context + steps + 1)
    gen = og.Generator(model, params)
    gen.append_tokens(np.random.default_rng(0).integers(100, 40000, context).astype(np.int32))
    for _ in range(steps):
        gen.generate_next_token()


def profile(folder: str, context: int, steps: int, threads: int, prefix: str) -> dict:
    """Step time and kernel time per op type (ms) of the decode steps after the first six."""
    subprocess.run([sys.executable, __file__, folder, "--generate", prefix, "--context", str(context), "--steps",
                    str(steps), "--threads", str(threads)], check=True)
    trace = max(pathlib.Path(prefix).parent.glob(pathlib.Path(prefix).name + "*.json"),
                key=lambda p: p.stat().st_mtime)
    events = json.loads(trace.read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"][6:]
    lo, hi = runs[0]["ts"], runs[-1]["ts"] + runs[-1]["dur"]
    ops = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and lo <= e["ts"] <= hi:
            ops[e["args"].get("op_name")] += e["dur"]
    n = len(runs)
    return {"step_ms": sum(r["dur"] for r in runs) / n / 1e3, "ops_ms": {k: v / n / 1e3 for k, v in ops.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--generate", metavar="PREFIX", help=argparse.SUPPRESS)  # the child process: one profiled run
    args = p.parse_args(argv)
    if args.generate:
        generate(args.folders[0], args.context, args.steps, args.threads, args.generate)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, folder in enumerate(args.folders):
                got = profile(folder, args.context, args.steps, args.threads, f"{tmp}/r{r}f{i}_")
                top = sorted(got["ops_ms"].items(), key=lambda kv: -kv[1])[:5]
                print(f"round {r} {folder}: context {args.context}, {got['step_ms']:.2f} ms a step (profiled); "
                      + ", ".join(f"{k} {v:.2f}" for k, v in top), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
