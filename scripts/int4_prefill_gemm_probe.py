"""Issue 28, prefill: int4 GEMM forms at prefill rows against cuBLAS fp16 on the same weights dequantized, and the
library's path (dequantize, then cuBLAS), on a Llama-2-7B layer's projections (GPU machine, torch + Triton JIT; no
onnxruntime).

Forms:
- ``lib``: the library's Triton int4 GEMM as it is (X @ W^T with the dequantized W as the dot's B operand);
- ``swap``: the same weight tile as the dot's A operand (Y^T = W X^T: on sm_90 wgmma takes A from registers, so the
  dequantized tile need not go through shared memory), scales per block (BS a constexpr);
- ``split``: ``swap`` without the nibble interleave: each byte's low nibbles (even k) and high nibbles (odd k) as two
  [BLOCK_N, BLOCK_K/2] tiles, each dotted with X's even / odd columns (tl.split of the loaded X tile);
- ``cutlass``: the library's CUTLASS sm90 mixed-input GEMM in five tile configs (scripts/int4_cutlass_probe.cu, which
  includes cuda/cutlass/int4_mixed_gemm.cu; built with nvcc here and carried as a .so; blocks of 64 and more only);
- ``dq+cublas``: the library's path in torch terms (a dequantization kernel, then torch.matmul), and ``cublas``:
  torch.matmul on an already-dequantized W (the fp16 model's GEMM).

    python scripts/int4_prefill_gemm_probe.py OUT.json [--rows 2048] [--blocks 32,128] [--cutlass PROBE.so]
        [--forms lib,swap,split] (--forms none: CUTLASS and cuBLAS only)
"""
from __future__ import annotations

import argparse
import ctypes
import json
import pathlib
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from onnxfuse.kernels.triton.int4_linear import _int4_linear_kernel  # noqa: E402

LAYER = {"qkv": (4096, 12288), "o": (4096, 4096), "gate": (4096, 11008), "down": (11008, 4096)}


@triton.jit
def _dq_interleaved(q, s_ptrs, BS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, T: tl.constexpr):
    lo = (q & 15).to(T)
    hi = (q >> 4).to(T)
    v = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_K)) - 8.0
    s = tl.load(s_ptrs)  # [BLOCK_N, BLOCK_K // BS]
    s = tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_N, BLOCK_K // BS, BS)), (BLOCK_N, BLOCK_K))
    return (v * s).to(T)


@triton.jit
def _swap_kernel(x_ptr, wq_ptr, s_ptr, y_ptr, M, N, K, RB, NB, BS: tl.constexpr, SPLIT: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * num_n
    group = pid // width
    first_m = group * GROUP_M
    gm = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % gm
    pid_n = (pid % width) // gm
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    cols = tl.where(offs_n < N, offs_n, 0).to(tl.int64)
    T = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    x_ptrs = x_ptr + rows[:, None] * K + tl.arange(0, BLOCK_K)[None, :]
    w_ptrs = wq_ptr + cols[:, None] * RB + tl.arange(0, BLOCK_K // 2)[None, :]
    s_ptrs = s_ptr + cols[:, None] * NB + tl.arange(0, BLOCK_K // BS)[None, :]
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        x = tl.load(x_ptrs)
        q = tl.load(w_ptrs)
        if SPLIT:
            s = tl.load(s_ptrs)
            s = tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_N, BLOCK_K // BS, BS // 2)), (BLOCK_N, BLOCK_K // 2))
            lo = (((q & 15).to(T) - 8.0) * s).to(T)
            hi = (((q >> 4).to(T) - 8.0) * s).to(T)
            xe, xo = tl.split(tl.reshape(x, (BLOCK_M, BLOCK_K // 2, 2)))
            acc = tl.dot(lo, tl.trans(xe), acc)
            acc = tl.dot(hi, tl.trans(xo), acc)
        else:
            w = _dq_interleaved(q, s_ptrs, BS, BLOCK_N, BLOCK_K, T)
            acc = tl.dot(w, tl.trans(x), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K // 2
        s_ptrs += BLOCK_K // BS
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(y_ptrs, tl.trans(acc).to(T), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def quantize(k, n, block, gen):
    w = torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5
    wb = w.view(n, k // block, block)
    s = (wb.abs().amax(-1) / 7).clamp_min(1e-8)
    q = (torch.round(wb / s[..., None]) + 8).clamp(0, 15).to(torch.uint8).view(n, k)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
    return packed, s.half().contiguous()


def dequant(packed, s, block):
    n = packed.shape[0]
    q = torch.stack([packed & 15, packed >> 4], -1).view(n, -1).half() - 8
    return (q.view(n, -1, block) * s[..., None]).view(n, -1)


def time_us(fn, reps=30, rounds=5):
    fn()
    torch.cuda.synchronize()
    meds = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        torch.cuda.synchronize()
        meds.append(a.elapsed_time(b) * 1000 / reps)
    return statistics.median(meds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rows", default="2048")
    ap.add_argument("--blocks", default="32,128")
    ap.add_argument("--cutlass", default=None)
    ap.add_argument("--forms", default="lib,swap,split")
    a = ap.parse_args()
    forms = [f for f in a.forms.split(",") if f in ("lib", "swap", "split")]
    gen = torch.Generator(device="cuda").manual_seed(0)
    lib = ctypes.CDLL(a.cutlass) if a.cutlass else None
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    results = []
    configs = [(128, 128, 64, 8, 3, 8), (128, 256, 64, 8, 3, 8), (64, 256, 64, 8, 4, 4), (128, 128, 128, 8, 3, 8),
               (256, 128, 64, 8, 3, 8), (128, 256, 128, 8, 3, 8), (64, 256, 128, 8, 4, 4)]
    for m in [int(r) for r in a.rows.split(",")]:
        for block in [int(b) for b in a.blocks.split(",")]:
            for name, (k, n) in LAYER.items():
                x = torch.randn(m, k, generator=gen, device="cuda").half()
                packed, s = quantize(k, n, block, gen)
                w = dequant(packed, s, block)
                ref = x.float() @ w.float().T
                row = {"rows": m, "block": block, "proj": name, "k": k, "n": n}
                row["cublas"] = time_us(lambda: x @ w.T)
                row["dq+cublas"] = time_us(lambda: x @ dequant(packed, s, block).T)
                y = torch.empty(m, n, dtype=torch.float16, device="cuda")

                def err():
                    return float((y.float() - ref).abs().max() / ref.abs().max())
                best = {}
                for form in forms:
                    for bm, bn, bk, gm, stages, warps in configs:
                        if form == "lib":
                            grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))

                            def run(bm=bm, bn=bn, bk=bk, gm=gm, st=stages, wp=warps, grid=grid):
                                _int4_linear_kernel[(grid[0] * grid[1],)](
                                    x, packed, s, packed, y, m, n, k, k // 2, k // block, block, ZP=False,
                                    BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, DOT_PRECISION="ieee",
                                    num_stages=st, num_warps=wp)
                        else:
                            if bk % block:  # a K tile of whole blocks
                                continue
                            grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)

                            def run(bm=bm, bn=bn, bk=bk, gm=gm, st=stages, wp=warps, grid=grid, form=form):
                                _swap_kernel[grid](x, packed, s, y, m, n, k, k // 2, k // block, BS=block,
                                                   SPLIT=form == "split", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                                   GROUP_M=gm, num_stages=st, num_warps=wp)
                        try:
                            y.zero_()
                            run()
                            torch.cuda.synchronize()
                            e = err()
                            t = time_us(run)
                        except Exception as ex:  # a config Triton cannot compile (shared memory) is skipped
                            print(form, (bm, bn, bk, stages, warps), "failed:", str(ex).splitlines()[0][:120])
                            continue
                        key = f"{form} {bm}x{bn}x{bk} s{stages} w{warps}"
                        row[key] = t
                        row[key + " err"] = e
                        if e < 2e-2 and (form not in best or t < best[form][0]):
                            best[form] = (t, key)
                if lib is not None and block >= 64 and k % 64 == 0:
                    st = torch.empty(k // block, n, dtype=torch.float16, device="cuda")
                    zt = torch.empty_like(st)
                    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

                    def prep():
                        lib.probe_scale_zero(ctypes.c_void_p(s.data_ptr()), ctypes.c_void_p(st.data_ptr()),
                                             ctypes.c_void_p(zt.data_ptr()), n, k // block, stream)
                    for cfg in range(5):
                        def run(cfg=cfg):
                            rc = lib.probe_gemm(cfg, ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(packed.data_ptr()),
                                                ctypes.c_void_p(st.data_ptr()), ctypes.c_void_p(zt.data_ptr()),
                                                ctypes.c_void_p(y.data_ptr()), m, n, k, block,
                                                ctypes.c_void_p(ws.data_ptr()), ctypes.c_size_t(ws.numel()), stream)
                            if rc:
                                raise RuntimeError(f"cutlass config {cfg}: {rc}")
                        try:
                            prep()
                            y.zero_()
                            run()
                            torch.cuda.synchronize()
                            e = err()
                            t = time_us(run)
                            tp = time_us(lambda: (prep(), run()))
                        except Exception as ex:
                            print("cutlass", cfg, "failed:", ex)
                            continue
                        row[f"cutlass {cfg}"] = t
                        row[f"cutlass {cfg} +prep"] = tp
                        row[f"cutlass {cfg} err"] = e
                        if e < 2e-2 and ("cutlass" not in best or tp < best["cutlass"][0]):
                            best["cutlass"] = (tp, f"cutlass {cfg}")
                row["best"] = best
                results.append(row)
                summary = "  ".join(f"{f} {v[0]:.1f} ({v[1]})" for f, v in best.items())
                print(f"M={m} block={block} {name:5s} cublas {row['cublas']:.1f} dq+cublas {row['dq+cublas']:.1f}  "
                      f"{summary}", flush=True)
    dev = torch.cuda.get_device_name()
    pathlib.Path(a.out).write_text(json.dumps({"device": dev, "torch": torch.__version__,
                                               "triton": triton.__version__, "results": results}, indent=1))


if __name__ == "__main__":
    main()
