"""The gated LoRA pass at 2048 tokens in CUDA with its tiles in the mma fragments (scripts/lora_gate_mma.cu) against
the library's Triton `lora_gate` (JIT, its sm_90 tile config) and a plain act(g) * u pass, timed on the GPU.

A Llama-2-7B MLP's shapes (2048 rows, 11008 columns), rank-16 adapters on gate and up, phase 1's four fp32 partials
(as the launcher splits K there) and the down adapter's X @ A summed in the pass (LoRAGatedMLP) or not (LoRASwiGLU).
Outputs checked against PyTorch (y and the down sum) and between the two kernels. Time: each kernel's CUDA graph (20
launches) replayed in turn, `--rounds` rounds of `--reps` replays, medians in us per launch. Needs a CUDA GPU (sm_90),
torch and triton, and the .cu built as a shared library (nvcc, no onnxruntime):

    nvcc -std=c++17 -O3 -shared -Xcompiler -fPIC -gencode=arch=compute_90,code=sm_90 scripts/lora_gate_mma.cu \\
         -o /tmp/lora_gate_mma.so
    python scripts/lora_gate_mma_probe.py /tmp/lora_gate_mma.so [--rounds 9] [--reps 20] [--chunks 1,2,4,8]
                                          [--partials 4] [--skips 1,2,4,8,16,31]

--skips: timing-only runs of the CUDA pass (first --chunks count, folded) with parts left out (the .cu's `skip` bits;
lora_gate_ldm: its pipeline's stages; lora_gate_lib: the activation's code); --partials: phase 1's partials summed in
the pass (the Triton pass's too). The library's own pass (scripts/lora_gate_lib.cu, nvcc with -I for the generated
onnxfuse_ops.h, onnxfuse/kernels and onnxfuse/kernels/cuda) times with --entry lora_gate_lib.
"""
from __future__ import annotations

import argparse
import ctypes
import pathlib
import sys

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_mlp_fold_probe import _silu_mul_kernel, report_over, round_robin  # noqa: E402
from lora_pdl_probe import SW, I, R, cfg  # noqa: E402

M, S, SG, SU = 2048, 4, 0.5, 0.5


def gate_inputs(s: int, dev: str, dt):
    """The pass's inputs (seeded): g and u [M, I], phase 1's s fp32 partials of each adapter [s, M, 16], the B tiles
    [R, I], the down adapter's A [I, R]; and PyTorch's y and down sum (T summed, scaled and rounded as the kernels
    do). Returns (g, u, tg, tu, bg, bu, ad, y_ref, td_ref)."""
    torch.manual_seed(0)
    g, u = torch.randn(M, I, device=dev, dtype=dt), torch.randn(M, I, device=dev, dtype=dt)
    tg, tu = torch.randn(s, M, 16, device=dev) / 4, torch.randn(s, M, 16, device=dev) / 4
    bg, bu = torch.randn(R, I, device=dev, dtype=dt) / 4, torch.randn(R, I, device=dev, dtype=dt) / 4
    ad = torch.randn(I, R, device=dev, dtype=dt) / I ** 0.5
    tgr = (SG * tg.sum(0)).to(dt).float()
    tur = (SU * tu.sum(0)).to(dt).float()
    y_ref = (torch.nn.functional.silu(g.float() + tgr @ bg.float()) * (u.float() + tur @ bu.float())).to(dt)
    return g, u, tg, tu, bg, bu, ad, y_ref, y_ref.float() @ ad.float()


def library_gate(ins, s: int, y, td, rd: int):
    """The library's Triton lora_gate on gate_inputs' tensors `ins` (s partials) into y and td (rd: the down
    adapter's rank, 0 for none), its sm_90 tile config: a launch to time or run."""
    g, u, tg, tu, bg, bu, ad = ins[:7]
    c = {k: v for k, v in cfg("lora_gate", M).items() if k != "BLOCK_K"}
    grid = (triton.cdiv(M, c["BLOCK_M"]) * triton.cdiv(I, c["BLOCK_N"]),)
    return lambda: SW._lora_gate_kernel[grid](g, u, tg, bg, tu, bu, y, M, I, R, R, s, SG, SU, 0, ad, td, rd,
                                              R_PAD=16, DOT_PRECISION="tf32", **c)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("lib")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--chunks", default="1,2,4,8")
    ap.add_argument("--entry", default="lora_gate_mma", help="the library's function: lora_gate_mma (the mma "
                    "fragments form; --chunks: chunks a block), lora_gate_ldm (scripts/lora_gate_ldm.cu; --chunks: "
                    "blocks across the columns) or lora_gate_lib (scripts/lora_gate_lib.cu: onnxfuse's own gate pass, "
                    "cuda/lora_gate_pass.h; --chunks as lora_gate_ldm's, 0 the library's choice)")
    ap.add_argument("--partials", type=int, default=4, help="phase 1's fp32 partials summed in the pass")
    ap.add_argument("--skips", default="", help="SKIP,...: timing-only runs at the first --chunks count leaving parts "
                    "out (bits: 1 the partials' loads, 2 the B/A staging, 4 the down sum's atomics, 8 the rank "
                    "mmas, 16 the down sum's mmas)")
    args = ap.parse_args(argv)
    lib = ctypes.CDLL(args.lib)
    S = args.partials
    entry = getattr(lib, args.entry)
    entry.restype = ctypes.c_int
    entry.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                      ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_float, ctypes.c_void_p,
                      ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                      ctypes.c_void_p, ctypes.c_int]
    dev, dt = "cuda", torch.float16
    print(f"lora_gate in CUDA ({args.entry}) on {torch.cuda.get_device_name()}: {M} x {I}, rank {R}, {S} partials, "
          f"fp16; us per launch (CUDA graph of 20, {args.reps} replays, median of {args.rounds} rounds)")
    ins = gate_inputs(S, dev, dt)
    g, u, tg, tu, bg, bu, ad, y_ref, td_ref = ins

    def triton_gate(y, td, rd):
        return library_gate(ins, S, y, td, rd)

    def cuda_gate(y, td, rd, chunks, skip=0):
        def run():
            err = entry(1, g.data_ptr(), u.data_ptr(), tg.data_ptr(), tu.data_ptr(), S, bg.data_ptr(), bu.data_ptr(),
                        SG, SU, ad.data_ptr(), td.data_ptr(), rd, y.data_ptr(), M, I, chunks,
                        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), skip)
            assert err == 0, err
        return run

    def plain(y):
        return lambda: _silu_mul_kernel[(triton.cdiv(M * I, 4096),)](g, u, y, M * I, BLOCK=4096, num_warps=8)

    chunks = [int(v) for v in args.chunks.split(",")]
    # numerics: one launch each on zeroed sums
    outs = {}
    for name, make in [("triton", lambda y, td: triton_gate(y, td, R))] + [
            (f"cuda x{ch}", lambda y, td, ch=ch: cuda_gate(y, td, R, ch)) for ch in chunks]:
        y, td = torch.empty(M, I, device=dev, dtype=dt), torch.zeros(M, 16, device=dev)
        make(y, td)()
        torch.cuda.synchronize()
        ey = float((y.float() - y_ref.float()).abs().max() / y_ref.float().abs().max())
        et = float((td - td_ref).abs().max() / td_ref.abs().max())
        outs[name] = y
        print(f"  {name:10s} y rel err {ey:.1e}, down sum rel err {et:.1e}")
        assert ey < 1e-2 and et < 1e-2, (name, ey, et)
    for name, y in outs.items():
        d = int((y != outs["triton"]).sum())
        print(f"  {name:10s} elements differing from triton's: {d} of {y.numel()}")

    y, td = torch.empty(M, I, device=dev, dtype=dt), torch.zeros(M, 16, device=dev)
    fns = {"plain act(g) * u (Triton)": plain(y),
           "lora_gate Triton, folded": triton_gate(y, td, R), "lora_gate Triton, no down": triton_gate(y, td, 0)}
    for ch in chunks:
        fns[f"{args.entry} x{ch}, folded"] = cuda_gate(y, td, R, ch)
        fns[f"{args.entry} x{ch}, no down"] = cuda_gate(y, td, 0, ch)
    for skip in [int(v) for v in args.skips.split(",") if v]:
        fns[f"{args.entry} x{chunks[0]}, folded, skip {skip}"] = cuda_gate(y, td, R, chunks[0], skip)
    report_over(round_robin(fns, args.reps, args.rounds, launches=20), "plain act(g) * u (Triton)", "the plain pass",
                per=20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
