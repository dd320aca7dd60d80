"""Issue 27, the synthetic llama-7b layer's attention: what onnxruntime's MultiHeadAttention (the node
onnxscript's optimize_for_ort makes of the exported SDPA, com.microsoft) costs with the additive bias the graph
builds (a constant causal mask and the attention_mask input's key padding, 0 / -65504), and the same node told it is
causal (unidirectional=1, the bias kept): whether onnxruntime's kernel then skips the masked half.

One node, fp16, 1 x S tokens, 32 heads of 128 (Llama-2-7B), IOBinding on the CUDA EP, each variant with and without a
CUDA graph, round-robin, medians; the outputs against the plain node's. Prints a table. A probe, not a test: run on
the GPU machine with onnxruntime-gpu first on PYTHONPATH:
    python3 scripts/mha_causal_probe.py [--seq 2048] [--rounds 7] [--reps 200]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from onnx import TensorProto, helper


def mha_model(seq: int, hidden: int, heads: int, unidirectional: int) -> bytes:
    f16 = TensorProto.FLOAT16
    attrs = {"num_heads": heads}
    if unidirectional:
        attrs["unidirectional"] = 1
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v", "", "", "bias"], ["y"], domain="com.microsoft",
                            **attrs)
    g = helper.make_graph([node], "mha", [helper.make_tensor_value_info(n, f16, [1, seq, hidden]) for n in "qkv"]
                          + [helper.make_tensor_value_info("bias", f16, [1, 1, seq, seq])],
                          [helper.make_tensor_value_info("y", f16, [1, seq, hidden])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m.SerializeToString()


def bound(session, feeds: dict, warmup: int):
    """The one-node model's session bound by IOBinding to the fp16 CUDA tensors `feeds` and a new output y like q,
    run `warmup` times: (binding, y)."""
    import torch
    y = torch.empty_like(feeds["q"])
    b = session.io_binding()
    for n, t in feeds.items():
        b.bind_input(n, "cuda", 0, np.float16, list(t.shape), t.data_ptr())
    b.bind_output("y", "cuda", 0, np.float16, list(y.shape), y.data_ptr())
    for _ in range(warmup):
        session.run_with_iobinding(b)
    return b, y


def round_robin_us(runs: dict, rounds: int, reps: int) -> dict[str, list[float]]:
    """us a run of each bound session, {name: (session, binding)}, `rounds` rounds of `reps` runs round-robin."""
    import torch
    ts = {n: [] for n in runs}
    for _ in range(rounds):
        for n, (s, b) in runs.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(reps):
                s.run_with_iobinding(b)
            torch.cuda.synchronize()
            ts[n].append((time.perf_counter() - t0) / reps * 1e6)
    return ts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    import onnxruntime as ort
    import torch
    seq, hidden, heads = a.seq, 4096, 32
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, seq, hidden, generator=g).half().cuda() for _ in range(3))
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    masks = {"key padding as the bench (only key 0)": torch.tril(torch.ones(1, seq))[0] > 0,
             "no padding": torch.ones(seq) > 0}
    print(f"onnxruntime {ort.__version__}, {torch.cuda.get_device_name()}, seq {seq}, {heads} heads x "
          f"{hidden // heads}")
    for mask_name, keep in masks.items():
        allowed = causal & keep[None, :]
        bias = torch.where(allowed, 0.0, -65504.0).half().reshape(1, 1, seq, seq).cuda()
        feeds = {"q": q, "k": k, "v": v, "bias": bias}
        runs = {}
        outs = {}
        for uni in (0, 1):
            for graph in (False, True):
                so = ort.SessionOptions()
                po = {"enable_cuda_graph": "1"} if graph else {}
                s = ort.InferenceSession(mha_model(seq, hidden, heads, uni), so,
                                         providers=[("CUDAExecutionProvider", po)])
                b, y = bound(s, feeds, warmup=5)
                torch.cuda.synchronize()
                name = f"unidirectional={uni}{' +graph' if graph else ''}"
                runs[name] = (s, b)
                outs[name] = y
        ts = round_robin_us(runs, a.rounds, a.reps)
        ref = outs["unidirectional=0"].float()
        # torch's SDPA with the boolean mask, fp32 math, as the reference
        qh, kh, vh = (t.float().reshape(1, seq, heads, -1).transpose(1, 2) for t in (q, k, v))
        sd = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias.float())
        sd = sd.transpose(1, 2).reshape(1, seq, hidden)
        print(f"\n{mask_name}:")
        for n in runs:
            med = float(np.median(ts[n]))
            d = (outs[n].float() - ref).abs().max().item()
            e = (outs[n].float() - sd).abs().max().item() / sd.abs().max().item()
            print(f"  {n:28s} {med:8.1f} us  (rounds {min(ts[n]):.1f}-{max(ts[n]):.1f})  max|d| vs plain {d:.2e}"
                  f"  err vs torch fp32 {e:.2e}")


if __name__ == "__main__":
    main()
