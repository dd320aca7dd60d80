"""FlashAttention (the fused op, this library) against onnxruntime's MultiHeadAttention with the same bias, one node
each, fp16, one sequence of S tokens, Llama-2-7B heads (32 x 128), a causal bias without padding (0 / -65504);
IOBinding and CUDA graphs, round-robin, medians of rounds. Every length is fused here (the rule's threshold
lowered): where the op is faster is where the rule fuses it (rewrites/flash_attention.py MIN_TOKENS). On the GPU
machine with onnxruntime-gpu first on PYTHONPATH and ONNXFUSE_LIBRARY set:
    python3 scripts/flash_attention_vs_ort.py [--seqs 128,256,512,1024,2048,4096] [--rounds 5] [--reps 100]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
from mha_causal_probe import bound, mha_model, round_robin_us  # the one-node model, its binding and timing



def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqs", default="128,256,512,1024,2048,4096")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=100)
    a = ap.parse_args()
    import torch

    from onnxfuse import fuse, runtime
    from onnxfuse.rewrites import flash_attention as rule
    rule.MIN_TOKENS = 1  # every length fused: this is where the threshold comes from
    hidden, heads = 4096, 32
    print(f"{torch.cuda.get_device_name()}, fp16, {heads} heads x {hidden // heads}, causal bias without padding")
    print("   S   onnxruntime MHA us   FlashAttention us   MHA / FlashAttention   max |d| / max |y|")
    for seq in (int(s) for s in a.seqs.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "mha.onnx", Path(tmp) / "fa.onnx"
            src.write_bytes(mha_model(seq, hidden, heads, 0))
            res = fuse.fuse(src, dst, force=True, write_unchanged=True)
            if not res.matches:
                print(f"{seq:5d}   not fused: {[r['reason'] for r in res.refusals][:1]}")
                continue
            g = torch.Generator().manual_seed(seq)
            feeds = {n: torch.randn(1, seq, hidden, generator=g).half().cuda() for n in "qkv"}
            i = torch.arange(seq)[:, None]
            feeds["bias"] = torch.where(torch.arange(seq)[None, :] > i, -65504.0, 0.0).half().reshape(
                1, 1, seq, seq).cuda()
            runs, outs = {}, {}
            for name, path, lib in (("mha", src, False), ("fa", dst, True)):
                s = runtime.session(str(path), "cuda", library=lib, cuda_graph=True)
                b, y = bound(s, feeds, warmup=3)
                runs[name], outs[name] = (s, b), y
            ts = round_robin_us(runs, a.rounds, a.reps)
            m, f = float(np.median(ts["mha"])), float(np.median(ts["fa"]))
            d = ((outs["fa"].float() - outs["mha"].float()).abs().max() / outs["mha"].float().abs().max()).item()
            print(f"{seq:5d}   {m:18.1f}   {f:17.1f}   {m / f:20.2f}   {d:.1e}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
