"""A gated LoRA MLP with the down projection's X @ A folded into the gated kernel's epilogue, timed on the GPU.

The LoRA MLP as LoRASwiGLU + LoRALinear runs the down adapter's phase 1 (X @ A_down over the MLP activation h) as a
launch of its own; LoRAGatedMLP (and MultiLoRAGatedMLP) add each finished tile's h @ A_down to an fp32 [M, r]
accumulator in the gated kernel's epilogue (gemm_loop._down_xa, fp32 atomics; phase 1 of the gate and up adapters
zeroes it), and the down's main kernel reads it as one partial. This probe runs the library's Triton kernels (JIT,
the AOT tile configs of sm_90) as the launchers do, for a Llama-2-7B MLP (hidden 4096, MLP 11008, rank 16): the
mixed batch (8 decode rows, 8 adapters), the LoRA MLP at 16 tokens (PDL as the launchers) and at 2048 (cuBLAS's
base GEMMs, lora_gate), each chain beside the base MLP (SwiGLU's kernel or cuBLAS's GEMMs, and cuBLAS's down GEMM).
Time: one CUDA graph of the chain replayed back to back (the GPU's own time per run), best of rounds; outputs checked
against PyTorch. Needs a CUDA GPU (sm_90), torch and triton; nothing of onnxruntime.

    python scripts/lora_mlp_fold_probe.py [--reps 200] [--rounds 5] [--gate-tiles 16x128x4,32x128x4] [--profile]
                                          [--before DIR] [--multi-tiles 16x64x128x4x4,...] [--mixed-only]

--gate-tiles: the 2048-token folded chain again with lora_gate on each BLOCK_M x BLOCK_N x warps tile (the library's:
swiglu.py's _GATE), the base MLP and every tile round-robin (their CUDA graphs replayed in turn, `--rounds` rounds,
medians): at 2048 tokens the GPU's clocks drift by more than the tiles differ. --profile: each chain's kernels by GPU
time (torch.profiler over 20 replays of its graph, us per replay). --before DIR: the folded chains on the kernel files
in DIR (an earlier commit's onnxfuse/kernels/triton, e.g. `git archive HEAD onnxfuse/kernels/triton`) and on the
checkout's, round-robin with the base MLP (at 2048 tokens also the down projection as the CUDA backend runs it:
cuBLAS's T @ B, then X @ W + that in the GEMM's epilogue). The base MLP at 2048 tokens: cuBLAS's gate and up GEMMs
and one act(gate) * up pass (a Triton kernel here), as the CUDA backend runs it; the LoRA MLP's down projection there
is the launcher's persistent TMA lora_main.
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from lora_pdl_probe import (LO, SMS, SW, H, I, R, cfg, graph_of, kernel_modules, mixed_batch, mlp_weights, plan,  # noqa: E402
                            replay_us, steady, xa_cfg)



@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = silu(g) * u over n elements in fp32: the base MLP's pass after cuBLAS's gate and up GEMMs at 2048 tokens,
    one memory-bound kernel like the CUDA backend's (PyTorch's silu then mul is two)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    g = tl.load(g_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (g / (1.0 + tl.exp(-g)) * u).to(y_ptr.dtype.element_ty), mask=ok)


def round_robin(fns: dict, reps: int, rounds: int, launches: int = 1) -> dict:
    """us per replay of each fn's CUDA graph (of `launches` calls), the fns replayed in turn `rounds` times (reps
    each): {name: median}."""
    graphs = {name: graph_of(fn, launches) for name, fn in fns.items()}
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, g in graphs.items():
            g.replay()  # one replay first: the previous graph's tail stays out of this one's time
            times[name].append(replay_us(g, reps))
    return {name: statistics.median(v) for name, v in times.items()}


def report_over(med: dict, base: str, against: str, per: int = 1) -> None:
    """Print each median (us, divided by `per` launches) and its excess over `base`'s, `against` naming it."""
    b = med[base] / per
    for label, us in med.items():
        print(f"  {label:40s} {us / per:8.1f} us  ({us / per - b:+6.1f} over {against})")


def checked_rounds(title: str, fns: dict, ref, base: str, reps: int, rounds: int, tol: float = 2e-3) -> dict:
    """Every fn but `base` checked against the PyTorch reference `ref` (largest error relative to its largest value
    under `tol`), then all round-robin (round_robin) and printed against `base`'s median. Returns the medians."""
    for label, fn in fns.items():
        if label != base:
            err = float((fn().float() - ref).abs().max() / ref.abs().max())
            assert err < tol, (label, err)
    med = round_robin(fns, reps, rounds)
    print(f"  {title}: round-robin, {rounds} rounds of {reps} replays, medians:")
    for label, us in med.items():
        print(f"    {label:44s} {us:8.1f} us   {us / med[base]:.4f}x the base")
    return med


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gate-tiles", default="", help="BMxBNxWARPS,... for lora_gate in the 2048-token folded chain")
    ap.add_argument("--profile", action="store_true", help="each chain's kernels by GPU time")
    ap.add_argument("--xa-splits", default="", help="S1,S2,...: the folded 8- and 16-row chains with phase 1 split in "
                    "at most S slices of K, round-robin with the base")
    ap.add_argument("--multi-pdl", default="", help="S1,S2,...: the folded mixed batch with multi_lora_swiglu as "
                    "a programmatic dependent of phase 1 (in at most S slices), round-robin with the base and the "
                    "library's form")
    ap.add_argument("--mixed-only", action="store_true", help="the mixed batch's runs only")
    ap.add_argument("--multi-tiles", default="", help="BMxBNxBKxWARPSxSTAGES,...: the folded mixed batch as the "
                    "library launches it (PDL, phase 1 in at most 2 slices) with multi_lora_swiglu on each tile")
    ap.add_argument("--before", default="", help="a folder of the kernel files (e.g. an earlier commit's "
                    "onnxfuse/kernels/triton): the folded chains on its kernels and on the checkout's, round-robin "
                    "with the base")
    args = ap.parse_args(argv)
    # the persistent TMA lora_main builds its descriptors in Triton's global scratch (the library: its own scratch)
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    before = kernel_modules(args.before) if args.before else None
    torch.manual_seed(0)
    dev, dt = "cuda", torch.float16
    F = torch.nn.functional
    wg, wu, wd, zb = mlp_weights(dev, dt)
    print(f"gated LoRA MLP fold probe on {torch.cuda.get_device_name()}, fp16, h{H} i{I} r{R}; us per run (CUDA "
          f"graph, {args.reps} replays, best of {args.rounds})")

    def report(name, runs, ref):
        for label, fn in runs:
            out = fn().clone()
            torch.cuda.synchronize()
            err = float((out.float() - ref).abs().max() / ref.abs().max()) if ref is not None else float("nan")
            us = steady(fn, args.reps, args.rounds)
            print(f"  {name:26s} {label:44s} {us:8.1f} us   rel err {err:.1e}", flush=True)
            if args.profile:
                kernels(fn)

    def split_rounds(name, fns, ref):
        """fns (the base first) round-robin, each LoRA chain checked against PyTorch first."""
        checked_rounds(name, fns, ref, "base MLP", args.reps, max(args.rounds, 9))

    def kernels(fn, replays=20):
        """The chain's kernels by GPU time per replay of its CUDA graph (torch.profiler)."""
        from torch.profiler import ProfilerActivity, profile
        g = graph_of(fn)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                g.replay()
            torch.cuda.synchronize()
        rows = [(e.key, e.device_time_total / replays) for e in prof.key_averages() if e.device_time_total > 0]
        for key, us in sorted(rows, key=lambda r: -r[1])[:8]:
            print(f"      {us:8.1f} us  {key[:90]}")

    def base(m, x):
        h = torch.empty(m, I, device=dev, dtype=dt)
        g = torch.empty(m, I, device=dev, dtype=dt)
        u = torch.empty(m, I, device=dev, dtype=dt)
        c = cfg("swiglu", m)
        grid = (triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(I, c["BLOCK_N"]),)

        def run():
            if m >= 2048:  # the CUDA backend's form there: cuBLAS's two GEMMs and the pass
                torch.mm(x, wg, out=g)
                torch.mm(x, wu, out=u)
                _silu_mul_kernel[(triton.cdiv(m * I, 4096),)](g, u, h, m * I, BLOCK=4096, num_warps=8)
            else:
                SW._swiglu_kernel[grid](x, wg, wu, h, m, I, H, 0, DOT_PRECISION="tf32", **c)
            return torch.mm(h, wd)
        return run

    # ---- the mixed batch: 8 rows, 8 adapters
    (m, na, x, ag, au, bg, bu, ad, bd, sg, su, sd, idx, h, y, cx, s1, kb1, g1, s2, kb2, g2, tg, tu, td, csw, cmain, gsw,
     gmain) = mixed_batch(dev, dt)

    def multi(fold, max_split=16, mods=(LO, SW), pdl=False, tile=None):
        s1, kb1, g1 = plan(m, H, na, cx, max_split)
        lo, sw = mods
        pdl_args = dict(PDL=True) if pdl else {}
        c_sw = tile or csw
        g_sw = gsw if tile is None else (triton.cdiv(m, tile["BLOCK_M"]) * triton.cdiv(I, tile["BLOCK_N"]),)

        def run():
            lo._multi_lora_xa_kernel[(g1,)](x, ag, au, idx, tg, tu, m, H, R, R, 2, na, 1, kb1, td, int(fold),
                                            R_PAD=16, DOT_PRECISION="tf32", **pdl_args, **cx)
            sw._multi_lora_swiglu_kernel[g_sw](x, wg, wu, tg, bg, sg, tu, bu, su, idx, h, m, I, H, R, R, na, 1, s1, 0,
                        ad, td, R if fold else 0, R_PAD=16, DOT_PRECISION="tf32",
                        **({"PDL": True, "launch_pdl": True} if pdl else {}), **c_sw)
            if not fold:
                lo._multi_lora_xa_kernel[(g2,)](h, ad, ad, idx, td, td, m, I, R, R, 1, na, 1, kb2, td, 0, R_PAD=16,
                                                DOT_PRECISION="tf32", **cx)
            lo._multi_lora_main_kernel[gmain](h, wd, td, bd, zb, sd, idx, y, m, H, I, R, na, 1, 1 if fold else s2,
                                              R_PAD=16, DOT_PRECISION="tf32", **cmain)
            return y
        return run

    xf = x.float()
    gate = xf @ wg.float() + ((torch.einsum("mk,mkr->mr", xf, ag[idx].float()) * 0.5).half().float().unsqueeze(1)
                              @ bg[idx].float()).squeeze(1)
    up = xf @ wu.float() + ((torch.einsum("mk,mkr->mr", xf, au[idx].float()) * 0.5).half().float().unsqueeze(1)
                            @ bu[idx].float()).squeeze(1)
    hh = (F.silu(gate) * up).half().float()
    ref = hh @ wd.float() + ((torch.einsum("mk,mkr->mr", hh, ad[idx].float()) * 0.5).half().float().unsqueeze(1)
                             @ bd[idx].float()).squeeze(1)
    report("base MLP, 8 rows", [("swiglu + cuBLAS down", base(8, x))], None)
    splits = [int(v) for v in args.xa_splits.split(",")] if args.xa_splits else []
    if splits:
        fns = {"base MLP": base(8, x), **{f"folded, phase 1 in <= {sp} slices": multi(True, sp) for sp in splits}}
        split_rounds("mixed batch, 8 rows", fns, ref)
    pdl_splits = [int(v) for v in args.multi_pdl.split(",")] if args.multi_pdl else []
    if pdl_splits:
        fns = {"base MLP": base(8, x), "folded, phase 1 in <= 16 slices": multi(True, 16),
               **{f"folded, PDL, phase 1 in <= {sp} slices": multi(True, sp, pdl=True) for sp in pdl_splits}}
        split_rounds("mixed batch, 8 rows", fns, ref)
    tiles = [t for t in args.multi_tiles.split(",") if t]
    if tiles:  # the library's launch (PDL, phase 1 in at most 2 slices) with multi_lora_swiglu on each tile
        def tile_of(t):
            bm, bn, bk, warps, stages = (int(v) for v in t.split("x"))
            return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=1, num_warps=warps, num_stages=stages)
        fns = {"base MLP": base(8, x), "folded, PDL, library tile": multi(True, 2, pdl=True),
               **{f"folded, PDL, tile {t}": multi(True, 2, pdl=True, tile=tile_of(t)) for t in tiles}}
        split_rounds("mixed batch, 8 rows", fns, ref)
    if args.mixed_only:
        return 0
    report("mixed batch, 8 rows", [("MultiLoRASwiGLU + MultiLoRALinear", multi(False)),
                                   ("MultiLoRAGatedMLP (down X @ A folded)", multi(True))], ref)
    if before:
        split_rounds("mixed batch, 8 rows", {"base MLP": base(8, x),
                                             "folded, --before kernels": multi(True, mods=before),
                                             "folded, this checkout's kernels": multi(True)}, ref)

    # ---- the LoRA MLP at 16 and 2048 tokens
    a1g, a1u = (torch.randn(H, R, device=dev, dtype=dt) / H ** 0.5 for _ in range(2))
    b1g, b1u = (torch.randn(R, I, device=dev, dtype=dt) / 4 for _ in range(2))
    a1d, b1d = torch.randn(I, R, device=dev, dtype=dt) / I ** 0.5, torch.randn(R, H, device=dev, dtype=dt) / 4
    for m in (16, 2048):
        xm = torch.randn(m, H, device=dev, dtype=dt)
        hm = torch.empty(m, I, device=dev, dtype=dt)
        um = torch.empty(m, I, device=dev, dtype=dt)
        ym = torch.empty(m, H, device=dev, dtype=dt)
        cx = xa_cfg("lora_xa", m)
        large = m >= 2048
        s1, kb1, g1 = plan(m, H, 1, cx)
        if large:  # the cuBLASLt path's phase 1: at most LORA_GATE_MAX_SPLIT slices
            kblocks = triton.cdiv(H, cx["BLOCK_K"])
            kb1 = triton.cdiv(kblocks, min(s1, 4))
            s1 = triton.cdiv(kblocks, kb1)
            g1 = triton.cdiv(m, cx["BLOCK_M"]) * s1
        s2, kb2, g2 = plan(m, I, 1, cx)
        t1g, t1u = torch.empty(s1, m, 16, device=dev), torch.empty(s1, m, 16, device=dev)
        t1d = torch.empty(max(s2, 1), m, 16, device=dev)
        csw, cmain, cgate = cfg("lora_swiglu", m), cfg("lora_main", m), cfg("lora_gate", m)
        gsw = (triton.cdiv(m, csw["BLOCK_M"]) * triton.cdiv(I, csw["BLOCK_N"]),)
        ggate = (triton.cdiv(m, cgate["BLOCK_M"]) * triton.cdiv(I, cgate["BLOCK_N"]),)
        cgate = {k: v for k, v in cgate.items() if k != "BLOCK_K"}
        gmain = triton.cdiv(m, cmain["BLOCK_M"]) * triton.cdiv(H, cmain["BLOCK_N"])
        pdl = m <= 16

        def lora(fold, m=m, xm=xm, hm=hm, um=um, ym=ym, s1=s1, kb1=kb1, g1=g1, s2=s2, kb2=kb2, g2=g2, t1g=t1g,
                 t1u=t1u, t1d=t1d, csw=csw, cmain=cmain, cgate=cgate, gsw=gsw, ggate=ggate, gmain=gmain, cx=cx,
                 large=large, pdl=pdl, tile=None, max_split=None, mods=(LO, SW), down="triton"):
            lo, sw = mods
            tma = large and down == "triton"  # the launcher's persistent TMA lora_main (K >= 1024, large class)
            nprog = min(gmain, SMS) if tma else gmain
            if max_split is not None:  # phase 1 in at most max_split slices of K
                s1, kb1, g1 = plan(m, H, 1, cx, max_split)
            if tile is not None:  # lora_gate on another tile
                bm, bn, warps = tile
                cgate = dict(cgate, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
                ggate = (triton.cdiv(m, bm) * triton.cdiv(I, bn),)
            def run():
                lo._lora_xa_kernel[(g1,)](xm, a1g, a1u, t1g, t1u, m, H, R, R, 2, kb1, t1d, int(fold), R_PAD=16,
                                          DOT_PRECISION="tf32", PDL=pdl, **cx)
                rd = R if fold else 0
                if large:
                    torch.mm(xm, wg, out=hm)
                    torch.mm(xm, wu, out=um)
                    sw._lora_gate_kernel[ggate](hm, um, t1g, b1g, t1u, b1u, hm, m, I, R, R, s1, 0.5, 0.5, 0, a1d, t1d,
                                                rd, R_PAD=16, DOT_PRECISION="tf32", **cgate)
                else:
                    sw._lora_swiglu_kernel[gsw](xm, wg, wu, t1g, b1g, t1u, b1u, hm, m, I, H, R, R, s1, 0.5, 0.5, 0, a1d,
                                                t1d, rd, R_PAD=16, DOT_PRECISION="tf32", PDL=pdl, launch_pdl=pdl,
                                                **csw)
                down_pdl = pdl and not fold  # the down main may overlap its own phase 1, not the gated kernel
                if not fold:
                    lo._lora_xa_kernel[(g2,)](hm, a1d, a1d, t1d, t1d, m, I, R, R, 1, kb2, t1d, 0, R_PAD=16,
                                              DOT_PRECISION="tf32", PDL=pdl, **cx)
                if down == "cublas":  # the CUDA backend's form: T @ B, then X @ W + that in cuBLAS's epilogue (beta 1)
                    yc = torch.mm((t1d[0] * 0.5).to(dt), b1d)
                    return yc.addmm_(hm, wd)
                lo._lora_main_kernel[(nprog,)](hm, wd, t1d, b1d, zb, ym, m, H, I, R, 1 if fold else s2, 0.5, 0, nprog,
                                               R_PAD=16, DOT_PRECISION="tf32", TMA=tma, PDL=down_pdl,
                                               launch_pdl=down_pdl, **cmain)
                return ym
            return run

        xf = xm.float()
        gate = xf @ wg.float() + ((xf @ a1g.float()) * 0.5).half().float() @ b1g.float()
        up = xf @ wu.float() + ((xf @ a1u.float()) * 0.5).half().float() @ b1u.float()
        hh = (F.silu(gate) * up).half().float()
        ref = hh @ wd.float() + ((hh @ a1d.float()) * 0.5).half().float() @ b1d.float()
        report(f"base MLP, {m} tokens", [("SwiGLU + cuBLAS down", base(m, xm))], None)
        report(f"LoRA MLP, {m} tokens", [("LoRASwiGLU + LoRALinear", lora(False)),
                                         ("LoRAGatedMLP (down X @ A folded)", lora(True))], ref)
        if before:  # the library's phase-1 slices: at most table.LORA_PDL_MAX_SPLIT to 16 rows
            cap = 4 if m <= 16 else None
            fns = {"base MLP": base(m, xm), "folded, --before kernels": lora(True, max_split=cap, mods=before),
                   "folded, this checkout's kernels": lora(True, max_split=cap)}
            if large:
                fns["folded, the down on cuBLAS (T @ B, beta 1)"] = lora(True, down="cublas")
            split_rounds(f"LoRA MLP, {m} tokens", fns, ref)
        if not large and splits:
            fns = {"base MLP": base(m, xm), **{f"folded, phase 1 in <= {sp} slices": lora(True, max_split=sp)
                                               for sp in splits}}
            split_rounds(f"LoRA MLP, {m} tokens", fns, ref)
        if large and args.gate_tiles:
            tiles = [tuple(int(v) for v in t.split("x")) for t in args.gate_tiles.split(",")]
            fns = {"base MLP": base(m, xm), "unfolded": lora(False)}
            fns.update({f"folded, lora_gate {'x'.join(map(str, t))}": lora(True, tile=t) for t in tiles})
            split_rounds(f"LoRA MLP, {m} tokens", fns, ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
