"""The `onnxfuse bench` command line.

register(subparsers) adds the `bench` subcommand to onnxfuse.cli's parser: the one parser of the command
(`python -m onnxfuse bench ...` is the same command). cli_main(args), which onnxfuse.cli dispatches,
runs the benchmark (or re-reads a results file with --from-json, only plots one: `bench plot RESULTS.json
[-o PNG]`, or prints the README's markdown table of several: `bench table R.json [R2.json ...]`), writes the
JSON and the plot, prints the table, and returns 1 when --check-goals finds a goal missed.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys

from ..argtypes import nonneg_int as _nonneg, positive_int as _positive
from ..errors import OnnxfuseError
from .cases import CASES
from .goals import goals_failed
from .report import (DEFAULT_RESULTS, NOISY_SPREAD, annotate, default_output, format_table, json_default, load_json,
                     markdown_backends_table, markdown_table, plot, plot_genai, reevaluate, write_json)
from .runner import DEFAULT_CACHE, Options, run
from .variants import VARIANTS

# The command's description (its --help), the first paragraph of the package docstring.
DESCRIPTION = ("`onnxfuse bench`: torch eager, torch.compile, onnxruntime unfused and onnxruntime fused (per kernel "
               "backend, with\nand without CUDA graphs) on one workload, in one process and one run.")


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


def _transformers_modes(text: str) -> list[str]:
    from ..genai.timing import TRANSFORMERS_MODES
    vals = [v for v in re.split(r"[,\s]+", text.strip()) if v]
    bad = [v for v in vals if v not in TRANSFORMERS_MODES]
    if bad or not vals:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(TRANSFORMERS_MODES)}, e.g. eager,compile")
    return vals


def register(subparsers, parser_class=None) -> argparse.ArgumentParser:
    """Add the `bench` subcommand, with all its arguments, to the cli package's subparsers; its func(args)
    (cli_main) returns the exit code.

    parser_class is accepted for symmetry with the cli package (its subparsers already create parsers of that class).
    """
    p = subparsers.add_parser("bench", help="benchmark torch, ORT unfused and ORT fused (per backend, CUDA graphs)",
                              description=DESCRIPTION)
    p.add_argument("targets", nargs="*", metavar="CASE|MODEL.onnx",
                   help=f"named cases ({', '.join(CASES)}; default all) or one .onnx model; 'plot R.json' only plots a "
                        "results file, 'table R.json [R2.json ...]' prints their markdown table (the README's), "
                        "'backends R.json [...]' the per-backend one (ms and %% of roofline)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="where to run (default: cuda when torch sees a GPU, else cpu)")
    p.add_argument("--dtype", choices=["fp16", "fp32"], help="benchmark dtype (default fp16 on cuda, fp32 on cpu)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", default=None,
                      help="small sizes (tokens 64, hidden 256, ...; the default on the CPU)")
    size.add_argument("--full-size", dest="quick", action="store_false",
                      help="the issue's sizes even on the CPU (slow)")
    p.add_argument("--sizes", type=_int_list, help="tokens / batch sizes to sweep, e.g. 16,128,2048 (default per case)")
    p.add_argument("--batch", type=_int_list, metavar="B1,B2",
                   help="bench genai: sequences decoded together, e.g. 1,8 (default 1; --sizes are the prompt lengths)")
    p.add_argument("--transformers", type=_transformers_modes, metavar="eager,compile",
                   help="bench genai: also the first folder's checkpoint (its onnxfuse.json source) through "
                        "transformers, eager and/or with a static cache and torch.compile, on the same prompts")
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
    p.set_defaults(func=cli_main)
    return p


def options_from_args(args) -> Options:
    """The run's Options from the parsed arguments."""
    return Options(device=args.device, dtype=args.dtype, quick=args.quick, sizes=args.sizes, runs=args.runs,
                   warmup=args.warmup, layers=args.layers, variants=args.variants, compile=args.compile,
                   tf32=args.tf32, lib=args.lib, cache_dir=args.cache_dir, seed=args.seed,
                   quiet=args.quiet or args.json, profile=args.profile)


def cli_main(args) -> int:
    """The `bench` command: run (or re-read), write the JSON and the plot, print the table; 1 if goals fail."""
    if args.targets[:1] == ["plot"] and not args.from_json:
        return _plot_only(args)
    if args.targets[:1] == ["table"] and not args.from_json:
        if len(args.targets) < 2:
            raise OnnxfuseError("bench table takes results JSONs: onnxfuse bench table R.json [R2.json ...]")
        print(markdown_table([load_json(t) for t in args.targets[1:]]))
        return 0
    if args.targets[:1] == ["backends"] and not args.from_json:
        if len(args.targets) < 2:
            raise OnnxfuseError("bench backends takes results JSONs: onnxfuse bench backends R.json [R2.json ...]")
        print(markdown_backends_table([load_json(t) for t in args.targets[1:]]))
        return 0
    if args.targets[:1] == ["genai"] and not args.from_json:
        return _genai(args)
    if args.batch:
        raise OnnxfuseError("--batch is for bench genai (sequences decoded together); the cases sweep --sizes")
    if args.transformers:
        raise OnnxfuseError("--transformers is for bench genai (a folder's checkpoint through transformers); the "
                            "cases have their torch variants (--variants torch-eager,torch-compile)")
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
                f"no plot: matplotlib is not installed; make it later with 'onnxfuse bench plot {json_path}'")
    failed = goals_failed(result)
    if args.json:
        print(json.dumps(result, indent=1, default=json_default))
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


def _plot_only(args) -> int:
    """`bench plot RESULTS.json [-o PNG]` : only the plot of a results file, the cases' or a `bench genai` run's
    (default: the JSON's path with .png); no table, no goals."""
    if len(args.targets) != 2:
        raise OnnxfuseError("bench plot takes one results JSON: onnxfuse bench plot RESULTS.json [-o PNG]")
    target = args.output or args.plot or pathlib.Path(args.targets[1]).with_suffix(".png")
    genai = _genai_results(args.targets[1])
    if genai is not None:
        if not genai["rows"]:
            raise OnnxfuseError(f"{args.targets[1]}: a bench genai results file without rows: nothing to plot")
        out = plot_genai(genai, target)
    else:
        out = plot(load_json(args.targets[1]), target)
    if out is None:
        raise OnnxfuseError("matplotlib is not installed; pip install matplotlib")
    if not args.quiet:
        print(f"wrote {out}")
    return 0


def _genai_results(path) -> dict | None:
    """A `bench genai` results JSON (kind genai, a list of rows), read; None for anything else, which goes to
    load_json, whose errors name the problem."""
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError):
        return None
    genai = isinstance(data, dict) and data.get("kind") == "genai" and isinstance(data.get("rows"), list)
    return data if genai else None


def _gemm_peak(provider: str, dtype: str) -> dict:
    """bench genai's GEMM peak: harness.measure_ceilings' (torch's matmul, on the CPU also onnxruntime's)."""
    from .harness import Device, measure_ceilings
    c = measure_ceilings(Device("cuda" if provider == "cuda" else "cpu"), dtype, quick=provider != "cuda")
    return {"peak_tflops": c["peak_tflops"], "peak_gemm": c["peak_gemm"]}


def _genai(args) -> int:
    """`bench genai DIR [DIR ...]`: onnxruntime-genai folders timed in one run (prefill and decode; the first
    folder is the baseline), written as JSON to -o or the results folder."""
    from ..genai import folder as gf, timing
    folders = [pathlib.Path(t) for t in args.targets[1:]]
    if not folders:
        raise OnnxfuseError("bench genai takes genai model folders: onnxfuse bench genai BASELINE_DIR [DIR ...]")
    for f in folders:
        gf.read_config(f)
    provider = "cuda" if args.device == "cuda" else "cpu" if args.device == "cpu" else \
        gf.provider_of(gf.read_config(folders[0]))
    say = None if (args.quiet or args.json) else (lambda text: print(f"onnxfuse bench genai: {text}",
                                                                      file=sys.stderr, flush=True))
    result = timing.bench(folders, provider=provider, sizes=args.sizes, runs=args.runs or 5,
                          warmup=args.warmup if args.warmup is not None else 2, progress=say, batches=args.batch,
                          transformers_modes=args.transformers, gemm_peak=_gemm_peak)
    result["target"] = "genai"
    out = write_json(result, pathlib.Path(args.output) if args.output else default_output(result, args.results_dir))
    png_path = pathlib.Path(args.plot) if args.plot else out.with_suffix(".png")
    png = None if args.no_plot else plot_genai(result, png_path)
    if args.json:
        print(json.dumps(result, indent=1))
    elif not args.quiet:
        print(timing.table(result))
        for line in result.get("skipped", []):
            print(f"skipped: {line}")
        print(f"\nwrote {out}")
        if png:
            print(f"wrote {png}")
    return 0
