"""`onnxfuse fuse`: find the fusable subgraphs of an exported model and replace them with onnxfuse ops.

Rules run in a fixed order: LoRA first (a LoRA-wrapped projection must not be half-taken by the plain-linear
rules), then SwiGLU, then Linear+activation, then the MLP-stack pass that chains consecutive Linear+activation
nodes into one MLPStack. The result carries one model-local function per onnxfuse op (so it
also runs without the kernel library), the fusion report in its metadata, and annotated nodes for Netron.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import pathlib
import shutil
import tempfile
import time

import onnx
from onnxscript import ir

from . import functions, onnxio
from .errors import OnnxfuseError
from .rewrites import _base, linear_act, lora_linear, mlp_stack, swiglu
from .schema import BACKENDS, DOMAIN, DOMAIN_VERSION

REPORT_KEY = "onnxfuse.fusion_report"
# pattern family -> rule-set factory, in application order
PATTERNS = {"lora_linear": lora_linear.rules, "swiglu": swiglu.rules, "linear_act": linear_act.rules,
            "mlp_stack": mlp_stack.rules}


@dataclasses.dataclass
class FuseResult:
    model: onnx.ModelProto | None
    matches: list[_base.Match]
    nodes_before: int
    nodes_after: int
    removed: dict[str, int]
    total_flops: int | None
    fused_flops: int | None
    refusals: list[dict]
    already_fused: int
    seconds: float
    output: str | None = None

    def table(self) -> list[dict]:
        rows: dict[str, dict] = {}
        for m in self.matches:
            row = rows.setdefault(m.pattern, {"pattern": m.pattern, "op": m.op, "matches": 0, "nodes_removed": 0,
                                              "nodes_added": 0, "flops": 0})
            row["matches"] += 1
            row["nodes_removed"] += len(m.replaced)
            row["nodes_added"] += 1
            row["flops"] = None if row["flops"] is None or m.flops is None else row["flops"] + m.flops
        for row in rows.values():
            row["flop_share"] = (row["flops"] / self.total_flops) if row["flops"] is not None and self.total_flops else None
        return list(rows.values())

    @property
    def flop_share(self) -> float | None:
        if not self.total_flops or self.fused_flops is None:
            return None
        return self.fused_flops / self.total_flops

    def report(self) -> dict:
        return {"patterns": self.table(), "matches": [dataclasses.asdict(m) for m in self.matches],
                "nodes_before": self.nodes_before, "nodes_after": self.nodes_after, "total_flops": self.total_flops,
                "fused_flops": self.fused_flops, "flop_share": self.flop_share, "refusals": self.refusals,
                "already_fused": self.already_fused, "seconds": round(self.seconds, 3), "output": self.output}


def model_flops(model: ir.Model) -> int | None:
    """FLOPs of the main graph's MatMul/Gemm nodes (2 * output elements * K); None if a shape is not static."""
    total = 0
    for node in model.graph:
        if node.op_type not in ("MatMul", "Gemm") or node.domain not in ("", "ai.onnx"):
            continue
        out, a = node.outputs[0], node.inputs[0]
        if out.shape is None or a.shape is None or not out.shape.is_static() or not a.shape.is_static():
            return None
        k = a.shape[-1] if not (node.op_type == "Gemm" and node.attributes.get_int("transA", 0)) else a.shape[0]
        numel = 1
        for d in out.shape:
            numel *= d
        total += 2 * numel * k
    return total


def _infer_shapes(model: ir.Model) -> None:
    # Shape inference without weight data (dims suffice): cheap even for models with external data.
    from onnx_ir.passes.common import ShapeInferencePass
    try:
        ShapeInferencePass(strict_mode=False)(model)
    except Exception:
        pass  # shapes only feed the FLOP report and checks that skip unknown dims


def fuse_model(model: ir.Model, patterns: list[str] | None = None, explain: bool = False):
    patterns = list(PATTERNS) if not patterns else patterns
    unknown = [p for p in patterns if p not in PATTERNS]
    if unknown:
        raise OnnxfuseError(f"--patterns: unknown pattern(s) {', '.join(unknown)}; choose from {', '.join(PATTERNS)}")
    _infer_shapes(model)
    total = model_flops(model)
    before = collections.Counter(n.op_type for n in model.graph)
    recorder = _base.Recorder()
    refusals = []
    for name in PATTERNS:  # fixed order, whatever order the user listed them in
        if name in patterns:
            for rs in _as_list(PATTERNS[name](recorder)):
                rs.apply_to_model(model)
                if explain:  # graph passes (mlp_stack) say why during the real pass
                    refusals += getattr(rs, "refusals", [])
    if recorder.matches:
        # A Gemm(transB=1) weight the rules transposed into a new [K, N] initializer is dead now: drop it (and any
        # other node or initializer the rewrite orphaned) so the fused model does not carry the weights twice.
        from onnx_ir.passes.common import RemoveUnusedNodesPass
        RemoveUnusedNodesPass()(model)
    for node in model.graph:
        if node.domain == DOMAIN:
            # The rewriter copies the exporter's per-node metadata (stack traces, fx dumps) of one replaced node
            # onto the fused node, where it misleads: keep only onnxfuse's own keys.
            for key in [k for k in node.metadata_props if k.startswith("pkg.torch") or k == "namespace"]:
                del node.metadata_props[key]
    if explain:
        tracer = _base.ExplainTracer()
        for name in PATTERNS:
            if name in patterns:
                for rs in _as_list(PATTERNS[name](_base.Recorder())):
                    rs.apply_to_model(model, tracer=tracer)
        seen = set()
        for r in tracer.refusals:
            key = (r["node"], r["reason"])
            if key not in seen:
                seen.add(key)
                refusals.append(r)
    after = collections.Counter(n.op_type for n in model.graph if n.domain != DOMAIN)
    removed = {k: before[k] - after.get(k, 0) for k in before if before[k] - after.get(k, 0) > 0}
    fused = sum(m.flops for m in recorder.matches) if all(m.flops is not None for m in recorder.matches) else None
    return recorder, removed, total, fused, refusals


def _as_list(rule_sets):
    return rule_sets if isinstance(rule_sets, list) else [rule_sets]


def fuse(src: str | os.PathLike, out: str | os.PathLike | None = None, *, patterns: list[str] | None = None,
         report_path: str | os.PathLike | None = None, explain: bool = False, force: bool = False,
         write_unchanged: bool = False, external_data: bool | None = None, backend: str | None = None) -> FuseResult:
    """Fuse `src` into `out`. backend (auto|cpu|cuda|triton), when given, is written into every onnxfuse node's
    `backend` attribute (the kernel family the library runs for it; default auto)."""
    t0 = time.perf_counter()
    if backend is not None and backend not in BACKENDS:
        raise OnnxfuseError(f"--backend must be one of {', '.join(BACKENDS)} (got {backend!r})")
    src = pathlib.Path(src)
    proto = onnxio.load(src, load_external_data=False)  # validates the file with a clear error
    if out is not None:
        onnxio.check_output_path(out, force=force)
    if report_path is not None:
        onnxio.check_output_path(report_path, force=True)
    already = sum(1 for n in proto.graph.node if n.domain == DOMAIN)
    src_external = not onnxio._all_data_inline(proto)
    del proto
    model = ir.load(str(src))  # external data stays on disk (memory-mapped on use) until written
    nodes_before = len(model.graph)
    recorder, removed, total, fused_flops, refusals = fuse_model(model, patterns, explain)
    if backend is not None:
        for node in model.graph:
            if node.domain == DOMAIN:
                node.attributes["backend"] = ir.AttrString("backend", backend)
    result = FuseResult(None, recorder.matches, nodes_before, len(model.graph), removed, total, fused_flops,
                        refusals, already, 0.0)
    if recorder.matches or write_unchanged:
        model.ir_version = min(model.ir_version or 10, onnxio.MAX_IR_VERSION)
        if external_data is None:  # automatic: keep the source's layout, and go external past protobuf's limit
            external_data = src_external or not _fits_in_memory(src)
        if not external_data:
            # Small and inline: one proto in memory, written atomically by onnxio.save.
            proto = ir.serde.serialize_model(model)
            if src_external:  # --no external data asked for a model whose weights are in a file: pull them in
                from onnx.external_data_helper import load_external_data_for_model
                load_external_data_for_model(proto, str(src.parent))
            functions.add_functions(proto)
            onnxio.set_metadata(proto, REPORT_KEY, json.dumps(_metadata_report(result)))
            result.model = proto
            if out is not None:
                onnxio.save(proto, out, external_data=False)
                result.output = str(out)
        elif out is not None:
            # Weights stream from the source's data file (or memory, for tensors the rules made) into the output's
            # own '<out>.data': the fused model never points at the source's weights file.
            _save_large(model, out, result)
    result.seconds = time.perf_counter() - t0
    if report_path is not None:
        tmp = pathlib.Path(str(report_path) + ".tmp")
        tmp.write_text(json.dumps(result.report(), indent=2))
        os.replace(tmp, report_path)
    return result


def _metadata_report(result: FuseResult) -> dict:
    return {"patterns": result.table(), "flop_share": result.flop_share, "nodes_before": result.nodes_before,
            "nodes_after": result.nodes_after,
            "nodes": [{"name": m.node, "op": m.op, "module": m.module, "replaced": len(m.replaced)} for m in result.matches]}


def _fits_in_memory(src: pathlib.Path) -> bool:
    data = src.with_name(src.name + ".data")
    size = src.stat().st_size + (data.stat().st_size if data.exists() else 0)
    return size < onnxio.EXTERNAL_DATA_THRESHOLD


def _save_large(model: ir.Model, out, result: FuseResult) -> None:
    """Models with external data (any size, past protobuf's 2 GiB included): functions and metadata are added on
    the IR and onnx_ir streams the weights, tensor by tensor, into '<out>.data'. Both files are written in a
    temporary folder beside the output and renamed into place, so a failure leaves no partial output and an
    in-place fuse (out == src) never overwrites the weights it is reading."""
    for op, overload in sorted({(n.op_type, n.overload) for n in model.graph if n.domain == DOMAIN}):
        f = ir.serde.deserialize_function(functions.function_proto(op, overload))
        model.functions[f.identifier()] = f
    if any(n.domain == DOMAIN for n in model.graph):
        model.opset_imports.setdefault(DOMAIN, DOMAIN_VERSION)
    model.metadata_props[REPORT_KEY] = json.dumps(_metadata_report(result))
    out = pathlib.Path(out)
    parent = out.parent if str(out.parent) else pathlib.Path(".")
    data_name = out.name + ".data"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".onnxfuse-", dir=parent))
    try:
        ir.save(model, str(tmp / out.name), external_data=data_name)
        if (tmp / data_name).exists():
            os.replace(tmp / data_name, parent / data_name)
        os.replace(tmp / out.name, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.output = str(out)
