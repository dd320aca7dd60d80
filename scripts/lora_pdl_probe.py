"""LoRA's phase 1 (X @ A) overlapped with the main kernels by programmatic dependent launch (PDL), timed on the GPU.

Runs the library's Triton LoRA kernels (JIT, the AOT tile configs of sm_90) as the launchers do, for a Llama-2-7B MLP
(hidden 4096, MLP 11008, rank 16): the mixed batch (8 decode rows, 8 adapters: multi_lora_xa -> multi_lora_swiglu
-> multi_lora_xa -> multi_lora_main), the LoRA MLP at 16 tokens (lora_xa -> lora_swiglu -> lora_xa -> lora_main)
and LoRASwiGLU at 2048 rows (cuBLAS's two GEMMs, lora_xa, lora_gate), beside the base MLP (SwiGLU's kernel and
cuBLAS's down GEMM): the LoRA MLP with the main kernels launched the usual way and as programmatic dependents of
phase 1 (PDL=True, launch_pdl: what the launchers do to triton/table.py LORA_PDL_MAX_M rows), LoRASwiGLU's phase 1
with one program per stack (X read twice) and with both stacks from each X tile (the library's). The PDL forms of
the mixed batch and of the 2048-row path measured no gain (table.py) and left the kernels. Time: one CUDA graph of
the sequence replayed back to back (the GPU's own time per run, gaps included), best of rounds; outputs checked
equal between the forms and against PyTorch. Needs a CUDA GPU (sm_90), torch and triton; nothing of onnxruntime.

    python scripts/lora_pdl_probe.py [--reps 200] [--rounds 5]
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from onnxfuse.kernels.build import aot_module  # noqa: E402

AOT = aot_module()
AOT._kernel_modules()


def aot_like(*modules):
    """Have the modules' kernels specialise as aot.py compiles them: Triton's JIT turns an int argument equal to 1
    into a constant and marks one divisible by 16 (native_specialize_impl: 1 -> ("constexpr", 1), 16 -> ("i32",
    "D")), the AOT build neither but for K and N (divisibility 16 in its aligned build; the ranks 8). So a probe at
    SPLIT 1 (a folded down projection) or RPI 1 (decode rows of a mixed batch) timed other code than the library
    runs: every int parameter but K and N stays unspecialised. Returns the modules."""
    for mod in modules:
        for fn, params in mod.KERNELS.values():
            ints = {name for name, ptype in params if ptype.startswith("i") and name not in ("K", "N")}
            for kp in fn.params:
                if kp.name in ints:
                    kp.do_not_specialize = True
    return modules


LO, SW = aot_like(sys.modules["_onnxfuse_triton_kernels.lora_linear"], sys.modules["_onnxfuse_triton_kernels.swiglu"])


def kernel_modules(folder, name="_onnxfuse_triton_before"):
    """(lora_linear, swiglu) of another copy of the kernel files (a folder like onnxfuse/kernels/triton, e.g. an
    earlier commit's, `git archive`d), imported as a package of its own name: the probes time its kernels beside the
    checkout's in one process."""
    import importlib
    AOT._kernel_package(folder, name)
    return aot_like(importlib.import_module(f"{name}.lora_linear"), importlib.import_module(f"{name}.swiglu"))


CFG = AOT.configs_for("90", AOT.default_overrides())
SMS = 132


def cfg(kernel, m):
    size = "small" if m <= 16 else "medium" if m <= 128 else "large"
    bm, bn, bk, gm, warps, stages = CFG[kernel]["h"][size]
    return dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, num_warps=warps, num_stages=stages)


def xa_cfg(kernel, m):
    c = cfg(kernel, m)
    return dict(BLOCK_M=c["BLOCK_M"], BLOCK_K=c["BLOCK_K"], num_warps=c["num_warps"], num_stages=c["num_stages"])


def plan(m, k, fanout, c, max_split=16):
    """runtime.h PlanLoRA: (split, kb_per_split, grid) of phase 1."""
    grid_m = triton.cdiv(m, c["BLOCK_M"])
    k_blocks = triton.cdiv(k, c["BLOCK_K"])
    split = max(1, min(max_split, k_blocks, triton.cdiv(SMS, grid_m * fanout)))
    kb = triton.cdiv(k_blocks, split)
    split = triton.cdiv(k_blocks, kb)
    return split, kb, grid_m * split * fanout


H, I, R = 4096, 11008, 16  # the Llama-2-7B MLP, rank-16 adapters


def mlp_weights(dev, dt):
    """The base MLP's weights (gate, up, down; scaled to keep outputs O(1)) and a zero bias for the down projection."""
    wg = torch.randn(H, I, device=dev, dtype=dt) / H ** 0.5
    wu = torch.randn(H, I, device=dev, dtype=dt) / H ** 0.5
    wd = torch.randn(I, H, device=dev, dtype=dt) / I ** 0.5
    zb = torch.zeros(H, device=dev, dtype=dt)
    return wg, wu, wd, zb


def mixed_batch(dev, dt):
    """The mixed batch of the probes (8 rows, each on its own of 8 rank-R adapters on gate, up and down; scales 0.5):
    its tensors, phase 1's plans and the kernels' configs and grids, as the launchers make them (a tuple, in the
    order the probes unpack it)."""
    m, na = 8, 8
    x = torch.randn(m, H, device=dev, dtype=dt)
    ag, au = (torch.randn(na, H, R, device=dev, dtype=dt) / H ** 0.5 for _ in range(2))
    bg, bu = (torch.randn(na, R, I, device=dev, dtype=dt) / 4 for _ in range(2))
    ad = torch.randn(na, I, R, device=dev, dtype=dt) / I ** 0.5
    bd = torch.randn(na, R, H, device=dev, dtype=dt) / 4
    sg, su, sd = (torch.full((na,), 0.5, device=dev, dtype=dt) for _ in range(3))
    idx = torch.arange(m, device=dev, dtype=torch.int64) % na
    h = torch.empty(m, I, device=dev, dtype=dt)
    y = torch.empty(m, H, device=dev, dtype=dt)
    cx = xa_cfg("multi_lora_xa", m)
    s1, kb1, g1 = plan(m, H, na, cx)
    s2, kb2, g2 = plan(m, I, na, cx)
    tg, tu = torch.empty(s1, m, 16, device=dev), torch.empty(s1, m, 16, device=dev)
    td = torch.empty(s2, m, 16, device=dev)
    csw, cmain = cfg("multi_lora_swiglu", m), cfg("multi_lora_main", m)
    gsw = (triton.cdiv(m, csw["BLOCK_M"]) * triton.cdiv(I, csw["BLOCK_N"]),)
    gmain = (triton.cdiv(m, cmain["BLOCK_M"]) * triton.cdiv(H, cmain["BLOCK_N"]),)
    return (m, na, x, ag, au, bg, bu, ad, bd, sg, su, sd, idx, h, y, cx, s1, kb1, g1, s2, kb2, g2, tg, tu, td, csw,
            cmain, gsw, gmain)


def graph_of(fn, launches=1):
    """A CUDA graph of `launches` calls of fn (run once first, so Triton's compilation stays out of the capture),
    replayed once."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(launches):
            fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def replay_us(g, reps):
    """us per replay of graph g, `reps` replays back to back."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def steady(fn, reps=200, rounds=5):
    """us per replay of one CUDA graph of fn, replayed back to back, best of rounds."""
    g = graph_of(fn)
    return min(replay_us(g, reps) for _ in range(rounds))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    dev, dt = "cuda", torch.float16
    wg, wu, wd, zb = mlp_weights(dev, dt)
    print(f"lora PDL probe on {torch.cuda.get_device_name()}, fp16, h{H} i{I} r{R}; us per run (CUDA graph, "
          f"{args.reps} replays, best of {args.rounds})")

    def base(m):
        x = torch.randn(m, H, device=dev, dtype=dt)
        h = torch.empty(m, I, device=dev, dtype=dt)
        c = cfg("swiglu", m)
        grid = (triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(I, c["BLOCK_N"]),)

        def run():
            SW._swiglu_kernel[grid](x, wg, wu, h, m, I, H, 0, DOT_PRECISION="tf32", **c)
            return torch.mm(h, wd)
        return run

    # ---- the mixed batch: 8 rows, 8 adapters
    (m, na, x, ag, au, bg, bu, ad, bd, sg, su, sd, idx, h, y, cx, s1, kb1, g1, s2, kb2, g2, tg, tu, td, csw, cmain, gsw,
     gmain) = mixed_batch(dev, dt)

    def multi():
        def run():
            LO._multi_lora_xa_kernel[(g1,)](x, ag, au, idx, tg, tu, m, H, R, R, 2, na, 1, kb1, tg, 0, R_PAD=16,
                                            DOT_PRECISION="tf32", **cx)
            SW._multi_lora_swiglu_kernel[gsw](x, wg, wu, tg, bg, sg, tu, bu, su, idx, h, m, I, H, R, R, na, 1, s1, 0,
                                              ad, td, 0, R_PAD=16, DOT_PRECISION="tf32", **csw)
            LO._multi_lora_xa_kernel[(g2,)](h, ad, ad, idx, td, td, m, I, R, R, 1, na, 1, kb2, td, 0, R_PAD=16,
                                            DOT_PRECISION="tf32", **cx)
            LO._multi_lora_main_kernel[gmain](h, wd, td, bd, zb, sd, idx, y, m, H, I, R, na, 1, s2, R_PAD=16,
                                              DOT_PRECISION="tf32", **cmain)
            return y
        return run

    def multi_ref():
        xf = x.float()
        j = idx
        gate = xf @ wg.float() + ((torch.einsum("mk,mkr->mr", xf, ag[j].float()) * sg[j, None].float()).half().float()
                                  .unsqueeze(1) @ bg[j].float()).squeeze(1)
        up = xf @ wu.float() + ((torch.einsum("mk,mkr->mr", xf, au[j].float()) * su[j, None].float()).half().float()
                                .unsqueeze(1) @ bu[j].float()).squeeze(1)
        hh = (torch.nn.functional.silu(gate) * up).half().float()
        return hh @ wd.float() + ((torch.einsum("mk,mkr->mr", hh, ad[j].float()) * sd[j, None].float()).half()
                                  .float().unsqueeze(1) @ bd[j].float()).squeeze(1)

    rows = []

    def report(name, runs, ref):
        outs = {}
        for label, fn in runs:
            out = fn().clone()
            torch.cuda.synchronize()
            err = float((out.float() - ref).abs().max() / ref.abs().max()) if ref is not None else float("nan")
            us = steady(fn, args.reps, args.rounds)
            outs[label] = out
            rows.append((name, label, us))
            print(f"  {name:28s} {label:34s} {us:8.1f} us   rel err {err:.1e}")
        first = next(iter(outs.values()))
        same = all(torch.equal(first, o) for o in outs.values())
        print(f"  {name:28s} outputs of the forms bit-equal: {same}")

    report("base MLP, 8 rows", [("swiglu + cuBLAS down", base(8))], None)
    report("mixed batch, 8 rows", [("launched the usual way", multi())], multi_ref())

    # ---- the LoRA MLP at 16 tokens
    m = 16
    x16 = torch.randn(m, H, device=dev, dtype=dt)
    a1g, a1u = (torch.randn(H, R, device=dev, dtype=dt) / H ** 0.5 for _ in range(2))
    b1g, b1u = (torch.randn(R, I, device=dev, dtype=dt) / 4 for _ in range(2))
    a1d, b1d = torch.randn(I, R, device=dev, dtype=dt) / I ** 0.5, torch.randn(R, H, device=dev, dtype=dt) / 4
    h16 = torch.empty(m, I, device=dev, dtype=dt)
    y16 = torch.empty(m, H, device=dev, dtype=dt)
    cx = xa_cfg("lora_xa", m)
    s1, kb1, g1 = plan(m, H, 1, cx)
    s2, kb2, g2 = plan(m, I, 1, cx)
    t1g, t1u = torch.empty(s1, m, 16, device=dev), torch.empty(s1, m, 16, device=dev)
    t1d = torch.empty(s2, m, 16, device=dev)
    csw, cmain = cfg("lora_swiglu", m), cfg("lora_main", m)
    gsw = (triton.cdiv(m, csw["BLOCK_M"]) * triton.cdiv(I, csw["BLOCK_N"]),)
    gmain = triton.cdiv(m, cmain["BLOCK_M"]) * triton.cdiv(H, cmain["BLOCK_N"])

    def lora16(pdl):
        def run():
            LO._lora_xa_kernel[(g1,)](x16, a1g, a1u, t1g, t1u, m, H, R, R, 2, kb1, t1g, 0, R_PAD=16,
                                      DOT_PRECISION="tf32", PDL=pdl, **cx)
            SW._lora_swiglu_kernel[gsw](x16, wg, wu, t1g, b1g, t1u, b1u, h16, m, I, H, R, R, s1, 0.5, 0.5, 0, a1d,
                                        t1d, 0, R_PAD=16, DOT_PRECISION="tf32", PDL=pdl, launch_pdl=pdl, **csw)
            LO._lora_xa_kernel[(g2,)](h16, a1d, a1d, t1d, t1d, m, I, R, R, 1, kb2, t1d, 0, R_PAD=16,
                                      DOT_PRECISION="tf32", PDL=pdl, **cx)
            LO._lora_main_kernel[(gmain,)](h16, wd, t1d, b1d, zb, y16, m, H, I, R, s2, 0.5, 0, gmain, R_PAD=16,
                                           DOT_PRECISION="tf32", TMA=False, PDL=pdl, launch_pdl=pdl, **cmain)
            return y16
        return run

    xf = x16.float()
    gate = xf @ wg.float() + ((xf @ a1g.float()) * 0.5).half().float() @ b1g.float()
    up = xf @ wu.float() + ((xf @ a1u.float()) * 0.5).half().float() @ b1u.float()
    hh = (torch.nn.functional.silu(gate) * up).half().float()
    ref16 = hh @ wd.float() + ((hh @ a1d.float()) * 0.5).half().float() @ b1d.float()
    report("base MLP, 16 tokens", [("swiglu + cuBLAS down", base(16))], None)
    report("LoRA MLP, 16 tokens", [("launched the usual way", lora16(False)), ("main kernels as PDL dependents",
                                                                              lora16(True))], ref16)

    # ---- LoRASwiGLU at 2048 rows: cuBLAS's GEMMs, phase 1, lora_gate
    m = 2048
    xl = torch.randn(m, H, device=dev, dtype=dt)
    cx = xa_cfg("lora_xa", m)
    s1, kb1, g1 = plan(m, H, 1, cx)
    s1b, kb1b, g1b = plan(m, H, 2, cx)  # the old fanout: one program per stack
    tlg, tlu = (torch.empty(max(s1, s1b), m, 16, device=dev) for _ in range(2))
    gl = torch.empty(m, I, device=dev, dtype=dt)
    ul = torch.empty(m, I, device=dev, dtype=dt)
    cg = cfg("lora_gate", m)
    ggate = (triton.cdiv(m, cg["BLOCK_M"]) * triton.cdiv(I, cg["BLOCK_N"]),)
    cg = {k: v for k, v in cg.items() if k != "BLOCK_K"}

    def gate_path(merged):
        split, kb, grid = (s1, kb1, g1) if merged else (s1b, kb1b, g1b)

        def run():
            if merged:
                LO._lora_xa_kernel[(grid,)](xl, a1g, a1u, tlg, tlu, m, H, R, R, 2, kb, tlg, 0, R_PAD=16,
                                            DOT_PRECISION="tf32", **cx)
            else:  # each stack its own programs (X read once per stack)
                LO._lora_xa_kernel[(grid // 2,)](xl, a1g, a1g, tlg, tlg, m, H, R, R, 1, kb, tlg, 0, R_PAD=16,
                                                 DOT_PRECISION="tf32", **cx)
                LO._lora_xa_kernel[(grid // 2,)](xl, a1u, a1u, tlu, tlu, m, H, R, R, 1, kb, tlu, 0, R_PAD=16,
                                                 DOT_PRECISION="tf32", **cx)
            torch.mm(xl, wg, out=gl)
            torch.mm(xl, wu, out=ul)
            SW._lora_gate_kernel[ggate](gl, ul, tlg, b1g, tlu, b1u, gl, m, I, R, R, split, 0.5, 0.5, 0, a1g, tlg, 0,
                                        R_PAD=16,
                                        DOT_PRECISION="tf32", **cg)
            return gl
        return run

    def base2048():
        def run():
            torch.mm(xl, wg, out=gl)
            torch.mm(xl, wu, out=ul)
            return torch.mul(torch.nn.functional.silu(gl), ul, out=gl)
        return run
    xf = xl.float()
    gate = (xl @ wg).float() + ((xf @ a1g.float()) * 0.5).half().float() @ b1g.float()
    up = (xl @ wu).float() + ((xf @ a1u.float()) * 0.5).half().float() @ b1u.float()
    ref = torch.nn.functional.silu(gate) * up
    report("SwiGLU base, 2048 rows", [("cuBLAS x2 + torch silu*mul", base2048())], None)
    report("LoRASwiGLU, 2048 rows", [("phase 1 per stack", gate_path(False)),
                                     ("phase 1 both stacks per X tile", gate_path(True))], ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
