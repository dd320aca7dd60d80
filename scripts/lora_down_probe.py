"""The LoRA MLP's down projection at 2048 tokens in four forms, timed round-robin on the GPU: what the 2048-token
LoRA MLP's remaining excess over the base MLP is made of on the down side.

Forms (Llama-2-7B shapes: H [2048, 11008] @ W [11008, 4096], a rank-16 adapter whose X @ A the gated kernel already
summed into one fp32 partial, scale 0.5):
  cuBLAS            the base MLP's down GEMM (torch.mm), no adapter: the floor
  lora_main TMA     the library's Triton launcher at 2048 rows: the persistent TMA lora_main, the rank-r term after
                    its main loop (one partial)
  cuBLAS + expand   cuBLAS's GEMM, then one Triton pass adding (s T) @ B to its output in place (reads and writes
                    [2048, 4096] once more)
  cuBLAS beta 1     the CUDA backend's form: (s T) @ B into the output first, then cuBLAS's GEMM with beta 1
  CUTLASS c (r)     with --cutlass PROBE.so (scripts/lora_main_cutlass_probe.cu, measured and not kept): CUTLASS's
                    sm_90a GEMM with the rank-r term in its epilogue in tile config c, and config 0 with r 0 (the
                    same GEMM, no adapter term)

    python scripts/lora_down_probe.py [--rounds 9] [--reps 50] [--cutlass PROBE.so]

Needs a CUDA GPU (sm_90), torch and triton; nothing of onnxruntime.
"""
from __future__ import annotations

import argparse
import ctypes
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_mlp_fold_probe import report_over, round_robin  # noqa: E402
from lora_pdl_probe import LO, SMS, H, I, R, cfg  # noqa: E402

M, SCALE = 2048, 0.5


@triton.jit
def _expand_add_kernel(y_ptr, t_ptr, b_ptr, M, N, scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       R_PAD: tl.constexpr):
    """y[tile] += (scale * t[rows]).to(y's type) @ b[:, cols] (t fp32 [M, R_PAD], b [R_PAD, N]), in place."""
    pid_m = tl.program_id(0) // tl.cdiv(N, BLOCK_N)
    pid_n = tl.program_id(0) % tl.cdiv(N, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_r = tl.arange(0, R_PAD)
    m_ok = offs_m < M
    n_ok = offs_n < N
    t = tl.load(t_ptr + offs_m.to(tl.int64)[:, None] * R_PAD + offs_r[None, :], mask=m_ok[:, None], other=0.0)
    b = tl.load(b_ptr + offs_r[:, None] * N + offs_n[None, :], mask=n_ok[None, :], other=0.0)
    ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    y = tl.load(ptrs, mask=ok, other=0.0).to(tl.float32)
    y = tl.dot((t * scale).to(b.dtype), b, y)
    tl.store(ptrs, y.to(y_ptr.dtype.element_ty), mask=ok)


def cutlass_forms(lib, h, wd, t, bd, zb, y) -> dict:
    """The CUTLASS GEMM's configs (lora_main_cutlass_probe.cu's probe_lora_main) as forms of the round robin."""
    lib.probe_lora_main.restype = ctypes.c_int
    lib.probe_lora_main_ws.restype = ctypes.c_size_t
    ws_bytes = lib.probe_lora_main_ws(M, H, I)
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda")
    p = ctypes.c_void_p

    def form(config, r):
        def run():
            err = lib.probe_lora_main(config, p(h.data_ptr()), p(wd.data_ptr()), p(t.data_ptr()), p(bd.data_ptr()),
                                      p(zb.data_ptr()), ctypes.c_float(SCALE), p(y.data_ptr()), M, H, I, r,
                                      p(ws.data_ptr()), ctypes.c_size_t(ws_bytes),
                                      p(torch.cuda.current_stream().cuda_stream))
            assert err == 0, (config, r, err)
            return y
        return run

    names = {0: "128x256", 1: "128x256 cluster 2", 2: "256x128", 3: "128x256 stream-K", 4: "128x128"}
    forms = {f"CUTLASS {c} {n} (r {R})": form(c, R) for c, n in names.items()}
    forms[f"CUTLASS 0 {names[0]} (r 0)"] = form(0, 0)
    return forms


def down_inputs():
    """The down projection's seeded tensors (fp16, on the GPU): h [M, I], wd [I, H], one fp32 partial t [1, M, 16],
    bd [R, H], a zero bias zb [H], an output y [M, H], and PyTorch's y in fp32 (T scaled and rounded as the kernels
    do). Returns (h, wd, t, bd, zb, y, ref)."""
    torch.manual_seed(0)
    dev, dt = "cuda", torch.float16
    h = torch.randn(M, I, device=dev, dtype=dt)
    wd = torch.randn(I, H, device=dev, dtype=dt) / I ** 0.5
    t = torch.randn(1, M, 16, device=dev) / 4
    bd = torch.randn(R, H, device=dev, dtype=dt) / 4
    zb = torch.zeros(H, device=dev, dtype=dt)
    y = torch.empty(M, H, device=dev, dtype=dt)
    ref = h.float() @ wd.float() + (SCALE * t[0]).to(dt).float() @ bd.float()
    return h, wd, t, bd, zb, y, ref


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--cutlass", help="scripts/lora_main_cutlass_probe.cu built as a shared library")
    args = ap.parse_args(argv)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    h, wd, t, bd, zb, y, ref = down_inputs()
    dt = h.dtype
    c = torch.empty_like(y)
    cmain = cfg("lora_main", M)
    gmain = triton.cdiv(M, cmain["BLOCK_M"]) * triton.cdiv(H, cmain["BLOCK_N"])
    nprog = min(gmain, SMS)
    print(f"LoRA down projection on {torch.cuda.get_device_name()}: [{M}, {I}] @ [{I}, {H}], rank {R}, fp16; us per "
          f"run (CUDA graph, {args.reps} replays, median of {args.rounds} rounds, round-robin)")

    def cublas():
        torch.mm(h, wd, out=y)
        return y

    def lora_main():
        LO._lora_main_kernel[(nprog,)](h, wd, t, bd, zb, y, M, H, I, R, 1, SCALE, 0, nprog, R_PAD=16,
                                       DOT_PRECISION="tf32", TMA=True, PDL=False, **cmain)
        return y

    def expand(bm, bn, warps):
        def run():
            torch.mm(h, wd, out=y)
            _expand_add_kernel[(triton.cdiv(M, bm) * triton.cdiv(H, bn),)](y, t, bd, M, H, SCALE, BLOCK_M=bm,
                                                                          BLOCK_N=bn, R_PAD=16, num_warps=warps)
            return y
        return run

    def beta1():
        torch.mm((SCALE * t[0]).to(dt), bd, out=c)
        torch.addmm(c, h, wd, out=y)
        return y

    fns = {"cuBLAS (no adapter)": cublas, "lora_main TMA (library)": lora_main,
           "cuBLAS + expand 64x128x4": expand(64, 128, 4), "cuBLAS + expand 128x128x8": expand(128, 128, 8),
           "cuBLAS + expand 32x256x4": expand(32, 256, 4), "cuBLAS beta 1 (CUDA backend)": beta1}
    if args.cutlass:
        fns.update(cutlass_forms(ctypes.CDLL(args.cutlass), h, wd, t, bd, zb, y))
    for name, fn in fns.items():
        if name.startswith("cuBLAS (no"):
            continue
        out = fn().float()
        torch.cuda.synchronize()
        err = float((out - ref).abs().max() / ref.abs().max())
        print(f"  {name:32s} rel err {err:.1e}")
        assert err < 5e-3 or "r 0" in name, (name, err)
    report_over(round_robin(fns, args.reps, args.rounds), "cuBLAS (no adapter)", "cuBLAS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
