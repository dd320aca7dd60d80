"""The `onnxfuse` command line: each command parses, calls the Python API, prints.

Exit codes: 0 ok, 1 a verification or benchmark goal failed, 2 bad input (one line on stderr naming the fix).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import warnings

from . import __version__
from .errors import OnnxfuseError
from .genai import command as genai_command
from .host import FAMILIES
from .schema import BACKENDS, TYPES as _DTYPES

DEFAULT_OUT = pathlib.Path("models")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own errors: one line, exit 2
        self.exit(2, f"onnxfuse: error: {message} (see '{self.prog} --help')\n")


def _console(quiet: bool = False):
    from ._term import console
    return console(quiet)


from .argtypes import (choice_list, layer_sizes as _sizes, name_list as _names,  # noqa: E402
                       positive_int as _positive)


# ------------------------------------------------------------------------------------------------------ export

def _add_common_export(p):
    p.add_argument("-o", "--output", help="output .onnx path (default: models/<name>.onnx)")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32", help="parameter dtype (default fp32)")
    p.add_argument("--seed", type=int, default=0, help="random seed for weights and inputs (default 0)")
    p.add_argument("--batch", type=_positive, help="batch size of the example inputs")
    p.add_argument("--dynamic", action="store_true", help="symbolic batch (and sequence) dimensions")
    p.add_argument("--exporter", choices=["auto", "dynamo", "torchscript"], default="auto",
                   help="torch.onnx exporter (auto: dynamo, falling back to TorchScript with a warning)")
    p.add_argument("--external-data", action="store_true", default=None,
                   help="store weights in '<output>.data' (automatic above 2 GB)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output file")
    _add_output_flags(p, "print the result as JSON")


def _export_llama(args) -> int:
    from . import export, zoo
    overrides = {k: getattr(args, k) for k in (
        "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
        "max_position_embeddings", "rms_norm_eps", "rope_theta", "batch", "seq", "attn_implementation",
        "hidden_act") if getattr(args, k) is not None}
    overrides["num_hidden_layers"] = args.layers
    overrides["mlp_only"] = args.mlp_only
    overrides["mlp_bias"] = args.mlp_bias
    if args.lora_rank:
        overrides.update(lora_rank=args.lora_rank, lora_alpha=args.lora_alpha or 0.0)
        if args.lora_targets:
            overrides["lora_targets"] = tuple(args.lora_targets)
    spec = zoo.LlamaSpec.from_preset(args.preset, **overrides)
    name = f"llama-{args.preset}-{'mlp' if args.mlp_only else f'{args.layers}l'}{f'-lora{args.lora_rank}' if args.lora_rank else ''}-{args.dtype}"
    return _run_export(args, "llama", spec, name)


def _export_dlrm(args) -> int:
    from . import export, zoo
    overrides = {k: getattr(args, k) for k in ("bottom_mlp", "top_mlp", "embedding_dim", "table_cap", "interaction",
                                                 "batch", "num_dense") if getattr(args, k) is not None}
    if args.cardinalities:
        overrides["cardinalities"] = args.cardinalities
    if args.lora_rank:
        overrides.update(lora_rank=args.lora_rank, lora_alpha=args.lora_alpha or 0.0)
    spec = zoo.DlrmSpec.from_preset(args.preset, **overrides)
    name = f"dlrm-{args.preset}{f'-lora{args.lora_rank}' if args.lora_rank else ''}-{args.dtype}"
    return _run_export(args, "dlrm", spec, name)


def _run_export(args, kind, spec, name) -> int:
    from . import export
    from ._term import Stages
    out = pathlib.Path(args.output) if args.output else DEFAULT_OUT / f"{name}.onnx"
    if not args.output:
        out.parent.mkdir(parents=True, exist_ok=True)
    res = export.export(kind, spec, out, seed=args.seed, dtype=args.dtype, exporter=args.exporter,
                        dynamic=args.dynamic, external_data=args.external_data, force=args.force,
                        progress=Stages("export", not (args.quiet or args.json)))
    # res.warnings (e.g. the TorchScript fallback) were already issued as Python warnings, printed by main().
    if args.json:
        print(json.dumps({"path": str(res.path), "data_path": str(res.data_path) if res.data_path else None,
                          "exporter": res.exporter, "seconds": round(res.seconds, 2), "op_counts": res.op_counts,
                          "recipe": res.recipe}, indent=2))
    elif not args.quiet:
        from ._term import human_size
        con = _console()
        data = f" and its weights {res.data_path} ({human_size(res.data_path.stat().st_size)})" if res.data_path else ""
        con.print(f"wrote {res.path}{data} ({res.exporter} exporter, {res.seconds:.1f} s, "
                  f"{sum(res.op_counts.values())} nodes)", soft_wrap=True)
        con.print("  " + ", ".join(f"{k} {v}" for k, v in res.op_counts.items()))
    return 0


# ------------------------------------------------------------------------------------------------------ verify/run

def _verify(args) -> int:
    if pathlib.Path(args.model).is_dir():
        return genai_command.verify_command(args)
    from . import verify as v
    from ._term import Stages, Table
    module = inputs = None
    if args.module:
        made = v.load_factory(args.module)
        module, inputs = made if isinstance(made, tuple) else (made, None)
    res = v.verify(args.model, module=module, inputs=inputs, provider=args.provider, tolerance=args.tolerance,
                   graph_optimization=not args.no_graph_opt, library=True if args.require_library else None,
                   backend=args.backend, progress=Stages("verify", not (args.quiet or args.json)))
    if args.json:
        print(json.dumps(res.to_dict(), indent=2))
    elif not args.quiet:
        t = Table("output", "shape", "max abs err", "max rel err", "rel L2 err", "tolerance", "result",
                  title=f"verify {args.model} ({res.provider}, {res.dtype}, {res.fused_nodes} onnxfuse nodes)",
                  numeric=("shape", "max abs err", "max rel err", "rel L2 err", "tolerance", "result"))
        for o in res.outputs:
            t.add_row(o.name, "x".join(map(str, o.shape)), f"{o.max_abs_err:.3e}", f"{o.max_rel_err:.3e}",
                      f"{o.rel_l2_err:.3e}", f"{o.tolerance:.0e}", "[green]PASS[/]" if o.passed else "[red]FAIL[/]")
        _console().print(t)
    return 0 if res.passed else 1


def _run(args) -> int:
    import numpy as np
    from . import export, onnxio, runtime, zoo
    model = onnxio.load(args.model, load_external_data=False)
    if args.output:
        onnxio.check_output_path(args.output, force=args.force)
    sess = runtime.session(args.model, args.provider, library=True if args.require_library else None,
                           backend=args.backend)
    if args.inputs:
        feeds = runtime.load_npz(args.inputs)
    else:
        recipe = export.read_recipe(model)
        if recipe:
            spec = zoo.spec_from_dict(recipe["kind"], recipe["spec"])
            feeds = {k: t.numpy() for k, t in zoo.make_inputs(recipe["kind"], spec, recipe["seed"], recipe["dtype"]).items()}
        else:
            feeds = runtime.random_feeds(sess)
    feeds = runtime.check_feeds(sess, feeds)
    outs = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    if args.output:
        tmp = pathlib.Path(args.output).with_suffix(".tmp.npz")
        np.savez(tmp, **dict(zip(names, outs)))
        os.replace(tmp, args.output)
    summary = {n: {"shape": list(o.shape), "dtype": str(o.dtype), "mean": float(np.mean(o)), "std": float(np.std(o))}
               for n, o in zip(names, outs)}
    if args.json:
        print(json.dumps({"provider": args.provider, "outputs": summary}, indent=2))
    elif not args.quiet:
        for n, s in summary.items():
            print(f"{n}: shape {s['shape']} {s['dtype']} mean {s['mean']:.5g} std {s['std']:.5g}")
        if args.output:
            print(f"wrote {args.output}")
    return 0


def _fuse(args) -> int:
    if pathlib.Path(args.model).is_dir():
        return genai_command.fuse_command(args)
    from . import fuse as f
    out = args.output
    if out is None:
        src = pathlib.Path(args.model)
        out = src.with_name(src.name.removesuffix(".onnx") + ".fused.onnx")
    res = f.fuse(args.model, out, patterns=args.patterns, report_path=args.report, explain=args.explain,
                 force=args.force, write_unchanged=args.write_unchanged,
                 external_data=args.external_data, ort=not args.no_ort_fusions, backend=args.backend,
                 provider=args.provider, cpu_isa=args.cpu_isa)
    if args.json:
        print(json.dumps(res.report(), indent=2))
        return 0
    con = _console(args.quiet)
    from ._term import Table
    if res.ort is not None:
        _print_ort_stage(con, res)
    for pattern, why in res.left_to_ort.items():
        con.print(f"{pattern}: left to onnxruntime for --provider {args.provider}: {why}", soft_wrap=True)
    if not res.changed:
        if res.already_fused:
            con.print(f"{args.model} is already fused ({res.already_fused} onnxfuse nodes); nothing matched, "
                      f"{'wrote an unchanged copy to ' + str(out) if res.output else 'nothing written'}")
        else:
            con.print(f"no subgraph of {args.model} matched {', '.join(args.patterns or f.PATTERNS)}; "
                      f"{'wrote an unchanged copy to ' + str(out) if res.output else 'nothing written (pass --write-unchanged to copy it anyway)'}")
    else:
        stage = "stage 2, onnxfuse" if res.ort is not None else "onnxfuse"
        if res.matches:
            t = Table("pattern", "op", "matches", "nodes removed", "nodes added", "FLOP share",
                      title=f"{stage}: {args.model} -> {res.output}",
                      numeric=("matches", "nodes removed", "nodes added", "FLOP share"))
            for row in res.table():
                share = "n/a" if row["flop_share"] is None else f"{100 * row['flop_share']:.1f}%"
                details = ", ".join(f"{k} x{v}" for k, v in sorted(row.get("details", {}).items()))
                t.add_row(row["pattern"], f"onnxfuse::{row['op']}" + (f" ({details})" if details else ""),
                          str(row["matches"]), str(row["nodes_removed"]), str(row["nodes_added"]), share)
            con.print(t)
        else:
            con.print(f"{stage}: no subgraph matched {', '.join(args.patterns or f.PATTERNS)}; wrote {res.output}")
        total = "n/a (dynamic shapes)" if res.flop_share is None else f"{100 * res.flop_share:.1f}%"
        steps = [res.nodes_before] + ([res.nodes_after_ort] if res.nodes_after_ort is not None else []) + \
            [res.nodes_after]
        con.print(f"nodes {' -> '.join(map(str, steps))}; MatMul/Gemm FLOPs inside onnxfuse ops: {total}; "
                  f"{res.seconds:.2f} s", soft_wrap=True)
    if res.in_functions and not args.explain:
        con.print(f"{res.in_functions} candidate(s) inside model-local functions were left alone (onnxfuse rewrites "
                  "the main graph and If/Loop/Scan bodies; --explain names them)", soft_wrap=True)
    if args.explain:
        if res.refusals:
            con.print("candidates that did not fuse:")
            for r in res.refusals:
                # one line per candidate, never wrapped: users grep these
                con.print(f"  {r['node']} ({r['op_type']}): rule {r['rule']} refused: {r['reason']}", soft_wrap=True)
        else:
            con.print("no candidate subgraph was refused, and no near miss (a GEMM before an unfused activation, a "
                      "gated MLP with an activation SwiGLU does not compute) was seen", soft_wrap=True)
    return 0


def _all_backends() -> tuple[str, ...]:
    from .kernels.build import ALL_BACKENDS
    return ALL_BACKENDS


def _patterns() -> list[str]:
    from .fuse import PATTERNS  # imports onnxscript: only when a --patterns value is parsed
    return list(PATTERNS)


def _doctor_modes() -> tuple[str, ...]:
    from .kernels.doctor import ALL_MODES
    return ALL_MODES


def _ops() -> list[str]:
    from .schema import OPS
    return list(OPS)


_backend_list = choice_list(_all_backends, "backend(s)")  # --backends cpu,cuda,triton
_pattern_list = choice_list(_patterns, "pattern(s)")      # --patterns a,b (the names are fuse.PATTERNS')


def _print_ort_stage(con, res) -> None:
    """Stage 1 of the report: onnxruntime's fusions by name and count, the check, what was left out."""
    stage = res.ort
    if stage.applied:
        from ._term import Table
        t = Table("fusion", "matches", title="stage 1, onnxruntime's fusions (onnxscript ort_fusions)",
                  numeric=("matches",))
        for name, count in stage.applied.items():
            t.add_row(name, str(count))
        con.print(t)
    if stage.intermediate:
        con.print("stage 1 also matched, without leaving its ops in the model: " + ", ".join(
            f"{n} x{k}" for n, k in stage.intermediate.items()) + " (consumed by a later fusion, or given back: "
            "onnxruntime's rotary needs a cos/sin cache)", soft_wrap=True)
    if stage.checked and stage.applied:
        con.print("stage 1 checked: onnxruntime gives the original's outputs (CPU EP, seeded inputs)")
    elif stage.note:
        con.print(f"stage 1: {stage.note}", soft_wrap=True)
    for left in stage.left_out:
        con.print(f"stage 1 left out {left['fusion']}: it changed the outputs ({left['reason']})", soft_wrap=True)


def _build(args) -> int:
    from . import kernels
    backends = args.backends
    quiet = args.quiet or args.json  # stage progress goes to stderr, never with --json
    explicit = backends is not None or args.arch or args.experiments or args.force
    try:
        if args.print_path and not explicit:
            # What a session here would load: ONNXFUSE_LIBRARY, else the cached (or first-use) build, through the
            # stable link of its configuration (which no build of another configuration moves).
            lib = kernels.library_path()
            stable = lib if os.environ.get("ONNXFUSE_LIBRARY") else kernels.link_stable(lib)
            print(json.dumps({"path": str(stable), "library": str(lib.resolve())}, indent=2) if args.json else stable)
            return 0
        res = kernels.build(arch=args.arch, backends=backends, force=args.force, quiet=quiet,
                            experiments=args.experiments)
    except kernels.BuildError as e:
        raise OnnxfuseError(f"kernel library build failed: {e}") from None
    stable = kernels.link_stable(res.path)
    if args.print_path:
        print(json.dumps({"path": str(stable), "library": str(res.path)}, indent=2) if args.json else stable)
        return 0
    data = {"path": str(res.path), "stable_path": str(stable), "backends": res.backends,
            "archs": res.archs, "experiments": res.experiments, "headers": res.header_source, "cached": res.cached,
            "cache_key": res.cache_key, "seconds": round(res.seconds, 1)}
    if args.json:
        print(json.dumps(data, indent=2))
    elif not args.quiet:
        print(f"{'cached' if res.cached else 'built'} {res.path}")
        print(f"  backends: {', '.join(res.backends)}; archs: {', '.join('sm_' + a for a in res.archs) or '-'}; "
              f"experiments: {'yes' if res.experiments else 'no'}; headers: {res.header_source}")
        print(f"  stable path: {stable}")
    return 0


def _cache(args) -> int:
    from . import kernels
    if args.action == "clean":
        removed = kernels.clean(include_headers=args.all)
        if args.json:
            print(json.dumps({"removed": [str(p) for p in removed]}, indent=2))
        elif not args.quiet:
            print(f"removed {len(removed)} entries from {kernels.build_dir()}"
                  f"{'' if args.all else ' (kept the onnxruntime headers; --all removes them too)'}")
        return 0
    entries = kernels.cache_entries(check=True)
    if args.json:
        print(json.dumps({"cache": str(kernels.build_dir()), "entries": entries}, indent=2))
        return 0
    if args.quiet:
        return 0
    from ._term import Table, human_age, human_size
    t = Table("key", "status", "backends", "archs", "experiments", "size", "age",
              title=f"onnxfuse build cache: {kernels.build_dir()}", numeric=("key", "size", "age"))
    for e in entries:
        status = e["status"] + (f" (stable: {', '.join(e['stable'])})" if e["stable"] else "")
        if e["status"] == "failed":
            status += f" at {e.get('stage')}"
        t.add_row(e["key"], status, ",".join(e["backends"]) or "-", ",".join(e["archs"]) or "-",
                  "yes" if e["experiments"] else "no", human_size(e["size_bytes"]), human_age(e["age_s"]))
    con = _console()
    con.print(t)
    failed = [e for e in entries if e["status"] == "failed"]
    for e in failed:
        con.print(f"failed {e['key']}: log {e.get('log')}")
    if not entries:
        con.print("no cached builds; 'onnxfuse build' makes one")
    return 0


def _doctor(args) -> int:
    from . import info
    if args.lib and not pathlib.Path(args.lib).is_file():
        raise OnnxfuseError(f"--lib {args.lib}: no such file; give a built libonnxfuse_ops.so "
                            "('onnxfuse build --print-path' prints the path of one)")
    return info.doctor_command(args, _console)


def _tune(args) -> int:
    from .kernels import tune
    out = pathlib.Path(args.output) if args.output else (tune.TUNED_FILE if args.into_package else None)
    if out is None or not out.parent.is_dir():
        raise OnnxfuseError(f"-o {out}: no folder {out.parent}" if out else "onnxfuse tune: say where the table goes: "
                            f"-o FILE.json, or --into-package to update {tune.TUNED_FILE} (what the build applies)")
    try:
        table = tune.run_tune(kernels=args.kernels or tune.KERNELS, sizes=args.sizes or tune.SIZES, jobs=args.jobs,
                              rep_ms=args.rep_ms, on_line=None if args.quiet else print)
    except RuntimeError as e:
        raise OnnxfuseError(str(e)) from None
    msg = tune.save(table, out)
    if not args.quiet:
        print(msg)
    return 0


def _info(args) -> int:
    from . import info
    data = info.collect(check=args.check)
    if args.json:
        print(json.dumps(data, indent=2))
    elif not args.quiet:
        info.print_info(data, _console())
    return 0 if data.get("check_passed", True) else 1


# ------------------------------------------------------------------------------------------------------ parser

def _add_output_flags(p, json_help: str, quiet_help: str = "print nothing but errors") -> None:
    """-q and --json, which every command takes (issue contract: consistent flags)."""
    p.add_argument("-q", "--quiet", action="store_true", help=quiet_help)
    p.add_argument("--json", action="store_true", help=json_help)


def _add_session_args(p) -> None:
    """Flags of the commands that run a model in onnxruntime (verify, run)."""
    p.add_argument("--provider", choices=["cpu", "cuda"], default="cpu", help="execution provider (default cpu)")
    p.add_argument("--require-library", action="store_true",
                   help="fail (exit 2) instead of falling back to the function bodies when the kernel library is unavailable")
    p.add_argument("--backend", choices=BACKENDS,
                   help="run every onnxfuse node with this kernel family (sets the nodes' backend attribute on an "
                        "in-memory copy; default: what the model says)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="onnxfuse", description="Export PyTorch models to ONNX, fuse subgraphs into onnxfuse custom ops, "
                "and run them in onnxruntime with CPU, CUDA and Triton kernels.")
    p.add_argument("--version", action="version", version=f"onnxfuse {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    ex = sub.add_parser("export", help="export a PyTorch model (llama, dlrm) to ONNX with a rebuild recipe, or a "
                        "checkpoint (hf) to an onnxruntime-genai folder")
    exsub = ex.add_subparsers(dest="model", metavar="MODEL", parser_class=_Parser, required=True)
    ll = exsub.add_parser("llama", help="a transformers Llama decoder (random weights, no downloads)")
    ll.add_argument("--preset", choices=["seed", "tiny", "llama2-7b"], default="seed",
                    help="base shapes: seed (the notebook's h1024/i11008, 4 heads, 2x1024 tokens), tiny (tests), "
                         "llama2-7b (h4096/i11008, 32 heads)")
    ll.add_argument("--layers", type=_positive, default=1, help="number of decoder layers (default 1)")
    ll.add_argument("--mlp-only", action="store_true", help="export one LlamaMLP alone (input x: batch x seq x hidden)")
    ll.add_argument("--seq", type=_positive, help="sequence length of the example inputs")
    for flag, typ in (("hidden-size", _positive), ("intermediate-size", _positive), ("num-attention-heads", _positive),
                      ("num-key-value-heads", _positive), ("vocab-size", _positive),
                      ("max-position-embeddings", _positive), ("rms-norm-eps", float), ("rope-theta", float)):
        ll.add_argument(f"--{flag}", type=typ, help="LlamaConfig field (default from --preset)")
    ll.add_argument("--attn-implementation", choices=["eager", "sdpa"], help="attention implementation (default eager)")
    ll.add_argument("--hidden-act", help="MLP activation (default silu)")
    ll.add_argument("--mlp-bias", action="store_true", help="bias on the MLP projections")
    ll.add_argument("--lora-rank", type=int, default=0, help="wrap linears with peft LoRA adapters of this rank")
    ll.add_argument("--lora-alpha", type=float, help="LoRA alpha (default 2 x rank)")
    ll.add_argument("--lora-targets", type=_names, metavar="M1,M2",
                    help="comma-separated modules to adapt (default gate_proj,up_proj,down_proj)")
    _add_common_export(ll)
    ll.set_defaults(func=_export_llama)

    dl = exsub.add_parser("dlrm", help="a DLRM recommender (13 dense + 26 sparse Criteo-style features)")
    dl.add_argument("--preset", choices=["criteo-kaggle", "small"], default="criteo-kaggle",
                    help="criteo-kaggle: Kaggle cardinalities capped by --table-cap; small: tables capped at 1000")
    dl.add_argument("--bottom-mlp", type=_sizes, metavar="N1,N2", help="bottom MLP sizes (default 512,256,64,16)")
    dl.add_argument("--top-mlp", type=_sizes, metavar="N1,N2", help="top MLP sizes (default 512,256,1)")
    dl.add_argument("--embedding-dim", type=_positive, help="embedding dimension (default 16)")
    dl.add_argument("--cardinalities", type=_sizes, metavar="N1,N2", help="table sizes, 26 values like 1460,583,...")
    dl.add_argument("--table-cap", type=_positive, help="cap on each table's rows (default 262144)")
    dl.add_argument("--num-dense", type=_positive, help="number of dense features (default 13)")
    dl.add_argument("--interaction", choices=["dot", "cat"], help="feature interaction (default dot)")
    dl.add_argument("--lora-rank", type=int, default=0, help="add a plain-PyTorch LoRA branch to every MLP layer")
    dl.add_argument("--lora-alpha", type=float, help="LoRA alpha (default 2 x rank)")
    _add_common_export(dl)
    dl.set_defaults(func=_export_dlrm)
    genai_command.register_export(exsub)

    ve = sub.add_parser("verify", help="compare a model's outputs with the PyTorch module it came from")
    ve.add_argument("model", help="the .onnx model (fused or not), or an onnxruntime-genai model folder")
    ve.add_argument("--module", metavar="PATH.py:FACTORY", help="the PyTorch module (default: rebuilt from the recipe)")
    _add_session_args(ve)
    ve.add_argument("--tolerance", type=float, help="max |out-ref|/max|ref| (default by dtype and provider)")
    ve.add_argument("--no-graph-opt", action="store_true", help="turn onnxruntime's graph optimisations off")
    genai_command.add_verify_args(ve)
    _add_output_flags(ve, "print the result as JSON", quiet_help="print nothing; the exit code says it")
    ve.set_defaults(func=_verify)

    ru = sub.add_parser("run", help="run a model in onnxruntime (the kernel library registered when needed)")
    ru.add_argument("model", help="the .onnx model")
    _add_session_args(ru)
    ru.add_argument("--inputs", metavar="FILE.npz", help="inputs (default: the recipe's seeded inputs, else random)")
    ru.add_argument("-o", "--output", metavar="FILE.npz", help="write the outputs here")
    ru.add_argument("--force", action="store_true", help="overwrite an existing output file")
    _add_output_flags(ru, "print a summary of the outputs as JSON")
    ru.set_defaults(func=_run)

    fu = sub.add_parser("fuse", help="replace fusable subgraphs with onnxfuse custom ops")
    fu.add_argument("model", help="the exported .onnx model, or an onnxruntime-genai model folder")
    fu.add_argument("-o", "--output", help="fused model path (default: <model>.fused.onnx; for a folder <DIR>-fused)")
    fu.add_argument("--patterns", type=_pattern_list, metavar="P1,P2",
                    help="comma-separated patterns to apply (default all: lora_linear, swiglu, rotary_embedding, "
                         "linear_act, mlp_stack, embedding_interaction, embedding; mlp_stack chains the layers "
                         "linear_act fused; embedding_interaction takes DLRM's hash, embedding lookups or bags, and "
                         "feature interaction)")
    fu.add_argument("--report", metavar="FILE.json", help="write the fusion report as JSON")
    fu.add_argument("--explain", action="store_true", help="say, for candidates that did not fuse, which check refused")
    fu.add_argument("--no-ort-fusions", action="store_true",
                    help="skip stage 1 (onnxruntime's own transformer fusions) and apply onnxfuse's rules alone")
    fu.add_argument("--write-unchanged", action="store_true", help="write the output even when nothing matched")
    fu.add_argument("--external-data", action="store_true", default=None,
                    help="store weights in '<output>.data' (automatic above 2 GB)")
    fu.add_argument("--backend", choices=BACKENDS,
                    help="kernel family written into every fused node's backend attribute (default auto: the "
                         "library picks per node at run time)")
    fu.add_argument("--provider", choices=["cpu", "cuda"],
                    help="the execution provider the model will run on: cpu leaves to onnxruntime the patterns whose "
                         "CPU kernel measured slower than onnxruntime's own path on hosts of this CPU's vector ISA "
                         "family (fuse.CPU_LEFT_TO_ORT; --patterns overrides)")
    fu.add_argument("--cpu-isa", choices=[name for name, _ in FAMILIES],
                    help="with --provider cpu: the host family the model will run on (default this host's, e.g. "
                         "avx2 on a CPU without AVX-512)")
    fu.add_argument("--force", action="store_true", help="overwrite an existing output file")
    _add_output_flags(fu, "print the fusion report as JSON")
    fu.set_defaults(func=_fuse)

    bu = sub.add_parser("build", help="build the kernel library (CPU, CUDA, Triton) into the cache",
                        description="Build the kernel library into the user cache (stages on stderr). A cached "
                                    "build of the same inputs is reused; a build that failed is remembered and "
                                    "fails at once until its inputs change or --force.")
    bu.add_argument("--arch", metavar="A1,A2", help="CUDA architectures, e.g. 90 or 80,90 (default 90)")
    bu.add_argument("--backends", type=_backend_list, metavar="B1,B2",
                    help="comma list of cpu,cuda,triton (default: all this machine can build)")
    bu.add_argument("--experiments", action="store_true",
                    help="also compile the Triton A/B variants (node attributes small_cfg, lora_onepass, stack_cfg); "
                         "a larger library, for experiments only")
    bu.add_argument("--force", action="store_true", help="rebuild even if a cached build exists, or retry one that failed")
    bu.add_argument("--print-path", action="store_true",
                    help="print only the stable path of the library (<cache>/stable/<configuration>/"
                         "libonnxfuse_ops.so, e.g. stable/cpu-cuda-triton-sm90; only a build of the same backends, "
                         "archs and experiments re-points it); without other flags, of the library a session here "
                         "loads (or ONNXFUSE_LIBRARY), building it first if needed")
    _add_output_flags(bu, "print the result as JSON")
    bu.set_defaults(func=_build)

    ca = sub.add_parser("cache", help="list or clean the kernel library build cache",
                        description="List the cached kernel-library builds (key, status, backends, archs, size, "
                                    "age) or remove them.")
    ca.add_argument("action", nargs="?", choices=["list", "clean"], default="list",
                    help="list (default) or clean (remove every build, failure record and log)")
    ca.add_argument("--all", action="store_true", help="clean: also remove the fetched onnxruntime headers")
    _add_output_flags(ca, "print as JSON")
    ca.set_defaults(func=_cache)

    do = sub.add_parser("doctor", help="build/load the library and check every op per backend against PyTorch",
                        description="Check every onnxfuse op on every kernel backend against PyTorch: a one-node "
                                    "model per op, dtype and shape, run in onnxruntime (CPU EP; CUDA EP plain, on a "
                                    "user stream and under CUDA graphs). GPU rows are skipped, saying why, without "
                                    "onnxruntime-gpu, a GPU or the library's CUDA kernels. Exit 1 when a check fails.")
    do.add_argument("--providers", type=choice_list(("cpu", "cuda"), "provider(s)"), metavar="P1,P2",
                    help="execution providers to check: cpu, cuda (default both)")
    do.add_argument("--backends", type=_backend_list, metavar="B1,B2",
                    help="kernel backends to check: cpu (CPU EP), cuda, triton (CUDA EP) (default all)")
    do.add_argument("--ops", type=choice_list(_ops, "op(s)"), metavar="OP1,OP2", help="ops to check (default all)")
    do.add_argument("--dtypes", type=choice_list(_DTYPES, "dtype(s)"), metavar="T1,T2",
                    help=f"element types to check: {','.join(_DTYPES)} (default all)")
    do.add_argument("--modes", type=choice_list(_doctor_modes, "mode(s)"), metavar="M1,M2",
                    help="CUDA EP modes: plain, user_stream, cuda_graph (default all; the CPU EP runs plain)")
    do.add_argument("--lib", metavar="PATH", help="the libonnxfuse_ops.so to check (default: ONNXFUSE_LIBRARY, else "
                    "the cached build, built first if there is none)")
    do.add_argument("--special-values", action="store_true",
                    help="also check IEEE semantics: rows of NaN, +-Inf, -0, the type's max and subnormals in X, "
                         "NaN and Inf exactly where PyTorch has them (on the CPU with weights as inputs and as "
                         "initializers)")
    do.add_argument("-v", "--verbose", action="store_true",
                    help="print each check as it finishes (long GPU runs), then the failures and counts")
    _add_output_flags(do, "print the result as JSON", quiet_help="print nothing; the exit code says it")
    do.set_defaults(func=_doctor)

    tu = sub.add_parser("tune", help="time Triton tile configs on this GPU; write the table the build compiles with",
                        description="Time the Triton GEMM kernels' tile configs (linear_act, swiglu, lora_main; "
                                    "fp16) on this GPU per size class on the benchmark shapes, check each against "
                                    "torch, write the fastest as triton/aot.py --configs JSON (timings under 'meta').")
    tu.add_argument("-o", "--output", metavar="FILE.json", help="where to write the table")
    tu.add_argument("--into-package", action="store_true",
                    help="merge the result into onnxfuse/kernels/triton/tuned.json, the table the build applies")
    tu.add_argument("--kernels", type=choice_list(("linear_act", "swiglu", "lora_main"), "kernel(s)"),
                    metavar="K1,K2", help="kernels to tune (default linear_act,swiglu,lora_main)")
    tu.add_argument("--sizes", type=choice_list(("small", "medium", "large"), "size class(es)"), metavar="S1,S2",
                    help="size classes to tune: small (M <= 16), medium (<= 128), large (default all)")
    tu.add_argument("--jobs", type=int, help="parallel compile workers (default: one per CPU)")
    tu.add_argument("--rep-ms", type=int, default=200, help="milliseconds of timed runs per config (default 200)")
    tu.add_argument("-q", "--quiet", action="store_true", help="print nothing")
    tu.set_defaults(func=_tune)

    from . import bench, view
    bench.register(sub, _Parser)
    genai_command.register(sub)
    view.register(sub)

    inf = sub.add_parser("info", help="versions, providers, GPU, headers and kernel library status")
    inf.add_argument("--check", action="store_true",
                     help="also build/load the kernel library and test every op (a summary; failures in full)")
    _add_output_flags(inf, "print as JSON", quiet_help="print nothing; the exit code says it (1: a check failed)")
    inf.set_defaults(func=_info)

    _remember_parsers(p)
    return p


def _remember_parsers(parser) -> None:
    """Give every command's parser a default `_parser` naming itself, so that errors found after parsing (an
    unrecognized argument) point at that command's help, not at 'onnxfuse --help'."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(_parser=sub)
                _remember_parsers(sub)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings the user should see: one line on stderr, no source location."""
    print(f"onnxfuse: warning: {str(message).splitlines()[0] if str(message) else category.__name__}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # --help (0) and argparse's errors (2): return the code, as for every other path
        return e.code if isinstance(e.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        from .kernels import announcements
        quiet = bool(getattr(args, "quiet", False) or getattr(args, "json", False))
        with warnings.catch_warnings(), announcements(not quiet):  # no first-use build notice with -q/--json
            if getattr(args, "quiet", False):
                warnings.simplefilter("ignore")
            else:
                from .runtime import LibraryUnavailableWarning
                warnings.filterwarnings("always", category=LibraryUnavailableWarning)
            warnings.showwarning = _show_warning
            return args.func(args)
    except OnnxfuseError as e:
        print(f"onnxfuse: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("onnxfuse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
