"""`onnxfuse serve` (a Triton server on loopback running a fused model) and `onnxfuse triton-repo` (a model
repository for a production Triton's onnxruntime backend)."""
from __future__ import annotations

import json
import pathlib
import shutil
import signal
import tempfile
import threading

from ._common import _add_output_flags, _console


def _model_name(args) -> str:
    if args.name:
        return args.name
    path = pathlib.Path(args.model)
    stem = path.name if path.is_dir() else path.stem
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in stem.replace(".fused", "_fused")) or "model"


def _serve(args) -> int:
    from .. import onnxio
    from ..serving import repository, server
    con = _console(args.quiet)
    name = _model_name(args)
    repo = pathlib.Path(tempfile.mkdtemp(prefix="onnxfuse-repo-"))
    srv = None
    try:
        model_dir = repository.write_repository(
            args.model, repo, name=name, backend="python", max_batch=args.max_batch, delay_us=args.max_queue_delay_us,
            instances=args.instances, provider=args.provider, library_path=args.lib, threads=args.threads)
        sig = repository.signature(onnxio.load(str(model_dir / "1" / repository.MODEL_FILE), load_external_data=False))
        srv = server.TritonServer(repo, host=args.host, http_port=args.port, grpc_port=args.port + 1,
                                  metrics_port=args.port + 2)
        if not args.json:
            con.print(f"starting Triton ({server.triton_dist()}) with {name} on {args.provider}, {args.instances} "
                      "instance(s) ...", soft_wrap=True)
        srv.start()
        batching = (f"dynamic batching up to {args.max_batch} rows, {args.max_queue_delay_us} us queue delay"
                    if sig.batched and args.max_batch > 0 else f"no batching: {sig.why_not_batched or '--max-batch 0'}")
        info = {"model": name, "http": f"http://{srv.url}", "grpc": f"{args.host}:{srv.grpc_port}",
                "metrics": f"http://{args.host}:{srv.metrics_port}/metrics", "batching": batching,
                "inputs": {t.name: [t.data_type, t.dims] for t in sig.inputs},
                "outputs": {t.name: [t.data_type, t.dims] for t in sig.outputs}}
        if args.json:
            print(json.dumps(info), flush=True)
        else:
            con.print(f"ready: {name} at {info['http']}/v2/models/{name}/infer (gRPC {info['grpc']}, metrics "
                      f"{info['metrics']}); {batching}. Ctrl-C stops it.", soft_wrap=True)
        if not _wait(srv):
            con.print(f"the Triton server exited by itself ({srv.proc.returncode}): {srv.log_tail()}", soft_wrap=True)
            return 1
        return 0
    finally:
        if srv is not None:
            srv.stop()
        shutil.rmtree(repo, ignore_errors=True)


def _wait(srv) -> bool:
    """Until Ctrl-C or SIGTERM (True: the caller stops the server), or until the server exits by itself (False)."""
    stop = threading.Event()
    # SIGINT too: a shell that starts the command in the background ignores it, and Python then raises no
    # KeyboardInterrupt
    old = {sig: signal.signal(sig, lambda *a: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.is_set() and srv.proc.poll() is None:
            stop.wait(0.5)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    return stop.is_set()


def _triton_repo(args) -> int:
    from ..serving import repository
    name = _model_name(args)
    model_dir = repository.write_repository(
        args.model, args.output, name=name, backend="onnxruntime", max_batch=args.max_batch,
        delay_us=args.max_queue_delay_us, instances=args.instances, provider=args.provider, library_path=args.lib,
        mount=args.mount, cuda_graph=args.cuda_graph, threads=args.threads, force=args.force)
    files = sorted(str(p.relative_to(model_dir.parent)) for p in model_dir.rglob("*") if p.is_file())
    if args.json:
        print(json.dumps({"model_dir": str(model_dir), "files": files}))
    elif not args.quiet:
        con = _console()
        con.print(f"wrote {model_dir}: {', '.join(files)}", soft_wrap=True)
        con.print(f"start it: tritonserver --model-repository={model_dir.parent} (the onnxruntime backend; "
                  "the library path in config.pbtxt must hold in the server, see --mount)", soft_wrap=True)
    return 0


def _common(p, instances_help: str) -> None:
    p.add_argument("model", help="the (fused) .onnx model, or a folder holding model.onnx")
    p.add_argument("--name", help="the model's name in Triton (default: from the file name)")
    p.add_argument("--max-batch", type=int, default=64,
                   help="largest batch the dynamic batcher forms (default 64; 0 turns batching off)")
    p.add_argument("--max-queue-delay-us", type=int, default=100,
                   help="how long a request may wait for others to batch with (default 100 us)")
    p.add_argument("--instances", type=int, default=1, help=instances_help)
    p.add_argument("--provider", choices=["cpu", "cuda"], default="cpu", help="execution provider (default cpu)")
    p.add_argument("--threads", type=int, default=0,
                   help="onnxruntime intra-op threads per instance (default 0: onnxruntime's choice)")
    p.add_argument("--lib", help="the libonnxfuse_ops.so to use (default: the cached build)")


def register(sub) -> None:
    se = sub.add_parser("serve", help="serve a model with a Triton Inference Server on loopback (PyTriton's binary)",
                        description="Start NVIDIA's Triton Inference Server (the binary PyTriton ships: pip install "
                        "nvidia-pytriton) with the model in onnxruntime and the kernel library, one session per "
                        "instance, dynamic batching over axis 0 when every input and output has it, HTTP on --port, "
                        "gRPC on --port + 1, Prometheus metrics on --port + 2. Ctrl-C stops it.")
    _common(se, "model instances, one onnxruntime session each (default 1)")
    se.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    se.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000, Triton's)")
    _add_output_flags(se, "print the endpoints as one JSON line once ready")
    se.set_defaults(func=_serve)
    tr = sub.add_parser("triton-repo", help="write a model repository for a production Triton's onnxruntime backend",
                        description="Write REPO/NAME/{config.pbtxt, 1/model.onnx, libonnxfuse_ops.so (+ the oneDNN "
                        "it links)}: platform onnxruntime_onnx, the library in model_operations, inputs and "
                        "outputs, max_batch_size and dynamic batching, an instance group and, for --provider cuda, "
                        "the CUDA execution accelerator.")
    _common(tr, "instances in the instance group (default 1)")
    tr.add_argument("-o", "--output", required=True, help="the model repository folder to write into")
    tr.add_argument("--mount", help="the repository's path inside the Triton server (default: its path here); "
                                    "model_operations names the library under it")
    tr.add_argument("--cuda-graph", action="store_true",
                    help="enable_cuda_graph for the CUDA provider (only for a model that always runs one shape)")
    tr.add_argument("--force", action="store_true", help="overwrite the model's folder if it exists")
    _add_output_flags(tr, "print the written files as JSON")
    tr.set_defaults(func=_triton_repo)
