"""`onnxfuse bench`: torch eager, torch.compile, onnxruntime unfused and onnxruntime fused (per kernel backend, with
and without CUDA graphs) on one workload, in one process and one run.

    onnxfuse bench                       # every named case (GPU sizes on a GPU, small sizes on the CPU)
    onnxfuse bench llama-mlp dlrm        # some named cases
    onnxfuse bench models/x.onnx         # a model file (fused on the fly when it is not fused yet)
    onnxfuse bench --from-json R.json --check-goals   # re-read a results file: table, goals, plot; no run
    onnxfuse bench plot R.json [-o R.png]   # the plot alone (e.g. on a machine with matplotlib)

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

The package, by job: cases (the named workloads and model files as workloads), models (export, fuse, cache; FLOPs
and bytes), harness (timing, IOBinding sessions, ceilings, the ORT floor, the kernel profile), variants (the
variants and run_variants), ratios, goals (with the goal values in goals.json), report (flags, JSON, table, plot),
runner (Options, run, run_workload) and command (register, the argparse of `onnxfuse bench`, and cli_main).
"""
from __future__ import annotations

from .cases import CASES, CaseDef, Workload, file_workload, workloads
from .command import cli_main, options_from_args, register
from .goals import (GOALS, SAME_SHAPES_AS, Goal, cross_case_ratios, evaluate_goals, goal_applies, goals_failed,
                    load_goals)
from .harness import Device, OrtRun, measure_ceilings, measure_ort_floor, profile_kernels, stats
from .models import flops_and_bytes, prepare_file_models, prepare_models
from .ratios import add_variant_speedups, compute_ratios
from .report import (DEFAULT_RESULTS, NOISY_SPREAD, annotate, default_output, format_table, load_json,
                     markdown_backends_table, markdown_table, plot, reevaluate, results_dir, slug, write_json)
from .runner import DEFAULT_CACHE, SCHEMA_VERSION, Options, run, run_workload
from .variants import FUSED_GPU, GPU_ONLY, ORT_OPTIMIZED, UNFUSED, VARIANTS, run_variants

__all__ = [
    # running
    "Options", "run", "run_workload", "run_variants", "SCHEMA_VERSION", "DEFAULT_CACHE",
    # cases and models
    "CASES", "CaseDef", "Workload", "workloads", "file_workload", "prepare_models", "prepare_file_models",
    "flops_and_bytes",
    # the harness
    "Device", "OrtRun", "stats", "measure_ceilings", "measure_ort_floor", "profile_kernels",
    # variants, ratios and goals
    "VARIANTS", "GPU_ONLY", "FUSED_GPU", "UNFUSED", "ORT_OPTIMIZED", "compute_ratios", "add_variant_speedups",
    "Goal", "GOALS", "SAME_SHAPES_AS", "load_goals", "goal_applies", "evaluate_goals", "cross_case_ratios",
    "goals_failed",
    # output
    "NOISY_SPREAD", "DEFAULT_RESULTS", "annotate", "results_dir", "default_output", "slug", "write_json", "load_json",
    "reevaluate", "format_table", "markdown_table", "markdown_backends_table", "plot",
    # the command (onnxfuse.cli calls register; cli_main is the subcommand's func)
    "register", "options_from_args", "cli_main",
]
