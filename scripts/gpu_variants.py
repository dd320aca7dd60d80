"""Time one onnxfuse node on a GPU under node-attribute variants: the A/B timings no onnxfuse command makes.

    PYTHONPATH=/path/to/ort-gpu:$PWD ONNXFUSE_LIBRARY=<prebuilt .so> python scripts/gpu_variants.py \
        [--stack] [--activations] [--iters 50] [-o variants.json]

Why a script: `onnxfuse bench` times whole workloads with the attributes `onnxfuse fuse` writes (stack_mode=auto,
the model's activation), `onnxfuse tune` times the Triton tile configs, and `onnxfuse doctor` /
`pytest -m gpu tests/test_gpu.py` check correctness (every op, backend, dtype and mode, each forced stack_mode
included). What none of them does is time the alternatives behind the other kernel choices, so this script does
that alone:
  * --stack: MLPStack on the Triton backend forced to stack_mode=fused, grid and layers, next to auto and the CUDA
    backend, at DLRM's bottom and top MLP for M = 128 to 16384, with and without CUDA graphs: the measurements
    triton/table.py's grid / row-block / per-layer thresholds come from;
  * --activations: SwiGLU per gate activation at the Llama MLP's shapes, as a ratio to silu's time (issue 15's goal:
    gelu and gelu_tanh within 5 % of silu).
With neither flag, both run. Method: fp16, one node alone with T-typed inputs, torch tensors bound with IOBinding, a
fresh session per variant (the attributes are read when a session creates its kernels), the median of --iters runs
timed with CUDA events after 10 warm-up runs; sessions without CUDA graphs run on torch's stream
(user_compute_stream), CUDA-graph sessions on ORT's own (ORT synchronises at the end of each run, so the events still
bracket it). Every row also gives the largest error against `schema.reference`. Prints one line per row, writes
the rows as JSON (-o), exits 1 when a variant failed to run.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DLRM_STACKS = [((13, 512, 256, 64, 16), "relu.relu.relu.relu"), ((367, 512, 256, 1), "relu.relu.sigmoid")]
STACK_ROWS = (128, 512, 2048, 8192, 16384)  # around triton/table.py's grid / row-block / per-layer thresholds
GATED_SHAPES = [(2048, 4096, 11008), (16, 4096, 11008)]


def _time_cuda(fn, iters: int, warmup: int = 10) -> float:
    """Median milliseconds of `fn` over `iters` runs, each bracketed by CUDA events on torch's current stream."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def _model(op: str, shapes: dict, attrs: dict) -> bytes:
    """The op alone with fp16 inputs and output (no Casts), its node carrying `attrs` (backend and op attributes)."""
    from onnx import TensorProto, helper

    from onnxfuse import schema
    from onnxfuse import doctor

    t = TensorProto.FLOAT16
    overload = attrs.get("activations", "") if op == "MLPStack" else \
        schema.swiglu_overload(attrs.get("activation", "silu")) if op == "SwiGLU" else ""
    node = helper.make_node(op, list(shapes), ["Y"], domain=schema.DOMAIN, overload=overload, **attrs)
    graph = helper.make_graph([node], "variant", [helper.make_tensor_value_info(k, t, v) for k, v in shapes.items()],
                              [helper.make_tensor_value_info("Y", t, doctor.out_shape(op, shapes, attrs))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", schema.ONNX_OPSET),
                                                   helper.make_opsetid(schema.DOMAIN, schema.DOMAIN_VERSION)],
                             ir_version=schema.IR_VERSION).SerializeToString()


def _runner(model: bytes, lib: str, tensors: dict, y, cuda_graph: bool):
    """A function running one session of `model` on the bound torch tensors (a fresh session: its kernels read the
    node's attributes when it is created)."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from onnxfuse import kernels

    so = ort.SessionOptions()
    kernels.register(so, lib)
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    opts = {"use_tf32": "0"}
    if cuda_graph:
        opts["enable_cuda_graph"] = "1"
    else:
        opts.update(has_user_compute_stream="1", user_compute_stream=str(torch.cuda.current_stream().cuda_stream))
    sess = ort.InferenceSession(model, so, providers=[("CUDAExecutionProvider", opts)])
    io = sess.io_binding()
    np_type = {torch.float16: np.float16, torch.int64: np.int64}
    for name, t in tensors.items():
        io.bind_input(name, "cuda", 0, np_type[t.dtype], list(t.shape), t.data_ptr())
    io.bind_output("Y", "cuda", 0, np.float16, list(y.shape), y.data_ptr())
    return lambda: sess.run_with_iobinding(io)


def _measure(op: str, shapes: dict, attrs: dict, lib: str, iters: int, graphs=(False, True), seed: int = 0) -> dict:
    """{"<graph|plain>_ms": median, "max_err": vs schema.reference} of one variant (errors reported, not raised)."""
    import torch

    from onnxfuse import schema
    from onnxfuse import doctor

    ins = doctor.make_inputs(op, "float16", shapes, seed, "cuda")
    tensors = dict(zip(shapes, ins))
    y = torch.empty(doctor.out_shape(op, shapes, attrs), device="cuda", dtype=torch.float16)
    ref = schema.reference(op, ins, {"scale": 0.5, **attrs}).float()
    model = _model(op, shapes, {"scale": 0.5, **attrs} if "scale" in schema.OPS[op].attr_names else attrs)
    row = {}
    for graph in graphs:
        key = "graph" if graph else "plain"
        try:
            y.zero_()
            row[f"{key}_ms"] = _time_cuda(_runner(model, lib, tensors, y, graph), iters)
            row["max_err"] = max(row.get("max_err", 0.0), (y.float() - ref).abs().max().item())
        except Exception as e:  # report and go on: one variant missing from a library is not the end of the run
            row[f"{key}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    del ins, tensors, y, ref
    torch.cuda.empty_cache()
    return row


def stack_modes(lib: str, iters: int) -> list[dict]:
    """MLPStack per forced stack_mode (Triton), auto, and the CUDA backend, at DLRM's two MLPs over STACK_ROWS."""
    from onnxfuse import doctor

    variants = [("triton fused", {"backend": "triton", "stack_mode": "fused"}),
                ("triton grid", {"backend": "triton", "stack_mode": "grid"}),
                ("triton layers", {"backend": "triton", "stack_mode": "layers"}),
                ("triton auto", {"backend": "triton"}), ("cuda", {"backend": "cuda"})]
    rows = []
    for m in STACK_ROWS:
        for widths, acts in DLRM_STACKS:
            for name, attrs in variants:
                row = dict(part="stack", M=m, layers="-".join(map(str, widths)), variant=name)
                row.update(_measure("MLPStack", doctor.stack_shapes(m, widths), {"activations": acts, **attrs}, lib,
                                    iters))
                rows.append(_show(row))
    return rows


def activations(lib: str, iters: int) -> list[dict]:
    """SwiGLU per gate activation and backend at the Llama MLP's shapes, with the ratio to silu's time."""
    from onnxfuse import schema
    from onnxfuse import doctor

    rows = []
    for m, k, n in GATED_SHAPES:
        for backend in ("triton", "cuda"):
            silu = None
            for act in schema.GATE_ACTIVATIONS:
                row = dict(part="activations", op="SwiGLU", M=m, K=k, N=n, variant=f"{backend} {act}")
                row.update(_measure("SwiGLU", doctor.input_shapes("SwiGLU", m, k, n, 0),
                                    {"backend": backend, "activation": act}, lib, iters, graphs=(False,)))
                silu = row.get("plain_ms") if act == "silu" else silu
                if silu and row.get("plain_ms"):
                    row["vs_silu"] = row["plain_ms"] / silu
                rows.append(_show(row))
    return rows


def _show(row: dict) -> dict:
    print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stack", action="store_true", help="MLPStack stack_mode timings")
    p.add_argument("--activations", action="store_true", help="SwiGLU per gate activation, vs silu")
    p.add_argument("--lib", help="libonnxfuse_ops.so (default: ONNXFUSE_LIBRARY, else the cached CUDA build)")
    p.add_argument("--iters", type=int, default=50, help="timed runs per variant (default 50)")
    p.add_argument("-o", "--output", type=pathlib.Path, help="write the rows as JSON here")
    args = p.parse_args(argv)
    parts = [name for name in ("stack", "activations") if getattr(args, name)] or ["stack", "activations"]

    import onnxruntime as ort
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    import torch

    from onnxfuse import kernels
    if "CUDAExecutionProvider" not in ort.get_available_providers() or not torch.cuda.is_available():
        print(f"gpu_variants: needs onnxruntime-gpu and a CUDA GPU (onnxruntime {ort.__version__}: "
              f"{ort.get_available_providers()}; torch sees a GPU: {torch.cuda.is_available()})", file=sys.stderr)
        return 2
    lib = args.lib or str(kernels.library_path(provider="cuda"))
    print(f"gpu_variants: {torch.cuda.get_device_name(0)}, onnxruntime {ort.__version__}, library {lib}", flush=True)
    rows = []
    for part in parts:
        rows += {"stack": stack_modes, "activations": activations}[part](lib, args.iters)
    if args.output:
        args.output.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "library": lib, "rows": rows},
                                          indent=1))
    failed = [r for r in rows if any(k.endswith("_error") for k in r)]
    print(f"{len(rows)} variants timed, {len(failed)} with errors"
          + (f"; JSON in {args.output}" if args.output else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
