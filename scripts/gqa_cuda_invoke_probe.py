"""Issue 27, GPU: onnxruntime's CUDA GroupQueryAttention invoked from a CUDA-EP custom op (op "InvGQA",
scripts/gqa_cuda_invoke_probe.cc) against the session's own node: the same outputs? as fast? under a CUDA graph?
The question is whether an onnxfuse replacement of genai's attention could hand prompts to onnxruntime's flash
kernels and run only decode steps itself.

    python scripts/gqa_cuda_invoke_probe.py --lib libgqa_cuda_invoke.so [--reps 200]

Llama-2-7B's attention shapes (32 heads of 128), fp16, a KV buffer of 4096 shared between past and present as genai
binds it: a first prompt of 128 and 2048 tokens, then decode steps at those contexts; plain runs, then the decode
step under enable_cuda_graph (captured, then replayed with a new query written into the bound buffer).
"""
from __future__ import annotations

import argparse
import time

import numpy as np


def model(custom: bool, h: int, hkv: int, d: int):
    """One InvGQA node (custom) or onnxruntime's GroupQueryAttention, over the inputs of
    scripts/cached_attention_vs_ort.py's models."""
    from onnx import helper

    from cached_attention_vs_ort import attention_model  # scripts/ is this script's own folder on sys.path
    if custom:
        node = helper.make_node("InvGQA", ["q", "pk", "pv", "sl", "tl", "cos", "sin"], ["y", "ok", "ov"], domain="inv",
                                num_heads=h, kv_num_heads=hkv)
    else:
        node = helper.make_node("GroupQueryAttention", ["q", "", "", "pk", "pv", "sl", "tl", "cos", "sin"],
                                ["y", "ok", "ov"], domain="com.microsoft", num_heads=h, kv_num_heads=hkv, do_rotary=1)
    return attention_model(node, h, hkv, d, ("inv", 1))


def session(lib: str | None, m, graph: bool):
    import onnxruntime as ort
    so = ort.SessionOptions()
    if lib:
        so.register_custom_ops_library(lib)
    opts = {"enable_cuda_graph": "1"} if graph else {}
    return ort.InferenceSession(m.SerializeToString(), so, providers=[("CUDAExecutionProvider", opts)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", required=True)
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args(argv)
    import onnxruntime as ort
    h, hkv, d, buf = 32, 32, 128, 4096
    rng = np.random.default_rng(0)
    cos = rng.standard_normal((8192, d // 2)).astype(np.float16)
    base = rng.standard_normal((1, hkv, buf, d)).astype(np.float16)
    for graph in (False, True):
        variants = {"onnxruntime node": session(None, model(False, h, hkv, d), graph),
                    "InvGQA (InvokeOp)": session(args.lib, model(True, h, hkv, d), graph)}
        calls = [(1, 128), (1, 2048)] if graph else [(128, 0), (2048, 0), (1, 128), (1, 2048)]
        for s, ctx in calls:
            total = ctx + s
            binds, ys, times = {}, {}, {}
            q_host = rng.standard_normal((1, s, (h + 2 * hkv) * d)).astype(np.float16)
            q_new = rng.standard_normal(q_host.shape).astype(np.float16)  # written in place before graph replays
            for name, sess in variants.items():
                q = ort.OrtValue.ortvalue_from_numpy(q_host, "cuda", 0)
                kv = [ort.OrtValue.ortvalue_from_numpy(base.copy(), "cuda", 0) for _ in range(2)]
                y = ort.OrtValue.ortvalue_from_shape_and_type([1, s, h * d], np.float16, "cuda", 0)
                io = sess.io_binding()
                io.bind_ortvalue_input("q", q)
                io.bind_ortvalue_input("pk", kv[0])
                io.bind_ortvalue_input("pv", kv[1])
                io.bind_ortvalue_input("sl", ort.OrtValue.ortvalue_from_numpy(np.array([total - 1], np.int32),
                                                                              "cuda", 0))
                io.bind_ortvalue_input("tl", ort.OrtValue.ortvalue_from_numpy(np.array(total, np.int32)))
                io.bind_ortvalue_input("cos", ort.OrtValue.ortvalue_from_numpy(cos, "cuda", 0))
                io.bind_ortvalue_input("sin", ort.OrtValue.ortvalue_from_numpy(cos, "cuda", 0))
                io.bind_ortvalue_output("y", y)
                io.bind_ortvalue_output("ok", kv[0])
                io.bind_ortvalue_output("ov", kv[1])
                try:
                    for _ in range(3):  # warm-up (and, with the graph, capture)
                        sess.run_with_iobinding(io)
                    if graph:  # a new query in the bound buffer: the replay must see it
                        q.update_inplace(q_new)
                        sess.run_with_iobinding(io)
                    t0 = time.perf_counter()
                    for _ in range(args.reps):
                        sess.run_with_iobinding(io)
                    times[name] = (time.perf_counter() - t0) / args.reps * 1e6
                    ys[name] = y.numpy().astype(np.float32)
                except Exception as e:  # noqa: BLE001 - what a failure says is the finding
                    print(f"{'graph' if graph else 'plain'} S{s} context {ctx} {name}: FAILED {str(e)[:300]}")
                binds[name] = io
            if len(ys) == 2:
                err = float(np.abs(ys["onnxruntime node"] - ys["InvGQA (InvokeOp)"]).max())
                print(f"{'graph' if graph else 'plain'} S{s:5d} context {ctx:5d}: " + ", ".join(
                    f"{k} {v:8.1f} us" for k, v in times.items()) + f"; max|difference| {err:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
