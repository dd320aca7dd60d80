"""Issue 27, FlashAttention's main loop (Triton JIT, no onnxruntime): a baseline kernel file's bias and key passes
and flash kernel (default the library's, triton/flash_attention.py; benchmarks/results/h100-2026-11-28/attention/
loop-probes.txt ran it with e8dfa4d's, which computed every K/V/bias element's 64-bit address each tile) against
variants of the loop: K, V and bias pointers advanced a tile a step (32-bit offsets inside a (b, h) slice, the tiles
wholly inside S_kv unmasked and a masked last one), the query blocks with the most key tiles first, TMA descriptors
for K and V, warp_specialize on the loop; tile configs 128 x 64 (8 warps, 3 stages) and 128 x 128 (2 stages). The
variants skip the check of skipped tiles (left padding's wholly masked rows need it: their error shows it). One
Llama-2-7B layer's attention, fp16, 32 heads x 128; masks causal, causal with 100 keys of left padding, a random
bias. A probe, not a test; on the GPU machine (torch and triton, no onnxruntime needed):
    python3 scripts/flash_attention_loop_probe.py [--seqs 2048,4096] [--baseline FILE]
"""

from __future__ import annotations

import argparse
import importlib.util

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

ap = argparse.ArgumentParser()
ap.add_argument("--seqs", default="2048,4096")
ap.add_argument("--baseline", default="onnxfuse/kernels/triton/flash_attention.py")
args = ap.parse_args()
spec = importlib.util.spec_from_file_location("fa_baseline", args.baseline)
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
LOG2E = 1.4426950408889634
triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


@triton.jit
def _step(acc, l_i, m_i, q, k, v, bias, s_ok, qk_scale, DOT_PRECISION: tl.constexpr, TRANS_K: tl.constexpr):
    if TRANS_K:
        s = tl.dot(q, k.T, input_precision=DOT_PRECISION) * qk_scale
    else:
        s = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(s_ok, s + bias.to(tl.float32), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2((m_i - m_safe) * 1.4426950408889634)
    p = tl.math.exp2((s - m_safe[:, None]) * 1.4426950408889634)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def _fa_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    b_ptr,
    y_ptr,
    bmax_ptr,
    S,
    SKV,
    H,
    HD,
    SQB,
    SKB,
    SBS,
    TILES_M,
    TILES_N,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    TMA: tl.constexpr,
    WS: tl.constexpr,
    REVERSE: tl.constexpr,
):
    pid = tl.program_id(0)
    if REVERSE:
        BH = tl.num_programs(0) // TILES_M
        pid_m = TILES_M - 1 - pid // BH
        bh = pid % BH
    else:
        pid_m = pid % TILES_M
        bh = pid // TILES_M
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_K)
    row_ok = offs_m < S
    q_base = q_ptr + b.to(tl.int64) * SQB + h * BLOCK_K
    k_base = k_ptr + b.to(tl.int64) * SKB + h * BLOCK_K
    v_base = v_ptr + b.to(tl.int64) * SKB + h * BLOCK_K
    q = tl.load(q_base + offs_m[:, None] * HD + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    bmax_row = bmax_ptr + pid_m * TILES_N
    lo = TILES_N
    hi = 0
    for c in range(0, TILES_N, 64):
        idx = c + tl.arange(0, 64)
        f = tl.load(bmax_row + idx, mask=idx < TILES_N, other=float("-inf"))
        live = f > -30000.0
        lo = tl.minimum(lo, tl.min(tl.where(live, idx, TILES_N), 0))
        hi = tl.maximum(hi, tl.max(tl.where(live, idx + 1, 0), 0))
    lo = tl.where(hi == 0, 0, lo)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    b_ptrs = b_ptr + offs_m[:, None] * SBS + (lo * BLOCK_N + offs_n)[None, :]
    if TMA:
        desc_k = tl.make_tensor_descriptor(
            k_base, shape=[SKV, BLOCK_K], strides=[HD, 1], block_shape=[BLOCK_N, BLOCK_K]
        )
        desc_v = tl.make_tensor_descriptor(
            v_base, shape=[SKV, BLOCK_K], strides=[HD, 1], block_shape=[BLOCK_N, BLOCK_K]
        )
        for start in tl.range(lo * BLOCK_N, hi * BLOCK_N, BLOCK_N, warp_specialize=WS):
            k = desc_k.load([start, 0])
            v = desc_v.load([start, 0])
            bias = tl.load(b_ptrs)
            acc, l_i, m_i = _step(
                acc, l_i, m_i, q, k, v, bias, (start + offs_n < SKV)[None, :], qk_scale, DOT_PRECISION, True
            )
            b_ptrs += BLOCK_N
    else:
        full_hi = tl.minimum(hi, SKV // BLOCK_N)
        k_ptrs = k_base + (lo * BLOCK_N + offs_n)[None, :] * HD + offs_d[:, None]
        v_ptrs = v_base + (lo * BLOCK_N + offs_n)[:, None] * HD + offs_d[None, :]
        for start in tl.range(lo * BLOCK_N, full_hi * BLOCK_N, BLOCK_N, warp_specialize=WS):
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
            bias = tl.load(b_ptrs)
            acc, l_i, m_i = _step(acc, l_i, m_i, q, k, v, bias, offs_n[None, :] >= 0, qk_scale, DOT_PRECISION, False)
            k_ptrs += BLOCK_N * HD
            v_ptrs += BLOCK_N * HD
            b_ptrs += BLOCK_N
        if hi > full_hi:
            start = tl.maximum(full_hi, lo) * BLOCK_N
            cols = start + offs_n
            k = tl.load(k_base + cols[None, :] * HD + offs_d[:, None], mask=(cols < SKV)[None, :], other=0.0)
            v = tl.load(v_base + cols[:, None] * HD + offs_d[None, :], mask=(cols < SKV)[:, None], other=0.0)
            bias = tl.load(b_ptr + offs_m[:, None] * SBS + cols[None, :])
            acc, l_i, m_i = _step(acc, l_i, m_i, q, k, v, bias, (cols < SKV)[None, :], qk_scale, DOT_PRECISION, False)
    y = acc / l_i[:, None]
    tl.store(
        y_ptr + b.to(tl.int64) * SQB + offs_m[:, None] * HD + h * BLOCK_K + offs_d[None, :],
        y.to(y_ptr.dtype.element_ty),
        mask=row_ok[:, None],
    )


H, D = 32, 128
torch.manual_seed(0)
print(torch.cuda.get_device_name(), "triton", triton.__version__)


def masks(S):
    i = torch.arange(S, device="cuda")[:, None]
    j = torch.arange(S, device="cuda")[None, :]
    yield "causal", torch.where(j > i, -65504.0, 0.0)
    yield "causal+pad100", torch.where((j > i) | (j < 100), -65504.0, 0.0)
    yield "random bias", 0.5 * torch.randn(S, S, device="cuda")


for S in [int(x) for x in args.seqs.split(",")]:
    q, k, v = (torch.randn(1, S, H * D, device="cuda").half() for _ in range(3))
    qh, kh, vh = (t.float().reshape(1, S, H, D).transpose(1, 2) for t in (q, k, v))
    flops = 4 * S * S * D * H / 2
    for mname, b32 in masks(S):
        bias = b32.half().contiguous()
        ref = (
            torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias.float())
            .transpose(1, 2)
            .reshape(1, S, H * D)
        )
        for cfg in ((128, 64, 8, 3), (128, 128, 8, 2)):
            BM, BN, W, ST = cfg
            tm, tn = triton.cdiv(S, BM), triton.cdiv(S, BN)
            bmax = torch.empty(tm * tn, device="cuda")
            kinfo = torch.empty(H * tn, device="cuda")
            pb = torch.empty(tm * BM * tn * BN, device="cuda", dtype=q.dtype)
            y = torch.empty_like(q)
            old._flash_attention_bias_kernel[(tm * tn,)](
                bias, bmax, pb, S, S, 0, 0, S, 1, tm, tn, BLOCK_M=BM, BLOCK_N=BN, num_warps=8
            )
            old._flash_attention_keys_kernel[(H * tn,)](
                k, v, kinfo, S, H, H * D, S * H * D, tn, BLOCK_N=BN, BLOCK_K=D, num_warps=8
            )
            torch.cuda.synchronize()
            sizes = (S, S, H, H * D, S * H * D, S * H * D)
            cfg_kw = dict(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=D, DOT_PRECISION="tf32", num_warps=W, num_stages=ST)
            variants = [("baseline", lambda: old._flash_attention_kernel[(tm * H,)](
                q, k, v, pb, y, kinfo, bmax, *sizes, 0, 0, tn * BN, 0, 0, tm, tn, D**-0.5, **cfg_kw))]
            for name, tma, ws, rev in (("ptr", False, False, False), ("ptr heavy-first", False, False, True),
                                       ("tma", True, False, False), ("ptr ws", False, True, False),
                                       ("tma ws", True, True, False)):
                variants.append((name, lambda tma=tma, ws=ws, rev=rev: _fa_kernel[(tm * H,)](
                    q, k, v, pb, y, bmax, *sizes, tn * BN, tm, tn, D**-0.5, TMA=tma, WS=ws, REVERSE=rev, **cfg_kw)))
            for name, fn in variants:
                try:
                    y.zero_()
                    fn()
                    torch.cuda.synchronize()
                    err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
                    t = do_bench(fn, rep=200) * 1e3
                    print(
                        f"S {S} {mname:14s} {str(cfg):18s} {name:16s} {t:7.1f} us "
                        f"({flops / t / 1e6:4.0f} TFLOP/s causal-equiv) err {err:.1e}",
                        flush=True,
                    )
                except Exception as e:  # noqa
                    print(
                        f"S {S} {mname:14s} {str(cfg):18s} {name:16s} failed: {type(e).__name__}: {str(e)[:150]}",
                        flush=True,
                    )
