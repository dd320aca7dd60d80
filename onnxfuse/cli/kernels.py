"""`onnxfuse build`, `cache`, `doctor`, `tune` and `info`: the kernel library and this machine."""
from __future__ import annotations

import json
import os
import pathlib

from ..errors import OnnxfuseError
from ..schema import TYPES as _DTYPES
from ._common import _add_output_flags, _console, choice_list


def _all_backends() -> tuple[str, ...]:
    from ..kernels.build import ALL_BACKENDS
    return ALL_BACKENDS



def _doctor_modes() -> tuple[str, ...]:
    from ..doctor import ALL_MODES
    return ALL_MODES


def _ops() -> list[str]:
    from ..schema import OPS
    return list(OPS)


_backend_list = choice_list(_all_backends, "backend(s)")  # --backends cpu,cuda,triton


def _build(args) -> int:
    from .. import kernels
    backends = args.backends
    quiet = args.quiet or args.json  # stage progress goes to stderr, never with --json
    explicit = backends is not None or args.arch or args.force
    try:
        if args.print_path and not explicit:
            # What a session here would load: ONNXFUSE_LIBRARY, else the cached (or first-use) build, through the
            # stable link of its configuration (which no build of another configuration moves).
            lib = kernels.library_path()
            stable = lib if os.environ.get("ONNXFUSE_LIBRARY") else kernels.link_stable(lib)
            print(json.dumps({"path": str(stable), "library": str(lib.resolve())}, indent=2) if args.json else stable)
            return 0
        res = kernels.build(arch=args.arch, backends=backends, force=args.force, quiet=quiet)
    except kernels.BuildError as e:
        raise OnnxfuseError(f"kernel library build failed: {e}") from None
    stable = kernels.link_stable(res.path)
    if args.print_path:
        print(json.dumps({"path": str(stable), "library": str(res.path)}, indent=2) if args.json else stable)
        return 0
    data = {"path": str(res.path), "stable_path": str(stable), "backends": res.backends, "archs": res.archs,
            "headers": res.header_source, "cached": res.cached, "cache_key": res.cache_key,
            "seconds": round(res.seconds, 1)}
    if args.json:
        print(json.dumps(data, indent=2))
    elif not args.quiet:
        print(f"{'cached' if res.cached else 'built'} {res.path}")
        print(f"  backends: {', '.join(res.backends)}; archs: {', '.join('sm_' + a for a in res.archs) or '-'}; "
              f"headers: {res.header_source}")
        print(f"  stable path: {stable}")
    return 0


def _cache(args) -> int:
    from .. import kernels
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
    from .._term import Table, human_age, human_size
    t = Table("key", "status", "backends", "archs", "size", "age",
              title=f"onnxfuse build cache: {kernels.build_dir()}", numeric=("key", "size", "age"))
    for e in entries:
        status = e["status"] + (f" (stable: {', '.join(e['stable'])})" if e["stable"] else "")
        if e["status"] == "failed":
            status += f" at {e.get('stage')}"
        t.add_row(e["key"], status, ",".join(e["backends"]) or "-", ",".join(e["archs"]) or "-",
                  human_size(e["size_bytes"]), human_age(e["age_s"]))
    con = _console()
    con.print(t)
    failed = [e for e in entries if e["status"] == "failed"]
    for e in failed:
        con.print(f"failed {e['key']}: log {e.get('log')}")
    if not entries:
        con.print("no cached builds; 'onnxfuse build' makes one")
    return 0


def _doctor(args) -> int:
    from .. import info
    if args.lib and not pathlib.Path(args.lib).is_file():
        raise OnnxfuseError(f"--lib {args.lib}: no such file; give a built libonnxfuse_ops.so "
                            "('onnxfuse build --print-path' prints the path of one)")
    return info.doctor_command(args, _console)


def _tune(args) -> int:
    from .. import tune
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
    from .. import info
    data = info.collect(check=args.check)
    if args.json:
        print(json.dumps(data, indent=2))
    elif not args.quiet:
        info.print_info(data, _console())
    return 0 if data.get("check_passed", True) else 1


def register(sub) -> None:
    bu = sub.add_parser("build", help="build the kernel library (CPU, CUDA, Triton) into the cache",
                        description="Build the kernel library into the user cache (stages on stderr). A cached "
                                    "build of the same inputs is reused; a build that failed is remembered and "
                                    "fails at once until its inputs change or --force.")
    bu.add_argument("--arch", metavar="A1,A2", help="CUDA architectures, e.g. 90 or 80,90 (default 90)")
    bu.add_argument("--backends", type=_backend_list, metavar="B1,B2",
                    help="comma list of cpu,cuda,triton (default: all this machine can build)")
    bu.add_argument("--force", action="store_true",
                    help="rebuild even if a cached build exists, or retry one that failed")
    bu.add_argument("--print-path", action="store_true",
                    help="print only the stable path of the library (<cache>/stable/<configuration>/"
                         "libonnxfuse_ops.so, e.g. stable/cpu-cuda-triton-sm90; only a build of the same backends "
                         "and archs re-points it); without other flags, of the library a session here "
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

    inf = sub.add_parser("info", help="versions, providers, GPU, headers and kernel library status")
    inf.add_argument("--check", action="store_true",
                     help="also build/load the kernel library and test every op (a summary; failures in full)")
    _add_output_flags(inf, "print as JSON", quiet_help="print nothing; the exit code says it (1: a check failed)")
    inf.set_defaults(func=_info)
