"""Compile every Triton kernel specialisation of onnxfuse to cubin ahead of time and write them as a C++ header.

Run by the CMake build (cuda/cuda.cmake) on a machine that needs no GPU:

    python aot.py --out BUILD/triton_kernels.h --archs 90 [--archs 80] [--configs tuned.json] [--jobs 2]

The header holds one byte array per cubin and a table `kTritonSpecs` (of `TritonSpec`, cuda/triton/runtime.h) that
the hand-written launchers (cuda/<family>.cu) search at launch time: (kernel, dtype, size class, aligned,
r_pad, arch, tma) -> cubin, entry name, warps, shared memory, block shape, pdl (may start as a programmatic
dependent: table.PDL_DEPENDENTS on sm_90+). Kernel ids, dtype codes, size classes and
rank padding come from table.py, which the build also writes into the generated onnxfuse_ops.h that the launchers
read. Specialisations:
  * dtype: fp32, fp16, bf16 (fp32 GEMMs use tl.dot with input_precision="ieee": exact fp32, no TF32 rounding);
  * size class by M, chosen by the launcher: "small" (M <= 16, the decode path: one 16-row tile, narrow column tiles
    so that N / BLOCK_N programs cover every SM and the weights are streamed once), "medium" (M <= 128) and "large";
  * aligned: pointers 16-byte aligned and K, N multiples of 16, for LoRA also r a multiple of 8 (divisibility hints
    give vectorised, cp.async-pipelined loads), or not;
  * LoRA only (a kernel with the R_PAD constexpr): r padded to 16, 32 or 64. LoRA runs as the two-phase pair
    "lora_xa" (fp32 partials of X @ A into scratch; its config's BLOCK_N is unused) and "lora_main" (the GEMM main
    loop plus one T @ B dot);
  * tma: the aligned fp16/bf16 builds of table.TMA_KERNELS in table.TMA_SIZE_CLASS on sm_90+ are compiled a second
    time with TMA=True (tma_eligible): persistent, tiles loaded through TMA descriptors (gemm_loop._gemm_tile_tma),
    same tile config;
  * the embedding interaction (a kernel file with SHAPE_CONFIGS): per padded shape (NP, DP) instead of size class.
Kernel sources: table.KERNEL_FILES (every triton/*.py with a KERNELS table), imported as one package so that they
can share @triton.jit helpers through relative imports (gemm_loop.py: the GEMM tile and K loop; cuda/cuda.cmake
lists every file as an input of this step). Tile configs live beside each kernel, in its file's CONFIGS per arch
(`base_configs`); tuned.json in this folder (written by `onnxfuse tune` on the GPU, committed
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


def _load_table():
    """table.py of this folder, loaded by path: aot.py runs as a script, outside the onnxfuse package."""
    spec = importlib.util.spec_from_file_location("_onnxfuse_triton_table", HERE / "table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TABLE = _load_table()
KERNEL_IDS, DTYPES, SIZE_CLASSES, R_PADS = TABLE.KERNEL_IDS, TABLE.DTYPES, TABLE.SIZE_CLASSES, TABLE.R_PADS

def _kernel_package(folder: pathlib.Path, name: str) -> None:
    """A folder of kernel files as the private package `name` (not through onnxfuse.kernels, whose __init__ may need
    more), so that they share gemm_loop.py through relative imports; once per name. The probes load an earlier
    commit's copy beside this one under another name."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_loader(name, loader=None, is_package=True)
        pkg = importlib.util.module_from_spec(spec)
        pkg.__path__ = [str(folder)]
        sys.modules[name] = pkg


def _kernel_modules():
    """The kernel files of this folder (table.KERNEL_FILES), imported as the package _onnxfuse_triton_kernels."""
    name = "_onnxfuse_triton_kernels"
    _kernel_package(HERE, name)
    return [importlib.import_module(f"{name}.{f}") for f in TABLE.KERNEL_FILES]


def _load_kernels():
    """kernel name -> (function, parameters): every kernel file's KERNELS, in id order."""
    kernels = {}
    for mod in _kernel_modules():
        kernels.update(mod.KERNELS)
    assert list(kernels) == list(KERNEL_IDS), "table.KERNEL_IDS disagrees with the kernel files' KERNELS"
    return kernels


def base_configs() -> dict:
    """The tile configs the kernel files declare: arch -> kernel -> dtype group -> size class -> (BLOCK_M, BLOCK_N,
    BLOCK_K, GROUP_M, num_warps, num_stages), merged from each file's CONFIGS (gemm_loop.py says what a config
    is). The shape-specialised kernels (SHAPE_CONFIGS: the embedding interaction's (NP, DP) tiles) are not in it."""
    out: dict = {}
    for mod in _kernel_modules():
        for arch, kernels in getattr(mod, "CONFIGS", {}).items():
            out.setdefault(arch, {}).update(kernels)
    return out


def shape_configs() -> dict:
    """kernel -> {(NP, DP): config} of the kernels compiled per padded shape (a file's SHAPE_CONFIGS), checked
    against table.py's EMBED_NPS x EMBED_DPS, which the launcher searches."""
    out = {}
    for mod in _kernel_modules():
        table = getattr(mod, "SHAPE_CONFIGS", None)
        if table is None:
            continue
        if set(table) != {(n, d) for n in TABLE.EMBED_NPS for d in TABLE.EMBED_DPS}:
            raise ValueError(f"{mod.__name__}: SHAPE_CONFIGS must cover table.EMBED_NPS x table.EMBED_DPS")
        out.update({kernel: table for kernel in mod.KERNELS})
    return out


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
    configs = base_configs()
    base = configs.get(arch) or configs["90" if int(arch) >= 90 else "80"]
    out = json.loads(json.dumps(base))  # deep copy, tuples -> lists
    for kernel, groups in (overrides or {}).get(arch, {}).items():
        for group, classes in groups.items():
            out[kernel][group].update(classes)
    return out


def specialisations(archs, overrides=None):
    """Every (kernel, dtype, size class, aligned, r_pad, arch, tma, config) the launcher may ask for."""
    by_shape = shape_configs()
    # compiled per padded LoRA rank: the kernels that take the R_PAD constexpr; with and without zero points (r_pad 1
    # and 0): the kernels that take the ZP constexpr (int4_linear)
    rank_padded = {k for k, (fn, _) in _load_kernels().items() if "R_PAD" in fn.arg_names}
    zero_pointed = {k for k, (fn, _) in _load_kernels().items() if "ZP" in fn.arg_names}
    for arch in archs:
        cfgs = configs_for(arch, overrides)
        for kernel in KERNEL_IDS:
            if kernel in by_shape:
                # size class = index into table.EMBED_NPS, r_pad = the padded dim DP; generic alignment only (the
                # rows are gathered, so a divisibility hint would only cover the first row of each load)
                for dtype, _ in DTYPES:
                    for np_index, n_pad in enumerate(TABLE.EMBED_NPS):
                        for d_pad in TABLE.EMBED_DPS:
                            yield dict(kernel=kernel, dtype=dtype, size=SIZE_CLASSES[np_index], aligned=0,
                                       r_pad=d_pad, arch=arch, tma=0, config=by_shape[kernel][(n_pad, d_pad)])
                continue
            for dtype, _ in DTYPES:
                group = "f" if dtype == "fp32" else "h"
                for size in SIZE_CLASSES:
                    for aligned in (1, 0):
                        for r_pad in (R_PADS if kernel in rank_padded else (0, 1) if kernel in zero_pointed else (0,)):
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
        elif spec["aligned"] and pname in ("R", "R2", "RG", "RU", "RD"):  # LoRA ranks: multiples of 8 (16-byte A rows)
            attrs[(i,)] = [["tt.divisibility", 8]]
    constexprs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group_m,
                  "DOT_PRECISION": "ieee" if spec["dtype"] == "fp32" else "tf32"}
    if spec["r_pad"]:
        constexprs["R_PAD"] = spec["r_pad"]
    if "ZP" in fn.arg_names:  # int4_linear: r_pad 1 is the build with zero points
        constexprs["ZP"] = bool(spec["r_pad"])
    if "NP" in fn.arg_names:  # shape-specialised (SHAPE_CONFIGS): size class = NP's index, r_pad = DP
        constexprs.update(NP=TABLE.EMBED_NPS[SIZE_CLASSES.index(spec["size"])], DP=spec["r_pad"])
    constexprs["TMA"] = bool(spec.get("tma", 0))
    constexprs["PDL"] = pdl_eligible(spec)  # programmatic dependent launch (gemm_loop._pdl_*), kept where taken
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
        raise RuntimeError(f"{spec}: cooperative / PDL launch options are the AOT launcher's, not the compiler's")
    return dict(spec, cubin=compiled.asm["cubin"], name=md.name, num_warps=md.num_warps, shared=md.shared,
                seconds=round(time.time() - t0, 2), n_params=len(params),
                pdl=int(spec["kernel"] in TABLE.PDL_DEPENDENTS and pdl_eligible(spec)))


def pdl_eligible(spec: dict) -> bool:
    """Whether a kernel that takes the PDL constexpr (LoRA's phase 1, which signals, and the main kernels after it,
    which wait) is compiled with PDL=True: sm_90 or later (griddepcontrol). The table's pdl field marks the waiting
    ones (table.PDL_DEPENDENTS), which the launcher may start as programmatic dependents."""
    return int(spec["arch"]) >= 90


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
                     f"{int(r.get('tma', 0))}, {int(r.get('pdl', 0))}}},  "
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
    p.add_argument("--configs", type=pathlib.Path,
                   help="JSON overrides of the kernel files' CONFIGS (autotuned tiles per arch)")
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
