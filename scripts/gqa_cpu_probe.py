"""Issue 27, CPU: onnxruntime's GroupQueryAttention (com.microsoft, the node genai's builder writes) on the CPU EP, the
groundwork for an onnxfuse replacement of it: its time per call at decode by context and at prefill by prompt, and a
PyTorch reference of what it computes, checked against it (the semantics such an op must keep).

What it computes (packed QKV as genai writes it: query [B, S, (H + 2 Hkv) D], key and value empty; past_key and
past_value [B, Hkv, P, D]; seqlens_k [B] = each sequence's valid length - 1 after this call; total_sequence_length;
cos_cache and sin_cache [positions, rotary_dim / 2]):
- a first prompt (S == total_sequence_length): no past, positions 0..S-1, each sequence's valid rows its first
  seqlens_k[b] + 1 (right padding past them);
- later calls: past length p_b = seqlens_k[b] + 1 - S, positions p_b + s (S > 1 there: batch 1 only, onnxruntime
  refuses more);
- rotary on Q and K (half split, or interleaved pairs), K and V written to the cache at p_b + s (present is the past
  buffer itself when they are one buffer, past_present_share_buffer, else past[:p_b] then the new rows);
- causal softmax(scale Q K^T) V per head, head h on KV head h // (H / Hkv), row s over keys 0..p_b + s.

    python scripts/gqa_cpu_probe.py check            # the reference against onnxruntime (several cases)
    python scripts/gqa_cpu_probe.py time [--threads 2] [--contexts 128,512,1024,2048] [--prompts 128,512,2048]
    python scripts/gqa_cpu_probe.py invoke --lib libgqa_invoke.so [--threads 2]   # scripts/gqa_invoke_probe.cc
    python scripts/gqa_cpu_probe.py chain [--threads 2] [--contexts ...] [--cached-attention]   # 30 nodes, each its
                                                                     # own cache, as a decoder; and onnxfuse's op

SmolLM2-135M's shapes by default (9 heads, 3 KV heads, head size 64, rotary on all 64).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from onnxfuse.ops.cached_attention import rotate  # the op's own rotary: the reference below checks it too


def gqa_model(h: int, hkv: int, d: int, max_pos: int, rotary_dim: int, interleaved: bool, scale: float):
    from onnx import TensorProto as TP
    from onnx import helper
    node = helper.make_node("GroupQueryAttention", ["q", "", "", "pk", "pv", "sl", "tl", "cos", "sin"],
                            ["y", "ok", "ov"], domain="com.microsoft", num_heads=h, kv_num_heads=hkv, scale=scale,
                            local_window_size=-1, softcap=0.0, do_rotary=1, rotary_interleaved=int(interleaved))
    inputs = [helper.make_tensor_value_info("q", TP.FLOAT, ["b", "s", (h + 2 * hkv) * d]),
              helper.make_tensor_value_info("pk", TP.FLOAT, ["b", hkv, "p", d]),
              helper.make_tensor_value_info("pv", TP.FLOAT, ["b", hkv, "p", d]),
              helper.make_tensor_value_info("sl", TP.INT32, ["b"]), helper.make_tensor_value_info("tl", TP.INT32, []),
              helper.make_tensor_value_info("cos", TP.FLOAT, [max_pos, rotary_dim // 2]),
              helper.make_tensor_value_info("sin", TP.FLOAT, [max_pos, rotary_dim // 2])]
    outputs = [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ("y", "ok", "ov")]
    graph = helper.make_graph([node], "gqa", inputs, outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def reference(q, past_k, past_v, seqlens, total: int, cos, sin, h: int, hkv: int, interleaved: bool, scale: float,
              share: bool):
    """(Y [B, S, H D], present_k, present_v, valid rows per sequence) as GroupQueryAttention computes them, in fp32;
    rows past a sequence's valid ones (a first prompt's right padding) are left to the caller to ignore."""
    import torch
    b, s, width = q.shape
    d = width // (h + 2 * hkv)
    first = s == total
    qh = q[..., : h * d].reshape(b, s, h, d).transpose(1, 2)
    kh = q[..., h * d:(h + hkv) * d].reshape(b, s, hkv, d).transpose(1, 2)
    vh = q[..., (h + hkv) * d:].reshape(b, s, hkv, d).transpose(1, 2)
    p_len = past_k.shape[2]
    present_len = p_len if share else max(total, p_len)
    pk = torch.zeros(b, hkv, present_len, d)
    pv = torch.zeros(b, hkv, present_len, d)
    y = torch.zeros(b, h, s, d)
    valid = []
    for i in range(b):
        tot = int(seqlens[i]) + 1
        past = 0 if first else tot - s
        rows = min(s, tot - past)
        valid.append(rows)
        pos = torch.arange(past, past + s)
        c, sn = cos[pos.clamp(max=cos.shape[0] - 1)], sin[pos.clamp(max=sin.shape[0] - 1)]
        qi = rotate(qh[i], c, sn, interleaved)
        ki = rotate(kh[i], c, sn, interleaved)
        if share:
            pk[i], pv[i] = past_k[i], past_v[i]
        else:
            pk[i, :, :past], pv[i, :, :past] = past_k[i, :, :past], past_v[i, :, :past]
        pk[i, :, past:past + rows] = ki[:, :rows]
        pv[i, :, past:past + rows] = vh[i][:, :rows]
        group = h // hkv
        for head in range(h):
            kv = head // group
            scores = (qi[head, :rows] @ pk[i, kv, :past + rows].T) * scale
            mask = torch.arange(past + rows)[None, :] > (past + torch.arange(rows))[:, None]
            scores = scores.masked_fill(mask, float("-inf"))
            y[i, head, :rows] = torch.softmax(scores, dim=-1) @ pv[i, kv, :past + rows]
    return y.transpose(1, 2).reshape(b, s, h * d), pk, pv, valid


def run_ort(sess, q, pk, pv, seqlens, total, cos, sin, share: bool):
    import onnxruntime as ort
    kv = [ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(t)) for t in (pk, pv)]
    io = sess.io_binding()
    io.bind_cpu_input("q", q)
    io.bind_ortvalue_input("pk", kv[0])
    io.bind_ortvalue_input("pv", kv[1])
    io.bind_cpu_input("sl", seqlens.astype(np.int32))
    io.bind_cpu_input("tl", np.array(total, np.int32))
    io.bind_cpu_input("cos", cos)
    io.bind_cpu_input("sin", sin)
    io.bind_output("y")
    if share:  # genai's past_present_share_buffer: present bound to the past buffer
        io.bind_ortvalue_output("ok", kv[0])
        io.bind_ortvalue_output("ov", kv[1])
    else:
        io.bind_output("ok")
        io.bind_output("ov")
    sess.run_with_iobinding(io)
    return io, [o.numpy() for o in io.get_outputs()]


def check(args) -> int:
    """The reference against onnxruntime: first prompts (right padding in a batch), decode and a later prompt of 3
    tokens, shared and separate KV buffers, rotary half-split and interleaved, a partial rotary, GQA groups of 3."""
    import onnxruntime as ort
    import torch
    rng = np.random.default_rng(0)
    cases = [  # (B, S, past or None (first prompt), seqlens after, share, interleaved, rotary_dim, H, Hkv, D)
        (1, 7, None, [6], True, False, 64, 9, 3, 64),
        (2, 6, None, [5, 3], True, False, 64, 9, 3, 64),
        (2, 1, [9, 4], [9, 4], True, False, 64, 9, 3, 64),
        (1, 3, [8], [10], True, True, 32, 4, 2, 64),  # onnxruntime: a later prompt of S > 1 at batch 1 only
        (1, 1, [12], [12], False, False, 64, 9, 3, 64),
        (3, 1, [3, 17, 9], [3, 17, 9], False, True, 16, 8, 8, 32),
    ]
    worst = 0.0
    for b, s, past, seqlens, share, inter, rdim, h, hkv, d in cases:
        scale = 1 / np.sqrt(d)
        p_buf = 32 if share else (0 if past is None else max(seqlens) + 1 - s)
        total = s if past is None else max(seqlens) + 1
        sess = ort.InferenceSession(gqa_model(h, hkv, d, 64, rdim, inter, scale).SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        q = rng.standard_normal((b, s, (h + 2 * hkv) * d), dtype=np.float32)
        pk = rng.standard_normal((b, hkv, p_buf, d), dtype=np.float32)
        pv = rng.standard_normal((b, hkv, p_buf, d), dtype=np.float32)
        ang = np.arange(64)[:, None] / 10000 ** (np.arange(rdim // 2)[None, :] / (rdim // 2))
        cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
        sl = np.array(seqlens, np.int32)
        _, (y, ok, ov) = run_ort(sess, q, pk, pv, sl, total, cos, sin, share)
        ry, rk, rv, valid = reference(*(torch.from_numpy(t) for t in (q, pk, pv)), sl, total, torch.from_numpy(cos),
                                      torch.from_numpy(sin), h, hkv, inter, scale, share)
        errs = []
        for i in range(b):
            first = past is None
            p_i = 0 if first else int(sl[i]) + 1 - s
            errs.append(float(np.abs(y[i, :valid[i]] - ry[i, :valid[i]].numpy()).max()))
            n = p_i + valid[i]
            errs.append(float(np.abs(ok[i, :, :n] - rk[i, :, :n].numpy()).max()))
            errs.append(float(np.abs(ov[i, :, :n] - rv[i, :, :n].numpy()).max()))
        err = max(errs)
        worst = max(worst, err)
        print(f"B{b} S{s} past {past} seqlens_k {seqlens} share {share} interleaved {inter} rotary {rdim} H{h}/"
              f"{hkv} D{d}: present {list(ok.shape)}, max |ort - reference| {err:.2e}")
    print(f"worst {worst:.2e}")
    return 0 if worst < 1e-4 else 1


def threaded(threads: int):
    """onnxruntime session options with `threads` intra-op threads."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return so


def timing_caches(rng, d: int):
    """cos and sin caches [8192, d / 2] of random values (the timed work does not depend on them)."""
    return (rng.standard_normal((8192, d // 2), dtype=np.float32),
            rng.standard_normal((8192, d // 2), dtype=np.float32))


def timed(sess_run, reps: int, rounds: int) -> float:
    for _ in range(3):
        sess_run()
    t = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(reps):
            sess_run()
        t.append((time.perf_counter() - t0) / reps * 1e6)
    return statistics.median(t)


def timing(args) -> int:
    import onnxruntime as ort
    h, hkv, d = 9, 3, 64
    so = threaded(args.threads)
    rng = np.random.default_rng(0)
    cos, sin = timing_caches(rng, d)
    buf = 4096
    sess = ort.InferenceSession(gqa_model(h, hkv, d, 8192, d, False, d ** -0.5).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    print(f"onnxruntime {ort.__version__} GroupQueryAttention, CPU EP, {args.threads} threads, H{h}/{hkv} D{d}, "
          f"shared KV buffer of {buf}; us per call (median of rounds)")
    pk = rng.standard_normal((1, hkv, buf, d), dtype=np.float32)
    pv = rng.standard_normal((1, hkv, buf, d), dtype=np.float32)
    for ctx in (int(c) for c in args.contexts.split(",")):
        q = rng.standard_normal((1, 1, (h + 2 * hkv) * d), dtype=np.float32)
        io, _ = run_ort(sess, q, pk, pv, np.array([ctx], np.int32), ctx + 1, cos, sin, True)
        us = timed(lambda: sess.run_with_iobinding(io), 100, 7)
        kv_mb = 2 * hkv * (ctx + 1) * d * 4 / 1e6
        print(f"  decode at context {ctx}: {us:8.1f} us ({kv_mb:.2f} MB of KV cache read)")
    for s in (int(p) for p in args.prompts.split(",")):
        q = rng.standard_normal((1, s, (h + 2 * hkv) * d), dtype=np.float32)
        io, _ = run_ort(sess, q, pk, pv, np.array([s - 1], np.int32), s, cos, sin, True)
        us = timed(lambda: sess.run_with_iobinding(io), 3, 5)
        print(f"  prefill of {s}: {us / 1e3:8.2f} ms")
    return 0


def invoke_model(h: int, hkv: int, d: int, max_pos: int):
    """The same call as one custom node of scripts/gqa_invoke_probe.cc, which hands it to GroupQueryAttention through
    InvokeOp."""
    from onnx import helper
    m = gqa_model(h, hkv, d, max_pos, d, False, d ** -0.5)
    node = helper.make_node("InvGQA", ["q", "pk", "pv", "sl", "tl", "cos", "sin"], ["y", "ok", "ov"], domain="inv")
    m.graph.ClearField("node")
    m.graph.node.append(node)
    m.opset_import.append(helper.make_opsetid("inv", 1))
    return m


def invoke(args) -> int:
    """onnxruntime's GroupQueryAttention invoked from a custom op (InvokeOp) against the session's own node: outputs
    equal, time per call at decode and prefill."""
    import onnxruntime as ort
    h, hkv, d, buf = 9, 3, 64, 4096
    so = threaded(args.threads)
    so.register_custom_ops_library(args.lib)
    own = ort.InferenceSession(gqa_model(h, hkv, d, 8192, d, False, d ** -0.5).SerializeToString(), so,
                               providers=["CPUExecutionProvider"])
    inv = ort.InferenceSession(invoke_model(h, hkv, d, 8192).SerializeToString(), so,
                               providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    cos, sin = timing_caches(rng, d)
    print(f"onnxruntime {ort.__version__}, {args.threads} threads: GroupQueryAttention through InvokeOp from a custom "
          f"op against the session's own node (shared KV buffer of {buf}; us per call, median of rounds)")
    worst = 0.0
    for s, ctx in ((1, 128), (1, 2048), (128, 0), (512, 0), (2048, 0)):
        q = rng.standard_normal((1, s, (h + 2 * hkv) * d), dtype=np.float32)
        pk = rng.standard_normal((1, hkv, buf, d), dtype=np.float32)
        pv = rng.standard_normal((1, hkv, buf, d), dtype=np.float32)
        seq, total = (np.array([ctx], np.int32), ctx + 1) if s == 1 else (np.array([s - 1], np.int32), s)
        io_own, out_own = run_ort(own, q, pk, pv, seq, total, cos, sin, True)
        io_inv, out_inv = run_ort(inv, q, pk, pv, seq, total, cos, sin, True)
        err = max(float(np.abs(a - b).max()) for a, b in zip(out_own, out_inv))
        worst = max(worst, err)
        reps = 100 if s == 1 else 3
        t_own = timed(lambda: own.run_with_iobinding(io_own), reps, 5)
        t_inv = timed(lambda: inv.run_with_iobinding(io_inv), reps, 5)
        label = f"decode at context {ctx}" if s == 1 else f"prefill of {s}"
        print(f"  {label:24s} own {t_own:10.1f} us  invoked {t_inv:10.1f} us  ({t_inv / t_own:.3f}x)  "
              f"max |diff| {err:.1e}")
    return 0 if worst == 0.0 else 1


def chain(args) -> int:
    """One decode step of 30 GroupQueryAttention nodes, each with its own KV cache (shared past and present, as genai
    binds them), so that each node's cache comes from memory as in a decoder step: us a node, beside
    scripts/cpu_decode_attention_probe.cc's kernel timed the same way. --cached-attention: the same chain fused by
    `fuse --provider cpu` (onnxfuse's CachedAttention, the kernel library) timed round-robin with it, on the same
    caches (median and fastest round of each)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    h, hkv, d, buf, layers = 9, 3, 64, 4096, 30
    m = gqa_model(h, hkv, d, 8192, d, False, d ** -0.5)
    node = m.graph.node[0]
    m.graph.ClearField("node")
    outs = []
    for i in range(layers):
        m.graph.node.append(helper.make_node(node.op_type, ["q", "", "", f"pk{i}", f"pv{i}", "sl", "tl", "cos", "sin"],
                                             [f"y{i}", f"ok{i}", f"ov{i}"], domain=node.domain,
                                             **{a.name: helper.get_attribute_value(a) for a in node.attribute}))
        outs += [f"y{i}", f"ok{i}", f"ov{i}"]
    pk_info = next(i for i in m.graph.input if i.name == "pk")
    for i in range(layers):
        for n in ("pk", "pv"):
            vi = m.graph.input.add()
            vi.CopyFrom(pk_info)
            vi.name = f"{n}{i}"
    for n in ("pk", "pv"):
        m.graph.input.remove(next(i for i in m.graph.input if i.name == n))
    m.graph.ClearField("output")
    for n in outs:
        shape = ["b", "s", h * d] if n.startswith("y") else ["b", hkv, "p", d]
        m.graph.output.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, shape))
    so = threaded(args.threads)
    sessions = {"GroupQueryAttention": ort.InferenceSession(m.SerializeToString(), so,
                                                            providers=["CPUExecutionProvider"])}
    if args.cached_attention:
        sessions["CachedAttention"] = _fused_chain(m, args.threads)
    rng = np.random.default_rng(0)
    cos, sin = timing_caches(rng, d)
    caches = [[ort.OrtValue.ortvalue_from_numpy(rng.standard_normal((1, hkv, buf, d), dtype=np.float32))
               for _ in range(2)] for _ in range(layers)]
    print(f"onnxruntime {ort.__version__}: {', '.join(sessions)}, {layers} nodes each with its own shared KV buffer "
          f"of {buf}, {args.threads} threads: us a node at decode (median of rounds, fastest round)")
    q = rng.standard_normal((1, 1, (h + 2 * hkv) * d), dtype=np.float32)
    for ctx in (int(c) for c in args.contexts.split(",")):
        bound = {}
        for name, sess in sessions.items():
            io = sess.io_binding()
            io.bind_cpu_input("q", q)
            io.bind_cpu_input("sl", np.array([ctx], np.int32))
            io.bind_cpu_input("tl", np.array(ctx + 1, np.int32))
            io.bind_cpu_input("cos", cos)
            io.bind_cpu_input("sin", sin)
            for i, (k, v) in enumerate(caches):
                io.bind_ortvalue_input(f"pk{i}", k)
                io.bind_ortvalue_input(f"pv{i}", v)
                io.bind_ortvalue_output(f"ok{i}", k)
                io.bind_ortvalue_output(f"ov{i}", v)
                io.bind_output(f"y{i}")
            bound[name] = (sess, io)
        rounds = {name: [] for name in bound}
        for _ in range(args.rounds):  # round-robin: the host's drift moves every variant alike
            for name, (sess, io) in bound.items():
                rounds[name].append(timed(lambda: sess.run_with_iobinding(io), 20, 1) / layers)
        mb = 2 * hkv * (ctx + 1) * d * 4 / 1e6
        for name, us in rounds.items():
            med = statistics.median(us)
            print(f"  context {ctx:5d} {name:20}: {med:7.1f} us a node, fastest round {min(us):7.1f} (KV {mb:.2f} "
                  f"MB, {mb / med * 1e3:.1f} GB/s)")
    return 0


def _fused_chain(model, threads: int):
    """A session of `model` fused by onnxfuse for the CPU (CachedAttention nodes, the kernel library)."""
    import pathlib
    import tempfile

    import onnx

    from onnxfuse import fuse, runtime
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = pathlib.Path(tmp) / "chain.onnx", pathlib.Path(tmp) / "chain.fused.onnx"
        onnx.save(model, str(src))
        res = fuse.fuse(src, dst, provider="cpu", ort=False)
        assert {m_.op for m_ in res.matches} == {"CachedAttention"}, res.matches
        return runtime.session(str(dst), "cpu", sess_options=threaded(threads))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("check", "time", "invoke", "chain"))
    ap.add_argument("--lib", help="invoke: scripts/gqa_invoke_probe.cc built as a shared library")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="128,512,1024,2048")
    ap.add_argument("--prompts", default="128,512,2048")
    ap.add_argument("--cached-attention", action="store_true",
                    help="chain: also the chain fused by onnxfuse (CachedAttention), timed round-robin with it")
    ap.add_argument("--rounds", type=int, default=7, help="chain: rounds of 20 steps per variant")
    args = ap.parse_args(argv)
    return {"check": check, "time": timing, "invoke": invoke, "chain": chain}[args.mode](args)


if __name__ == "__main__":
    sys.exit(main())
