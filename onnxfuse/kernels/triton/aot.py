"""Compile every Triton kernel specialisation of onnxfuse to cubin ahead of time and write them as a C++ header.

Run by the CMake build (cuda/cuda.cmake) on a machine that needs no GPU:

    python aot.py --out BUILD/triton_kernels.h --archs 90 [--archs 80] [--configs tuned.json] [--jobs 2]

The header holds one byte array per cubin and a table `kTritonSpecs` (of `TritonSpec`, cuda/triton/runtime.h) that
the hand-written launchers (cuda/triton/<family>.cc) search at launch time: (kernel, dtype, size class, aligned,
r_pad, arch, tma) -> cubin, entry name, warps, shared memory, block shape. Kernel ids, dtype codes, size classes and
rank padding come from table.py, which the build also writes into the generated onnxfuse_ops.h that the launchers
read. Specialisations:
  * dtype: fp32, fp16, bf16 (fp32 GEMMs use tl.dot with input_precision="ieee": exact fp32, no TF32 rounding);
  * size class by M, chosen by the launcher: "small" (M <= 16, the decode path: one 16-row tile, narrow column tiles
    so that N / BLOCK_N programs cover every SM and the weights are streamed once), "medium" (M <= 128) and "large";
  * aligned: pointers 16-byte aligned and K, N multiples of 16, for LoRA also r a multiple of 8 (divisibility hints
    give vectorised, cp.async-pipelined loads), or not;
  * LoRA only: r padded to 16, 32 or 64. LoRA runs as the two-phase pair "lora_xa" (fp32 partials of X @ A into
    scratch; its config's BLOCK_N is unused) and "lora_main" (the GEMM main loop plus one T @ B dot);
  * tma: the aligned fp16/bf16 builds of table.TMA_KERNELS in table.TMA_SIZE_CLASS on sm_90+ are compiled a second
    time with TMA=True (tma_eligible): persistent, tiles loaded through TMA descriptors (gemm_loop._gemm_tile_tma),
    same tile config;
Kernel sources: KERNEL_FILES, imported as one package so that they can share @triton.jit helpers through relative
imports (gemm_loop.py: the GEMM tile and K loop; cuda/cuda.cmake lists every file as an input of this step).
Tile configs live in CONFIGS per arch; tuned.json in this folder (written by `onnxfuse tune` on the GPU, committed
for sm_90) overrides entries for the archs it lists, and `--configs FILE` (JSON of the same shape) overrides those
(`default_overrides`). Triton 3.6 ABI: kernel params are the non-constexpr args, then two scratch pointers (global,
profile). Only the TMA builds may need global scratch (their device-side descriptors, at most
table.TMA_SCRATCH_PER_PROGRAM bytes per program, which the launcher takes from the caller's scratch); any other
need of either scratch is refused here, since the launcher passes null.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib.util
import json
import os
import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
KERNEL_FILES = ("linear_act", "swiglu", "lora_linear", "mlp_stack", "rotary_embedding", "embedding",
                "embedding_interaction")
LORA_KERNELS = ("lora_xa", "lora_main")


def _load_table():
    """table.py of this folder, loaded by path: aot.py runs as a script, outside the onnxfuse package."""
    spec = importlib.util.spec_from_file_location("_onnxfuse_triton_table", HERE / "table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TABLE = _load_table()
KERNEL_IDS, DTYPES, SIZE_CLASSES, R_PADS = TABLE.KERNEL_IDS, TABLE.DTYPES, TABLE.SIZE_CLASSES, TABLE.R_PADS

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) per arch / kernel / dtype group / size class.
# "h" = fp16 and bf16, "f" = fp32. Shared memory per config stays below 160 KB so sm_80 fits as well.
#
# "small" (M <= 16, decode) is memory bound: the goal is streaming the weights once at full bandwidth with every
# program resident in ONE wave (no tail) and enough bytes in flight (~3 TB/s x ~0.7 us ~ 2-3 MB over the chip).
# H100: 132 SMs, 228 KB shared memory per SM. Per K step a program loads W BLOCK_K x BLOCK_N (x2 for SwiGLU) and
# X 16 x BLOCK_K (from L2; re-read by every column tile, 16 / BLOCK_N of the W bytes).
# (compiled.metadata.shared shows num_stages - 1 buffers for these mma.sync pipelines.)
#   * swiglu N=11008: BLOCK_N=64, BLOCK_K=128, 4 stages -> 172 programs, 36 KB per stage (108 KB): 2 per SM, all
#     resident (264 slots), 128-byte row segments of W, ~2 stages (72 KB) in flight each -> ~12 MB over the chip;
#   * linear_act / LoRA, N=4096: BLOCK_N=32, BLOCK_K=128, 5 stages -> 128 programs (one per SM), 12 KB per stage,
#     48 KB of shared memory, ~3 stages in flight each (~4.6 MB); with N=11008, 344 programs: 3-4 per SM, one wave.
_H_COMMON = {"small": (16, 32, 128, 1, 4, 5), "medium": (64, 128, 64, 8, 4, 4), "large": (128, 128, 64, 8, 8, 4)}
_F_COMMON = {"small": (16, 32, 64, 1, 4, 3), "medium": (64, 64, 32, 8, 4, 3), "large": (128, 64, 32, 8, 8, 3)}
_H_SWIGLU_SMALL = (16, 64, 128, 1, 4, 4)
# lora_xa: (BLOCK_M, unused, BLOCK_K, unused, warps, stages). Grid = row tiles x SPLIT slices of K (the launcher
# picks SPLIT so that about one program per SM runs); memory bound (reads X once, A per program from L2).
_H_XA = {"small": (16, 0, 128, 1, 4, 3), "medium": (16, 0, 128, 1, 4, 3), "large": (64, 0, 64, 1, 4, 4)}
_F_XA = {"small": (16, 0, 64, 1, 4, 3), "medium": (16, 0, 64, 1, 4, 3), "large": (64, 0, 32, 1, 4, 3)}
# mlp_stack: the size class is BLOCK_M (the rows one program carries through every layer), picked by the launcher
# so that the grid covers the SMs: "small" 16 rows, "medium" 32, "large" 64. GROUP_M is unused. BLOCK_N = 128 is
# the best of 64 / 128 / 256 measured on the H100 for DLRM's bottom and top MLPs at M = 128 and 16384
# (the 2026-11-22 run, in git history).
_H_STACK = {"small": (16, 128, 64, 1, 4, 3), "medium": (32, 128, 64, 1, 4, 3), "large": (64, 128, 64, 1, 4, 3)}
_F_STACK = {"small": (16, 64, 32, 1, 4, 2), "medium": (32, 64, 32, 1, 4, 2), "large": (64, 64, 32, 1, 4, 2)}
# rotary_embedding: (rows per program, half-columns per program, -, -, warps, stages), memory bound: 16 rows x 64 pairs
# (a head dim of 128 in one column tile: 16 x 128 elements of X, cos and sin per program), the same for every size.
_ROTARY = {size: (16, 64, 16, 1, 4, 1) for size in ("small", "medium", "large")}
# embedding: (ids per program, columns per program, -, -, warps, stages): a copy, 8 rows x 512 columns.
_EMBEDDING = {size: (8, 512, 16, 1, 4, 1) for size in ("small", "medium", "large")}
# mlp_stack_grid (the persistent small-M stack): the size class by M picks the tile every layer is split into; the
# grid is min(SMs, the most tiles of any layer). 16 x 32 tiles at M <= 128 put DLRM's 512-wide layers on 128 SMs
# (8 row x 16 column tiles); 64 x 64 above (M = 2048: 256 tiles of a 512-wide layer, two rounds per SM).
_H_GRID = {"small": (16, 32, 64, 1, 4, 3), "medium": (16, 32, 64, 1, 4, 3), "large": (64, 64, 64, 1, 4, 3)}
_F_GRID = {"small": (16, 32, 32, 1, 4, 2), "medium": (16, 32, 32, 1, 4, 2), "large": (32, 64, 32, 1, 4, 2)}
CONFIGS: dict[str, dict[str, dict[str, dict[str, tuple]]]] = {
    "90": {
        "linear_act": {"h": dict(_H_COMMON, large=(128, 256, 64, 8, 8, 3)), "f": _F_COMMON},
        "swiglu": {"h": dict(_H_COMMON, small=_H_SWIGLU_SMALL, large=(128, 128, 64, 8, 8, 3)), "f": _F_COMMON},
        "lora_xa": {"h": _H_XA, "f": _F_XA},
        "lora_main": {"h": dict(_H_COMMON, large=(128, 256, 64, 8, 8, 3)), "f": _F_COMMON},
        "mlp_stack": {"h": _H_STACK, "f": _F_STACK},
        "rotary_embedding": {"h": _ROTARY, "f": _ROTARY},
        "embedding": {"h": _EMBEDDING, "f": _EMBEDDING},
        "mlp_stack_grid": {"h": _H_GRID, "f": _F_GRID},
    },
    "80": {
        "linear_act": {"h": _H_COMMON, "f": _F_COMMON},
        "swiglu": {"h": dict(_H_COMMON, small=_H_SWIGLU_SMALL, large=(128, 128, 32, 8, 8, 3)), "f": _F_COMMON},
        "lora_xa": {"h": _H_XA, "f": _F_XA},
        "lora_main": {"h": _H_COMMON, "f": _F_COMMON},
        "mlp_stack": {"h": _H_STACK, "f": _F_STACK},
        "rotary_embedding": {"h": _ROTARY, "f": _ROTARY},
        "embedding": {"h": _EMBEDDING, "f": _EMBEDDING},
        "mlp_stack_grid": {"h": _H_GRID, "f": _F_GRID},
    },
}
# embedding_interaction: one cubin per dtype and (NP, DP) of table.py (the padded vector count and embedding dim);
# (BLOCK_M samples per program, 0, 0, 1, warps, stages). A program holds [BLOCK_M, NP, DP] vectors and the
# [BLOCK_M, NP, NP] fp32 products: BLOCK_M keeps both near 8K and 16K elements (64 + 128 registers over 128
# threads). DLRM (27 vectors of 16): NP = 32, DP = 16, 8 samples per program (16 programs at batch 128).
EMBED_CONFIGS = {(32, 16): (8, 0, 0, 1, 4, 1), (32, 32): (4, 0, 0, 1, 4, 1), (32, 64): (2, 0, 0, 1, 4, 1),
                 (32, 128): (1, 0, 0, 1, 4, 1), (64, 16): (2, 0, 0, 1, 4, 1), (64, 32): (2, 0, 0, 1, 4, 1),
                 (64, 64): (1, 0, 0, 1, 4, 1), (64, 128): (1, 0, 0, 1, 8, 1)}
EMBED_KERNELS = ("embedding_interaction",)
assert set(EMBED_CONFIGS) == {(n, d) for n in TABLE.EMBED_NPS for d in TABLE.EMBED_DPS}


def _load_kernels():
    """Import the kernel files as a private package (not through onnxfuse.kernels, whose __init__ may need more)."""
    name = "_onnxfuse_triton_kernels"
    if name not in sys.modules:
        spec = importlib.util.spec_from_loader(name, loader=None, is_package=True)
        pkg = importlib.util.module_from_spec(spec)
        pkg.__path__ = [str(HERE)]
        sys.modules[name] = pkg
    kernels = {}
    for f in KERNEL_FILES:
        mod = importlib.import_module(f"{name}.{f}")
        kernels.update(mod.KERNELS)
    return kernels


TUNED = HERE / "tuned.json"


def default_overrides(configs: pathlib.Path | None = None) -> dict:
    """tuned.json's entries (if the file exists), then those of `configs`, per arch / kernel / group / size class."""
    out: dict = {}
    for path in (TUNED if TUNED.is_file() else None, configs):
        for arch, kernels in (json.loads(path.read_text()) if path else {}).items():
            if arch == "meta":
                continue
            for kernel, groups in kernels.items():
                for group, classes in groups.items():
                    out.setdefault(arch, {}).setdefault(kernel, {}).setdefault(group, {}).update(classes)
    return out


def configs_for(arch: str, overrides: dict | None = None) -> dict:
    base = CONFIGS.get(arch) or CONFIGS["90" if int(arch) >= 90 else "80"]
    out = json.loads(json.dumps(base))  # deep copy, tuples -> lists
    for kernel, groups in (overrides or {}).get(arch, {}).items():
        for group, classes in groups.items():
            out[kernel][group].update(classes)
    return out


def specialisations(archs, overrides=None):
    """Every (kernel, dtype, size class, aligned, r_pad, arch, tma, config) the launcher may ask for."""
    for arch in archs:
        cfgs = configs_for(arch, overrides)
        for kernel in KERNEL_IDS:
            if kernel in EMBED_KERNELS:
                # size class = index into table.EMBED_NPS, r_pad = the padded dim DP; generic alignment only (the
                # rows are gathered, so a divisibility hint would only cover the first row of each load)
                for dtype, _ in DTYPES:
                    for np_index, n_pad in enumerate(TABLE.EMBED_NPS):
                        for d_pad in TABLE.EMBED_DPS:
                            yield dict(kernel=kernel, dtype=dtype, size=SIZE_CLASSES[np_index], aligned=0,
                                       r_pad=d_pad, arch=arch, tma=0, config=EMBED_CONFIGS[(n_pad, d_pad)])
                continue
            for dtype, _ in DTYPES:
                group = "f" if dtype == "fp32" else "h"
                for size in SIZE_CLASSES:
                    for aligned in (1, 0):
                        for r_pad in (R_PADS if kernel in LORA_KERNELS else (0,)):
                            base = dict(kernel=kernel, dtype=dtype, size=size, aligned=aligned, r_pad=r_pad, arch=arch,
                                        tma=0)
                            yield dict(base, config=tuple(cfgs[kernel][group][size]))
                            if tma_eligible(base):
                                yield dict(base, tma=1, config=tuple(cfgs[kernel][group][size]))


def compile_one(spec: dict) -> dict:
    # No line info in the cubins (ptxas -suppress-debug-info): with it, ptxas schedules around the debug scopes of
    # inlined helpers (gemm_loop.py), so how the source is factored would change the SASS. Set in the environment,
    # not as a knob, because Triton's cache key reads the environment.
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    import triton
    from triton.backends.compiler import GPUTarget

    kernels = _load_kernels()
    fn, params = kernels[spec["kernel"]]
    bm, bn, bk, group_m, warps, stages = spec["config"]
    signature, attrs = {}, {}
    for i, (pname, ptype) in enumerate(params):
        hinted = ptype.endswith(":16")  # an int the kernel file marks for the divisibility hint
        ptype = ptype.removesuffix(":16")
        signature[pname] = ptype.replace("T", spec["dtype"]) if ptype.startswith("*") else ptype
        # Alignment hints: every pointer and the K, N sizes (row strides) divisible by 16.
        if spec["aligned"] and (ptype.startswith("*") or pname in ("K", "N") or hinted):
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif spec["aligned"] and pname == "R":  # LoRA: rank a multiple of 8 (16-byte rows of A for fp16/bf16)
            attrs[(i,)] = [["tt.divisibility", 8]]
    constexprs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
                  "DOT_PRECISION": "ieee" if spec["dtype"] == "fp32" else "tf32"}
    if spec["r_pad"]:
        constexprs["R_PAD"] = spec["r_pad"]
    if spec["kernel"] in EMBED_KERNELS:
        constexprs.update(NP=TABLE.EMBED_NPS[SIZE_CLASSES.index(spec["size"])], DP=spec["r_pad"])
    constexprs["TMA"] = bool(spec.get("tma", 0))
    constexprs = {k: v for k, v in constexprs.items() if k in fn.arg_names}  # lora_xa has no BLOCK_N / GROUP_M
    for k in constexprs:
        signature[k] = "constexpr"
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    t0 = time.time()
    compiled = triton.compile(src, target=GPUTarget("cuda", int(spec["arch"]), 32),
                              options={"num_warps": warps, "num_stages": stages})
    md = compiled.metadata
    scratch = int(getattr(md, "global_scratch_size", 0) or 0)
    if getattr(md, "profile_scratch_size", 0) or (scratch and not constexprs.get("TMA")):
        raise RuntimeError(f"{spec}: needs Triton global/profile scratch, which the AOT launcher gives only the "
                           "persistent TMA kernels")
    if scratch and (scratch > TABLE.TMA_SCRATCH_PER_PROGRAM or int(getattr(md, "global_scratch_align", 1)) > 128):
        raise RuntimeError(f"{spec}: {scratch} bytes of descriptor scratch per program (align "
                           f"{getattr(md, 'global_scratch_align', 1)}), over table.TMA_SCRATCH_PER_PROGRAM")
    if tuple(getattr(md, "cluster_dims", (1, 1, 1)) or (1, 1, 1)) not in ((1, 1, 1), (0, 0, 0)) \
            or getattr(md, "num_ctas", 1) != 1:
        raise RuntimeError(f"{spec}: thread-block clusters are not supported by the AOT launcher")
    if getattr(md, "launch_cooperative_grid", False) or getattr(md, "launch_pdl", False):
        raise RuntimeError(f"{spec}: cooperative / PDL launches are not supported by the AOT launcher")
    return dict(spec, cubin=compiled.asm["cubin"], name=md.name, num_warps=md.num_warps, shared=md.shared,
                seconds=round(time.time() - t0, 2), n_params=len(params))


def tma_eligible(spec: dict) -> bool:
    """Whether a specialisation also gets a persistent TMA build (gemm_loop._gemm_tile_tma): a kernel of
    table.TMA_KERNELS, sm_90 or later, the aligned build (TMA needs 16-byte aligned bases and row strides), 16-bit
    types, table.TMA_SIZE_CLASS."""
    return (spec["kernel"] in TABLE.TMA_KERNELS and int(spec["arch"]) >= 90 and bool(spec["aligned"])
            and spec["dtype"] != "fp32" and spec["size"] == TABLE.TMA_SIZE_CLASS)


def _c_ident(spec):
    return "k_{kernel}_{dtype}_{size}_{a}_r{r_pad}_sm{arch}{t}".format(
        a="al" if spec["aligned"] else "un", t="_tma" if spec.get("tma") else "", **spec)


def write_header(results, out: pathlib.Path, triton_version: str):
    lines = ["// Generated by onnxfuse/kernels/triton/aot.py: do not edit. Triton " + triton_version,
             "#pragma once", "#include <cstddef>", "", '#include "cuda/triton/runtime.h"', "",
             "namespace onnxfuse::triton_aot {", ""]
    for r in results:
        data = r["cubin"]
        body = ",".join(str(b) for b in data)
        lines.append(f"alignas(16) static const unsigned char {_c_ident(r)}[{len(data)}] = {{{body}}};")
    # TritonSpec is the runtime's (cuda/triton/runtime.h); each entry below lists its fields in order.
    lines += ["", "static const TritonSpec kTritonSpecs[] = {"]
    dt = dict(DTYPES)
    for r in results:
        bm, bn, bk = r["config"][0], r["config"][1], r["config"][2]
        lines.append(f"  {{{KERNEL_IDS[r['kernel']]}, {dt[r['dtype']]}, {SIZE_CLASSES.index(r['size'])}, "
                     f"{r['aligned']}, {r['r_pad']}, {r['arch']}, {_c_ident(r)}, "
                     f"sizeof({_c_ident(r)}), \"{r['name']}\", {r['num_warps']}, {r['shared']}, {bm}, {bn}, {bk}, "
                     f"{int(r.get('tma', 0))}}},  "
                     f"// {r['kernel']} {r['dtype']} {r['size']} cfg={list(r['config'])}")
    lines += ["};", f"static const int kNumTritonSpecs = {len(results)};", "",
              "}  // namespace onnxfuse::triton_aot", ""]
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text("\n".join(lines))
    os.replace(tmp, out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=pathlib.Path, help="header to write")
    p.add_argument("--archs", default="90", help="semicolon/comma separated compute capabilities, e.g. '80;90'")
    p.add_argument("--configs", type=pathlib.Path, help="JSON overrides of CONFIGS (autotuned tiles per arch)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--manifest", type=pathlib.Path, help="also write a JSON summary (configs, shared, warps)")
    args = p.parse_args(argv)
    import triton

    archs = [a.strip() for a in args.archs.replace(",", ";").split(";") if a.strip()]
    overrides = default_overrides(args.configs)
    specs = list(specialisations(archs, overrides))
    t0 = time.time()
    if args.jobs > 1:
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
            results = list(pool.map(compile_one, specs))
    else:
        results = [compile_one(s) for s in specs]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_header(results, args.out, triton.__version__)
    if args.manifest:
        summary = [{k: v for k, v in r.items() if k != "cubin"} | {"cubin_bytes": len(r["cubin"]),
                   "cubin_sha256": hashlib.sha256(r["cubin"]).hexdigest()[:16]} for r in results]
        args.manifest.write_text(json.dumps({"triton": triton.__version__, "archs": archs,
                                             "tuned": str(TUNED) if TUNED.is_file() else None,
                                             "configs": str(args.configs) if args.configs else None,
                                             "overrides": overrides, "kernels": summary}, indent=1))
    total = sum(len(r["cubin"]) for r in results)
    print(f"onnxfuse triton aot: {len(results)} cubins for sm_{'/sm_'.join(archs)}, {total / 1e6:.1f} MB, "
          f"{time.time() - t0:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
