"""The variants `onnxfuse bench` times on each workload, and run_variants, which times them.

In table order (VARIANTS): torch eager, torch.compile, the bare GEMMs through torch.matmul (torch-gemms),
onnxruntime on the unfused model (ort-unfused) and on the model after onnxruntime's own fusions (ort-optimized), and
onnxruntime on the fused model with each kernel backend (fused-triton, fused-cuda, fused-auto; each also with CUDA
graphs, +graph) or the CPU kernels (fused-cpu: what `fuse --provider cpu` fuses on this host; fused-cpu-all: every
pattern). Every variant's output is checked against the torch eager one (or,
without a module, the unfused ORT one) on poisoned output buffers (rel_err).
"""
from __future__ import annotations

import gc
import time

from .cases import Workload
from .harness import Device, OrtRun, poison_check, profile_kernels, rates, rel_err, stats


# Every variant, in table order. GPU-only ones are reported {"skipped": "no CUDA"} on a CPU run.
VARIANTS = ("torch-eager", "torch-compile", "torch-gemms", "ort-unfused", "ort-unfused+graph",
            "ort-optimized", "ort-optimized+graph",
            "fused-triton", "fused-cuda", "fused-auto", "fused-triton+graph", "fused-cuda+graph", "fused-auto+graph",
            "fused-cpu", "fused-cpu-all")
GPU_ONLY = {"ort-unfused+graph", "ort-optimized+graph", "fused-triton", "fused-cuda", "fused-auto",
            "fused-triton+graph", "fused-cuda+graph", "fused-auto+graph"}
FUSED_GPU = ("fused-triton", "fused-cuda", "fused-auto", "fused-triton+graph", "fused-cuda+graph", "fused-auto+graph")
UNFUSED = ("ort-unfused", "ort-unfused+graph")
# The strongest baseline a user has without onnxfuse: the same model after onnxruntime's own transformer fusions
# (fuse's stage 1 alone), run with ORT's graph optimisations on.
ORT_OPTIMIZED = ("ort-optimized", "ort-optimized+graph")


def run_variants(w: Workload, module, inputs: dict, models: dict, flops: int | None, nbytes: int | None, opts,
                 dev: Device, result: dict) -> dict:
    """Time every variant of workload `w` (bench.Options `opts`: which variants, runs, device, --lib, --profile) on
    `inputs` (on the device): the ORT ones on `models` (prepare_models' paths), then torch eager, torch.compile and
    the GEMMs on `module` (None: a model file without a recipe). Returns {variant: timings | {"skipped": why}} in
    VARIANTS order; a variant that fails is reported, not raised."""
    import torch
    variants: dict = {}
    ref_outputs = None

    def skip(name, reason):
        variants[name] = {"skipped": reason}

    def selected(name) -> bool:
        if opts.variants and name not in opts.variants:
            skip(name, "not selected (--variants)")
            return False
        if name in GPU_ONLY and opts.device != "cuda":
            skip(name, "no CUDA" if not torch.cuda.is_available() else "CPU run (--device cpu)")
            return False
        return True

    def record(name, fn, outputs=None, extra=None):
        try:
            times = dev.measure(fn, opts.warmup, opts.runs)
        except Exception as e:
            variants[name] = _failure(e)
            return
        v = stats(times)
        v.update(rates(flops, nbytes, v["median_ms"], result))
        if outputs is not None:
            try:
                v["rel_err"] = poison_check(fn, outputs, ref_outputs, dev)
            except Exception as e:
                v["rel_err_error"] = str(e).splitlines()[0][:200]
            if v.get("rel_err") is not None:
                v["rel_err_vs"] = ref_name
        if extra:
            v.update(extra)
        variants[name] = v

    ref_name = None
    ref_error = None
    if module is not None:  # the reference output for every variant's rel_err: one torch eager call
        try:
            with torch.no_grad():
                out = module(*inputs.values())
            ref_outputs = [out.detach().clone()] if torch.is_tensor(out) else [o.detach().clone() for o in out]
            ref_name = "torch-eager"
        except Exception as e:
            ref_error = _failure(e)

    ort_plan = [("ort-unfused", None, "unfused", False), ("ort-unfused+graph", None, "unfused", True),
                ("ort-optimized", None, "ort_optimized", False), ("ort-optimized+graph", None, "ort_optimized", True)]
    ort_plan += [(f"fused-{b}{'+graph' if g else ''}", b, "fused", g) for g in (False, True)
                 for b in ("triton", "cuda", "auto")]
    # fused-cpu: the model `fuse --provider cpu` writes for this host's family (patterns whose CPU kernel loses
    # here are left to onnxruntime: fuse.CPU_LEFT_TO_ORT); fused-cpu-all: every pattern fused, the kernels measured
    # against onnxruntime's (the evidence for that table).
    ort_plan += [("fused-cpu", "cpu", "fused_cpu", False), ("fused-cpu-all", "cpu", "fused", False)]
    for name, backend, which, graph in ort_plan:
        fused = which in ("fused", "fused_cpu")
        if not selected(name):
            continue
        if name.startswith("fused-cpu") and opts.device == "cuda":
            skip(name, "GPU run: the CPU kernels are benchmarked with --device cpu")
            continue
        path = models.get(which) or (models.get("fused") if which == "fused_cpu" else None)  # a model file
        if path is None:
            skip(name, models.get("note", "no model"))
            continue
        if fused and not models["fused_ops"]:
            skip(name, "nothing fused in this model")
            continue
        if which == "fused_cpu" and "fused_cpu" in models and not models["fused_cpu_ops"]:
            left = "; ".join(f"{p}: {why}" for p, why in models["left_to_ort"].items())
            skip(name, f"every pattern here is left to onnxruntime (fuse --provider cpu) - {left}")
            continue
        runner = None
        try:
            runner = OrtRun(path, opts.device, opts.lib, backend, graph, inputs, ref_outputs, opts.tf32)
            if ref_outputs is None:  # no torch reference: the unfused ORT output is the reference
                runner()
                dev.sync()
                ref_outputs = [y.clone() for y in runner.outputs]
                ref_name = name
            record(name, runner, runner.outputs, {"ort_stream": runner.stream} if opts.device == "cuda" else None)
            if opts.profile and opts.device == "cuda" and "median_ms" in variants[name]:
                variants[name].update(profile_kernels(runner, dev))
        except Exception as e:
            variants[name] = _failure(e)
        finally:
            del runner
            gc.collect()
    with torch.no_grad():
        # torch eager (timed after the ORT variants: on the CPU, torch's spinning OpenMP threads would slow ORT)
        if module is None:
            skip("torch-eager", "no PyTorch module (the model file has no onnxfuse recipe)")
        elif selected("torch-eager"):
            if ref_error is not None:
                variants["torch-eager"] = ref_error
            else:
                args = list(inputs.values())
                record("torch-eager", lambda: module(*args))
        # torch.compile
        if module is None:
            skip("torch-compile", "no PyTorch module")
        elif selected("torch-compile"):
            if not opts.compile:
                skip("torch-compile", "off on the CPU by default (--compile to run it)" if opts.device == "cpu"
                     else "off (--no-compile)")
            else:
                try:
                    tc = time.perf_counter()
                    compiled = torch.compile(module)
                    args = list(inputs.values())
                    compiled(*args)
                    dev.sync()
                    compile_s = round(time.perf_counter() - tc, 2)
                    out_c = []

                    def call():
                        out_c[:] = [compiled(*args)]
                    record("torch-compile", call, extra={"compile_s": compile_s})
                    if "median_ms" in variants["torch-compile"] and ref_outputs:
                        call()
                        variants["torch-compile"]["rel_err"] = rel_err(out_c[0], ref_outputs[0])
                        variants["torch-compile"]["rel_err_vs"] = "torch-eager"
                except Exception as e:
                    variants["torch-compile"] = _failure(e)
                finally:
                    torch._dynamo.reset()
        # the GEMMs alone (no activation)
        if w.gemms is None or module is None:
            skip("torch-gemms", "only for the gated-MLP and LoRA cases")
        elif selected("torch-gemms"):
            try:
                record("torch-gemms", w.gemms(module, inputs))
            except Exception as e:
                variants["torch-gemms"] = _failure(e)

    return {name: variants.get(name, {"skipped": "not run"}) for name in VARIANTS}


def _failure(e: Exception) -> dict:
    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return {"skipped": f"failed: {type(e).__name__}: {msg}", "error": f"{type(e).__name__}: {msg}"}
