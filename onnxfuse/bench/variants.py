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
    run = _VariantRun(module, inputs, flops, nbytes, opts, dev, result)
    run.reference()
    for name, backend, which, graph in ORT_PLAN:
        run.ort_variant(name, backend, which, graph, models)
    run.torch_variants(w)
    return {name: run.variants.get(name, {"skipped": "not run"}) for name in VARIANTS}


ORT_PLAN = [("ort-unfused", None, "unfused", False), ("ort-unfused+graph", None, "unfused", True),
            ("ort-optimized", None, "ort_optimized", False), ("ort-optimized+graph", None, "ort_optimized", True)]
ORT_PLAN += [(f"fused-{b}{'+graph' if g else ''}", b, "fused", g) for g in (False, True)
             for b in ("triton", "cuda", "auto")]
# fused-cpu: the model `fuse --provider cpu` writes for this host's family (patterns whose CPU kernel loses here are
# left to onnxruntime: fuse.CPU_LEFT_TO_ORT); fused-cpu-all: every pattern fused, the kernels measured against
# onnxruntime's (the evidence for that table).
ORT_PLAN += [("fused-cpu", "cpu", "fused_cpu", False), ("fused-cpu-all", "cpu", "fused", False)]


class _VariantRun:
    """One workload's variants: what each measured (`variants`), and the reference output every rel_err compares
    with (torch eager's, else the first ORT variant's)."""

    def __init__(self, module, inputs, flops, nbytes, opts, dev, result):
        self.module, self.inputs, self.flops, self.nbytes = module, inputs, flops, nbytes
        self.opts, self.dev, self.result = opts, dev, result
        self.variants: dict = {}
        self.ref_outputs = self.ref_name = self.ref_error = None

    def skip(self, name, reason):
        self.variants[name] = {"skipped": reason}

    def selected(self, name) -> bool:
        import torch
        if self.opts.variants and name not in self.opts.variants:
            self.skip(name, "not selected (--variants)")
            return False
        if name in GPU_ONLY and self.opts.device != "cuda":
            self.skip(name, "no CUDA" if not torch.cuda.is_available() else "CPU run (--device cpu)")
            return False
        return True

    def record(self, name, fn, outputs=None, extra=None):
        try:
            times = self.dev.measure(fn, self.opts.warmup, self.opts.runs)
        except Exception as e:
            self.variants[name] = _failure(e)
            return
        v = stats(times)
        v.update(rates(self.flops, self.nbytes, v["median_ms"], self.result))
        if outputs is not None:
            try:
                v["rel_err"] = poison_check(fn, outputs, self.ref_outputs, self.dev)
            except Exception as e:
                v["rel_err_error"] = str(e).splitlines()[0][:200]
            if v.get("rel_err") is not None:
                v["rel_err_vs"] = self.ref_name
        if extra:
            v.update(extra)
        self.variants[name] = v

    def reference(self) -> None:
        """The reference output for every variant's rel_err: one torch eager call."""
        import torch
        if self.module is None:
            return
        try:
            with torch.no_grad():
                out = self.module(*self.inputs.values())
            self.ref_outputs = [out.detach().clone()] if torch.is_tensor(out) else \
                [o.detach().clone() for o in out]
            self.ref_name = "torch-eager"
        except Exception as e:
            self.ref_error = _failure(e)

    def ort_variant(self, name, backend, which, graph, models) -> None:
        opts = self.opts
        fused = which in ("fused", "fused_cpu")
        if not self.selected(name):
            return
        if name.startswith("fused-cpu") and opts.device == "cuda":
            return self.skip(name, "GPU run: the CPU kernels are benchmarked with --device cpu")
        path = models.get(which) or (models.get("fused") if which == "fused_cpu" else None)  # a model file
        if path is None:
            return self.skip(name, models.get("note", "no model"))
        if fused and not models["fused_ops"]:
            return self.skip(name, "nothing fused in this model")
        if which == "fused_cpu" and "fused_cpu" in models and not models["fused_cpu_ops"]:
            left = "; ".join(f"{p}: {why}" for p, why in models["left_to_ort"].items())
            return self.skip(name, f"every pattern here is left to onnxruntime (fuse --provider cpu) - {left}")
        runner = None
        try:
            runner = OrtRun(path, opts.device, opts.lib, backend, graph, self.inputs, self.ref_outputs, opts.tf32)
            if self.ref_outputs is None:  # no torch reference: the unfused ORT output is the reference
                runner()
                self.dev.sync()
                self.ref_outputs = [y.clone() for y in runner.outputs]
                self.ref_name = name
            self.record(name, runner, runner.outputs, {"ort_stream": runner.stream} if opts.device == "cuda" else None)
            if opts.profile and opts.device == "cuda" and "median_ms" in self.variants[name]:
                self.variants[name].update(profile_kernels(runner, self.dev))
        except Exception as e:
            self.variants[name] = _failure(e)
        finally:
            del runner
            gc.collect()

    def torch_variants(self, w: Workload) -> None:
        """torch eager, torch.compile and the GEMMs alone (after the ORT variants: on the CPU, torch's spinning
        OpenMP threads would slow ORT)."""
        import torch
        module = self.module
        with torch.no_grad():
            if module is None:
                self.skip("torch-eager", "no PyTorch module (the model file has no onnxfuse recipe)")
            elif self.selected("torch-eager"):
                if self.ref_error is not None:
                    self.variants["torch-eager"] = self.ref_error
                else:
                    args = list(self.inputs.values())
                    self.record("torch-eager", lambda: module(*args))
            if module is None:
                self.skip("torch-compile", "no PyTorch module")
            elif self.selected("torch-compile"):
                self.torch_compile()
            if w.gemms is None or module is None:
                self.skip("torch-gemms", "only for the gated-MLP and LoRA cases")
            elif self.selected("torch-gemms"):
                try:
                    self.record("torch-gemms", w.gemms(module, self.inputs))
                except Exception as e:
                    self.variants["torch-gemms"] = _failure(e)

    def torch_compile(self) -> None:
        import torch
        if not self.opts.compile:
            return self.skip("torch-compile", "off on the CPU by default (--compile to run it)"
                             if self.opts.device == "cpu" else "off (--no-compile)")
        try:
            tc = time.perf_counter()
            compiled = torch.compile(self.module)
            args = list(self.inputs.values())
            compiled(*args)
            self.dev.sync()
            compile_s = round(time.perf_counter() - tc, 2)
            out_c = []

            def call():
                out_c[:] = [compiled(*args)]
            self.record("torch-compile", call, extra={"compile_s": compile_s})
            if "median_ms" in self.variants["torch-compile"] and self.ref_outputs:
                call()
                self.variants["torch-compile"]["rel_err"] = rel_err(out_c[0], self.ref_outputs[0])
                self.variants["torch-compile"]["rel_err_vs"] = "torch-eager"
        except Exception as e:
            self.variants["torch-compile"] = _failure(e)
        finally:
            torch._dynamo.reset()

def _failure(e: Exception) -> dict:
    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return {"skipped": f"failed: {type(e).__name__}: {msg}", "error": f"{type(e).__name__}: {msg}"}
