"""onnxruntime's own CPU MatMul at one row against the host's read rate (issue 27, CPU): is there a faster decode GEMV
for onnxfuse to substitute?

For each of SmolLM2-135M's decode projections (genai's fp32 model: packed qkv 576 -> 960, o 576 -> 576, gate and up
576 -> 1536, down 1536 -> 576, lm_head 576 -> 49152), one model of LAYERS MatMul nodes on distinct constant [K, N]
weights (together far past the caches, as a decoder's layers are) all reading the same x [1, 1, K]; its run time
(median of RUNS, two intra-op threads as genai's session has on this host) in GB/s of weight read, beside the same
run's read rate (onnxfuse.genai.timing.cpu_read_gbs) and, when given, the GEMV probe's binary
(scripts/cpu_gemv_probe.cc: the same shapes split over N and over K, outside onnxruntime).

    g++ -O3 -march=native -fopenmp scripts/cpu_gemv_probe.cc -o /tmp/gemv_probe
    python scripts/cpu_decode_matmul.py [--probe /tmp/gemv_probe] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# (K, N, layers): layers chosen so each model's weights are 150-700 MB
SHAPES = {"gate/up": (576, 1536, 200), "down": (1536, 576, 200), "qkv": (576, 960, 200), "lm_head": (576, 49152, 8)}
RUNS = 15


def matmul_session(k: int, n: int, layers: int, threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from onnxfuse import onnxio

    rng = np.random.default_rng(0)
    inits, nodes, outs = [], [], []
    for i in range(layers):
        inits.append(numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"y{i}"]))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, 1, n]))
    graph = helper.make_graph(nodes, "decode_matmuls", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                     [1, 1, k])], outs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = onnxio.MAX_IR_VERSION
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_gbs(k: int, n: int, layers: int, threads: int) -> float:
    sess = matmul_session(k, n, layers, threads)
    x = {"x": np.random.default_rng(1).standard_normal((1, 1, k), dtype=np.float32)}
    for _ in range(3):
        sess.run(None, x)
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        sess.run(None, x)
        times.append(time.perf_counter() - t0)
    return layers * k * n * 4 / statistics.median(times) / 1e9


def probe_gbs(probe: str, k: int, n: int, layers: int, threads: int) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([probe, str(k), str(n), str(layers)], capture_output=True, text=True, env=env, check=True)
    rates = {}
    for line in out.stdout.splitlines():  # "ksplit K576 N1536 L200: 18.485 ms, 38.3 GB/s"
        rates[line.split()[0]] = float(line.rsplit(",", 1)[1].split()[0])
    return rates


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", help="the built scripts/cpu_gemv_probe.cc")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    from onnxfuse.genai.timing import cpu_read_gbs

    for r in range(args.rounds):
        print(f"round {r + 1}: read rate {cpu_read_gbs():.1f} GB/s")
        for name, (k, n, layers) in SHAPES.items():
            gbs = ort_gbs(k, n, layers, args.threads)
            line = f"  {name:8s} K{k} N{n} x{layers}: onnxruntime MatMul {gbs:5.1f} GB/s"
            if args.probe:
                line += "".join(f", probe {mode} {gbs:5.1f}" for mode, gbs in
                                probe_gbs(args.probe, k, n, layers, args.threads).items())
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
