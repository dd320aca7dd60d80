"""Issue 27, GPU: one CachedAttention node (backends cuda and triton) against onnxruntime's CUDA GroupQueryAttention
(the node genai's builder writes) on the same inputs: decode steps after a context and first prompts, 7B shapes (32
heads of 128; 32 KV heads as Llama-2-7B, 8 as GQA models), fp16, KV buffers shared as genai binds them
(past_present_share_buffer), IOBinding of device OrtValues, each model timed round-robin in one process. Prints us
per call and the max difference of Y against onnxruntime's.

    python scripts/cached_attention_vs_ort.py [--contexts 128,2048] [--prompts 128,2048] [--reps 200]

A diagnosis for the CUDA provider's policy (cpu_policy.GPU_LEFT_TO_ORT), not a user's measurement.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def model(fused: bool, h: int, hkv: int, d: int, backend: str = "auto"):
    """One CachedAttention node (fused) or onnxruntime's GroupQueryAttention over the same inputs."""
    from onnx import helper

    from onnxfuse import schema
    ins = ["q", "pk", "pv", "sl", "tl", "cos", "sin"]
    if fused:
        node = helper.make_node("CachedAttention", ins, ["y", "ok", "ov"], domain=schema.DOMAIN, num_heads=h,
                                kv_num_heads=hkv, backend=backend)
    else:
        node = helper.make_node("GroupQueryAttention", ["q", "", "", *ins[1:]], ["y", "ok", "ov"],
                                domain="com.microsoft", num_heads=h, kv_num_heads=hkv, do_rotary=1)
    return attention_model(node, h, hkv, d, (schema.DOMAIN, schema.DOMAIN_VERSION))


def attention_model(node, h: int, hkv: int, d: int, domain: tuple[str, int]):
    """A model of one attention `node` over genai's fp16 inputs (q packed [b, s, (H + 2 Hkv) D], the KV cache
    [b, Hkv, p, D], seqlens and total length int32, cos/sin [8192, D / 2]) and its three outputs; `domain` (name,
    version) is imported beside the default and com.microsoft ones (scripts/gqa_cuda_invoke_probe.py's too)."""
    from onnx import TensorProto as TP
    from onnx import helper
    t = TP.FLOAT16
    inputs = [helper.make_tensor_value_info("q", t, ["b", "s", (h + 2 * hkv) * d]),
              helper.make_tensor_value_info("pk", t, ["b", hkv, "p", d]),
              helper.make_tensor_value_info("pv", t, ["b", hkv, "p", d]),
              helper.make_tensor_value_info("sl", TP.INT32, ["b"]), helper.make_tensor_value_info("tl", TP.INT32, []),
              helper.make_tensor_value_info("cos", t, [8192, d // 2]),
              helper.make_tensor_value_info("sin", t, [8192, d // 2])]
    outputs = [helper.make_tensor_value_info(n, t, None) for n in ("y", "ok", "ov")]
    graph = helper.make_graph([node], "attn", inputs, outputs)
    return helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid(*domain)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="128,2048")
    p.add_argument("--prompts", default="128,2048")
    p.add_argument("--kv-heads", default="32,8")
    p.add_argument("--reps", type=int, default=200)
    args = p.parse_args(argv)
    import onnxruntime as ort

    from onnxfuse import runtime
    h, d, buf = 32, 128, 4096
    rng = np.random.default_rng(0)
    cos = rng.standard_normal((8192, d // 2)).astype(np.float16)
    for hkv in (int(x) for x in args.kv_heads.split(",")):
        variants = {"onnxruntime GQA": runtime.session(model(False, h, hkv, d), "cuda", library=False),
                    "CachedAttention cuda": runtime.session(model(True, h, hkv, d, "cuda"), "cuda"),
                    "CachedAttention triton": runtime.session(model(True, h, hkv, d, "triton"), "cuda")}
        calls = [(1, c) for c in map(int, args.contexts.split(","))] + \
                [(s, 0) for s in map(int, args.prompts.split(","))]
        for s, ctx in calls:
            q = ort.OrtValue.ortvalue_from_numpy(
                rng.standard_normal((1, s, (h + 2 * hkv) * d)).astype(np.float16), "cuda", 0)
            base = rng.standard_normal((1, hkv, buf, d)).astype(np.float16)
            total = ctx + s
            binds, ys = {}, {}
            for name, sess in variants.items():
                kv = [ort.OrtValue.ortvalue_from_numpy(base.copy(), "cuda", 0) for _ in range(2)]
                y = ort.OrtValue.ortvalue_from_shape_and_type([1, s, h * d], np.float16, "cuda", 0)
                io = sess.io_binding()
                io.bind_ortvalue_input("q", q)
                io.bind_ortvalue_input("pk", kv[0])
                io.bind_ortvalue_input("pv", kv[1])
                io.bind_cpu_input("sl", np.array([total - 1], np.int32))
                io.bind_cpu_input("tl", np.array(total, np.int32))
                io.bind_cpu_input("cos", cos)
                io.bind_cpu_input("sin", cos)
                io.bind_ortvalue_output("y", y)
                io.bind_ortvalue_output("ok", kv[0])
                io.bind_ortvalue_output("ov", kv[1])
                binds[name] = (sess, io, kv, y)
            times = {name: [] for name in variants}
            for r in range(7):
                for name, (sess, io, kv, y) in binds.items():
                    for _ in range(3):
                        sess.run_with_iobinding(io)
                    t0 = time.perf_counter()
                    for _ in range(args.reps):
                        sess.run_with_iobinding(io)
                    times[name].append((time.perf_counter() - t0) / args.reps * 1e6)
                    ys[name] = y.numpy().astype(np.float32)
            ref = ys["onnxruntime GQA"]
            what = f"decode at context {ctx}" if s == 1 else f"first prompt of {s}"
            for name in variants:
                err = float(np.abs(ys[name] - ref).max())
                print(f"H{h}/{hkv} D{d} {what:24} {name:24} {statistics.median(times[name]):9.1f} us  "
                      f"max|Y - onnxruntime's| {err:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
