"""`onnxfuse tune`: time candidate tile configs of the Triton GEMM kernels on this GPU and write the winners as a
JSON table in the shape of triton/aot.py's `--configs` (arch -> kernel -> dtype group -> size class -> config).

What it tunes: the fp16/bf16 ("h") configs of linear_act, swiglu and lora_main (LoRA's GEMM phase) for each size
class of triton/table.py, each on the op's benchmark shape of that class (SHAPES: the Llama MLP's and LoRA's, M =
16 / 128 / 2048). Every candidate is JIT-compiled (in parallel worker processes, into Triton's cache), run on the
same inputs, checked against torch (a config with a wrong result is rejected) and timed with
triton.testing.do_bench (median, L2 flushed between runs). A candidate replaces the built-in config only when it is
faster by more than MIN_GAIN, so run-to-run noise does not churn the table. fp32 ("f") configs are not tuned.
Where the library runs the persistent TMA build (triton/table.py TMA_*: linear_act and lora_main, large class, the
bench's K = 4096), the candidates run on it, as the library would; the picked config serves both builds of the class.

The build applies triton/tuned.json (committed; written by this command on an H100, sm_90) on top of the kernel
files' CONFIGS for the archs it lists, and `--configs FILE` on top of that; `onnxfuse doctor` runs every op on shapes of
every size class (aligned and not), so the library's tuned configs are all checked against PyTorch, and it says
which table the library was built with.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import json
import multiprocessing
import pathlib

from . import onnxio
from .kernels.build import TRITON_DIR, aot_module as _aot
from .schema import FAMILY_OF

TUNED_FILE = TRITON_DIR / "tuned.json"

# kernel -> size class -> (M, K, N[, R]): the bench cases' shapes (llama-mlp, lora-linear).
SHAPES = {
    "swiglu": {"small": (16, 4096, 11008), "medium": (128, 4096, 11008), "large": (2048, 4096, 11008)},
    "linear_act": {"small": (16, 4096, 4096), "medium": (128, 4096, 4096), "large": (2048, 4096, 4096)},
    "lora_main": {"small": (16, 4096, 4096, 16), "medium": (128, 4096, 4096, 16), "large": (2048, 4096, 4096, 16)},
}
KERNELS = tuple(SHAPES)
SIZES = ("small", "medium", "large")
MIN_GAIN = 0.03          # a candidate must beat the built-in config by more than 3 %
SHARED_LIMIT = 220 * 1024  # bytes of shared memory per block a candidate may need (H100: 227 KB)


def shared_bytes(kernel: str, cfg) -> int:
    """Shared memory of a (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages) config, 2-byte elements: each stage
    holds the X tile and the W tile (two W tiles for swiglu's gate and up)."""
    bm, bn, bk, _, _, stages = cfg
    return stages * (bm * bk + bk * bn * (2 if kernel == "swiglu" else 1)) * 2


def candidates(kernel: str, size: str, default) -> list[tuple]:
    """The built-in config first, then the grid for the size class, without configs over SHARED_LIMIT."""
    if size == "small":
        grid = [(16, bn, bk, 1, 4, st) for bn in (32, 64, 128) for bk in (64, 128, 256) for st in (3, 4, 5)]
    elif size == "medium":
        grid = [(bm, bn, 64, 8, w, st) for bm in (32, 64, 128) for bn in (64, 128) for w in (4, 8) for st in (3, 4)]
    else:
        grid = [(bm, bn, 64, 8, w, st) for bm, bn in ((128, 128), (128, 256), (256, 128), (64, 256))
                for w in (4, 8) for st in (3, 4, 5)]
    out = [tuple(default)]
    for cfg in grid:
        if cfg not in out and shared_bytes(kernel, cfg) <= SHARED_LIMIT:
            out.append(cfg)
    return out


class _Problem:
    """Inputs, output and reference of one (kernel, size class) on the GPU, and the launch of one config."""

    def __init__(self, kernel: str, size: str, seed: int = 0):
        import torch
        from . import schema
        self.kernel, self.size = kernel, size
        shape = SHAPES[kernel][size]
        m, k, n = shape[:3]
        self.m, self.k, self.n = m, k, n
        g = torch.Generator(device="cuda").manual_seed(seed)
        dev, dt = "cuda", torch.float16

        def rnd(*s, scale=1.0):
            return (torch.randn(*s, generator=g, device=dev, dtype=torch.float32) * scale).to(dt)

        table = _aot().TABLE
        major, _ = torch.cuda.get_device_capability()
        # the persistent TMA kernel where the library runs it on this shape (cuda/triton/runtime.cc WithTma)
        self.tma = (kernel in table.TMA_KERNELS and size == table.TMA_SIZE_CLASS and k >= table.TMA_MIN_K
                    and major >= 9)
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        if self.tma:
            import triton
            # TMA descriptors are built on the device, in global scratch that a JIT launch takes from here
            triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=dev))
        self.x = rnd(m, k)
        self.w = rnd(k, n, scale=k ** -0.5)
        self.y = torch.empty(m, n, device=dev, dtype=dt)
        xf = self.x.float()
        if kernel == "swiglu":
            self.w2 = rnd(k, n, scale=k ** -0.5)
            gate = xf @ self.w.float()
            self.ref = gate * torch.sigmoid(gate) * (xf @ self.w2.float())
        elif kernel == "linear_act":
            self.bias = rnd(n, scale=0.1)
            self.act = schema.ACTIVATIONS["relu"]
            self.ref = torch.relu(xf @ self.w.float() + self.bias.float())
        else:
            r = shape[3]
            self.r = r
            a, self.b = rnd(k, r, scale=k ** -0.5), rnd(r, n, scale=r ** -0.5)
            self.bias = rnd(n, scale=0.1)
            self.scale = 2.0
            self.t = (xf @ a.float()).contiguous()  # phase 1's fp32 partials, one split
            t16 = (self.t * self.scale).to(dt).float()
            self.ref = torch.relu(xf @ self.w.float() + self.bias.float() + t16 @ self.b.float())

    def launch(self, fn, cfg):
        bm, bn, bk, group_m, warps, stages = cfg
        tiles = ((self.m + bm - 1) // bm) * ((self.n + bn - 1) // bn)
        nprog = min(tiles, self.sms) if self.tma else tiles
        grid = (nprog,)
        meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, DOT_PRECISION="tf32", num_warps=warps,
                    num_stages=stages)
        m, n, k = self.m, self.n, self.k
        if self.kernel == "swiglu":
            fn[grid](self.x, self.w, self.w2, self.y, m, n, k, 0, **meta)
        elif self.kernel == "linear_act":
            fn[grid](self.x, self.w, self.bias, self.y, m, n, k, self.act, nprog, TMA=self.tma, **meta)
        else:
            fn[grid](self.x, self.w, self.t, self.b, self.bias, self.y, m, n, k, self.r, 1, self.scale, 1, nprog,
                     R_PAD=16, TMA=self.tma, **meta)

    def error(self) -> float:
        ref = self.ref
        return float((self.y.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6))


def _kernel_fn(kernel: str):
    return _aot()._load_kernels()[kernel][0]


def _warm(kernel: str, size: str, cfg) -> str | None:
    """Worker: compile one config into Triton's cache by running it once; the error text if it does not compile."""
    try:
        import torch
        p = _Problem(kernel, size)
        p.launch(_kernel_fn(kernel), cfg)
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001 - reported per candidate, the sweep goes on
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


def run_tune(kernels=KERNELS, sizes=SIZES, jobs: int | None = None, rep_ms: int = 200, on_line=None) -> dict:
    """Sweep, time and pick; returns the table (aot.py --configs shape) with a "meta" entry holding every timing."""
    import torch
    import triton
    import triton.testing

    if not torch.cuda.is_available():
        raise RuntimeError("onnxfuse tune needs a CUDA GPU (torch.cuda.is_available() is False)")
    say = on_line or (lambda s: None)
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    aot = _aot()
    built_in = aot.configs_for(arch)
    plan = [(kernel, size, candidates(kernel, size, built_in[kernel]["h"][size])) for kernel in kernels
            for size in sizes]
    work = [(kernel, size, cfg) for kernel, size, cands in plan for cfg in cands]
    say(f"onnxfuse tune: {len(work)} configs of {', '.join(kernels)} on {torch.cuda.get_device_name()} (sm_{arch}); "
        f"compiling with {jobs or 'all'} workers")
    compile_errors = {}
    if jobs != 1:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            for item, err in zip(work, pool.map(_warm, *zip(*work))):
                if err:
                    compile_errors[item] = err
    table: dict = {arch: {}}
    results: dict = {}
    for kernel, size, cands in plan:
        prob = _Problem(kernel, size)
        fn = _kernel_fn(kernel)
        rows = []
        for cfg in cands:
            err_text = compile_errors.get((kernel, size, cfg))
            ms = err = None
            if err_text is None:
                try:
                    prob.y.zero_()
                    prob.launch(fn, cfg)
                    torch.cuda.synchronize()
                    err = prob.error()
                    if err > 2e-2:
                        err_text = f"wrong result (max error {err:.3g} of max |ref|)"
                    else:
                        ms = triton.testing.do_bench(lambda prob=prob, cfg=cfg: prob.launch(fn, cfg), rep=rep_ms,
                                                     return_mode="median")
                except Exception as e:  # noqa: BLE001
                    err_text = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
            rows.append({"config": list(cfg), "ms": ms, "rel_err": err, "error": err_text})
        default = rows[0]
        ok = [r for r in rows if r["ms"] is not None]
        if default["ms"] is None:
            raise RuntimeError(f"{kernel}/{size}: the built-in config {default['config']} failed: {default['error']}")
        best = min(ok, key=lambda r: r["ms"])
        pick = best if best["ms"] < default["ms"] * (1 - MIN_GAIN) else default
        table[arch].setdefault(kernel, {"h": {}})["h"][size] = pick["config"]
        results.setdefault(kernel, {})[size] = {
            "shape": list(SHAPES[kernel][size]), "built_in": default["config"], "built_in_ms": default["ms"],
            "picked": pick["config"], "picked_ms": pick["ms"], "best_ms": best["ms"], "candidates": rows}
        say(f"  {kernel:<10} {size:<6} M={SHAPES[kernel][size][0]:<5} built-in {default['ms'] * 1e3:8.1f} us "
            f"{tuple(default['config'])}  picked {pick['ms'] * 1e3:8.1f} us {tuple(pick['config'])}  "
            f"({len(ok)}/{len(rows)} ran)")
        del prob
        torch.cuda.empty_cache()
    table["meta"] = {
        "written_by": "onnxfuse tune", "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(), "arch": arch, "dtype": "fp16 (applied to the fp16/bf16 group 'h')",
        "versions": {"torch": torch.__version__, "triton": triton.__version__},
        "method": f"triton.testing.do_bench median over {rep_ms} ms, L2 flushed; a candidate replaces the built-in "
                  f"config when faster by more than {MIN_GAIN:.0%}", "results": results}
    return table


def merge_tables(base: dict, new: dict) -> dict:
    """`new`'s archs replace `base`'s per (kernel, group, size class); the meta entries are kept per arch."""
    out = json.loads(json.dumps(base))
    for arch, kernels in new.items():
        if arch == "meta":
            continue
        for kernel, groups in kernels.items():
            for group, classes in groups.items():
                out.setdefault(arch, {}).setdefault(kernel, {}).setdefault(group, {}).update(classes)
    if "meta" in new:  # meta per arch: {"90": {...}}; a table's own single meta has an "arch" key
        old = out.get("meta", {})
        old = {old["arch"]: old} if "arch" in old else {k: v for k, v in old.items() if k.isdigit()}
        old[new["meta"]["arch"]] = new["meta"]
        out["meta"] = old
    return out


def save(table: dict, out: pathlib.Path, records_dir: pathlib.Path | None = None) -> str:
    """Writes `table` to `out` atomically; the message. Into the package's tuned.json (what the build applies) go
    only the configs, merged into it; the timings of the run (its "meta") go to a records file in `records_dir`
    (default: bench's results folder, git-ignored in a checkout), so the package holds no measurements."""
    into_package = out.resolve() == TUNED_FILE.resolve()
    records = None
    if into_package:
        table = dict(table)
        meta = table.pop("meta", None)
        if TUNED_FILE.is_file():
            current = json.loads(TUNED_FILE.read_text())
            current.pop("meta", None)
            table = merge_tables(current, table)
        if meta is not None:
            from .bench.report import results_dir
            folder = pathlib.Path(records_dir) if records_dir is not None else results_dir()
            folder.mkdir(parents=True, exist_ok=True)
            records = folder / f"tune-sm{meta.get('arch', 'x')}-{meta.get('date', 'undated')}.json"
    validate(table, str(out))
    onnxio.write_atomic(out, json.dumps(table, indent=1) + "\n")  # never a half-written table
    if records is not None:
        onnxio.write_atomic(records, json.dumps(meta, indent=1) + "\n")
    if into_package:
        return f"wrote {out}; the next 'onnxfuse build' compiles with it" + (f"; the timings: {records}" if records
                                                                             else "")
    return f"wrote {out}; merge it into {TUNED_FILE} (onnxfuse tune --into-package) for the build to use it"


# Triton GEMM kernel -> the op family it runs (onnxfuse/ops/<family>.py); OPS_OF_KERNEL names the family's ops.
FAMILY_OF_KERNEL = {"linear_act": "linear_act", "swiglu": "swiglu", "lora_main": "lora_linear"}
OPS_OF_KERNEL = {kernel: tuple(op for op, f in FAMILY_OF.items() if f == family)
                 for kernel, family in FAMILY_OF_KERNEL.items()}


def doctor_coverage(shapes: dict, arch: str = "90", sms: int = 132) -> list[str]:
    """Which tuned (kernel, size class) no doctor shape runs with its fp16/bf16 aligned config: `shapes` is
    doctor.DEFAULT_SHAPES ((M, K, N, r[, act]) per op). A large-class config runs only where its tiles cover the SMs
    (else the launcher takes the medium tile, cuda/triton/runtime.cc FindForShape)."""
    aot = _aot()
    cfgs = aot.configs_for(arch, aot.default_overrides())
    limits = aot.TABLE.SIZE_CLASS_MAX_M

    def runs(kernel: str, size: str, min_k: int = 0) -> bool:
        """Some doctor shape of the kernel's ops runs its aligned config of `size` (with K >= min_k)."""
        bm, bn = cfgs[kernel]["h"][size][:2]
        for op in OPS_OF_KERNEL.get(kernel, ()):
            for m, k, n, r, *_ in shapes.get(op, ()):
                cls = "small" if m <= limits[0] else "medium" if m <= limits[1] else "large"
                aligned = k % 16 == 0 and n % 16 == 0 and (kernel != "lora_main" or r % 8 == 0)
                tiles = -(-m // bm) * -(-n // bn)
                if cls == size and aligned and k >= min_k and (size != "large" or tiles >= sms):
                    return True
        return False

    missing = [f"{kernel}/{size}" for kernel in OPS_OF_KERNEL for size in SIZES if not runs(kernel, size)]
    # the persistent TMA builds: K >= TMA_MIN_K on an aligned shape of their class whose tiles cover the SMs
    tma_size = aot.TABLE.TMA_SIZE_CLASS
    missing += [f"{kernel}/{tma_size}/tma" for kernel in aot.TABLE.TMA_KERNELS
                if not runs(kernel, tma_size, aot.TABLE.TMA_MIN_K)]
    return missing


def load_table(path: pathlib.Path = TUNED_FILE) -> dict:
    """A tuned table, checked: arch keys are numbers, every entry names a known kernel, group and size class and
    holds six positive ints."""
    data = json.loads(path.read_text())
    validate(data, str(path))
    return data


def validate(data: dict, where: str) -> None:
    aot = _aot()
    for arch, kernels in data.items():
        if arch == "meta":
            continue
        if not arch.isdigit():
            raise ValueError(f"{where}: arch key {arch!r} is not a number like '90'")
        for kernel, groups in kernels.items():
            if kernel not in aot.KERNEL_IDS:
                raise ValueError(f"{where}: unknown kernel {kernel!r} (one of {', '.join(aot.KERNEL_IDS)})")
            for group, classes in groups.items():
                if group not in ("h", "f"):
                    raise ValueError(f"{where}: {kernel}: dtype group {group!r} is not 'h' or 'f'")
                for size, cfg in classes.items():
                    if size not in aot.SIZE_CLASSES:
                        raise ValueError(f"{where}: {kernel}/{group}: unknown size class {size!r}")
                    if not (isinstance(cfg, list) and len(cfg) == 6 and all(isinstance(v, int) and v > 0
                                                                            for v in cfg)):
                        raise ValueError(f"{where}: {kernel}/{group}/{size}: {cfg!r} is not six positive ints "
                                         "(BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages)")
