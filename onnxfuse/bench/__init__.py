"""`onnxfuse bench`: torch eager, torch.compile, onnxruntime unfused and onnxruntime fused (per kernel backend, with
and without CUDA graphs) on one workload, in one process and one run.

    onnxfuse bench                       # every named case (GPU sizes on a GPU, small sizes on the CPU)
    onnxfuse bench llama-mlp dlrm        # some named cases
    onnxfuse bench models/x.onnx         # a model file (fused on the fly when it is not fused yet)
    onnxfuse bench --from-json R.json --check-goals   # re-read a results file: table, goals, plot; no run
    python -m onnxfuse.bench plot R.json [-o R.png]   # the plot alone (e.g. on a machine with matplotlib)

Method (GPU): inputs and outputs are torch tensors bound to onnxruntime with IOBinding (no host copies in the
timings); non-graph ORT sessions run on torch's current stream (provider option user_compute_stream); CUDA-graph
sessions use ORT's own stream (ORT synchronises at the end of every run, so events on torch's stream still bracket
the work). Every timed run is bracketed by CUDA events and followed by a synchronize, so each number is one
complete run including its host overhead; the same input buffers are used for every run (inputs are not rotated:
CUDA graphs need fixed addresses; weights dominate the bytes of every named case). Warm-up runs come first, then
the median (and p10/p90) of --runs runs. CPU: the same with time.perf_counter. The ceilings for the roofline are
measured in the same run: a large GEMM through torch.matmul in the benchmark dtype (peak) and a large
device-to-device copy (bytes read + bytes written over time).

fp32 on the GPU: ORT's CUDA EP uses TF32 for fp32 GEMMs by default and torch does not; this benchmark turns TF32
on everywhere (torch.backends.cuda.matmul.allow_tf32 = True, ORT use_tf32=1) unless --no-tf32 (then torch TF32 off
and ORT use_tf32=0; the onnxfuse fp32 kernels may still use TF32). The JSON's "fp32_math" says which.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import hashlib
import json
import math
import os
import pathlib
import platform
import re
import statistics
import sys
import time
import warnings
from typing import Callable

from ..errors import OnnxfuseError

SCHEMA_VERSION = 1
DEFAULT_CACHE = pathlib.Path("models/bench")
DEFAULT_RESULTS = pathlib.Path("benchmarks/results")

# Every variant, in table order. GPU-only ones are reported {"skipped": "no CUDA"} on a CPU run.
VARIANTS = ("torch-eager", "torch-compile", "torch-gemms", "ort-unfused", "ort-unfused+graph",
            "ort-optimized", "ort-optimized+graph",
            "fused-triton", "fused-cuda", "fused-auto", "fused-triton+graph", "fused-cuda+graph", "fused-auto+graph",
            "fused-cpu")
GPU_ONLY = {"ort-unfused+graph", "ort-optimized+graph", "fused-triton", "fused-cuda", "fused-auto",
            "fused-triton+graph", "fused-cuda+graph", "fused-auto+graph"}
FUSED_GPU = ("fused-triton", "fused-cuda", "fused-auto", "fused-triton+graph", "fused-cuda+graph", "fused-auto+graph")
UNFUSED = ("ort-unfused", "ort-unfused+graph")
# The strongest baseline a user has without onnxfuse: the same model after onnxruntime's own transformer fusions
# (fuse's stage 1 alone), run with ORT's graph optimisations on.
ORT_OPTIMIZED = ("ort-optimized", "ort-optimized+graph")


# ------------------------------------------------------------------------------------------------------------ goals

@dataclasses.dataclass(frozen=True)
class Goal:
    case: str            # a case name, or "*" for every case that has a fused model
    size: int | None     # tokens / batch the goal is stated at; None: any size
    metric: str          # a key of the case's "ratios"
    threshold: float     # goal: ratio >= threshold
    text: str


# Issue 7's goals (fp16 on the GPU, the issue's sizes). Ratios are speedups: baseline median / fused median.
GOALS: tuple[Goal, ...] = (
    Goal("llama-mlp", 2048, "fused_vs_unfused", 1.04, "Llama MLP h4096/i11008, 2048 tokens: fused ORT >= 1.04x unfused ORT"),
    Goal("llama-mlp", 16, "fused_vs_unfused", 1.5, "Llama MLP h4096/i11008, 16 tokens: fused ORT >= 1.5x unfused ORT"),
    Goal("seed-mlp", 2048, "fused_vs_unfused", 1.4, "Llama MLP h1024/i11008, 2048 tokens: fused ORT >= 1.4x unfused ORT"),
    Goal("lora-linear", 2048, "fused_vs_unfused", 1.8, "LoRA linear 4096^2 r16 + relu, 2048 tokens: fused >= 1.8x unfused"),
    Goal("dlrm", 128, "fused_vs_unfused", 2.0, "whole DLRM, batch 128: fused >= 2x unfused"),
    Goal("dlrm", 2048, "fused_vs_unfused", 1.5, "whole DLRM, batch 2048: fused >= 1.5x unfused"),
    Goal("llama-7b", 2048, "fused_vs_ort_optimized", 1.15,
         "Llama-2-7B shapes, 1 layer, 1x2048 tokens: fused >= 1.15x ORT-optimized (ORT's own fusions)"),
    Goal("llama-7b", 2048, "fused_vs_unfused", 1.75, "Llama-2-7B shapes, 1 layer, 1x2048 tokens: fused >= 1.75x unfused"),
    Goal("llama", 2048, "fused_vs_ort_optimized", 1.25,
         "seed Llama, 1 layer, 2x1024 tokens: fused >= 1.25x ORT-optimized (ORT's own fusions)"),
    Goal("dlrm-bottom", 128, "unfused_over_fused_above_floor", 3.0,
         "DLRM bottom MLP, batch 128: fused time above the ORT floor <= 1/3 of unfused"),
    Goal("dlrm-bottom", 2048, "unfused_over_fused_above_floor", 3.0,
         "DLRM bottom MLP, batch 2048: fused time above the ORT floor <= 1/3 of unfused"),
    Goal("dlrm-top", 128, "unfused_over_fused_above_floor", 3.0,
         "DLRM top MLP, batch 128: fused time above the ORT floor <= 1/3 of unfused"),
    Goal("dlrm-top", 2048, "unfused_over_fused_above_floor", 3.0,
         "DLRM top MLP, batch 2048: fused time above the ORT floor <= 1/3 of unfused"),
    Goal("dlrm", 128, "kernel_us_goal", 1.0, "whole DLRM, batch 128: GPU kernel time per run <= 30 us (--profile)"),
    Goal("llama-mlp", 2048, "gemms_over_fused", 1.0, "Llama MLP, 2048 tokens: fused MLP no slower than its GEMMs alone"),
    Goal("llama-mlp", 2048, "roofline_pct", 85.0, "Llama MLP, 2048 tokens: >= 85% of the GEMM peak of the same run"),
    Goal("llama-mlp", 16, "roofline_pct", 85.0, "Llama MLP, 16 tokens: >= 85% of the bandwidth of the same run"),
    Goal("lora-linear", 2048, "gemms_over_fused", round(1 / 1.15, 4),
         "LoRA linear, 2048 tokens: <= 1.15x the time of the base GEMM alone"),
    Goal("*", None, "fused_vs_compile", 1.0, "every fused case at least as fast as torch.compile"),
    # Issue 15: the gated-MLP family at the SwiGLU kernel's speed (same shapes, same run; see SAME_SHAPES_AS).
    *(Goal(case, size, "fused_vs_llama_mlp", round(1 / 1.05, 4),
           f"{what}, {size} tokens: fused within 5% of the fused Llama MLP (same shapes, same run)")
      for case, what in (("geglu-mlp", "GeGLU MLP h4096/i11008"), ("phi3-mlp", "Phi-3 MLP (merged gate_up) "
                                                                              "h4096/i11008"))
      for size in (2048, 16)),
)
# Cases whose fused op should run at the speed of another case's (same GEMM shapes; only the activation or the
# projections' spelling differ): ratio `fused_vs_<other>` = other's best fused median / this case's, computed when
# both ran in the same run (cross_case_ratios).
SAME_SHAPES_AS = {"geglu-mlp": "llama-mlp", "phi3-mlp": "llama-mlp"}


def goal_applies(goal: Goal, case: dict, run: dict) -> str | None:
    """None if the goal applies to this case result; else why not (the goals are GPU fp16 targets at the issue's
    sizes)."""
    if goal.case != "*" and goal.case != case["case"]:
        return "other case"
    if goal.size is not None and goal.size != case.get("size"):
        return "other size"
    if goal.case == "*" and case["case"] not in CASES:
        return "other case"
    if run.get("device_type") != "cuda":
        return "goals are GPU targets"
    if run.get("dtype") != "fp16":
        return "goals are fp16 targets"
    if case.get("quick"):
        return "shrunk sizes (--quick)"
    return None


def evaluate_goals(case: dict, run: dict, goals=GOALS) -> list[dict]:
    """Goal rows for one case result: status pass | miss | unmeasured (applies, but a variant is missing) | n/a."""
    rows = []
    for g in goals:
        why = goal_applies(g, case, run)
        if why in ("other case", "other size"):
            continue
        row = {"goal": g.text, "case": case["case"], "size": case.get("size"), "metric": g.metric,
               "threshold": g.threshold}
        value = (case.get("ratios") or {}).get(g.metric)
        row["value"] = None if value is None else round(float(value), 4)
        if why is None and value is None and g.metric.startswith("fused_vs_") and g.metric not in \
                ("fused_vs_unfused", "fused_vs_compile", "fused_vs_ort_optimized"):
            why = f"needs case {SAME_SHAPES_AS.get(case['case'], '?')} at the same size in the same run"
        if why is not None:
            row.update(status="n/a", reason=why)
        elif value is None:
            row.update(status="unmeasured", reason=f"{g.metric} could not be computed (a variant was skipped or failed)")
        else:
            row["status"] = "pass" if value >= g.threshold else "miss"
        rows.append(row)
    return rows


def cross_case_ratios(result: dict) -> None:
    """For the cases of SAME_SHAPES_AS: `fused_vs_<other>` = the other case's best fused median over this case's, at
    the same size in the same run (None when the other case did not run); goals re-evaluated."""
    by_key = {(c.get("case"), c.get("size")): c for c in result.get("cases", [])}
    for c in result.get("cases", []):
        other = SAME_SHAPES_AS.get(c.get("case"))
        if other is None:
            continue
        ref = by_key.get((other, c.get("size")))
        names = FUSED_GPU + ("fused-cpu",)
        mine = _best(c.get("variants", {}), names)[1]
        theirs = _best(ref.get("variants", {}), names)[1] if ref else None
        c.setdefault("ratios", {})[f"fused_vs_{other.replace('-', '_')}"] = \
            None if mine is None or theirs is None else round(theirs / mine, 4)
        c["goals"] = evaluate_goals(c, result)


def goals_failed(result: dict) -> list[dict]:
    """Goal rows that fail --check-goals: misses, and goals that apply but could not be measured."""
    return [g for c in result["cases"] for g in c.get("goals", []) if g["status"] in ("miss", "unmeasured")]


# ------------------------------------------------------------------------------------------------------------ ratios

def _median(variants: dict, name: str) -> float | None:
    v = variants.get(name) or {}
    m = v.get("median_ms")
    return float(m) if isinstance(m, (int, float)) and m > 0 else None


def _best(variants: dict, names) -> tuple[str | None, float | None]:
    got = [(n, _median(variants, n)) for n in names]
    got = [(n, m) for n, m in got if m is not None]
    return min(got, key=lambda nm: nm[1]) if got else (None, None)


def _floor_for(name: str, floor: dict | None) -> float | None:
    """The onnxruntime floor measured for a variant's CUDA-graph setting (None if not measured)."""
    if not floor:
        return None
    v = floor.get("graph" if name.endswith("+graph") else "plain")
    return float(v) if isinstance(v, (int, float)) else None


def compute_ratios(variants: dict, floor: dict | None = None) -> dict:
    """Speedups (baseline median / fused median) from a case's variants; None where a side is missing. `floor` is
    the run's ort_floor_ms (plain / graph): with it, times above the floor are compared too."""
    fused_names = FUSED_GPU + ("fused-cpu",)
    best_f_name, best_f = _best(variants, fused_names)
    best_u_name, best_u = _best(variants, UNFUSED)
    best_o_name, best_o = _best(variants, ORT_OPTIMIZED)
    nog_name, nog = _best(variants, ("fused-triton", "fused-cuda", "fused-auto", "fused-cpu"))
    g_name, g = _best(variants, ("fused-triton+graph", "fused-cuda+graph", "fused-auto+graph"))

    def ratio(a, b):
        return None if a is None or b is None else round(a / b, 4)

    def above(name, t):
        f = _floor_for(name or "", floor)
        return None if t is None or f is None else max(t - f, 1e-6)

    kernel_us = (variants.get(best_f_name) or {}).get("gpu_kernel_us") if best_f_name else None
    out = {
        "best_fused": best_f_name, "best_unfused": best_u_name, "best_ort_optimized": best_o_name,
        "fused_vs_unfused": ratio(best_u, best_f),
        "fused_vs_ort_optimized": ratio(best_o, best_f),
        "ort_optimized_vs_unfused": ratio(best_u, best_o),
        "unfused_over_fused_above_floor": ratio(above(best_u_name, best_u), above(best_f_name, best_f)),
        "kernel_us_goal": None if not kernel_us else round(30.0 / kernel_us, 4),
        "fused_vs_unfused_nograph": ratio(_median(variants, "ort-unfused"), nog),
        "fused_vs_unfused_graph": ratio(_median(variants, "ort-unfused+graph"), g),
        "fused_vs_compile": ratio(_median(variants, "torch-compile"), best_f),
        "fused_vs_eager": ratio(_median(variants, "torch-eager"), best_f),
        "unfused_vs_eager": ratio(_median(variants, "torch-eager"), best_u),
        # > 1: the fused op costs more than the bare GEMMs (the activation is not free); about 1: it is free.
        "fused_over_gemms": ratio(best_f, _median(variants, "torch-gemms")),
        "gemms_over_fused": ratio(_median(variants, "torch-gemms"), best_f),  # goal form of the line above
        "roofline_pct": (variants.get(best_f_name) or {}).get("roofline_pct") if best_f_name else None,
        "eager_over_gemms": ratio(_median(variants, "torch-eager"), _median(variants, "torch-gemms")),
    }
    return out


# ------------------------------------------------------------------------------------------------------------ cases

@dataclasses.dataclass
class Workload:
    """One case at one size: how to build the module and inputs, how to export it, what to call it."""
    case: str
    size: int                      # tokens (Llama, LoRA) or batch (DLRM)
    size_name: str                 # "tokens" | "batch"
    shape: dict
    key: str                       # cache key for the exported / fused models
    build_module: Callable[[], object]
    build_inputs: Callable[[], dict]
    export_kind: str | None = None  # "llama" / "dlrm": onnxfuse.export.export with export_spec
    export_spec: object = None
    gemms: Callable | None = None   # (module, inputs on device) -> callable doing the bare GEMMs
    quick: bool = False
    output_names: tuple[str, ...] = ("y",)


@dataclasses.dataclass(frozen=True)
class CaseDef:
    name: str
    description: str
    size_name: str
    sizes: tuple[int, ...]         # the issue's sizes (GPU default)
    quick_sizes: tuple[int, ...]   # CPU / --quick sizes
    make: Callable                 # (size, dtype, seed, quick, layers) -> Workload


def _key(case: str, size: int, dtype: str, seed: int, params: dict) -> str:
    from .. import __version__
    blob = json.dumps({"params": params, "onnxfuse": __version__}, sort_keys=True, default=str)
    return f"{case}-{size}-{dtype}-s{seed}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"


def _llama_mlp(case: str, hidden: int, inter: int, q_hidden: int, q_inter: int):
    def make(size, dtype, seed, quick, layers):
        from .. import zoo
        h, i = (q_hidden, q_inter) if quick else (hidden, inter)
        spec = zoo.LlamaSpec(hidden_size=h, intermediate_size=i, mlp_only=True, batch=1, seq=size,
                             max_position_embeddings=max(2048, size))
        params = dataclasses.asdict(spec)

        def gemms(module, inputs):
            """gate, up and down GEMMs through torch.matmul, no activation (down takes the gate product)."""
            import torch
            x = inputs["x"].reshape(-1, h)
            wg, wu, wd = (m.weight.t() for m in (module.gate_proj, module.up_proj, module.down_proj))

            def f():
                g = torch.matmul(x, wg)
                torch.matmul(x, wu)
                return torch.matmul(g, wd)
            return f

        return Workload(case, size, "tokens", {"tokens": size, "hidden": h, "intermediate": i},
                        _key(case, size, dtype, seed, params),
                        lambda: zoo.build_llama(spec, seed, dtype), lambda: zoo.llama_inputs(spec, seed, dtype),
                        "llama", spec, gemms, quick)
    return make


def _gated_mlp(case: str, mlp: str, act: str, hidden: int, inter: int, q_hidden: int, q_inter: int):
    """One transformers gated MLP (`mlp`: "gemma" for GemmaMLP's separate gate/up projections, "phi3" for Phi3MLP's
    merged gate_up_proj + chunk) with gate activation `act`, at the Llama MLP's shapes; weights N(0, 0.02) as the
    llama-mlp case."""
    def make(size, dtype, seed, quick, layers):
        import torch

        from .. import zoo
        h, i = (q_hidden, q_inter) if quick else (hidden, inter)
        params = {"mlp": mlp, "act": act, "hidden": h, "intermediate": i}

        def build():
            import transformers
            if mlp == "phi3":
                from transformers.models.phi3.modeling_phi3 import Phi3MLP as cls
                cfg = transformers.Phi3Config(hidden_size=h, intermediate_size=i, hidden_act=act)
            else:
                from transformers.models.gemma.modeling_gemma import GemmaMLP as cls
                cfg = transformers.GemmaConfig(hidden_size=h, intermediate_size=i, hidden_act=act)
            with zoo.default_dtype(zoo.DTYPES[dtype]):  # parameters made in dtype, as the llama cases do
                torch.manual_seed(seed)
                module = cls(cfg)
                for lin in module.children():
                    if isinstance(lin, torch.nn.Linear):
                        torch.nn.init.normal_(lin.weight, std=0.02)
            return module.to(zoo.DTYPES[dtype]).eval()

        def inputs():
            g = torch.Generator().manual_seed(seed)
            return {"x": torch.randn(1, size, h, generator=g).to(zoo.DTYPES[dtype])}

        def gemms(module, inputs):
            """The projections and the down GEMM through torch.matmul, no activation (same FLOPs as the MLP)."""
            x = inputs["x"].reshape(-1, h)
            wd = module.down_proj.weight.t()
            if mlp == "phi3":
                wgu = module.gate_up_proj.weight.t()
                return lambda: torch.matmul(torch.matmul(x, wgu)[:, :i], wd)
            wg, wu = module.gate_proj.weight.t(), module.up_proj.weight.t()

            def f():
                g = torch.matmul(x, wg)
                torch.matmul(x, wu)
                return torch.matmul(g, wd)
            return f

        return Workload(case, size, "tokens", {"tokens": size, "hidden": h, "intermediate": i, "act": act},
                        _key(case, size, dtype, seed, params), build, inputs, gemms=gemms, quick=quick)
    return make


def _lora_module(k: int, n: int, rank: int):
    import torch
    from torch import nn

    from .. import zoo

    class LoRALinearRelu(nn.Module):
        """nn.Linear wrapped in onnxfuse.zoo.LoRALinear, then ReLU: fuses to onnxfuse::LoRALinearRelu."""

        def __init__(self):
            super().__init__()
            self.lora = zoo.LoRALinear(nn.Linear(k, n), rank, 2.0 * rank)

        def forward(self, x):
            return torch.relu(self.lora(x))

    return LoRALinearRelu()


def _make_lora(size, dtype, seed, quick, layers):
    import torch

    from .. import zoo
    k = n = 256 if quick else 4096
    rank = 16
    params = {"k": k, "n": n, "rank": rank}

    def build():
        torch.manual_seed(seed)
        return _lora_module(k, n, rank).to(zoo.DTYPES[dtype]).eval()

    def inputs():
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(size, k, generator=g).to(zoo.DTYPES[dtype])}

    def gemms(module, inputs):
        """The base GEMM alone (x @ Wᵀ through torch.matmul): what the LoRA branch's cost is measured against."""
        import torch
        x, w = inputs["x"], module.lora.base.weight.t()
        return lambda: torch.matmul(x, w)

    return Workload("lora-linear", size, "tokens", {"tokens": size, "in": k, "out": n, "rank": rank},
                    _key("lora-linear", size, dtype, seed, params), build, inputs, gemms=gemms, quick=quick)


def _make_mlp_stack(case: str, sizes: list[int], final: str):
    def make(size, dtype, seed, quick, layers):
        import torch

        from .. import zoo
        params = {"sizes": sizes, "final": final}

        def build():
            torch.manual_seed(seed)
            return zoo.mlp(list(sizes), final).to(zoo.DTYPES[dtype]).eval()

        def inputs():
            g = torch.Generator().manual_seed(seed)
            return {"x": torch.randn(size, sizes[0], generator=g).to(zoo.DTYPES[dtype])}

        return Workload(case, size, "batch", {"batch": size, "layers": "-".join(map(str, sizes)) + f"+{final}"},
                        _key(case, size, dtype, seed, params), build, inputs, quick=quick)
    return make


def _dlrm_top_in() -> int:
    from .. import zoo
    spec = zoo.DlrmSpec()
    n_vec = len(spec.cardinalities) + 1
    return spec.embedding_dim + n_vec * (n_vec - 1) // 2  # 16 + 351 = 367: the top MLP's input in DLRM


def _make_dlrm(size, dtype, seed, quick, layers):
    from .. import zoo
    spec = zoo.DlrmSpec.from_preset("small" if quick else "criteo-kaggle", batch=size)
    params = zoo.spec_to_dict(spec)
    return Workload("dlrm", size, "batch", {"batch": size, "bottom": "13-" + "-".join(map(str, spec.bottom_mlp)),
                                            "top": "-".join(map(str, spec.top_mlp)), "table_cap": spec.table_cap},
                    _key("dlrm", size, dtype, seed, params), lambda: zoo.build_dlrm(spec, seed, dtype),
                    lambda: zoo.criteo_batch(spec, size, seed, dtype), "dlrm", spec, None, quick, ("probability",))


def _make_dlrm_interaction(size, dtype, seed, quick, layers):
    """The whole DLRM's hash, 26 lookups and dot interaction alone (bottom MLP output and ids in, 367 columns out)."""
    import torch

    from .. import zoo
    spec = zoo.DlrmSpec.from_preset("small" if quick else "criteo-kaggle", batch=size)
    params = {"dlrm": zoo.spec_to_dict(spec), "part": "interaction"}

    def inputs():
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(size, spec.embedding_dim, generator=g).to(zoo.DTYPES[dtype]),
                "sparse": zoo.criteo_batch(spec, size, seed, dtype)["sparse"]}

    return Workload("dlrm-interaction", size, "batch",
                    {"batch": size, "features": len(spec.cardinalities), "dim": spec.embedding_dim,
                     "interaction": spec.interaction, "table_cap": spec.table_cap},
                    _key("dlrm-interaction", size, dtype, seed, params),
                    lambda: zoo.DlrmInteraction(zoo.build_dlrm(spec, seed, dtype)).eval(), inputs, quick=quick)


def _make_llama(size, dtype, seed, quick, layers):
    from .. import zoo
    if size % 2:
        raise OnnxfuseError(f"the llama case runs 2 sequences: --sizes must be even (got {size})")
    seq = size // 2
    spec = zoo.LlamaSpec.from_preset("tiny" if quick else "seed", num_hidden_layers=layers, batch=2, seq=seq)
    spec.max_position_embeddings = max(spec.max_position_embeddings, seq)
    params = zoo.spec_to_dict(spec)
    return Workload("llama", size, "tokens", {"tokens": size, "batch": 2, "seq": seq, "hidden": spec.hidden_size,
                                              "intermediate": spec.intermediate_size, "layers": layers},
                    _key("llama", size, dtype, seed, params), lambda: zoo.build_llama(spec, seed, dtype),
                    lambda: zoo.llama_inputs(spec, seed, dtype), "llama", spec, None, quick, ("last_hidden_state",))


def _make_rotary(size, dtype, seed, quick, layers):
    """HF's apply_rotary_pos_emb on one tensor as a Llama-2-7B layer feeds it: q [1, S, 32, 128] transposed to
    [1, 32, S, 128], rotated with cos/sin [1, 1, S, 128], transposed back."""
    import torch
    from torch import nn

    from .. import zoo
    heads, head_dim = (4, 64) if quick else (32, 128)
    params = {"heads": heads, "head_dim": head_dim}

    class Rotary(nn.Module):
        def forward(self, q, cos, sin):
            t = q.transpose(1, 2)
            half = t.shape[-1] // 2
            rot = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
            return (t * cos.unsqueeze(1) + rot * sin.unsqueeze(1)).transpose(1, 2)

    def inputs():
        g = torch.Generator().manual_seed(seed)
        pos = torch.arange(size, dtype=torch.float32)[:, None]
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        ang = torch.cat([pos * inv, pos * inv], dim=-1)[None]
        return {"q": torch.randn(1, size, heads, head_dim, generator=g).to(zoo.DTYPES[dtype]),
                "cos": ang.cos().to(zoo.DTYPES[dtype]), "sin": ang.sin().to(zoo.DTYPES[dtype])}

    return Workload("rotary-embedding", size, "tokens", {"tokens": size, "heads": heads, "head_dim": head_dim},
                    _key("rotary-embedding", size, dtype, seed, params), lambda: Rotary().eval(), inputs, quick=quick)


def _make_llama7b(size, dtype, seed, quick, layers):
    """One decoder layer at Llama-2-7B shapes (h4096, i11008, 32 heads), one sequence of `size` tokens."""
    from .. import zoo
    spec = zoo.LlamaSpec.from_preset("tiny" if quick else "llama2-7b", num_hidden_layers=layers, batch=1, seq=size)
    spec.max_position_embeddings = max(spec.max_position_embeddings, size)
    params = zoo.spec_to_dict(spec)
    return Workload("llama-7b", size, "tokens", {"tokens": size, "batch": 1, "seq": size, "hidden": spec.hidden_size,
                                                 "intermediate": spec.intermediate_size,
                                                 "heads": spec.num_attention_heads, "layers": layers},
                    _key("llama-7b", size, dtype, seed, params), lambda: zoo.build_llama(spec, seed, dtype),
                    lambda: zoo.llama_inputs(spec, seed, dtype), "llama", spec, None, quick, ("last_hidden_state",))


CASES: dict[str, CaseDef] = {c.name: c for c in (
    CaseDef("llama-mlp", "one LlamaMLP h4096/i11008 (SwiGLU + down GEMM)", "tokens", (2048, 16), (64, 16),
            _llama_mlp("llama-mlp", 4096, 11008, 256, 688)),
    CaseDef("seed-mlp", "one LlamaMLP h1024/i11008 (the notebook's sizes)", "tokens", (2048,), (64,),
            _llama_mlp("seed-mlp", 1024, 11008, 128, 688)),
    CaseDef("geglu-mlp", "one GemmaMLP h4096/i11008 (GeGLU: gelu_tanh gate; SwiGLU op + down GEMM)", "tokens",
            (2048, 16), (64, 16), _gated_mlp("geglu-mlp", "gemma", "gelu_pytorch_tanh", 4096, 11008, 256, 688)),
    CaseDef("phi3-mlp", "one Phi3MLP h4096/i11008 (merged gate_up_proj + chunk; SwiGLU op + down GEMM)", "tokens",
            (2048, 16), (64, 16), _gated_mlp("phi3-mlp", "phi3", "silu", 4096, 11008, 256, 688)),
    CaseDef("lora-linear", "4096x4096 linear + rank-16 LoRA + ReLU", "tokens", (2048,), (64,), _make_lora),
    CaseDef("dlrm-bottom", "DLRM bottom MLP 13-512-256-64-16, Linear+ReLU", "batch", (128, 2048), (64,),
            _make_mlp_stack("dlrm-bottom", [13, 512, 256, 64, 16], "relu")),
    CaseDef("dlrm-top", "DLRM top MLP 367-512-256-1 + sigmoid", "batch", (128, 2048), (64,),
            lambda *a: _make_mlp_stack("dlrm-top", [_dlrm_top_in(), 512, 256, 1], "sigmoid")(*a)),
    CaseDef("dlrm", "whole DLRM (Criteo-Kaggle tables capped at 262144)", "batch", (128, 2048), (16, 64), _make_dlrm),
    CaseDef("dlrm-interaction", "DLRM's hash, 26 embedding lookups and dot interaction alone", "batch", (128, 2048),
            (64,), _make_dlrm_interaction),
    CaseDef("llama", "Llama decoder (seed preset h1024, --layers), 2 sequences", "tokens", (2048,), (64,), _make_llama),
    CaseDef("llama-7b", "Llama decoder at Llama-2-7B shapes (h4096/i11008, 32 heads, --layers), 1 sequence",
            "tokens", (2048,), (64,), _make_llama7b),
    CaseDef("rotary-embedding", "rotary embedding of one q tensor of a Llama-2-7B layer (32 heads x 128), HF's "
            "transposes and rotate_half", "tokens", (2048,), (64,), _make_rotary),
)}


def workloads(names: list[str], dtype: str, seed: int, quick: bool, sizes: list[int] | None, layers: int) -> list[Workload]:
    out = []
    for name in names:
        if name not in CASES:
            raise OnnxfuseError(f"unknown case {name!r}; choose from {', '.join(CASES)}, 'all', or give an .onnx path")
        c = CASES[name]
        for size in (sizes or (c.quick_sizes if quick else c.sizes)):
            out.append(c.make(size, dtype, seed, quick, layers))
    return out


# ------------------------------------------------------------------------------------------------------------ models

def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _export_module(module, inputs: dict, path: pathlib.Path, output_names) -> None:
    """torch.onnx.export (dynamo) of a plain module, saved atomically like onnxfuse.export does."""
    import tempfile

    import onnx

    from .. import export, onnxio
    with tempfile.TemporaryDirectory(prefix="onnxfuse-bench-") as tmp:
        tmp_path = pathlib.Path(tmp) / "model.onnx"
        export.torch_export(module, inputs, tmp_path, "dynamo", list(inputs), list(output_names), None)
        model = onnx.load(str(tmp_path), load_external_data=True)
    model.ir_version = min(model.ir_version or 10, onnxio.MAX_IR_VERSION)
    model.producer_name = "onnxfuse-bench"
    onnxio.save(model, path)


def prepare_models(w: Workload, dtype: str, seed: int, cache_dir: pathlib.Path, quiet: bool) -> dict:
    """Export and fuse (cached under cache_dir by key); returns paths, timings and the fused op counts."""
    from .. import export, fuse
    cache_dir.mkdir(parents=True, exist_ok=True)
    src = cache_dir / f"{w.key}.onnx"
    fused = cache_dir / f"{w.key}.fused.onnx"
    ort_opt = cache_dir / f"{w.key}.ort.onnx"
    info = {"unfused": str(src), "fused": str(fused), "ort_optimized": str(ort_opt), "cached": True,
            "export_s": 0.0, "fuse_s": 0.0}
    if not src.exists():
        info["cached"] = False
        _log(f"exporting {w.case} ({w.size_name} {w.size}, {dtype}) -> {src}", quiet)
        t0 = time.perf_counter()
        if w.export_kind:
            export.export(w.export_kind, w.export_spec, src, seed=seed, dtype=dtype, exporter="auto", force=True)
        else:
            _export_module(w.build_module(), w.build_inputs(), src, w.output_names)
        info["export_s"] = round(time.perf_counter() - t0, 2)
    if not fused.exists():
        info["cached"] = False
        t0 = time.perf_counter()
        res = fuse.fuse(src, fused, force=True, write_unchanged=True)
        info["fuse_s"] = round(time.perf_counter() - t0, 2)
        if not res.matches:
            warnings.warn(f"{w.case}: nothing fused in {src}")
        info["ort_fusions"] = res.ort.applied if res.ort is not None else None
    if not ort_opt.exists():
        fuse.fuse(src, ort_opt, force=True, write_unchanged=True, rules=False)
    info["fused_ops"] = _onnxfuse_ops(fused)
    return info


def _onnxfuse_ops(path) -> dict:
    import collections

    import onnx

    from ..schema import DOMAIN
    m = onnx.load(str(path), load_external_data=False)
    return dict(collections.Counter(n.op_type for n in m.graph.node if n.domain == DOMAIN))


def flops_and_bytes(path) -> tuple[int | None, int | None]:
    """FLOPs of the (unfused) graph's MatMul/Gemm nodes and the fewest bytes a run must move: graph inputs and
    outputs once, every initializer once, except tables read by Gather, which count only the gathered rows."""
    from onnxscript import ir

    from .. import fuse as _fuse
    model = ir.load(str(path))
    _fuse.infer_shapes(model)
    flops = _fuse.model_flops(model)

    def nbytes(v) -> int | None:
        if v is None or v.shape is None or v.dtype is None or not v.shape.is_static():
            return None
        n = 1
        for d in v.shape:
            n *= int(d)
        return n * v.dtype.itemsize

    total = 0
    for v in list(model.graph.inputs) + list(model.graph.outputs):
        b = nbytes(v)
        if b is None:
            return flops, None
        total += b
    for v in model.graph.initializers.values():
        users = [u for u, idx in v.uses()]
        if users and all(u.op_type == "Gather" and u.inputs[0] is v for u in users):
            for u in users:
                b = nbytes(u.outputs[0])
                if b is None:
                    return flops, None
                total += b
        elif users:
            b = nbytes(v)
            total += b or 0
    return flops, total


# ------------------------------------------------------------------------------------------------------------ timing

class _Device:
    def __init__(self, kind: str):
        self.kind = kind  # "cuda" | "cpu"

    def sync(self):
        if self.kind == "cuda":
            import torch
            torch.cuda.synchronize()

    def measure(self, fn: Callable, warmup: int, runs: int) -> list[float]:
        """Milliseconds of `runs` runs after `warmup` runs; each run synchronised (see the module docstring)."""
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        if self.kind == "cuda":
            import torch
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
            for s, e in zip(starts, ends):
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        else:
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return times


def _stats(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) >= 2 else [times[0]] * 9
    return {"median_ms": round(statistics.median(times), 5), "p10_ms": round(q[0], 5), "p90_ms": round(q[-1], 5),
            "runs": len(times)}


def measure_ceilings(dev: _Device, dtype: str, quick: bool) -> dict:
    """Peak GEMM rate (torch.matmul, benchmark dtype) and device copy bandwidth, measured now."""
    import torch
    from .. import zoo
    on = dev.kind
    n = 8192 if on == "cuda" and not quick else (4096 if on == "cuda" else 1024)
    tdt = zoo.DTYPES[dtype]
    g = torch.Generator(device=on).manual_seed(1)
    a = torch.randn(n, n, device=on, dtype=tdt, generator=g)
    b = torch.randn(n, n, device=on, dtype=tdt, generator=g)
    runs = 20 if on == "cuda" else 10
    t = min(dev.measure(lambda: torch.matmul(a, b), 5, runs))  # ceilings: the best run
    peak = 2 * n ** 3 / (t * 1e-3) / 1e12
    del a, b
    numel = (1 << 28) if on == "cuda" else (1 << 24)  # 1 GiB / 64 MiB of fp32
    x = torch.rand(numel, device=on, generator=g)
    y = torch.empty_like(x)
    t = min(dev.measure(lambda: y.copy_(x), 5, runs))
    bw = 2 * numel * 4 / (t * 1e-3) / 1e9
    del x, y
    return {"peak_tflops": round(peak, 2), "peak_gemm": f"torch.matmul {n}x{n}x{n} {dtype}, best of {runs}",
            "bandwidth_gbs": round(bw, 1), "bandwidth_copy": f"copy_ of {numel * 4 >> 20} MiB (read + write counted), best of {runs}"}


def measure_ort_floor(dev: _Device, opts) -> dict:
    """The smallest time one onnxruntime run can take here: an Identity on 4 floats through the same IOBinding
    harness, without and with CUDA graphs. Every ORT variant's median contains this floor (host work per run and,
    with the synchronising timer, the launch latency), so a fused model can never beat unfused by more than
    unfused / floor."""
    import tempfile

    import onnx
    import torch
    from onnx import TensorProto, helper
    out = {}
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "identity.onnx"
        g = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "floor",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))
        x = torch.zeros(4, device=dev.kind)
        for graph in ((False, True) if dev.kind == "cuda" else (False,)):
            try:
                r = _OrtRun(path, dev.kind, None, None, graph, {"X": x}, [x], False)
                out["graph" if graph else "plain"] = _stats(dev.measure(r, opts.warmup, opts.runs))["median_ms"]
            except Exception as e:  # reported, not fatal
                out["graph" if graph else "plain"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    return out


# ------------------------------------------------------------------------------------------------------------ sessions

_NP = {}


def _np_dtype(tdt):
    import numpy as np
    import torch
    if not _NP:
        _NP.update({torch.float16: np.float16, torch.float32: np.float32, torch.int64: np.int64,
                    torch.int32: np.int32, torch.float64: np.float64, torch.bool: np.bool_})
    if tdt not in _NP:
        raise OnnxfuseError(f"dtype {tdt} cannot be bound to onnxruntime from Python; use --dtype fp16 or fp32")
    return _NP[tdt]


_TORCH_OF_ORT = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
                 "tensor(int32)": "int32", "tensor(double)": "float64", "tensor(bool)": "bool"}


def _load_proto(path):
    import onnx
    return onnx.load(str(path), load_external_data=False)


class _OrtRun:
    """An IOBinding session on torch tensors: inputs bound once, outputs preallocated."""

    def __init__(self, path, device: str, lib, backend: str | None, cuda_graph: bool, inputs: dict, ref_outputs,
                 tf32: bool):
        import torch
        opts = {}
        self.stream = "cpu"
        if device == "cuda":
            opts["use_tf32"] = "1" if tf32 else "0"
            if not cuda_graph:
                opts.update(has_user_compute_stream="1", user_compute_stream=str(torch.cuda.current_stream().cuda_stream))
                self.stream = "torch"
            else:
                self.stream = "ort"
        from .. import runtime
        # lib (--lib) replaces the cached build; backend None: an unfused model (library only if it has onnxfuse nodes)
        self.sess = runtime.session(str(path), device, library=(lib or True) if backend is not None else None,
                                    cuda_graph=cuda_graph, provider_options=opts, backend=backend)
        self.io = self.sess.io_binding()
        dev_id = 0
        names = [i.name for i in self.sess.get_inputs()]
        missing = [n for n in names if n not in inputs]
        if missing:
            raise OnnxfuseError(f"{path}: model inputs {missing} not among the workload inputs {list(inputs)}")
        for name in names:
            t = inputs[name]
            self.io.bind_input(name, device, dev_id, _np_dtype(t.dtype), list(t.shape), t.data_ptr())
        self.outputs = []
        for i, o in enumerate(self.sess.get_outputs()):
            if ref_outputs is not None and i < len(ref_outputs):
                shape, dt = list(ref_outputs[i].shape), ref_outputs[i].dtype
            else:
                shape = [d if isinstance(d, int) else None for d in o.shape]
                if any(d is None for d in shape):
                    shape = self._probe_shape(o.name, device, names, inputs)
                dt = getattr(torch, _TORCH_OF_ORT.get(o.type, "float32"))
            y = torch.empty(shape, dtype=dt, device=device)
            self.io.bind_output(o.name, device, dev_id, _np_dtype(dt), shape, y.data_ptr())
            self.outputs.append(y)

    def _probe_shape(self, name, device, names, inputs):
        io = self.sess.io_binding()
        for n in names:
            t = inputs[n]
            io.bind_input(n, device, 0, _np_dtype(t.dtype), list(t.shape), t.data_ptr())
        io.bind_output(name, device)
        self.sess.run_with_iobinding(io)
        return list(io.get_outputs()[0].shape())

    def __call__(self):
        self.sess.run_with_iobinding(self.io)


def _rel_err(out, ref) -> float | None:
    import torch
    if out is None or ref is None or out.shape != ref.shape:
        return None
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("nan")
    den = torch.linalg.vector_norm(r).item()
    return float(torch.linalg.vector_norm(o - r).item() / den) if den > 0 else float(torch.linalg.vector_norm(o).item())


def _poison_check(fn, outputs, ref_outputs, dev: _Device) -> float | None:
    """Fill the outputs with NaN, run once, return ||out - ref|| / ||ref|| of the first output (NaN: unwritten)."""
    for y in outputs:
        if y.is_floating_point():
            y.fill_(float("nan"))
    fn()
    dev.sync()
    if not ref_outputs:
        return None
    return _rel_err(outputs[0], ref_outputs[0])


def profile_kernels(fn, dev: _Device, runs: int = 20, top: int = 25) -> dict:
    """GPU kernel time per run of `fn` (the sum of every CUDA kernel's device time, from torch.profiler: CUPTI is
    process-wide, so onnxruntime's and the library's kernels are seen too), kernels per run, and the kernels that
    take the most time per run. onnxruntime's own node profiling only times the host side of CUDA kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    dev.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        dev.sync()
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            dur = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
            kernels.setdefault(e.name, []).append(float(dur))
    total = sum(sum(v) for v in kernels.values())
    rows = sorted(((name, sum(v) / runs, len(v) / runs) for name, v in kernels.items()), key=lambda r: -r[1])
    return {"gpu_kernel_us": round(total / runs, 2), "kernels_per_run": round(sum(len(v) for v in kernels.values()) / runs, 1),
            "top_kernels": [{"name": n[:120], "us_per_run": round(t, 2), "calls_per_run": round(c, 2)}
                            for n, t, c in rows[:top]]}


# ------------------------------------------------------------------------------------------------------------ running

@dataclasses.dataclass
class Options:
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
        raise OnnxfuseError(f"--lib {o.lib}: no such file; give a built libonnxfuse_ops.so ('onnxfuse build' prints its path)")
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


def _device_name(kind: str) -> str:
    if kind == "cuda":
        import torch
        return torch.cuda.get_device_name(0)
    name = platform.processor() or platform.machine()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"CPU {name} ({os.cpu_count()} threads)"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "device"


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
    dev = _Device(opts.device)
    if opts.device == "cuda" and opts.dtype == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = opts.tf32
        torch.backends.cudnn.allow_tf32 = opts.tf32
    t_start = time.perf_counter()
    _log(f"device {_device_name(opts.device)}; measuring peak GEMM rate and copy bandwidth", opts.quiet)
    ceilings = measure_ceilings(dev, opts.dtype, opts.quick)
    ort_floor = measure_ort_floor(dev, opts)
    result = {
        "schema_version": SCHEMA_VERSION,
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "device": _device_name(opts.device), "device_type": opts.device,
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
        work = [_file_workload(files[0], opts)]
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


def _file_workload(path: str, opts: Options) -> Workload:
    """A model file: the module and inputs come from its recipe when it has one; else random inputs, no torch."""
    from .. import export, onnxio, zoo
    p = pathlib.Path(path)
    model = onnxio.load(p, load_external_data=False)
    recipe = export.read_recipe(model)
    if recipe:
        spec = zoo.spec_from_dict(recipe["kind"], recipe["spec"])
        build = lambda: zoo.build_module(recipe["kind"], spec, recipe["seed"], recipe["dtype"])  # noqa: E731
        inputs = lambda: zoo.make_inputs(recipe["kind"], spec, recipe["seed"], recipe["dtype"])  # noqa: E731
    else:
        build = None

        def inputs():
            import torch

            from .. import runtime
            sess = runtime.session(p, "cpu", library=False) if not runtime.has_onnxfuse_nodes(model) else \
                runtime.session(p, "cpu")
            return {k: torch.from_numpy(v) for k, v in runtime.random_feeds(sess, opts.seed).items()}
    size = 0
    for i in model.graph.input:  # the first dim of the first input (batch or rows)
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if dims:
            size = dims[0]
            break
    return Workload(p.stem, size, "rows", {"model": str(p)}, "file", build, inputs, quick=False,
                    output_names=tuple(o.name for o in model.graph.output))


def _model_paths_for_file(w: Workload, opts: Options) -> dict:
    from .. import fuse, runtime
    src = pathlib.Path(w.shape["model"])
    proto = _load_proto(src)
    if runtime.has_onnxfuse_nodes(proto):
        return {"unfused": None, "fused": str(src), "cached": True, "export_s": 0.0, "fuse_s": 0.0,
                "fused_ops": _onnxfuse_ops(src), "note": "the model is already fused: no unfused variant"}
    opts.cache_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(f"{src.resolve()}:{src.stat().st_mtime_ns}".encode()).hexdigest()[:8]
    fused = opts.cache_dir / f"{src.stem}-{digest}.fused.onnx"
    t0 = time.perf_counter()
    if not fused.exists():
        fuse.fuse(src, fused, force=True, write_unchanged=True)
    return {"unfused": str(src), "fused": str(fused), "cached": False, "export_s": 0.0,
            "fuse_s": round(time.perf_counter() - t0, 2), "fused_ops": _onnxfuse_ops(fused)}


def run_workload(w: Workload, opts: Options, dev: _Device, result: dict) -> dict:
    import torch
    t0 = time.perf_counter()
    entry: dict = {"case": w.case, "size": w.size, "size_name": w.size_name, "shape": dict(w.shape),
                   "dtype": opts.dtype, "quick": w.quick}
    models = _model_paths_for_file(w, opts) if w.key == "file" else prepare_models(w, opts.dtype, opts.seed,
                                                                                    opts.cache_dir, opts.quiet)
    entry["models"] = models
    flops, nbytes = flops_and_bytes(models["unfused"] or models["fused"])
    entry["flops"], entry["bytes"] = flops, nbytes
    _log(f"{w.case} {w.size_name} {w.size}: fused ops {models['fused_ops'] or 'none'}; timing", opts.quiet)

    inputs = {k: v.to(opts.device).contiguous() for k, v in w.build_inputs().items()}
    module = None
    if w.build_module is not None:
        module = w.build_module().to(opts.device)
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
        v = _stats(times)
        v.update(_rates(flops, nbytes, v["median_ms"], result))
        if outputs is not None:
            try:
                v["rel_err"] = _poison_check(fn, outputs, ref_outputs, dev)
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
    ort_plan.append(("fused-cpu", "cpu", "fused", False))
    for name, backend, which, graph in ort_plan:
        fused = which == "fused"
        if not selected(name):
            continue
        if name == "fused-cpu" and opts.device == "cuda":
            skip(name, "GPU run: the CPU kernels are benchmarked with --device cpu")
            continue
        path = models.get(which)
        if path is None:
            skip(name, models.get("note", "no model"))
            continue
        if fused and not models["fused_ops"]:
            skip(name, "nothing fused in this model")
            continue
        runner = None
        try:
            runner = _OrtRun(path, opts.device, opts.lib, backend, graph, inputs, ref_outputs, opts.tf32)
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
                        variants["torch-compile"]["rel_err"] = _rel_err(out_c[0], ref_outputs[0])
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
    module = None
    gc.collect()

    entry["variants"] = {name: variants.get(name, {"skipped": "not run"}) for name in VARIANTS}
    # unfused speedup per variant (same CUDA-graph setting where both ran), and the time above onnxruntime's floor
    for name, v in entry["variants"].items():
        if "median_ms" in v:
            base = _median(entry["variants"], "ort-unfused+graph" if name.endswith("+graph") else "ort-unfused")
            v["speedup_vs_unfused"] = None if base is None else round(base / v["median_ms"], 4)
            floor = _floor_for(name, result.get("ort_floor_ms")) if name.startswith(("ort", "fused")) else None
            if floor is not None:
                v["above_floor_ms"] = round(v["median_ms"] - floor, 5)
    entry["ratios"] = compute_ratios(entry["variants"], result.get("ort_floor_ms"))
    entry["goals"] = evaluate_goals(entry, result)
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    del inputs, ref_outputs
    gc.collect()
    if opts.device == "cuda":
        torch.cuda.empty_cache()
    return entry


def _failure(e: Exception) -> dict:
    msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return {"skipped": f"failed: {type(e).__name__}: {msg}", "error": f"{type(e).__name__}: {msg}"}


def _rates(flops, nbytes, median_ms, result) -> dict:
    s = median_ms * 1e-3
    out = {"tflops": None if flops is None else round(flops / s / 1e12, 3),
           "gbs": None if nbytes is None else round(nbytes / s / 1e9, 2), "roofline_pct": None}
    peak, bw = result.get("peak_tflops"), result.get("bandwidth_gbs")
    floors = []
    if flops is not None and peak:
        floors.append(flops / (peak * 1e12))
    if nbytes is not None and bw:
        floors.append(nbytes / (bw * 1e9))
    if floors:
        out["roofline_pct"] = round(100 * max(floors) / s, 2)
    return out


# ------------------------------------------------------------------------------------------------------------ output

# A median whose p90/p10 spread is above this is flagged noisy in the table and the JSON.
NOISY_SPREAD = 1.25


def results_dir() -> pathlib.Path:
    """Where results go without -o: benchmarks/results/ of the onnxfuse checkout this package runs from (an editable
    install), else the user data dir (e.g. ~/.local/share/onnxfuse/bench-results); never the current directory."""
    checkout = pathlib.Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / DEFAULT_RESULTS).is_dir():
        return checkout / DEFAULT_RESULTS
    try:
        import platformdirs
        return pathlib.Path(platformdirs.user_data_dir("onnxfuse")) / "bench-results"
    except ImportError:  # a declared dependency; the same path on Linux
        return pathlib.Path.home() / ".local" / "share" / "onnxfuse" / "bench-results"


def annotate(result: dict, noisy_spread: float = NOISY_SPREAD) -> dict:
    """Flag what a reader should not trust, per timed variant and per case (`flags`): a noisy median (p90/p10 above
    `noisy_spread`: `spread`, `noisy`), and a roofline above 100 % (`roofline_over_100`: the peak or bandwidth
    measured in the same run was itself noisy or low, so the percentage is not meaningful)."""
    result["noisy_spread"] = noisy_spread
    for c in result.get("cases", []):
        flags = []
        for name, v in c.get("variants", {}).items():
            if "median_ms" not in v:
                continue
            p10, p90 = v.get("p10_ms"), v.get("p90_ms")
            if isinstance(p10, (int, float)) and isinstance(p90, (int, float)) and p10 > 0:
                v["spread"] = round(p90 / p10, 3)
                v["noisy"] = v["spread"] > noisy_spread
                if v["noisy"]:
                    flags.append(f"{name}: noisy median (p90/p10 {v['spread']:.2f} > {noisy_spread})")
            roof = v.get("roofline_pct")
            v["roofline_over_100"] = isinstance(roof, (int, float)) and roof > 100
            if v["roofline_over_100"]:
                flags.append(f"{name}: roofline {roof:.0f}% > 100% (the same-run peak/bandwidth was noisy)")
        c["flags"] = flags
    return result


def default_output(result: dict, out_dir: pathlib.Path | None = None) -> pathlib.Path:
    """A new results path in `out_dir` (default results_dir()): <date>-<device>-<target>.json, -2, -3, ... if taken."""
    out_dir = pathlib.Path(out_dir) if out_dir is not None else results_dir()
    date = result.get("date", _dt.datetime.now().isoformat())[:10]
    base = f"{date}-{slug(result.get('device', 'device'))}-{slug(result.get('target', 'all'))}"
    p = out_dir / f"{base}.json"
    n = 2
    while p.exists():
        p = out_dir / f"{base}-{n}.json"
        n += 1
    return p


def write_json(result: dict, path: pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=_json_default))
    os.replace(tmp, path)
    return path


def _json_default(o):
    if isinstance(o, pathlib.Path):
        return str(o)
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


def load_json(path) -> dict:
    p = pathlib.Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise OnnxfuseError(f"{p}: no such results file; give a JSON written by 'onnxfuse bench'") from None
    except (OSError, ValueError) as e:
        raise OnnxfuseError(f"{p}: not a readable results JSON ({type(e).__name__}); give a file written by "
                            "'onnxfuse bench'") from None
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise OnnxfuseError(f"{p}: not an onnxfuse bench results file (no 'cases' list)")
    return data


def reevaluate(result: dict) -> dict:
    """Recompute ratios, goals and flags (e.g. after editing GOALS, or for a synthetic results file)."""
    for c in result["cases"]:
        c["ratios"] = compute_ratios(c.get("variants", {}), result.get("ort_floor_ms"))
        c["goals"] = evaluate_goals(c, result)
    cross_case_ratios(result)
    return annotate(result, result.get("noisy_spread", NOISY_SPREAD))


def _fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def format_table(result: dict) -> str:
    """Plain-text tables (one per case, then the goals): readable in CI logs and with or without rich."""
    lines = [f"onnxfuse bench on {result['device']} ({result['dtype']}; peak {result['peak_tflops']} TFLOP/s, "
             f"copy {result['bandwidth_gbs']} GB/s; {result.get('method', {}).get('runs', '?')} runs, median)"]
    floor = result.get("ort_floor_ms") or {}
    if floor:
        lines.append("onnxruntime floor (Identity on 4 floats, same harness): " +
                     ", ".join(f"{k} {_fmt(v, '.4f') if isinstance(v, float) else v} ms" for k, v in floor.items()))
    for c in result["cases"]:
        shape = ", ".join(f"{k} {v}" for k, v in c.get("shape", {}).items())
        lines.append("")
        lines.append(f"{c['case']} [{shape}]  {_fmt(c.get('flops') and c['flops'] / 1e9, '.2f')} GFLOP, "
                     f"{_fmt(c.get('bytes') and c['bytes'] / 1e6, '.1f')} MB; fused ops: "
                     f"{', '.join(f'{k} {v}' for k, v in (c.get('models', {}).get('fused_ops') or {}).items()) or '-'}")
        lines.append(f"  {'variant':20} {'median ms':>10} {'p10':>9} {'p90':>9} {'TFLOP/s':>8} {'GB/s':>8} "
                     f"{'%roof':>6} {'x unfused':>9} {'rel err':>8}  flags")
        skipped: dict[str, list[str]] = {}
        for name, v in c["variants"].items():
            if "median_ms" in v:
                marks = ", ".join(m for m, on in (("noisy", v.get("noisy")), (">100% roof", v.get("roofline_over_100")))
                                  if on)
                lines.append(f"  {name:20} {v['median_ms']:10.4f} {v['p10_ms']:9.4f} {v['p90_ms']:9.4f} "
                             f"{_fmt(v.get('tflops'), '8.2f')} {_fmt(v.get('gbs'), '8.1f')} "
                             f"{_fmt(v.get('roofline_pct'), '6.1f')} {_fmt(v.get('speedup_vs_unfused'), '9.3f')} "
                             f"{_fmt(v.get('rel_err'), '8.1e')}  {marks}".rstrip())
            else:
                skipped.setdefault(v.get("skipped", "?"), []).append(name)
        if skipped:  # one line per case, variants grouped by reason
            lines.append("  skipped: " + "; ".join(f"{', '.join(names)} ({reason})" for reason, names in skipped.items()))
        for flag in c.get("flags", []):
            lines.append(f"  flag: {flag}")
        r = c.get("ratios", {})
        lines.append("  ratios: " + ", ".join(f"{k} {v}" for k, v in r.items() if v is not None))
    goals = [g for c in result["cases"] for g in c.get("goals", [])]
    if goals:
        lines.append("")
        lines.append("goals:")
        for g in goals:
            val = "-" if g.get("value") is None else f"{g['value']:.3f}"
            extra = f" ({g['reason']})" if g.get("reason") else ""
            lines.append(f"  {g['status'].upper():10} {g['case']}/{g.get('size')}: {g['metric']} {val} "
                         f">= {g['threshold']}{extra}  [{g['goal']}]")
    return "\n".join(lines)


def plot(result: dict, path) -> pathlib.Path | None:
    """A perf-report style PNG: median ms vs size per variant, one panel per case. None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    by_case: dict[str, list[dict]] = {}
    for c in result["cases"]:
        by_case.setdefault(c["case"], []).append(c)
    n = len(by_case)
    if not n:
        return None
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    colors = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(VARIANTS)}
    for ax, (case, entries) in zip(axes.flat, by_case.items()):
        entries = sorted(entries, key=lambda e: e.get("size") or 0)
        xs = [e.get("size") or 0 for e in entries]
        names = [v for v in VARIANTS if any("median_ms" in e["variants"].get(v, {}) for e in entries)]
        if len(set(xs)) > 1:  # perf-report style: median ms vs size, one line per variant, p10-p90 error bars
            for name in names:
                pts = [(x, e["variants"][name]) for x, e in zip(xs, entries) if "median_ms" in e["variants"].get(name, {})]
                style = "--" if name.startswith("torch") else ("-." if name.startswith("ort") else "-")
                med = [v["median_ms"] for _, v in pts]
                err = [[max(v["median_ms"] - v.get("p10_ms", v["median_ms"]), 0) for _, v in pts],
                       [max(v.get("p90_ms", v["median_ms"]) - v["median_ms"], 0) for _, v in pts]]
                ax.errorbar([x for x, _ in pts], med, yerr=err, fmt=style, marker="o", capsize=2, label=name,
                            color=colors[name])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(sorted(set(xs)))
            ax.set_xticklabels([str(x) for x in sorted(set(xs))])
            ax.set_xlabel(entries[0].get("size_name", "size"))
            ax.set_ylabel("median ms (p10-p90 bars)")
            ratio = [(x, e.get("ratios", {}).get("fused_vs_unfused")) for x, e in zip(xs, entries)]
            ratio = [(x, r) for x, r in ratio if r]
            if ratio:  # best fused vs best unfused on a second axis
                ax2 = ax.twinx()
                ax2.plot([x for x, _ in ratio], [r for _, r in ratio], ":", marker="s", color="black",
                         label="fused/unfused speedup")
                ax2.axhline(1.0, color="gray", linewidth=0.6)
                ax2.set_ylabel("unfused / fused (x)")
                ax2.legend(fontsize=7, loc="lower right")
            ax.legend(fontsize=7)
        else:  # one size: a bar per variant, p10-p90 error bars, fused bars labelled with their speedup
            vs = [entries[0]["variants"][name] for name in names]
            ms = [v["median_ms"] for v in vs]
            err = [[max(v["median_ms"] - v.get("p10_ms", v["median_ms"]), 0) for v in vs],
                   [max(v.get("p90_ms", v["median_ms"]) - v["median_ms"], 0) for v in vs]]
            ax.barh(names, ms, xerr=err, capsize=2, color=[colors[n_] for n_ in names])
            ax.invert_yaxis()
            if ms and max(ms) / min(ms) > 30:
                ax.set_xscale("log")
            for i, (name, v) in enumerate(zip(names, vs)):
                sp = v.get("speedup_vs_unfused") if name.startswith("fused") else None
                label = f" {v['median_ms']:.3g}" + (f" ({sp:.2f}x vs unfused)" if sp else "") + \
                    (" noisy" if v.get("noisy") else "")
                ax.text(v.get("p90_ms", v["median_ms"]), i, label, va="center", fontsize=7)
            ax.set_xlabel(f"median ms, p10-p90 bars ({entries[0].get('size_name', 'size')} {xs[0]})")
            ax.tick_params(axis="y", labelsize=7)
        ax.set_title(f"{case} ({result.get('dtype')})")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"onnxfuse bench: {result.get('device')}", fontsize=10)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------------------------------ CLI

from ..argtypes import nonneg_int as _nonneg, positive_int as _positive  # noqa: E402


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in re.split(r"[,\s]+", text.strip()) if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected sizes like 16,128,2048")
    if not vals or min(vals) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: sizes must be positive, like 16,128,2048")
    return vals


def _variant_list(text: str) -> list[str]:
    vals = [v for v in re.split(r"[,\s]+", text.strip()) if v]
    bad = [v for v in vals if v not in VARIANTS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {', '.join(bad)}; choose from {', '.join(VARIANTS)}")
    return vals


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("targets", nargs="*", metavar="CASE|MODEL.onnx",
                   help=f"named cases ({', '.join(CASES)}; default all) or one .onnx model")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="where to run (default: cuda when torch sees a GPU, else cpu)")
    p.add_argument("--dtype", choices=["fp16", "fp32"], help="benchmark dtype (default fp16 on cuda, fp32 on cpu)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", default=None,
                      help="small sizes (tokens 64, hidden 256, ...; the default on the CPU)")
    size.add_argument("--full-size", dest="quick", action="store_false",
                      help="the issue's sizes even on the CPU (slow)")
    p.add_argument("--sizes", type=_int_list, help="tokens / batch sizes to sweep, e.g. 16,128,2048 (default per case)")
    p.add_argument("--layers", type=_positive, default=1, help="decoder layers of the llama case (default 1)")
    p.add_argument("--runs", type=_positive, help="timed runs per variant (default 100 on cuda, 50 on cpu)")
    p.add_argument("--warmup", type=_nonneg, help="warm-up runs per variant (default 10 on cuda, 3 on cpu)")
    p.add_argument("--variants", type=_variant_list, help=f"comma list of variants to run (default all: "
                   f"{', '.join(VARIANTS)})")
    comp = p.add_mutually_exclusive_group()
    comp.add_argument("--compile", dest="compile", action="store_true", default=None,
                      help="run torch.compile also on the CPU")
    comp.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    p.add_argument("--no-tf32", dest="tf32", action="store_false",
                   help="fp32: strict fp32 in torch and ORT (default: TF32 on in both, matched)")
    p.add_argument("--lib", metavar="PATH", help="a prebuilt libonnxfuse_ops.so (default: onnxfuse's cached build)")
    p.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE,
                   help=f"where exported and fused models are cached (default {DEFAULT_CACHE})")
    p.add_argument("--seed", type=int, default=0, help="seed for weights and inputs (default 0)")
    p.add_argument("-o", "--output", metavar="FILE.json",
                   help="results JSON (default: <results dir>/<date>-<device>-<case-or-all>.json)")
    p.add_argument("--results-dir", type=pathlib.Path, metavar="DIR",
                   help=f"folder for the results JSON and plot without -o (default: the checkout's {DEFAULT_RESULTS}/ "
                        "when onnxfuse runs from one, else the user data dir; never the current directory)")
    p.add_argument("--noisy-spread", type=float, default=NOISY_SPREAD, metavar="X",
                   help=f"flag a median as noisy when p90/p10 is above X (default {NOISY_SPREAD})")
    p.add_argument("--plot", metavar="FILE.png", help="plot path (default: the JSON's path with .png)")
    p.add_argument("--no-plot", action="store_true", help="write no plot")
    p.add_argument("--from-json", "--plot-from", dest="from_json", metavar="RESULTS.json",
                   help="run nothing: re-read a results file, print its table, re-check goals, plot it")
    p.add_argument("--check-goals", action="store_true", help="exit 1 when a goal is missed or cannot be measured")
    p.add_argument("--profile", action="store_true",
                   help="GPU: also record each ORT variant's kernel time per run and its top kernels (torch.profiler)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--json", action="store_true", help="print the results JSON on stdout")


def register(subparsers, parser_class=None) -> argparse.ArgumentParser:
    """Add the `bench` subcommand to cli.py's subparsers; its func(args) returns the exit code.

    parser_class is accepted for symmetry with cli.py (its subparsers already create parsers of that class).
    """
    bp = subparsers.add_parser("bench", help="benchmark torch, ORT unfused and ORT fused (per backend, CUDA graphs)",
                               description=__doc__.split("\n\n")[0])
    add_arguments(bp)
    bp.set_defaults(func=cli_main)
    return bp


def options_from_args(args) -> Options:
    return Options(device=args.device, dtype=args.dtype, quick=args.quick, sizes=args.sizes, runs=args.runs,
                   warmup=args.warmup, layers=args.layers, variants=args.variants, compile=args.compile,
                   tf32=args.tf32, lib=args.lib, cache_dir=args.cache_dir, seed=args.seed,
                   quiet=args.quiet or args.json, profile=args.profile)


def cli_main(args) -> int:
    """The `bench` command: run (or re-read), write the JSON and the plot, print the table; 1 if goals fail."""
    quiet = args.quiet or args.json
    if args.noisy_spread < 1:
        raise OnnxfuseError(f"--noisy-spread {args.noisy_spread}: p90/p10 is at least 1; give a threshold like 1.25")
    if args.from_json:
        if args.targets:
            raise OnnxfuseError("--from-json reads a results file: give no cases or models with it")
        result = load_json(args.from_json)
        result["noisy_spread"] = args.noisy_spread
        result = reevaluate(result)
        json_path = pathlib.Path(args.from_json)
    else:
        from .. import onnxio
        if args.output:
            onnxio.check_output_path(args.output, force=True)
        elif args.results_dir is not None and not args.results_dir.is_dir():
            raise OnnxfuseError(f"--results-dir {args.results_dir}: no such folder; create it first or pick another")
        if args.plot:
            onnxio.check_output_path(args.plot, force=True)
        result = annotate(run(args.targets, options_from_args(args)), args.noisy_spread)
        json_path = pathlib.Path(args.output) if args.output else default_output(result, args.results_dir)
        write_json(result, json_path)
    plot_path = None
    if not args.no_plot:
        target = pathlib.Path(args.plot) if args.plot else json_path.with_suffix(".png")
        plot_path = plot(result, target)
        if plot_path is None:
            result.setdefault("notes", []).append(
                f"no plot: matplotlib is not installed; make it later with 'python -m onnxfuse.bench plot {json_path}'")
    failed = goals_failed(result)
    if args.json:
        print(json.dumps(result, indent=1, default=_json_default))
    elif not quiet:
        print(format_table(result))
        if not args.from_json:
            print(f"\nwrote {json_path}")
        if plot_path:
            print(f"wrote {plot_path}")
        for note in result.get("notes", []):
            print(f"note: {note}")
    if args.check_goals and failed:
        if not args.quiet:
            print(f"onnxfuse: {len(failed)} benchmark goal(s) missed or unmeasured: "
                  + "; ".join(f"{g['case']}/{g['size']} {g['metric']} {g['value']} < {g['threshold']}"
                              if g["status"] == "miss" else f"{g['case']}/{g['size']} {g['metric']} unmeasured"
                              for g in failed), file=sys.stderr)
        return 1
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"onnxfuse bench: error: {message} (see '{self.prog} --help')\n")


def main(argv: list[str] | None = None) -> int:
    """`python -m onnxfuse.bench [bench args]` or `python -m onnxfuse.bench plot RESULTS.json [-o PNG]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["plot"]:
            p = _Parser(prog="python -m onnxfuse.bench plot", description="plot a bench results JSON")
            p.add_argument("results", help="results JSON written by onnxfuse bench")
            p.add_argument("-o", "--output", help="PNG path (default: the JSON's path with .png)")
            a = p.parse_args(argv[1:])
            result = load_json(a.results)
            out = plot(result, a.output or pathlib.Path(a.results).with_suffix(".png"))
            if out is None:
                raise OnnxfuseError("matplotlib is not installed; pip install matplotlib")
            print(f"wrote {out}")
            return 0
        p = _Parser(prog="python -m onnxfuse.bench", description=__doc__.split("\n\n")[0])
        add_arguments(p)
        args = p.parse_args(argv)
        with warnings.catch_warnings():
            if args.quiet:
                warnings.simplefilter("ignore")
            return cli_main(args)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    except OnnxfuseError as e:
        print(f"onnxfuse: error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
