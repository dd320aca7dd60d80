"""The models a bench workload runs, and what the roofline needs from them.

prepare_models exports a named case (onnxfuse.export for recipes, torch.onnx's dynamo exporter for plain modules),
fuses it, and makes the ORT-optimized model (onnxruntime's own fusions alone), all cached under --cache-dir by the
workload's key; prepare_file_models fuses a model file (cached by path and mtime) unless it is fused already.
flops_and_bytes gives a graph's GEMM FLOPs and the fewest bytes a run must move. log prints the bench's progress
lines on stderr.
"""
from __future__ import annotations

import hashlib
import pathlib
import sys
import time
import warnings

from .cases import Workload


def log(msg: str, quiet: bool) -> None:
    """A progress line on stderr ("[bench] ..."), unless quiet."""
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


def prepare_models(w: Workload, dtype: str, seed: int, cache_dir: pathlib.Path, quiet: bool,
                   cpu: bool = False) -> dict:
    """Export and fuse (cached under cache_dir by key); returns paths, timings and the fused op counts. cpu=True
    also fuses for the CPU provider on this host's family (fuse(provider="cpu"): "fused_cpu", its ops, and the
    patterns it left to onnxruntime with their reasons)."""
    from .. import export, fuse
    cache_dir.mkdir(parents=True, exist_ok=True)
    src = cache_dir / f"{w.key}.onnx"
    fused = cache_dir / f"{w.key}.fused.onnx"
    ort_opt = cache_dir / f"{w.key}.ort.onnx"
    info = {"unfused": str(src), "fused": str(fused), "ort_optimized": str(ort_opt), "cached": True,
            "export_s": 0.0, "fuse_s": 0.0}
    if not src.exists():
        info["cached"] = False
        log(f"exporting {w.case} ({w.size_name} {w.size}, {dtype}) -> {src}", quiet)
        t0 = time.perf_counter()
        if w.export_kind:
            export.export(w.export_kind, w.export_spec, src, seed=seed, dtype=dtype, exporter="auto", force=True,
                          **w.export_options)
        else:
            _export_module(w.build_module(), w.build_inputs(), src, w.output_names)
        info["export_s"] = round(time.perf_counter() - t0, 2)
    if not fused.exists():
        info["cached"] = False
        t0 = time.perf_counter()
        res = fuse.fuse(src, fused, force=True, write_unchanged=True,
                        patterns=list(w.patterns) if w.patterns is not None else None)
        info["fuse_s"] = round(time.perf_counter() - t0, 2)
        if not res.matches:
            warnings.warn(f"{w.case}: nothing fused in {src}")
        info["ort_fusions"] = res.ort.applied if res.ort is not None else None
    plain = src
    if w.export_options and _onnxfuse_ops(src):  # an export that writes onnxfuse ops (--adapters): the unfused
        plain = cache_dir / f"{w.key}.plain.onnx"  # model is what onnxruntime runs without the library
        if not plain.exists():
            _inline_functions(src, plain)
        info["unfused"] = str(plain)
    if not ort_opt.exists():
        fuse.fuse(plain, ort_opt, force=True, write_unchanged=True, rules=False)
    info["fused_ops"] = _onnxfuse_ops(fused)
    if cpu:
        info.update(_fuse_for_cpu(src, cache_dir / f"{w.key}.fused-cpu"))
    return info


def _inline_functions(src: pathlib.Path, out: pathlib.Path) -> None:
    """`src` with its onnxfuse ops replaced by their function bodies (standard ONNX)."""
    import onnx
    import onnx.inliner

    from .. import onnxio
    onnxio.save(onnx.inliner.inline_local_functions(onnx.load(str(src))), out)


def _fuse_for_cpu(src: pathlib.Path, stem: pathlib.Path) -> dict:
    """The model `fuse --provider cpu` writes on this host (cached per host family), what it fused and left."""
    from .. import fuse, host
    family = host.kernel_family()
    path = stem.with_name(f"{stem.name}-{family}.onnx")
    res = fuse.fuse(src, path, force=True, write_unchanged=True, provider="cpu")
    return {"fused_cpu": str(path), "fused_cpu_ops": _onnxfuse_ops(path), "cpu_family": family,
            "left_to_ort": res.left_to_ort}


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
    from ..flops import model_flops
    model = ir.load(str(path))
    _fuse.infer_shapes(model)
    flops = model_flops(model)

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


def _load_proto(path):
    import onnx
    return onnx.load(str(path), load_external_data=False)


def prepare_file_models(w: Workload, cache_dir: pathlib.Path) -> dict:
    """prepare_models for a model file (file_workload): an already fused model as it is (no unfused variant), else
    fused into cache_dir (cached by path and mtime)."""
    from .. import fuse, runtime
    src = pathlib.Path(w.shape["model"])
    proto = _load_proto(src)
    if runtime.has_onnxfuse_nodes(proto):
        return {"unfused": None, "fused": str(src), "cached": True, "export_s": 0.0, "fuse_s": 0.0,
                "fused_ops": _onnxfuse_ops(src), "note": "the model is already fused: no unfused variant"}
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha1(f"{src.resolve()}:{src.stat().st_mtime_ns}".encode()).hexdigest()[:8]
    fused = cache_dir / f"{src.stem}-{digest}.fused.onnx"
    t0 = time.perf_counter()
    if not fused.exists():
        fuse.fuse(src, fused, force=True, write_unchanged=True)
    return {"unfused": str(src), "fused": str(fused), "cached": False, "export_s": 0.0,
            "fuse_s": round(time.perf_counter() - t0, 2), "fused_ops": _onnxfuse_ops(fused)}
