"""`onnxfuse verify`, `run` and `fuse`: a model (or a genai folder) in, a check, outputs or a fused model out."""
from __future__ import annotations

import json
import pathlib

from ..genai import command as genai_command
from ..host import FAMILIES
from ..ops import FAMILIES as OP_FAMILIES
from ..schema import BACKENDS
from ._common import _add_output_flags, _add_session_args, _console, choice_list


def _verify(args) -> int:
    if pathlib.Path(args.model).is_dir():
        return genai_command.verify_command(args)
    from .. import verify as v
    from .._term import Stages, checks_table
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
        _console().print(checks_table(f"verify {args.model} ({res.provider}, {res.dtype}, {res.fused_nodes} onnxfuse "
                                      "nodes)", res.outputs))
    return 0 if res.passed else 1


def _run(args) -> int:
    import numpy as np
    from .. import export, onnxio, runtime, zoo
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
            feeds = {k: t.numpy() for k, t in
                     zoo.make_inputs(recipe["kind"], spec, recipe["seed"], recipe["dtype"]).items()}
        else:
            feeds = runtime.random_feeds(sess)
    feeds = runtime.check_feeds(sess, feeds)
    outs = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    if args.output:
        import io
        buf = io.BytesIO()
        np.savez(buf, **dict(zip(names, outs)))
        onnxio.write_atomic(args.output, buf.getvalue())
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
    from .. import fuse as f
    out = args.output
    if out is None:
        src = pathlib.Path(args.model)
        out = src.with_name(src.name.removesuffix(".onnx") + ".fused.onnx")
    res = f.fuse(args.model, out, patterns=args.patterns, report_path=args.report, explain=args.explain,
                 force=args.force, write_unchanged=args.write_unchanged,
                 external_data=args.external_data, ort=not args.no_ort_fusions, backend=args.backend,
                 provider=args.provider, cpu_isa=args.cpu_isa, keep_opset=args.keep_opset)
    if args.json:
        print(json.dumps(res.report(), indent=2))
        return 0
    con = _console(args.quiet)
    from .._term import Table
    if res.upgrade is not None:
        con.print(res.upgrade.line(), soft_wrap=True)
    if res.ort is not None:
        _print_ort_stage(con, res)
    target = f"--provider {args.provider}" if args.provider else "no --provider (a GPU target)"
    for pattern, why in res.left_to_ort.items():
        con.print(f"{pattern}: left to onnxruntime for {target}: {why}", soft_wrap=True)
    if not res.changed:
        if res.already_fused:
            con.print(f"{args.model} is already fused ({res.already_fused} onnxfuse nodes); nothing matched, "
                      f"{'wrote an unchanged copy to ' + str(out) if res.output else 'nothing written'}")
        else:
            con.print(f"no subgraph of {args.model} matched {', '.join(args.patterns or f.PATTERNS)}; "
                      + ('wrote an unchanged copy to ' + str(out) if res.output
                         else 'nothing written (pass --write-unchanged to copy it anyway)'))
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
        for line in res.explain_lines():
            con.print(line, soft_wrap=True)
    return 0


def _patterns() -> list[str]:
    from ..fuse import RULES  # imports onnxscript: only when a --patterns value is parsed
    return list(RULES)



_pattern_list = choice_list(_patterns, "pattern(s)")      # --patterns a,b (the names are fuse.PATTERNS')


def _print_ort_stage(con, res) -> None:
    """Stage 1 of the report: onnxruntime's fusions by name and count, the check, what was left out."""
    stage = res.ort
    if stage.applied:
        from .._term import Table
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
        if left.get("kind") == "slower":
            con.print(f"stage 1 left out {left['fusion']} for the CPU provider: {left['reason']}", soft_wrap=True)
        else:
            con.print(f"stage 1 left out {left['fusion']}: it changed the outputs ({left['reason']})", soft_wrap=True)


def register(sub) -> None:
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
                    help=f"comma-separated patterns to apply (default all: {', '.join(f.name for f in OP_FAMILIES)}; "
                         "mlp_stack chains the layers linear_act fused; embedding_interaction takes DLRM's hash, "
                         "embedding lookups or bags, and feature interaction; int4_linear takes onnxruntime's 4-bit "
                         "MatMulNBits)")
    fu.add_argument("--report", metavar="FILE.json", help="write the fusion report as JSON")
    fu.add_argument("--explain", action="store_true", help="say, for candidates that did not fuse, which check refused")
    fu.add_argument("--no-ort-fusions", action="store_true",
                    help="skip stage 1 (onnxruntime's own transformer fusions) and apply onnxfuse's rules alone")
    fu.add_argument("--keep-opset", action="store_true",
                    help="keep a model whose opset is below what the ops need (default: convert it with onnx's "
                         "version converter, checked against the original in onnxruntime)")
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
