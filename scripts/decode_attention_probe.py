"""Issue 27, decode: CachedAttention's CUDA decode step (`onnxfuse_cuda_cached_attention`, S = 1) from builds of
cuda/cached_attention.cu alone, side by side on the GPU machine with torch (no onnxruntime): each build's Y checked
against a PyTorch reference (rotary, the new row stored, softmax over the cache), then 32 layers' nodes over their own
KV buffers (past = present, genai's shared buffer) timed as CUDA graphs round-robin, per node. Built here:

    cd onnxfuse/kernels && nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -I. -Icuda -IGENERATED \
        cuda/cached_attention.cu cuda/gemm.cu -o ca.so        (GENERATED: the build's onnxfuse_ops.h folder)

    python scripts/decode_attention_probe.py NAME=LIB.so [NAME=LIB.so ...] [--contexts 128,512,2048]
        [--shapes 1x32x32,1x32x8,8x32x32] [--layers 32] [--rounds 9] [--reps 20] [--off NAME]

--off NAME: that build runs with ONNXFUSE_DECODE_CLUSTERS=0 (the env is read once per loaded copy: pass a copy of the
file under another name to time both forms).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import pathlib
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(1, str(pathlib.Path(__file__).resolve().parents[1]))
from lora_mlp_fold_probe import round_robin  # noqa: E402

from onnxfuse.genai.timing import copy_peak_gbs  # noqa: E402
from onnxfuse.kernels.triton.table import DTYPES as DTYPE_CODES  # noqa: E402  (the launchers' dtype codes)

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DTYPES = {TORCH_DTYPES[name]: code for name, code in DTYPE_CODES}


class Args(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int64) for n in ("B", "S", "H", "Hkv", "D", "P", "L", "R", "positions")] + \
               [("first", ctypes.c_int), ("interleaved", ctypes.c_int), ("scale", ctypes.c_float)]


def load(path: str, off: bool) -> ctypes.CDLL:
    # a private copy: each loaded copy reads ONNXFUSE_DECODE_CLUSTERS at its first call
    tmp = pathlib.Path(tempfile.mkdtemp()) / pathlib.Path(path).name
    shutil.copy(path, tmp)
    lib = ctypes.CDLL(str(tmp))
    lib.onnxfuse_cuda_cached_attention.restype = ctypes.c_int
    lib.onnxfuse_cuda_cached_attention_scratch_bytes.restype = ctypes.c_int64
    lib.probe_off = off
    return lib


def rotate(x, cos, sin, pos):
    half = x.shape[-1] // 2
    c, s = cos[pos].float(), sin[pos].float()
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def reference(q_packed, k_cache, v_cache, cos, sin, n, H, Hkv, D):
    """Y [B, H D] of one decode step: rows 0..n-2 of the caches, the new row at n - 1 (rotated key)."""
    B = q_packed.shape[0]
    row = q_packed.view(B, H + 2 * Hkv, D)
    q = rotate(row[:, :H], cos, sin, n - 1)
    k_new = rotate(row[:, H:H + Hkv], cos, sin, n - 1)
    v_new = row[:, H + Hkv:].float()
    k = k_cache[:, :, :n].float().clone()
    v = v_cache[:, :, :n].float().clone()
    k[:, :, n - 1], v[:, :, n - 1] = k_new, v_new
    G = H // Hkv
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    att = torch.softmax((q.unsqueeze(2) @ k.transpose(-1, -2)) / D ** 0.5, -1)
    return (att @ v).reshape(B, H * D)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libs", nargs="+", help="NAME=PATH")
    ap.add_argument("--contexts", default="128,512,2048")
    ap.add_argument("--shapes", default="1x32x32,1x32x8,8x32x32", help="BxHxHkv,... (D 128)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--L", type=int, default=4096, help="present's rows (genai: max_length)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--off", default="", help="NAME,...: run these with ONNXFUSE_DECODE_CLUSTERS=0")
    ap.add_argument("--dtypes", default="fp16", help="fp16,bf16,fp32 (the first timed, every one checked)")
    args = ap.parse_args(argv)
    off = set(filter(None, args.off.split(",")))
    libs = {}
    for spec in args.libs:
        name, path = spec.split("=", 1)
        libs[name] = load(path, name in off)
    for name, lib in libs.items():
        if hasattr(lib, "probe_max_clusters"):  # scripts/decode_attention_probe.cu's builds
            held = {(c, t): lib.probe_max_clusters(c, t) for t in (128, 256) for c in (1, 2, 4, 8, 16)}
            print(f"{name}: clusters the device holds at once (size/threads): "
                  + ", ".join(f"{c}/{t}: {n}" for (c, t), n in held.items()))
    D, L, R = 128, args.L, 128
    dev = "cuda"
    torch.manual_seed(0)
    rate = copy_peak_gbs() / 1e3  # TB/s: bench genai's memory rate (a 1 GiB device-to-device copy, read + write)
    print(f"copy rate {rate:.3f} TB/s (read + write of 1 GiB, median of 10): a node's KV bytes at that rate below")
    print(f"{torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).multi_processor_count} SMs; "
          f"D {D}, present rows {L}, {args.layers} layers over their own KV buffers (past = present); us a node "
          f"(CUDA graph of {args.layers} nodes, median of {args.rounds} rounds of {args.reps} replays)")
    for dname in args.dtypes.split(","):
        dt = TORCH_DTYPES[dname]
        for shape in args.shapes.split(","):
            B, H, Hkv = (int(x) for x in shape.split("x"))
            nl = args.layers if dname == args.dtypes.split(",")[0] else 2
            kc = [torch.randn(B, Hkv, L, D, device=dev).to(dt) for _ in range(nl)]
            vc = [torch.randn(B, Hkv, L, D, device=dev).to(dt) for _ in range(nl)]
            qs = [torch.randn(B, 1, (H + 2 * Hkv) * D, device=dev).to(dt) for _ in range(nl)]
            ang = torch.arange(L, device=dev)[:, None] / (10000 ** (torch.arange(0, D, 2, device=dev) / D))[None]
            cos, sin = ang.cos().to(dt), ang.sin().to(dt)
            for ctx in (int(c) for c in args.contexts.split(",")):
                a = Args(B=B, S=1, H=H, Hkv=Hkv, D=D, P=L, L=L, R=R, positions=L, first=0, interleaved=0,
                         scale=D ** -0.5)
                seqlens = torch.full((B,), ctx - 1, dtype=torch.int32, device=dev)
                fns = {}
                for name, lib in libs.items():
                    scratch = torch.empty(int(lib.onnxfuse_cuda_cached_attention_scratch_bytes(ctypes.byref(a))),
                                          dtype=torch.uint8, device=dev)
                    ys = [torch.empty(B, 1, H * D, device=dev, dtype=dt) for _ in range(nl)]

                    def call(lib=lib, scratch=scratch, ys=ys, name=name):
                        st = torch.cuda.current_stream().cuda_stream
                        for i in range(nl):
                            p = [ctypes.c_void_p(t.data_ptr()) for t in (qs[i], kc[i], vc[i], seqlens, cos, sin,
                                                                          ys[i], kc[i], vc[i], scratch)]
                            rc = lib.onnxfuse_cuda_cached_attention(DTYPES[dt], ctypes.byref(a), *p,
                                                                    ctypes.c_void_p(st))
                            assert rc == 0, (name, rc)
                        return ys
                    if lib.probe_off:
                        os.environ["ONNXFUSE_DECODE_CLUSTERS"] = "0"
                    call()
                    os.environ.pop("ONNXFUSE_DECODE_CLUSTERS", None)
                    torch.cuda.synchronize()
                    errs = []
                    for i in range(nl):
                        ref = reference(qs[i].view(B, -1), kc[i], vc[i], cos, sin, ctx, H, Hkv, D)
                        errs.append(float((ys[i].view(B, -1).float() - ref).abs().max()))
                    print(f"  {dname} B{B} H{H}/{Hkv} context {ctx:5d} {name:12s} max|Y - torch| {max(errs):.2e}")
                    fns[name] = call
                if dname != args.dtypes.split(",")[0]:
                    continue
                med = round_robin(fns, args.reps, args.rounds)
                base = next(iter(med))
                kv_bytes = 2 * B * Hkv * ctx * D * kc[0].element_size()
                for name, us in med.items():
                    print(f"  {dname} B{B} H{H}/{Hkv} context {ctx:5d} {name:12s} {us / nl:7.2f} us a node (graph)"
                          f"  {med[base] / us:.3f}x {base}  KV {kv_bytes / 1e6:6.2f} MB: "
                          f"{kv_bytes / (us / nl * 1e-6) / 1e12:.2f} TB/s, floor {kv_bytes / rate / 1e6:.2f} us")
                # without a graph: the launches' host time shows
                for name, fn in fns.items():
                    for _ in range(3):
                        fn()
                    torch.cuda.synchronize()
                    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    ev0.record()
                    for _ in range(args.reps):
                        fn()
                    ev1.record()
                    torch.cuda.synchronize()
                    print(f"  {dname} B{B} H{H}/{Hkv} context {ctx:5d} {name:12s} "
                          f"{ev0.elapsed_time(ev1) * 1e3 / args.reps / nl:7.2f} us a node (no graph)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
