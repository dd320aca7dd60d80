"""One `onnxfuse bench` run: its options, its header and every workload.

run resolves the Options for the device, measures the ceilings and onnxruntime's floor, writes the run's header
(device, versions, method) and runs every workload; run_workload prepares a workload's models, inputs and module,
times its variants (variants.run_variants), and adds the per-variant speedups, the case's ratios and its goals.
The result is the JSON schema (schema_version) that report writes and reads back.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import gc
import os
import pathlib
import platform
import time

from .. import host
from ..errors import OnnxfuseError
from .cases import CASES, Workload, file_workload, workloads
from .goals import cross_case_ratios, evaluate_goals
from .harness import Device, measure_ceilings, measure_ort_floor
from .models import flops_and_bytes, log, prepare_file_models, prepare_models
from .ratios import add_variant_speedups, compute_ratios
from .report import annotate
from .variants import VARIANTS, run_variants

SCHEMA_VERSION = 1
DEFAULT_CACHE = pathlib.Path("models/bench")  # exported and fused models (--cache-dir)


@dataclasses.dataclass
class Options:
    """What a run measures and how (the command's flags; None: the device's default, see _resolve)."""
    device: str = "auto"            # auto | cuda | cpu
    dtype: str | None = None        # fp16 on cuda, fp32 on cpu
    quick: bool | None = None       # None: automatic (True on the CPU)
    sizes: list[int] | None = None
    runs: int | None = None         # default 100 on cuda, 50 on cpu
    warmup: int | None = None       # default 10 on cuda, 3 on cpu
    layers: int = 1
    variants: list[str] | None = None
    compile: bool | None = None     # None: on for cuda, off for cpu
    tf32: bool = True
    lib: str | None = None
    cache_dir: pathlib.Path = DEFAULT_CACHE
    seed: int = 0
    quiet: bool = True
    profile: bool = False           # GPU kernel time per run of every ORT variant (torch.profiler / CUPTI)


def _resolve(opts: Options) -> Options:
    """A copy of opts with the device's defaults filled in and every value checked (one-line errors)."""
    import torch
    o = dataclasses.replace(opts)
    if o.device == "auto":
        o.device = "cuda" if torch.cuda.is_available() else "cpu"
    if o.device == "cuda" and not torch.cuda.is_available():
        raise OnnxfuseError("--device cuda: torch sees no CUDA device; run on the GPU machine or use --device cpu")
    if o.device not in ("cuda", "cpu"):
        raise OnnxfuseError(f"--device must be auto, cuda or cpu (got {o.device!r})")
    if o.dtype is None:
        o.dtype = "fp16" if o.device == "cuda" else "fp32"
    if o.dtype not in ("fp16", "fp32"):
        raise OnnxfuseError(f"--dtype must be fp16 or fp32 (got {o.dtype!r}; bf16 cannot be bound from Python)")
    if o.quick is None:
        o.quick = o.device == "cpu"
    o.runs = o.runs or (100 if o.device == "cuda" else 50)
    o.warmup = 10 if o.warmup is None and o.device == "cuda" else (3 if o.warmup is None else o.warmup)
    if o.runs < 1 or o.warmup < 0:
        raise OnnxfuseError("--runs must be >= 1 and --warmup >= 0")
    if o.compile is None:
        o.compile = o.device == "cuda"
    if o.variants:
        bad = [v for v in o.variants if v not in VARIANTS]
        if bad:
            raise OnnxfuseError(f"--variants: unknown {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    if o.sizes and min(o.sizes) <= 0:
        raise OnnxfuseError("--sizes must be positive")
    if o.lib is not None and not pathlib.Path(o.lib).is_file():
        raise OnnxfuseError(f"--lib {o.lib}: no such file; give a built libonnxfuse_ops.so "
                            "('onnxfuse build' prints its path)")
    o.cache_dir = pathlib.Path(o.cache_dir)
    return o


def _versions() -> dict:
    import importlib
    out = {"python": platform.python_version()}
    for m in ("onnxfuse", "torch", "onnxruntime", "onnx", "onnxscript", "transformers", "triton", "peft"):
        try:
            out[m] = getattr(importlib.import_module(m), "__version__", "?")
        except Exception:
            out[m] = None
    try:
        import torch
        out["cuda"] = torch.version.cuda
    except Exception:
        pass
    return out


def _device_name(kind: str, desc: dict) -> str:
    if kind == "cuda":
        import torch
        return torch.cuda.get_device_name(0)
    return f"CPU {desc['cpu_model']} ({desc['threads']} threads, {host.family(desc)})"


def _host(opts) -> dict:
    """host.describe() with what the kernel library runs here (the CPU kernels' GEMM family and oneDNN's choice)."""
    from .. import kernels
    try:
        lib = opts.lib or kernels.library_path(provider=opts.device)
    except Exception:  # no library: the variants that need one report it themselves
        lib = None
    return host.describe(lib)


def run(targets: list[str] | None = None, options: Options | None = None) -> dict:
    """Benchmark named cases (default all) or one .onnx model; returns the results dict (the JSON schema)."""
    opts = _resolve(options or Options())
    targets = list(targets or [])
    files = [t for t in targets if t.endswith(".onnx") or os.sep in t]
    names = [t for t in targets if t not in files]
    if names == ["all"] or not targets:
        names = list(CASES)
    if files and names:
        raise OnnxfuseError("give either named cases or one .onnx model file, not both")
    if len(files) > 1:
        raise OnnxfuseError("give one .onnx model file at a time")
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise OnnxfuseError(f"unknown case {unknown[0]!r}; choose from {', '.join(CASES)}, 'all', or an .onnx path")
    if opts.device == "cuda":
        import onnxruntime as ort
        if hasattr(ort, "preload_dlls"):
            try:
                ort.preload_dlls()
            except Exception:
                pass
    import torch
    dev = Device(opts.device)
    if opts.device == "cuda" and opts.dtype == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = opts.tf32
        torch.backends.cudnn.allow_tf32 = opts.tf32
    t_start = time.perf_counter()
    desc = _host(opts)
    log(f"device {_device_name(opts.device, desc)}; host {host.summary(desc)}", opts.quiet)
    log("measuring peak GEMM rate and copy bandwidth", opts.quiet)
    ceilings = measure_ceilings(dev, opts.dtype, opts.quick)
    ort_floor = measure_ort_floor(dev, opts)
    result = {
        "schema_version": SCHEMA_VERSION,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "device": _device_name(opts.device, desc), "device_type": opts.device,
        "host": desc,
        "versions": _versions(),
        "peak_tflops": ceilings["peak_tflops"], "bandwidth_gbs": ceilings["bandwidth_gbs"],
        "ceilings": ceilings,
        "ort_floor_ms": ort_floor,
        "dtype": opts.dtype,
        "fp32_math": ("n/a (fp16)" if opts.dtype == "fp16" else
                      "cpu: fp32" if opts.device == "cpu" else
                      "tf32 everywhere: torch allow_tf32=True, ORT use_tf32=1, onnxfuse kernels tf32" if opts.tf32 else
                      "strict fp32 for torch and ORT (use_tf32=0); onnxfuse fp32 kernels may use tf32"),
        "method": {"timer": "CUDA events, synchronize after every run" if opts.device == "cuda" else
                   "time.perf_counter per run", "warmup": opts.warmup, "runs": opts.runs,
                   "statistic": "median (p10, p90)", "rotate_inputs": False,
                   "iobinding": "torch tensors bound by data_ptr (inputs and outputs)",
                   "ort_stream": "torch's current stream (user_compute_stream) without CUDA graphs; ORT's own stream "
                                 "with CUDA graphs" if opts.device == "cuda" else "n/a",
                   "roofline": "roofline_pct = 100 * max(flops/peak, bytes/bandwidth) / median",
                   "backend_selection": "each fused session gets an in-memory copy of the model with the "
                                        "nodes' backend attribute set"},
        "quick": opts.quick,
        "cases": [],
    }
    if files:
        work = [file_workload(files[0], opts.seed)]
    else:
        work = workloads(names, opts.dtype, opts.seed, opts.quick, opts.sizes, opts.layers)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    # On stderr, so that --json output on stdout stays machine-readable.
    with Progress(TextColumn("[bench] {task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True, disable=opts.quiet) as bar:
        task = bar.add_task("cases", total=len(work))
        for w in work:
            bar.update(task, description=f"{getattr(w, 'case', 'model')} {getattr(w, 'size', '')}".strip())
            result["cases"].append(run_workload(w, opts, dev, result))
            bar.advance(task)
    cross_case_ratios(result)
    result["seconds"] = round(time.perf_counter() - t_start, 1)
    result["target"] = (pathlib.Path(files[0]).stem if files else
                        "all" if names == list(CASES) else "+".join(names))
    return annotate(result)


def run_workload(w: Workload, opts: Options, dev: Device, result: dict) -> dict:
    """One workload's entry of result["cases"]: its models (exported and fused, or from the cache), every variant on
    its inputs and module, then the per-variant speedups, the ratios and the goals (`result` is the run so far: its
    ceilings and floor)."""
    import torch
    t0 = time.perf_counter()
    entry: dict = {"case": w.case, "size": w.size, "size_name": w.size_name, "shape": dict(w.shape),
                   "dtype": opts.dtype, "quick": w.quick}
    models = (prepare_file_models(w, opts.cache_dir) if w.key == "file" else
              prepare_models(w, opts.dtype, opts.seed, opts.cache_dir, opts.quiet, cpu=opts.device == "cpu"))
    entry["models"] = models
    flops, nbytes = flops_and_bytes(models["unfused"] or models["fused"])
    entry["flops"], entry["bytes"] = flops, nbytes
    log(f"{w.case} {w.size_name} {w.size}: fused ops {models['fused_ops'] or 'none'}; timing", opts.quiet)

    inputs = {k: v.to(opts.device).contiguous() for k, v in w.build_inputs().items()}
    module = None
    if w.build_module is not None:
        module = w.build_module().to(opts.device)
    variants = run_variants(w, module, inputs, models, flops, nbytes, opts, dev, result)
    module = None
    gc.collect()

    entry["variants"] = variants
    # unfused speedup per variant (same CUDA-graph setting where both ran), and the time above onnxruntime's floor
    add_variant_speedups(entry["variants"], result.get("ort_floor_ms"))
    entry["ratios"] = compute_ratios(entry["variants"], result.get("ort_floor_ms"))
    entry["goals"] = evaluate_goals(entry, result)
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    del inputs
    gc.collect()
    if opts.device == "cuda":
        torch.cuda.empty_cache()
    return entry
