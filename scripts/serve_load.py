"""Load test of `onnxfuse serve`'s Triton server (issue 32): DLRM fused against unfused behind one server.

Exports onnxfuse's DLRM (dynamic batch; criteo-kaggle tables capped, or --preset small), fuses it for this host
(`fuse --provider cpu|cuda`), writes one Python-backend repository holding both models (dlrm_fused,
dlrm_unfused: the export as it is, which onnxruntime optimises with its own fusions when it opens it; server_floor:
the same inputs and output through one ReduceMean, the ceiling the server itself sets on this host), starts the
Triton server PyTriton ships on 127.0.0.1 and, for every (concurrency, request batch), times each model in turn with
tritonclient over HTTP, bounded by --requests and --seconds per cell, every response checked against a direct
onnxruntime run of the same input. Writes JSON (host, versions, cells, fused/unfused ratios) and prints a table.

    python scripts/serve_load.py [--preset criteo-kaggle] [--concurrency 1,8,64] [--batch 1,64] [--requests 3000]
        [--seconds 20] [--instances 1] [--threads 0] [--max-queue-delay-us 100] [-o serve-load.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import platform
import sys
import tempfile
import time


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _floor_model(path: pathlib.Path) -> None:
    """The server's ceiling: a model with the DLRM's inputs and output that does almost nothing (a mean of the
    dense features), so its requests/s is what the server, the backend and the client allow on this host."""
    import onnx
    from onnx import TensorProto, helper
    g = helper.make_graph(
        [helper.make_node("ReduceMean", ["dense", "axes"], ["probability"], keepdims=1)], "floor",
        [helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["batch", 13]),
         helper.make_tensor_value_info("sparse", TensorProto.INT64, ["batch", 26])],
        [helper.make_tensor_value_info("probability", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="criteo-kaggle", choices=["criteo-kaggle", "small"])
    p.add_argument("--concurrency", type=_ints, default=[1, 8, 64])
    p.add_argument("--batch", type=_ints, default=[1, 64])
    p.add_argument("--requests", type=int, default=3000, help="most requests per cell (default 3000)")
    p.add_argument("--seconds", type=float, default=20.0, help="most seconds per cell (default 20)")
    p.add_argument("--distinct", type=int, default=32, help="distinct inputs per cell, cycled (default 32)")
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--max-queue-delay-us", type=int, default=100)
    p.add_argument("--provider", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--rtol", type=float, default=None, help="answer check (default 1e-4 cpu, 2e-3 cuda)")
    p.add_argument("--atol", type=float, default=None, help="answer check (default 1e-5 cpu, 2e-4 cuda)")
    p.add_argument("-o", "--output", default="serve-load.json")
    args = p.parse_args(argv)

    import numpy as np

    from onnxfuse import export, fuse, host, kernels, zoo
    from onnxfuse.serving import load, repository, server

    work = pathlib.Path(tempfile.mkdtemp(prefix="onnxfuse-load-"))
    spec = zoo.DlrmSpec.from_preset(args.preset)
    src, fused = work / "dlrm.onnx", work / "dlrm.fused.onnx"
    export.export("dlrm", spec, src, dynamic=True)
    res = fuse.fuse(src, fused, provider=args.provider)
    lib = kernels.library_path(provider=args.provider)
    repo = work / "repo"
    _floor_model(work / "floor.onnx")
    models = {"dlrm_fused": fused, "dlrm_unfused": src, "server_floor": work / "floor.onnx"}
    for name, path in models.items():
        repository.write_repository(path, repo, name=name, backend="python", max_batch=args.max_batch,
                                    delay_us=args.max_queue_delay_us, instances=args.instances,
                                    provider=args.provider, library_path=lib, threads=args.threads)
    # a request the batcher runs together with others can take another GEMM algorithm than its run alone; on the
    # CUDA provider onnxruntime's fp32 GEMMs use TF32 (10-bit mantissa), so the check allows that rounding there
    rtol, atol = (args.rtol, args.atol) if args.rtol is not None else \
        ((2e-3, 2e-4) if args.provider == "cuda" else (1e-4, 1e-5))
    cells = []
    with server.TritonServer(repo) as srv:
        for batch in args.batch:
            reqs = [{k: v.numpy() for k, v in zoo.criteo_batch(spec, batch, 1000 + i).items()}
                    for i in range(args.distinct)]
            refs = {name: load.references(path, reqs, "probability", library=lib, provider=args.provider)
                    for name, path in models.items()}
            for conc in args.concurrency:
                for name in models:
                    cell = load.run_cell(srv.url, name, "probability", reqs, refs[name], concurrency=conc,
                                         max_requests=args.requests, max_seconds=args.seconds, rtol=rtol, atol=atol)
                    cells.append(cell)
                    print(f"{name} concurrency {conc} batch {batch}: {cell.rps} req/s, p50 {cell.p50_ms} ms, p99 "
                          f"{cell.p99_ms} ms, batch formed {cell.avg_batch}, errors {cell.errors}, wrong "
                          f"{cell.wrong}", flush=True)
    ratios = []
    for f in (c for c in cells if c.model == "dlrm_fused"):
        same = {c.model: c for c in cells if (c.concurrency, c.batch) == (f.concurrency, f.batch)}
        u, floor = same["dlrm_unfused"], same["server_floor"]
        ratios.append({"concurrency": f.concurrency, "batch": f.batch, "rps_fused_over_unfused":
                       round(f.rps / u.rps, 3) if u.rps else None,
                       "p99_fused_over_unfused": round(f.p99_ms / u.p99_ms, 3) if f.p99_ms and u.p99_ms else None,
                       "server_floor_rps": floor.rps,
                       "floor_over_unfused": round(floor.rps / u.rps, 3) if u.rps else None,
                       "fused_share_of_floor": round(f.rps / floor.rps, 3) if floor.rps else None})
    import onnxruntime
    import tritonclient
    gpu = None
    if args.provider == "cuda":
        import subprocess
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip().splitlines()[0]
    out = {"date": time.strftime("%Y-%m-%d"), "host": host.summary(host.describe(lib)), "gpu": gpu,
           "machine": platform.node(),
           "python": sys.version.split()[0], "versions": {"onnxruntime": onnxruntime.__version__,
                                                          "tritonclient": getattr(tritonclient, "__version__", "?"),
                                                          "numpy": np.__version__},
           "triton": str(server.triton_dist()), "preset": args.preset, "table_cap": spec.table_cap,
           "fused_ops": {m.op: sum(1 for x in res.matches if x.op == m.op) for m in res.matches},
           "settings": {k: v for k, v in vars(args).items() if k != "output"}, "check": {"rtol": rtol, "atol": atol},
           "cells": [dataclasses.asdict(c) for c in cells], "ratios": ratios}
    pathlib.Path(args.output).write_text(json.dumps(out, indent=1))
    print(load.markdown(cells))
    print("fused / unfused:", json.dumps(ratios))
    print(f"wrote {args.output}")
    bad = sum(c.errors + c.wrong for c in cells)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
