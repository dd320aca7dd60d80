"""The LoRA MLP's down projection at 2048 tokens: the library's persistent TMA `lora_main` at other tile configs and
with its tile loop flattened into the K loop, against cuBLAS's GEMM without the adapter, timed on the GPU.

At 2048 tokens the LoRA MLP's down projection (H [2048, 11008] @ W [11008, 4096] + the rank-16 term) runs the
persistent TMA lora_main (gemm_loop._gemm_tile_tma, the tile 128 x 256 x 64, 3 stages, 8 warps): 287.7 us against
cuBLAS's 273.2 without the adapter on an H200 (lora-down-cutlass-probe.txt), most of the LoRA MLP's excess on the
down side. Its persistent loop runs each tile's K loop, then its epilogue, then the next tile's K loop from an empty
pipeline. The forms here:

  cuBLAS                 torch.mm, no adapter (the base MLP's down GEMM): the floor
  library                the library's lora_main (TMA=True, its sm_90 "large" config), as the launcher runs it
  BMxBNxBK gG wW sS [one [flat]]
                         the same kernel body in this file (the library's helpers: _tma_descs, _tile_of,
                         _lora_epilogue) at that tile, GROUP_M, warps and stages; `one` loads T as the one partial it
                         is here without _rank_t's loop over partials; `flat` then runs the tile loop as
                         tl.range(..., flatten=True), so Triton's pipeliner treats the tiles' K loops as one loop and
                         issues the next tile's first loads before this tile's epilogue (with _rank_t's loop in the
                         body Triton does not flatten: the same PTX)

Outputs checked against PyTorch. Time: each form's CUDA graph (one launch) replayed in turn, `--rounds` rounds of
`--reps` replays, medians. Needs a CUDA GPU (sm_90), torch and triton; nothing of onnxruntime.

    python scripts/lora_main_tma_probe.py [--rounds 9] [--reps 50] [--configs 128x256x64g8w8s3,...] [--no-flat]
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_down_probe import M, SCALE, down_inputs  # noqa: E402
from lora_mlp_fold_probe import report_over, round_robin  # noqa: E402
from lora_pdl_probe import LO, SMS, H, I, R, cfg  # noqa: E402

GL = sys.modules["_onnxfuse_triton_kernels.gemm_loop"]
_tma_descs, _tile_of, _lora_epilogue = GL._tma_descs, GL._tile_of, LO._lora_epilogue
_rank_b, _rank_dot, _store_tile = GL._rank_b, GL._rank_dot, GL._store_tile

CONFIGS = ("128x256x64g8w8s3", "128x256x64g8w8s4", "128x256x64g16w8s3", "256x128x64g8w8s3", "256x128x64g8w8s4",
           "128x128x64g8w8s4", "128x128x64g8w4s5", "128x256x128g8w8s2")


@triton.jit
def _lora_main_v(x_ptr, w_ptr, t_ptr, b_ptr, bias_ptr, y_ptr, M, N, K, R, SPLIT, scale, NPROG,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 R_PAD: tl.constexpr, FLAT: tl.constexpr, ONE: tl.constexpr):
    """lora_main's TMA form (lora_linear._lora_main_kernel, TMA=True, no ReLU, no PDL) with the K loop written out in
    the tile loop, the tile loop flattened where FLAT. ONE: T is one partial (the folded down projection's), loaded
    without _rank_t's loop over the partials: a second loop in the tile loop's body keeps Triton from flattening it
    (the PTX of FLAT and not FLAT is the same with _lora_epilogue)."""
    xd, wd = _tma_descs(x_ptr, w_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), NPROG, flatten=FLAT):
        pid_m, pid_n = _tile_of(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(0, k_tiles):
            acc = tl.dot(xd.load([pid_m * BLOCK_M, kb * BLOCK_K]), wd.load([kb * BLOCK_K, pid_n * BLOCK_N]), acc)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
        if ONE:
            b = _rank_b(b_ptr, offs_n, n_ok, N, R, R_PAD)
            bias = tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
            t = tl.load(t_ptr + rows[:, None] * R_PAD + tl.arange(0, R_PAD)[None, :])
            acc = _rank_dot(acc, t, b, scale, "tf32") + bias[None, :]
            _store_tile(y_ptr, N, acc, offs_m, offs_m < M, offs_n, n_ok)
        else:
            _lora_epilogue(acc, rows, offs_m, offs_n, n_ok, t_ptr, b_ptr, bias_ptr, y_ptr, M, N, R, SPLIT, scale, 0,
                           BLOCK_M, R_PAD, "tf32", False)


def parse(c: str) -> dict:
    """'128x256x64g8w8s3' -> the kernel's tile constants and launch options."""
    tile, rest = c.split("g")
    bm, bn, bk = (int(v) for v in tile.split("x"))
    gm, rest = rest.split("w")
    warps, stages = rest.split("s")
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=int(gm), num_warps=int(warps), num_stages=int(stages))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--no-flat", action="store_true", help="time each config as the library's body only")
    args = ap.parse_args(argv)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    h, wd, t, bd, zb, y, ref = down_inputs()
    print(f"LoRA down projection on {torch.cuda.get_device_name()}: [{M}, {I}] @ [{I}, {H}], rank {R}, fp16; us per "
          f"run (CUDA graph, {args.reps} replays, median of {args.rounds} rounds, round-robin)")

    def cublas():
        torch.mm(h, wd, out=y)
        return y

    cmain = cfg("lora_main", M)

    def library():
        nprog = min(triton.cdiv(M, cmain["BLOCK_M"]) * triton.cdiv(H, cmain["BLOCK_N"]), SMS)
        LO._lora_main_kernel[(nprog,)](h, wd, t, bd, zb, y, M, H, I, R, 1, SCALE, 0, nprog, R_PAD=16,
                                       DOT_PRECISION="tf32", TMA=True, PDL=False, **cmain)
        return y

    def form(c: dict, flat: bool, one: bool):
        nprog = min(triton.cdiv(M, c["BLOCK_M"]) * triton.cdiv(H, c["BLOCK_N"]), SMS)

        def run():
            _lora_main_v[(nprog,)](h, wd, t, bd, zb, y, M, H, I, R, 1, SCALE, nprog, R_PAD=16, FLAT=flat, ONE=one,
                                   **c)
            return y
        return run

    fns = {"cuBLAS (no adapter)": cublas, "library lora_main TMA": library}
    for name in args.configs.split(","):
        fns[name] = form(parse(name), False, False)
        if not args.no_flat:
            fns[f"{name} one"] = form(parse(name), False, True)
            fns[f"{name} one flat"] = form(parse(name), True, True)
    kept = {}
    for name, fn in fns.items():
        try:
            y.zero_()
            out = fn().float()
            torch.cuda.synchronize()
        except Exception as e:  # a config that does not compile or fit (shared memory) is reported and left out
            print(f"  {name:32s} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            continue
        err = float((out - ref).abs().max() / ref.abs().max())
        print(f"  {name:32s} rel err {err:.1e}{' (no adapter term)' if fn is cublas else ''}")
        if err < 5e-3 or fn is cublas:
            kept[name] = fn
    report_over(round_robin(kept, args.reps, args.rounds), "cuBLAS (no adapter)", "cuBLAS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
