"""Issue 27, the synthetic llama-7b layer's attention: Triton flash-attention forwards that take the graph's additive
bias as it is and skip key tiles it masks, with a fallback for a block of query rows whose every key seen so far is
masked (a row of left padding: its softmax in the reference spreads over every key), which then goes on over the
skipped tiles too. Three forms: causal-skip (the tiles wholly above the diagonal, as a causal mask would allow;
heavy blocks first or not), bias tiles coded (a pass codes each bias tile zero / masked / mixed, the loop branches per
tile: no software pipelining), and the live key range (the same codes give each query block one range of key tiles,
one pipelined loop). The skip is exact only for finite K and V and scores far below the mask value's magnitude (a
NaN or Inf key or value in a skipped tile reaches the reference's output, and a score near 65504 lets a masked term
count): the op this probes for needs a pass that checks those per key tile (see the results file's notes).

Against onnxruntime's MultiHeadAttention on the same inputs (com.microsoft, what onnxscript's optimize_for_ort makes of
the exported SDPA; cuDNN's flash kernel with the bias), plain and told it is causal (unidirectional=1), and torch's
SDPA in fp32 as the reference. One layer of Llama-2-7B (32 heads of 128), fp16, 1 x S tokens; masks: the bench's
(causal and the attention_mask input's key padding; the bench's input keeps key 0 only), no padding, and left padding
of 100 keys (rows 0-99 wholly masked: the fallback). Timed with CUDA graphs, round-robin, medians of rounds. A probe,
not a test; on the GPU machine with onnxruntime-gpu first on PYTHONPATH:
    python3 scripts/flash_attention_probe.py [--seq 2048] [--rounds 7] [--reps 100]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _flash_attention_kernel(q_ptr, k_ptr, v_ptr, b_ptr, y_ptr, S, SKV, H, SQB, SQS, SKB, SKS, SBB, SBH, SBS, SYB, SYS,
                            qk_scale, CAUSAL, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                            REVERSE: tl.constexpr = False):
    pid_m = tl.program_id(0)
    if REVERSE:  # the blocks with the most key tiles first (a causal grid's last wave then holds short blocks)
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = q_ptr + b.to(tl.int64) * SQB + h * HEAD_DIM
    k_base = k_ptr + b.to(tl.int64) * SKB + h * HEAD_DIM
    v_base = v_ptr + b.to(tl.int64) * SKB + h * HEAD_DIM
    b_base = b_ptr + b.to(tl.int64) * SBB + h.to(tl.int64) * SBH
    row_ok = offs_m < S
    q = tl.load(q_base + offs_m[:, None].to(tl.int64) * SQS + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    # keys a causal block needs: j <= i + (SKV - S) for its last row
    hi = SKV
    if CAUSAL:
        hi = tl.minimum(SKV, (pid_m + 1) * BLOCK_M + (SKV - S))
    for start in range(0, hi, BLOCK_N):
        cols = start + offs_n
        col_ok = cols < SKV
        k = tl.load(k_base + cols[None, :].to(tl.int64) * SKS + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        s = tl.dot(q, k) * qk_scale
        bias = tl.load(b_base + offs_m[:, None].to(tl.int64) * SBS + cols[None, :],
                       mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        s = tl.where(col_ok[None, :], s + bias * 1.4426950408889634, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None].to(tl.int64) * SKS + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if CAUSAL:
        # a row whose every key so far is masked (max below -1000, natural units): the skipped keys count for it
        # in the reference (a softmax over its masked scores), so the block takes them too
        if tl.min(tl.where(row_ok, m_i, 0.0)) < -1442.6950408889634:
            for start in range(hi, SKV, BLOCK_N):
                cols = start + offs_n
                col_ok = cols < SKV
                k = tl.load(k_base + cols[None, :].to(tl.int64) * SKS + offs_d[:, None], mask=col_ok[None, :],
                            other=0.0)
                s = tl.dot(q, k) * qk_scale
                bias = tl.load(b_base + offs_m[:, None].to(tl.int64) * SBS + cols[None, :],
                               mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
                s = tl.where(col_ok[None, :], s + bias * 1.4426950408889634, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                alpha = tl.math.exp2(m_i - m_new)
                p = tl.math.exp2(s - m_new[:, None])
                l_i = l_i * alpha + tl.sum(p, 1)
                v = tl.load(v_base + cols[:, None].to(tl.int64) * SKS + offs_d[None, :], mask=col_ok[:, None],
                            other=0.0)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
    y = acc / l_i[:, None]
    tl.store(y_ptr + b.to(tl.int64) * SYB + offs_m[:, None].to(tl.int64) * SYS + h * HEAD_DIM + offs_d[None, :],
             y.to(y_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _bias_tiles_kernel(b_ptr, f_ptr, S, SKV, SBB, SBH, SBS, NH, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Each BLOCK_M x BLOCK_N tile of the bias (per broadcast batch x head plane): 0 all zero, 1 all <= -30000 (its
    keys add exactly nothing to a row that has a key above -1000), 2 otherwise. f: [planes, tiles_m, tiles_n] int8."""
    tm = tl.program_id(0)
    tn = tl.program_id(1)
    plane = tl.program_id(2)
    rows = tm * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = (rows < S)[:, None] & (cols < SKV)[None, :]
    pb = plane // NH
    ph = plane % NH
    x = tl.load(b_ptr + pb.to(tl.int64) * SBB + ph.to(tl.int64) * SBH + rows[:, None].to(tl.int64) * SBS
                + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    hi = tl.max(tl.max(tl.where(ok, x, float("-inf")), 1), 0)
    lo = tl.min(tl.min(tl.where(ok, x, float("inf")), 1), 0)
    code = tl.where((hi == 0.0) & (lo == 0.0), 0, tl.where(hi <= -30000.0, 1, 2))
    tl.store(f_ptr + (plane * tl.num_programs(0) + tm) * tl.num_programs(1) + tn, code.to(tl.int8))


@triton.jit
def _tile_step(q, k_base, v_base, b_base, offs_m, row_ok, start, SKV, SKS, SBS, qk_scale, m_i, l_i, acc, code,
               BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    cols = start + offs_n
    col_ok = cols < SKV
    k = tl.load(k_base + cols[None, :].to(tl.int64) * SKS + offs_d[:, None], mask=col_ok[None, :], other=0.0)
    s = tl.dot(q, k) * qk_scale
    if code != 0:
        bias = tl.load(b_base + offs_m[:, None].to(tl.int64) * SBS + cols[None, :],
                       mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        s = s + bias * 1.4426950408889634
    s = tl.where(col_ok[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_base + cols[:, None].to(tl.int64) * SKS + offs_d[None, :], mask=col_ok[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _flash_tiles_kernel(q_ptr, k_ptr, v_ptr, b_ptr, f_ptr, y_ptr, S, SKV, H, SQB, SQS, SKB, SKS, SBB, SBH, SBS, SYB,
                        SYS, FB, FH, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        HEAD_DIM: tl.constexpr):
    """As _flash_attention_kernel with the bias tiles' codes (_bias_tiles_kernel, BLOCK_M x BLOCK_N tiles): tiles
    coded 1 are skipped (then taken after all if a row of the block has no key above -1000), coded 0 add no bias."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = q_ptr + b.to(tl.int64) * SQB + h * HEAD_DIM
    k_base = k_ptr + b.to(tl.int64) * SKB + h * HEAD_DIM
    v_base = v_ptr + b.to(tl.int64) * SKB + h * HEAD_DIM
    b_base = b_ptr + b.to(tl.int64) * SBB + h.to(tl.int64) * SBH
    tiles_n = tl.cdiv(SKV, BLOCK_N)
    f_base = f_ptr + ((b * FB + h * FH) * tl.num_programs(0) + pid_m) * tiles_n
    row_ok = offs_m < S
    q = tl.load(q_base + offs_m[:, None].to(tl.int64) * SQS + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for t in range(0, tiles_n):
        code = tl.load(f_base + t)
        if code != 1:
            m_i, l_i, acc = _tile_step(q, k_base, v_base, b_base, offs_m, row_ok, t * BLOCK_N, SKV, SKS, SBS,
                                       qk_scale, m_i, l_i, acc, code, BLOCK_N, HEAD_DIM)
    if tl.min(tl.where(row_ok, m_i, 0.0)) < -1442.6950408889634:
        for t in range(0, tiles_n):
            code = tl.load(f_base + t)
            if code == 1:
                m_i, l_i, acc = _tile_step(q, k_base, v_base, b_base, offs_m, row_ok, t * BLOCK_N, SKV, SKS, SBS,
                                           qk_scale, m_i, l_i, acc, code, BLOCK_N, HEAD_DIM)
    y = acc / l_i[:, None]
    tl.store(y_ptr + b.to(tl.int64) * SYB + offs_m[:, None].to(tl.int64) * SYS + h * HEAD_DIM + offs_d[None, :],
             y.to(y_ptr.dtype.element_ty), mask=row_ok[:, None])


def flash_tiles(q, k, v, bias, heads, block_m=128, block_n=64, warps=8, stages=3, flags=None):
    B, S, hidden = q.shape
    SKV = k.shape[1]
    d = hidden // heads
    y = torch.empty_like(q)
    bb, bhh = bias.shape[0], bias.shape[1]
    sbb = bias.stride(0) if bb > 1 else 0
    sbh = bias.stride(1) if bhh > 1 else 0
    tm, tn = triton.cdiv(S, block_m), triton.cdiv(SKV, block_n)
    if flags is None:
        flags = torch.empty(bb * bhh * tm * tn, dtype=torch.int8, device=q.device)
    _bias_tiles_kernel[(tm, tn, bb * bhh)](bias, flags, S, SKV, sbb, sbh, bias.stride(2), bhh, BLOCK_M=block_m,
                                           BLOCK_N=block_n, num_warps=4)
    _flash_tiles_kernel[(tm, B * heads)](q, k, v, bias, flags, y, S, SKV, heads, q.stride(0), q.stride(1),
                                         k.stride(0), k.stride(1), sbb, sbh, bias.stride(2), y.stride(0),
                                         y.stride(1), bhh if bb > 1 else 0, 1 if bhh > 1 else 0, LOG2E / d ** 0.5,
                                         BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=d, num_warps=warps,
                                         num_stages=stages)
    return y


@triton.jit
def _flash_range_kernel(q_ptr, k_ptr, v_ptr, b_ptr, r_ptr, y_ptr, S, SKV, H, SQB, SQS, SKB, SKS, SBB, SBH, SBS, SYB,
                        SYS, FB, FH, qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        HEAD_DIM: tl.constexpr, REVERSE: tl.constexpr, MAX_TILES: tl.constexpr = 64):
    pid_m = tl.program_id(0)
    if REVERSE:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    q_base = q_ptr + b.to(tl.int64) * SQB + h * HEAD_DIM
    k_base = k_ptr + b.to(tl.int64) * SKB + h * HEAD_DIM
    v_base = v_ptr + b.to(tl.int64) * SKB + h * HEAD_DIM
    b_base = b_ptr + b.to(tl.int64) * SBB + h.to(tl.int64) * SBH
    tiles_n = tl.cdiv(SKV, BLOCK_N)
    # the live key range from the tile codes of _bias_tiles_kernel (r_ptr: int8 [planes, tiles_m, tiles_n])
    f_base = r_ptr + ((b * FB + h * FH) * tl.num_programs(0) + pid_m) * tiles_n
    idx = tl.arange(0, MAX_TILES)
    f = tl.load(f_base + idx, mask=idx < tiles_n, other=1)
    live = f != 1
    lo = tl.min(tl.where(live, idx, tiles_n), 0)
    hi = tl.max(tl.where(live, idx + 1, 0), 0)
    lo = tl.where(hi == 0, 0, lo)
    row_ok = offs_m < S
    q = tl.load(q_base + offs_m[:, None].to(tl.int64) * SQS + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(lo * BLOCK_N, hi * BLOCK_N, BLOCK_N):
        cols = start + offs_n
        col_ok = cols < SKV
        k = tl.load(k_base + cols[None, :].to(tl.int64) * SKS + offs_d[:, None], mask=col_ok[None, :], other=0.0)
        s = tl.dot(q, k) * qk_scale
        bias = tl.load(b_base + offs_m[:, None].to(tl.int64) * SBS + cols[None, :],
                       mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        s = tl.where(col_ok[None, :], s + bias * 1.4426950408889634, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + cols[:, None].to(tl.int64) * SKS + offs_d[None, :], mask=col_ok[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if tl.min(tl.where(row_ok, m_i, 0.0)) < -1442.6950408889634:
        for t in range(0, tiles_n):
            if (t < lo) | (t >= hi):
                m_i, l_i, acc = _tile_step(q, k_base, v_base, b_base, offs_m, row_ok, t * BLOCK_N, SKV, SKS, SBS,
                                           qk_scale, m_i, l_i, acc, 2, BLOCK_N, HEAD_DIM)
    y = acc / l_i[:, None]
    tl.store(y_ptr + b.to(tl.int64) * SYB + offs_m[:, None].to(tl.int64) * SYS + h * HEAD_DIM + offs_d[None, :],
             y.to(y_ptr.dtype.element_ty), mask=row_ok[:, None])


def flash_range(q, k, v, bias, heads, block_m=128, block_n=64, warps=8, stages=3, reverse=True, ranges=None):
    B, S, hidden = q.shape
    SKV = k.shape[1]
    d = hidden // heads
    y = torch.empty_like(q)
    bb, bhh = bias.shape[0], bias.shape[1]
    sbb = bias.stride(0) if bb > 1 else 0
    sbh = bias.stride(1) if bhh > 1 else 0
    tm, tn = triton.cdiv(S, block_m), triton.cdiv(SKV, block_n)
    if ranges is None:
        ranges = torch.empty(bb * bhh * tm * tn, dtype=torch.int8, device=q.device)
    _bias_tiles_kernel[(tm, tn, bb * bhh)](bias, ranges, S, SKV, sbb, sbh, bias.stride(2), bhh, BLOCK_M=block_m,
                                           BLOCK_N=block_n, num_warps=4)
    _flash_range_kernel[(tm, B * heads)](q, k, v, bias, ranges, y, S, SKV, heads, q.stride(0), q.stride(1),
                                         k.stride(0), k.stride(1), sbb, sbh, bias.stride(2), y.stride(0),
                                         y.stride(1), bhh if bb > 1 else 0, 1 if bhh > 1 else 0, LOG2E / d ** 0.5,
                                         BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=d, REVERSE=reverse,
                                         num_warps=warps, num_stages=stages)
    return y


def flash(q, k, v, bias, heads, causal, block_m=128, block_n=64, warps=8, stages=3, reverse=False):
    B, S, hidden = q.shape
    SKV = k.shape[1]
    d = hidden // heads
    y = torch.empty_like(q)
    sbb = bias.stride(0) if bias.shape[0] > 1 else 0
    sbh = bias.stride(1) if bias.shape[1] > 1 else 0
    grid = (triton.cdiv(S, block_m), B * heads)
    _flash_attention_kernel[grid](q, k, v, bias, y, S, SKV, heads, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                                  sbb, sbh, bias.stride(2), y.stride(0), y.stride(1), LOG2E / d ** 0.5, int(causal),
                                  BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=d, num_warps=warps, num_stages=stages,
                                  REVERSE=reverse)
    return y


def mha_session(seq, hidden, heads, uni):
    """onnxruntime's MultiHeadAttention (scripts/mha_causal_probe.py's one-node model) under its CUDA graph."""
    import onnxruntime as ort
    from mha_causal_probe import mha_model
    return ort.InferenceSession(mha_model(seq, hidden, heads, uni),
                                providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--ort", type=int, default=1, help="0: without onnxruntime's rows")
    ap.add_argument("--configs", default="128,64,8,3;128,64,8,2;128,64,4,3;64,64,4,3;128,32,4,3")
    a = ap.parse_args()
    seq, hidden, heads = a.seq, 4096, 32
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, seq, hidden, generator=g).half().cuda() for _ in range(3))
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    masks = {"bench (causal, key 0 only)": torch.tril(torch.ones(1, seq))[0] > 0,
             "causal, no padding": torch.ones(seq) > 0,
             "causal, 100 keys of left padding": torch.arange(seq) >= 100}
    configs = [tuple(int(x) for x in c.split(",")) for c in a.configs.split(";")]
    flops_causal = 4 * seq * seq * hidden / 2
    print(f"{torch.cuda.get_device_name()}, seq {seq}, {heads} heads x {hidden // heads}, fp16; causal FLOPs "
          f"{flops_causal / 1e9:.1f} G")
    for mask_name, keep in masks.items():
        allowed = causal & keep[None, :]
        bias = torch.where(allowed, 0.0, -65504.0).half().reshape(1, 1, seq, seq).cuda()
        qh, kh, vh = (t.float().reshape(1, seq, heads, -1).transpose(1, 2) for t in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=bias.float())
        ref = ref.transpose(1, 2).reshape(1, seq, hidden)
        fns = {}
        for uni in ((0, 1) if a.ort else ()):
            s = mha_session(seq, hidden, heads, uni)
            y = torch.empty_like(q)
            bnd = s.io_binding()
            for n, t in {"q": q, "k": k, "v": v, "bias": bias}.items():
                bnd.bind_input(n, "cuda", 0, np.float16, list(t.shape), t.data_ptr())
            bnd.bind_output("y", "cuda", 0, np.float16, list(y.shape), y.data_ptr())
            fns[f"onnxruntime MHA unidirectional={uni}"] = (lambda s=s, bnd=bnd: s.run_with_iobinding(bnd), y)
        for c in configs:
            out = torch.empty_like(q)

            def run(c=c, out=out):
                out.copy_(flash(q, k, v, bias, heads, True, *c))
            fns[f"triton flash causal-skip {c}"] = (run, out)
        for c in configs[:3]:
            out = torch.empty_like(q)
            rg = torch.empty(triton.cdiv(seq, c[0]) * triton.cdiv(seq, c[1]), dtype=torch.int8, device="cuda")

            def run_r(c=c, out=out, rg=rg):
                out.copy_(flash_range(q, k, v, bias, heads, *c, ranges=rg))
            fns[f"triton flash, live key range, heavy first {c}"] = (run_r, out)
            out2 = torch.empty_like(q)

            def run_rev(c=c, out2=out2):
                out2.copy_(flash(q, k, v, bias, heads, True, *c, reverse=True))
            fns[f"triton flash causal-skip, heavy first {c}"] = (run_rev, out2)
        fl0 = torch.empty(triton.cdiv(seq, configs[0][0]) * triton.cdiv(seq, configs[0][1]), dtype=torch.int8,
                          device="cuda")

        def classify(fl0=fl0):
            _bias_tiles_kernel[(triton.cdiv(seq, configs[0][0]), triton.cdiv(seq, configs[0][1]), 1)](
                bias, fl0, seq, seq, 0, 0, bias.stride(2), 1, BLOCK_M=configs[0][0], BLOCK_N=configs[0][1],
                num_warps=4)
        fns["bias tile codes alone " + str(configs[0][:2])] = (classify, ref.half())
        out0 = torch.empty_like(q)
        fns["triton flash no skip " + str(configs[0])] = (lambda: out0.copy_(flash(q, k, v, bias, heads, False,
                                                                                   *configs[0])), out0)
        graphs = {}
        for n, (fn, y) in list(fns.items()):
            try:
                fn()
            except triton.runtime.errors.OutOfResources as e:
                print(f"  {n}: {e}")
                del fns[n]
                continue
            for _ in range(2):
                fn()
            torch.cuda.synchronize()
            if n.startswith("triton"):
                gr = torch.cuda.CUDAGraph()
                with torch.cuda.graph(gr):
                    for _ in range(a.reps):
                        fn()
                graphs[n] = lambda gr=gr: gr.replay()
            else:
                graphs[n] = lambda fn=fn: [fn() for _ in range(a.reps)]
        ts = {n: [] for n in fns}
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(a.rounds):
            for n, gfn in graphs.items():
                e0.record()
                gfn()
                e1.record()
                torch.cuda.synchronize()
                ts[n].append(e0.elapsed_time(e1) * 1e3 / a.reps)
        print(f"\n{mask_name}:")
        for n, (fn, y) in fns.items():
            fn()
            torch.cuda.synchronize()
            err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
            med = float(np.median(ts[n]))
            print(f"  {n:50s} {med:8.1f} us  {flops_causal / med / 1e6:6.0f} TFLOP/s (causal)  err {err:.1e}"
                  f"  nan {bool(torch.isnan(y).any())}")


if __name__ == "__main__":
    main()
