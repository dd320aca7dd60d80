"""GPU probe: does a TMA (tensor-descriptor) main loop close the gap between the Triton GEMM and cuBLAS on Hopper?

JIT-compiles GEMM variants of the shape of the LoRA / linear benchmark (fp16, x [M, K] @ w [K, N], row-major) and
times them with triton.testing.do_bench against torch.matmul (cuBLAS): by default standalone TMA kernels (plain and
persistent, with and without warp specialisation) and onnxfuse's _linear_act_kernel on the cp.async loop; --real
onnxfuse's linear_act and lora_main with TMA off and on (and swiglu) on the bench shapes; --lora lora_main's rank-r
term before or after the K loop, flattened or not. Run on the GPU machine:
python3 scripts/tma_probe.py [--real | --lora] [--out FILE]. Prints (and writes) JSON lines. The numbers behind
triton/table.py's TMA_* choice: benchmarks/results/h100-2026-11-23/tma-probe/.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import triton
import triton.language as tl


def _gemm_loop():
    """triton/gemm_loop.py, as aot.py's loader imports it (the kernel files' private package)."""
    sys.path.insert(0, ".")
    from onnxfuse import tune
    tune._aot()._load_kernels()
    return sys.modules["_onnxfuse_triton_kernels.gemm_loop"]


_gl = _gemm_loop()
_tma_descs, _tile_of, _store_tile = _gl._tma_descs, _gl._tile_of, _gl._store_tile


def _time_one(record_row, name, fn, y, want, flops=None):
    """Run fn once, check y against want (max error over max |want|), time it with do_bench; one JSON row."""
    try:
        fn()
        torch.cuda.synchronize()
        err = ((y.float() - want).abs().max() / want.abs().max()).item()
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
        row = {"variant": name, "us": round(ms * 1000, 2), "rel_err": err}
        if flops:
            row["tflops"] = round(flops / ms / 1e9, 1)
    except Exception as e:  # noqa: BLE001 - a probe: report and go on
        row = {"variant": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    record_row(row)


@triton.jit
def _tma_gemm(x_ptr, w_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GM: tl.constexpr,
              STAGES: tl.constexpr, WS: tl.constexpr):
    pid_m, pid_n = _tile_of(tl.program_id(0), M, N, BM, BN, GM)
    xd = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    wd = tl.make_tensor_descriptor(w_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    yd = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in tl.range(0, tl.cdiv(K, BK), num_stages=STAGES, warp_specialize=WS):
        a = xd.load([pid_m * BM, kb * BK])
        b = wd.load([kb * BK, pid_n * BN])
        acc = tl.dot(a, b, acc)
    yd.store([pid_m * BM, pid_n * BN], acc.to(y_ptr.dtype.element_ty))


@triton.jit
def _tma_persistent(x_ptr, w_ptr, y_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    GM: tl.constexpr, STAGES: tl.constexpr, WS: tl.constexpr, NUM_SMS: tl.constexpr,
                    FLATTEN: tl.constexpr):
    xd = tl.make_tensor_descriptor(x_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    wd = tl.make_tensor_descriptor(w_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    yd = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    num_tiles = tl.cdiv(M, BM) * tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    for tile in tl.range(tl.program_id(0), num_tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WS):
        pid_m, pid_n = _tile_of(tile, M, N, BM, BN, GM)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kb in range(k_tiles):
            a = xd.load([pid_m * BM, kb * BK])
            b = wd.load([kb * BK, pid_n * BN])
            acc = tl.dot(a, b, acc)
        yd.store([pid_m * BM, pid_n * BN], acc.to(y_ptr.dtype.element_ty))



@triton.jit
def _lora_tma(x_ptr, w_ptr, t_ptr, b_ptr, bias_ptr, y_ptr, M, N, K, R, scale, NPROG, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, R_PAD: tl.constexpr,
              MODE: tl.constexpr, FLAT: tl.constexpr):
    """MODE 0: rank-r dot after the K loop; 1: before it (acc starts as T @ B); 2: no rank-r term (base GEMM)."""
    xd, wd = _tma_descs(x_ptr, w_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
    offs_r = tl.arange(0, R_PAD)
    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), NPROG, flatten=FLAT):
        pid_m, pid_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if MODE == 1:
            t = tl.load(t_ptr + rows[:, None] * R_PAD + offs_r[None, :])
            b = tl.load(b_ptr + offs_r[:, None] * N + offs_n[None, :], mask=(offs_r < R)[:, None] & n_ok[None, :],
                        other=0.0)
            acc = tl.dot((t * scale).to(b.dtype), b, acc)
        for kb in range(0, tl.cdiv(K, BLOCK_K)):
            acc = tl.dot(xd.load([pid_m * BLOCK_M, kb * BLOCK_K]), wd.load([kb * BLOCK_K, pid_n * BLOCK_N]), acc)
        if MODE == 0:
            t = tl.load(t_ptr + rows[:, None] * R_PAD + offs_r[None, :])
            b = tl.load(b_ptr + offs_r[:, None] * N + offs_n[None, :], mask=(offs_r < R)[:, None] & n_ok[None, :],
                        other=0.0)
            acc = tl.dot((t * scale).to(b.dtype), b, acc)
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        _store_tile(y_ptr, N, tl.maximum(acc, 0.0), offs_m, offs_m < M, offs_n, n_ok)


def lora_variants(record_row, sms):
    """lora_main's TMA build and where its rank-r term goes (probe kernel _lora_tma) against torch.matmul."""
    from onnxfuse import tune
    M, K, N, r = 2048, 4096, 4096, 16
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.float16
    x = torch.randn(M, K, device="cuda", dtype=dt, generator=g)
    w = torch.randn(K, N, device="cuda", dtype=dt, generator=g) / 64
    t = torch.randn(M, r, device="cuda", dtype=torch.float32, generator=g)
    b = torch.randn(r, N, device="cuda", dtype=dt, generator=g) / 4
    bias = torch.randn(N, device="cuda", dtype=dt, generator=g)
    y = torch.empty(M, N, device="cuda", dtype=dt)
    ref = torch.relu(x.float() @ w.float() + bias.float() + (t * 0.5).to(dt).float() @ b.float())
    ref_base = torch.relu(x.float() @ w.float() + bias.float())
    kmain = tune._aot()._load_kernels()["lora_main"][0]

    def timed(name, fn, want):
        _time_one(record_row, name, fn, y, want)

    timed("torch.matmul", lambda: torch.matmul(x, w, out=y), x.float() @ w.float())
    for cfg in ((128, 256, 64, 8, 8, 3),):
        bm, bn, bk, gm, nw, st = cfg
        tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
        for tma in (False, True):
            for nprog in ((tiles,) if not tma else (min(tiles, sms), tiles)):
                timed(f"lora_main tma={int(tma)} nprog={nprog}",
                      lambda: kmain[(nprog,)](x, w, t[None], b, bias, y, M, N, K, r, 1, 0.5, 1, nprog, BLOCK_M=bm,
                                             BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, R_PAD=16, DOT_PRECISION="tf32",
                                             TMA=tma, num_warps=nw, num_stages=st), ref)
        for mode in (0, 1, 2):
            for flat in (True, False):
                for nprog in (min(tiles, sms), tiles):
                    timed(f"probe mode={mode} flat={int(flat)} nprog={nprog}",
                          lambda: _lora_tma[(nprog,)](x, w, t, b, bias, y, M, N, K, r, 0.5, nprog, BLOCK_M=bm,
                                                     BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, R_PAD=16, MODE=mode,
                                                     FLAT=flat, num_warps=nw, num_stages=st),
                          ref if mode != 2 else ref_base)
    timed("torch.matmul (again)", lambda: torch.matmul(x, w, out=y), x.float() @ w.float())



def real_kernels(record_row, sms):
    """onnxfuse's own kernels (triton/*.py through aot's loader) with TMA off (cp.async loop, one tile per program)
    and on (persistent, min(tiles, SMs) programs), on the bench shapes."""
    from onnxfuse import tune
    kernels = tune._aot()._load_kernels()
    dt = torch.float16
    g = torch.Generator(device="cuda").manual_seed(1)

    def timed(name, fn, y, ref, flops):
        _time_one(record_row, name, fn, y, ref, flops)

    for M, K, N in ((2048, 4096, 4096), (4096, 4096, 4096), (2048, 4096, 11008), (8192, 512, 512)):
        x = torch.randn(M, K, device="cuda", dtype=dt, generator=g)
        w = (torch.randn(K, N, device="cuda", dtype=dt, generator=g) / 64)
        bias = torch.randn(N, device="cuda", dtype=dt, generator=g)
        y = torch.empty(M, N, device="cuda", dtype=dt)
        ref = torch.relu(x.float() @ w.float() + bias.float())
        fl = 2 * M * N * K
        timed(f"torch.matmul {M}x{K}x{N}", lambda: torch.matmul(x, w, out=y), y, x.float() @ w.float(), fl)
        for cfg in ((128, 256, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (128, 256, 64, 8, 8, 2)):
            bm, bn, bk, gm, nw, st = cfg
            tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
            for tma in (False, True):
                nprog = min(tiles, sms) if tma else tiles
                timed(f"linear_act {M}x{K}x{N} tma={int(tma)} {cfg}",
                      lambda: kernels["linear_act"][0][(nprog,)](x, w, bias, y, M, N, K, 1, nprog, BLOCK_M=bm,
                                                                BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm,
                                                                DOT_PRECISION="tf32", TMA=tma, num_warps=nw,
                                                                num_stages=st), y, ref, fl)
        if N == 4096:
            r = 16
            t = torch.randn(1, M, r, device="cuda", dtype=torch.float32, generator=g)
            b = torch.randn(r, N, device="cuda", dtype=dt, generator=g) / 4
            ref2 = torch.relu(x.float() @ w.float() + bias.float() + (t[0] * 0.5).to(dt).float() @ b.float())
            for cfg in ((128, 256, 64, 8, 8, 3),):
                bm, bn, bk, gm, nw, st = cfg
                tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
                for tma in (False, True):
                    nprog = min(tiles, sms) if tma else tiles
                    timed(f"lora_main {M}x{K}x{N} tma={int(tma)} {cfg}",
                          lambda: kernels["lora_main"][0][(nprog,)](x, w, t, b, bias, y, M, N, K, r, 1, 0.5, 1, nprog,
                                                                   BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm,
                                                                   R_PAD=16, DOT_PRECISION="tf32", TMA=tma,
                                                                   num_warps=nw, num_stages=st), y, ref2, fl)
        if N == 11008:
            wu = (torch.randn(K, N, device="cuda", dtype=dt, generator=g) / 64)
            gate = x.float() @ w.float()
            ref3 = gate * torch.sigmoid(gate) * (x.float() @ wu.float())
            y2 = torch.empty(M, N, device="cuda", dtype=dt)
            timed(f"torch 2 matmuls {M}x{K}x{N}", lambda: (torch.matmul(x, w, out=y), torch.matmul(x, wu, out=y2)),
                  y, gate, 2 * fl)
            # swiglu has no TMA build (its dual loop measured slower on TMA: table.py); the cp.async kernel only
            for cfg in ((128, 128, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (128, 128, 64, 4, 8, 4)):
                bm, bn, bk, gm, nw, st = cfg
                grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
                timed(f"swiglu {M}x{K}x{N} {cfg}",
                      lambda: kernels["swiglu"][0][grid](x, w, wu, y, M, N, K, 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                                         GROUP_M=gm, DOT_PRECISION="tf32", num_warps=nw,
                                                         num_stages=st), y, ref3, 2 * fl)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--shape", default="2048,4096,4096")
    ap.add_argument("--real", action="store_true", help="time onnxfuse's own kernels with TMA off and on")
    ap.add_argument("--lora", action="store_true", help="time lora_main's TMA build and rank-r placements")
    args = ap.parse_args(argv)
    sys.path.insert(0, ".")
    from onnxfuse import tune

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = open(args.out, "w") if args.out else None

    def record_row(row):
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")

    if args.real:
        real_kernels(record_row, sms)
        return
    if args.lora:
        lora_variants(record_row, sms)
        return
    M, K, N = (int(v) for v in args.shape.split(","))
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
    w = torch.randn(K, N, device="cuda", dtype=torch.float16, generator=g) / 64
    bias = torch.zeros(N, device="cuda", dtype=torch.float16)
    ref = (x.float() @ w.float())

    def record(name, fn, y):
        _time_one(record_row, name, fn, y, ref, 2 * M * N * K)

    y = torch.empty(M, N, device="cuda", dtype=torch.float16)
    record("torch.matmul", lambda: torch.matmul(x, w, out=y), y)
    lin = tune._aot()._load_kernels()["linear_act"][0]
    for cfg in ((128, 256, 64, 8, 8, 3), (128, 128, 64, 8, 8, 4), (128, 256, 64, 8, 8, 4)):
        bm, bn, bk, gm, nw, st = cfg
        y = torch.empty(M, N, device="cuda", dtype=torch.float16)
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        record(f"gemm_main {cfg}", lambda: lin[grid](x, w, bias, y, M, N, K, 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                                    GROUP_M=gm, DOT_PRECISION="ieee", num_warps=nw, num_stages=st),
               y)
    cfgs = [(128, 256, 64, 8, 8, 3), (128, 256, 64, 8, 8, 4), (128, 128, 64, 8, 8, 4), (128, 128, 64, 8, 4, 4),
            (128, 128, 64, 8, 8, 5), (256, 128, 64, 8, 8, 3), (128, 256, 64, 8, 4, 3), (128, 128, 128, 8, 8, 3)]
    for ws in (False, True):
        for cfg in cfgs:
            bm, bn, bk, gm, nw, st = cfg
            y = torch.empty(M, N, device="cuda", dtype=torch.float16)
            grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
            record(f"tma ws={int(ws)} {cfg}",
                   lambda: _tma_gemm[grid](x, w, y, M, N, K, BM=bm, BN=bn, BK=bk, GM=gm, STAGES=st, WS=ws,
                                           num_warps=nw), y)
        for cfg in cfgs[:5]:
            for flat in (False, True):
                bm, bn, bk, gm, nw, st = cfg
                y = torch.empty(M, N, device="cuda", dtype=torch.float16)
                tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
                grid = (min(sms, tiles),)
                record(f"tma-persistent ws={int(ws)} flat={int(flat)} {cfg}",
                       lambda: _tma_persistent[grid](x, w, y, M, N, K, BM=bm, BN=bn, BK=bk, GM=gm, STAGES=st, WS=ws,
                                                     NUM_SMS=grid[0], FLATTEN=flat, num_warps=nw, num_stages=st), y)
    record("torch.matmul (again)", lambda: torch.matmul(x, w, out=y), y)


if __name__ == "__main__":
    main()
