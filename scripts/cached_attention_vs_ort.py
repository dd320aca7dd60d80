"""Issue 27, GPU: one CachedAttention node (backends cuda and triton) against onnxruntime's CUDA GroupQueryAttention
(the node genai's builder writes) on the same inputs: decode steps after a context and first prompts, 7B shapes (32
heads of 128; 32 KV heads as Llama-2-7B, 8 as GQA models), fp16, KV buffers shared as genai binds them
(past_present_share_buffer), IOBinding of device OrtValues, each model timed round-robin in one process. Prints us
per call and the max difference of Y against onnxruntime's. --layers N puts N such nodes in one model, each over its
own KV buffers (as a decoder's layers: the caches come from memory, not L2, and a session run's overhead is shared
by N), and prints us per node; --graph captures each session in a CUDA graph (genai's enable_cuda_graph).

    python scripts/cached_attention_vs_ort.py [--contexts 128,2048] [--prompts 128,2048] [--reps 200] [--layers 32]

A diagnosis for the CUDA provider's policy (cpu_policy.GPU_LEFT_TO_ORT: the op fused on the CUDA provider, grouped
query heads too), not a user's measurement.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def model(fused: bool, h: int, hkv: int, d: int, backend: str = "auto", layers: int = 1):
    """One CachedAttention node (fused) or onnxruntime's GroupQueryAttention over the same inputs; with `layers` > 1,
    that many, node i over KV buffers pk{i}/pv{i} into y{i}, ok{i}, ov{i} (the names of node 0 have no number)."""
    from onnx import TensorProto as TP
    from onnx import helper

    from onnxfuse import schema
    nodes = []
    for i in range(layers):
        tag = str(i) if i else ""
        ins = ["q", "pk" + tag, "pv" + tag, "sl", "tl", "cos", "sin"]
        outs = ["y" + tag, "ok" + tag, "ov" + tag]
        if fused:
            nodes.append(helper.make_node("CachedAttention", ins, outs, domain=schema.DOMAIN, num_heads=h,
                                          kv_num_heads=hkv, backend=backend))
        else:
            nodes.append(helper.make_node("GroupQueryAttention", ["q", "", "", *ins[1:]], outs,
                                          domain="com.microsoft", num_heads=h, kv_num_heads=hkv, do_rotary=1))
    m = attention_model(nodes[0], h, hkv, d, (schema.DOMAIN, schema.DOMAIN_VERSION))
    g = m.graph
    for i, node in enumerate(nodes[1:], 1):
        g.node.append(node)
        for n in ("pk", "pv"):
            g.input.append(helper.make_tensor_value_info(f"{n}{i}", TP.FLOAT16, ["b", hkv, "p", d]))
        for n in ("y", "ok", "ov"):
            g.output.append(helper.make_tensor_value_info(f"{n}{i}", TP.FLOAT16, None))
    return m


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


def profile(binds: dict, layers: int, what: str, runs: int = 5) -> None:
    """Each variant's CUDA kernels, us a node (CUPTI through torch.profiler sees onnxruntime's and the library's)."""
    import torch
    from torch.profiler import ProfilerActivity
    for name, (sess, io, _) in binds.items():
        with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                sess.run_with_iobinding(io)
            torch.cuda.synchronize()
        kernels: dict[str, float] = {}
        for e in prof.events():
            if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
                dur = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
                kernels[e.name[:90]] = kernels.get(e.name[:90], 0.0) + float(dur) / runs / layers
        total = sum(kernels.values())
        print(f"  profile {what}, {name}: {total:.1f} us of kernels a node", flush=True)
        for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:6]:
            print(f"    {v:7.2f} us  {k}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="128,2048")
    p.add_argument("--prompts", default="128,2048")
    p.add_argument("--kv-heads", default="32,8")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--graph", action="store_true")
    p.add_argument("--profile", action="store_true", help="each variant's GPU kernels a node (torch.profiler)")
    p.add_argument("--variants", default="onnxruntime GQA,CachedAttention cuda,CachedAttention triton,"
                                         "CachedAttention auto")
    args = p.parse_args(argv)
    import onnxruntime as ort

    from onnxfuse import runtime
    h, d, buf = 32, 128, 4096
    rng = np.random.default_rng(0)
    cos = rng.standard_normal((8192, d // 2)).astype(np.float16)
    want = args.variants.split(",")
    L = args.layers
    for hkv in (int(x) for x in args.kv_heads.split(",")):
        calls = [(1, c) for c in map(int, args.contexts.split(","))] + \
                [(s, 0) for s in map(int, args.prompts.split(","))]
        for s, ctx in calls:
            # a graph is captured for one shape: the sessions are made per call
            variants = {}
            for name in want:
                fused = name.startswith("CachedAttention")
                variants[name] = runtime.session(model(fused, h, hkv, d, name.split()[-1] if fused else "auto", L),
                                                 "cuda", library=None if fused else False, cuda_graph=args.graph)
            q = ort.OrtValue.ortvalue_from_numpy(
                rng.standard_normal((1, s, (h + 2 * hkv) * d)).astype(np.float16), "cuda", 0)
            base = rng.standard_normal((1, hkv, buf, d)).astype(np.float16)
            total = ctx + s
            dev = {n: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for n, v in (
                ("sl", np.array([total - 1], np.int32)), ("cos", cos), ("sin", cos))}
            binds, ys = {}, {}
            for name, sess in variants.items():
                io = sess.io_binding()
                io.bind_ortvalue_input("q", q)
                for n, v in dev.items():
                    io.bind_ortvalue_input(n, v)
                io.bind_ortvalue_input("tl", ort.OrtValue.ortvalue_from_numpy(np.array(total, np.int32)))
                y = None
                for i in range(L):
                    tag = str(i) if i else ""
                    kv = [ort.OrtValue.ortvalue_from_numpy(base, "cuda", 0) for _ in range(2)]
                    yi = ort.OrtValue.ortvalue_from_shape_and_type([1, s, h * d], np.float16, "cuda", 0)
                    y = y or yi
                    io.bind_ortvalue_input("pk" + tag, kv[0])
                    io.bind_ortvalue_input("pv" + tag, kv[1])
                    io.bind_ortvalue_output("y" + tag, yi)
                    io.bind_ortvalue_output("ok" + tag, kv[0])
                    io.bind_ortvalue_output("ov" + tag, kv[1])
                binds[name] = (sess, io, y)
            times = {name: [] for name in variants}
            for r in range(7):
                for name, (sess, io, y) in binds.items():
                    for _ in range(3):
                        sess.run_with_iobinding(io)
                    t0 = time.perf_counter()
                    for _ in range(args.reps):
                        sess.run_with_iobinding(io)
                    times[name].append((time.perf_counter() - t0) / args.reps / L * 1e6)
                    ys[name] = y.numpy().astype(np.float32)
            if args.profile:
                profile(binds, L, f"H{h}/{hkv} {'decode at context %d' % ctx if s == 1 else 'first prompt of %d' % s}")
            ref = ys["onnxruntime GQA"]
            what = f"decode at context {ctx}" if s == 1 else f"first prompt of {s}"
            for name in variants:
                err = float(np.abs(ys[name] - ref).max())
                print(f"H{h}/{hkv} D{d} {what:24} {name:24} {statistics.median(times[name]):9.1f} us a node"
                      f"{' (graph)' if args.graph else ''}{f' of {L}' if L > 1 else ''}  "
                      f"max|Y - onnxruntime's| {err:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
