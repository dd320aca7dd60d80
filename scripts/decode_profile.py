"""Where one decode step of an onnxruntime-genai decoder spends its time on the CPU, op type by op type (issue 27).

    python scripts/decode_profile.py DIR [--context 128] [--runs 30] [--threads N]

Runs the folder's model.onnx alone in onnxruntime (CPU EP, its profiler on) with one new token after a KV cache of
--context positions (random cache contents: the work does not depend on them), then sums the profiler's kernel
times per op type and prints them with the median step time. Why a script and not the CLI: it reads onnxruntime's
profiler output of a decoder taken out of genai (genai's Generator has no per-node profile), a diagnosis for
choosing which op to write next, not a user's measurement (that is `onnxfuse bench genai`).
"""
from __future__ import annotations

import argparse
import collections
import json
import pathlib
import time

import numpy as np


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: onnxruntime's default)")
    args = p.parse_args(argv)
    import onnxruntime as ort

    from onnxfuse import runtime
    from onnxfuse.genai import folder as gf

    config = gf.read_config(pathlib.Path(args.folder))
    head = int(config["model"]["decoder"]["head_size"])
    so = ort.SessionOptions()
    so.enable_profiling = True
    so.intra_op_num_threads = args.threads
    so.profile_file_prefix = str(pathlib.Path("/tmp") / "onnxfuse_decode_profile")
    sess = runtime.session(str(gf.decoder_path(pathlib.Path(args.folder), config)), "cpu", sess_options=so)
    ctx = args.context
    feeds = {}
    for i in sess.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = np.array([[100]], dtype=np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((1, ctx + 1), dtype=np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.array([[ctx]], dtype=np.int64)
        elif i.name.startswith("past_key_values"):
            feeds[i.name] = np.random.default_rng(0).random((1, i.shape[1], ctx, head), dtype=np.float32)
        else:
            raise SystemExit(f"{i.name}: an input this script does not know how to feed")
    for _ in range(args.runs):
        sess.run(None, feeds)
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t0)
    events = json.loads(pathlib.Path(sess.end_profiling()).read_text())
    per_op, count = collections.defaultdict(float), collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_op[e["args"]["op_name"]] += e["dur"]
            count[e["args"]["op_name"]] += 1
    runs = 2 * args.runs
    total = sum(per_op.values())
    print(f"{args.folder}: one decode step after {ctx} positions: median {np.median(times) * 1e3:.3f} ms "
          f"(onnxruntime's node kernels {total / runs / 1e3:.3f} ms)")
    for op, us in sorted(per_op.items(), key=lambda kv: -kv[1]):
        print(f"  {op:36} {us / runs / 1e3:8.3f} ms  {100 * us / total:5.1f} %  {count[op] / runs:4.0f} nodes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
