"""`onnxfuse fuse`: find the fusable subgraphs of an exported model and replace them with onnxfuse ops.

Two stages. Stage 1 applies onnxruntime's own transformer fusions (`ort_fusions.py`: norms, rotary, attention into
com.microsoft ops), checks the result against the original in onnxruntime and leaves out a fusion that changes the
outputs. Stage 2 applies onnxfuse's rules in a fixed order: LoRA first (a LoRA-wrapped projection must not be
half-taken by the plain-linear rules), then SwiGLU, then Linear+activation, then the MLP-stack pass that chains
consecutive Linear+activation nodes into one MLPStack. The result carries one model-local function per onnxfuse op
(so it also runs without the kernel library), the fusion report of both stages in its metadata, and annotated
nodes for Netron; the soundness gate checks it before anything is written.
"""
from __future__ import annotations

import collections
import dataclasses
import importlib
import json
import os
import pathlib
import shutil
import tempfile
import time

import onnx
from onnxscript import ir

from . import functions, host, onnxio, opset_upgrade, ort_fusions, soundness
from .flops import model_flops
from .cpu_policy import (CPU_LEFT_TO_ORT, CPU_STAGE1_LEFT_OUT, GPU_LEFT_TO_ORT,  # noqa: F401  (public names)
                         cpu_left_to_ort)
from .errors import OnnxfuseError
from .rewrites import _base, _explain
from .ops import FAMILIES
from .schema import BACKENDS, DOMAIN, DOMAIN_VERSION

REPORT_KEY = "onnxfuse.fusion_report"
# pattern family -> rule-set factory, in application order: the families' order (onnxfuse/ops/__init__.py says why),
# each family's rules the `rules` of its module onnxfuse/rewrites/<family>.py (found by the family's name).
PATTERNS = {family.name: importlib.import_module(f"{__package__}.rewrites.{family.name}").rules for family in FAMILIES}
# Patterns that run only where --patterns names them, each before the family it belongs to (measured slower than what
# the default leaves in place, kept for A/B runs): pattern -> (the family it runs before, its rule-set factory).
OPT_IN_PATTERNS = {
    "linear_skip_norm": ("linear", importlib.import_module(f"{__package__}.rewrites.linear").skip_norm_rules)}
# Every pattern in application order: the families', each opt-in pattern just before its family.
RULES = {name: rules for family, factory in PATTERNS.items()
         for name, rules in [*((p, f) for p, (before, f) in OPT_IN_PATTERNS.items() if before == family),
                             (family, factory)]}


@dataclasses.dataclass
class FuseResult:
    """What `fuse` did: the onnxfuse `matches` (each a rewrite: pattern, op, nodes replaced, FLOPs), node counts
    before / after stage 1 (`nodes_after_ort`) / after, node types removed, MatMul/Gemm FLOPs in total and inside
    onnxfuse ops, `refusals` (with explain: the candidates that did not fuse and why), `already_fused` (onnxfuse
    nodes found in the input), candidates left `in_functions`, stage 1's outcome (`ort`, None without it), the
    seconds taken and the `output` path (None when nothing was written). `model` is the fused ModelProto when
    fuse_model made it in memory."""
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
    # candidates inside model-local functions, which onnxfuse does not rewrite (see --explain)
    in_functions: int = 0
    # stage 1: onnxruntime's fusions (None with --no-ort-fusions)
    ort: ort_fusions.Stage1 | None = None
    nodes_after_ort: int | None = None
    # patterns left to onnxruntime for the target provider (fuse(provider=)), with the reason
    left_to_ort: dict[str, str] = dataclasses.field(default_factory=dict)
    # an opset below what the rules need: converted (and checked) or kept, with the reason (None: not needed)
    upgrade: opset_upgrade.Upgrade | None = None

    @property
    def changed(self) -> bool:
        """Whether either stage rewrote anything."""
        return bool(self.matches) or bool(self.ort is not None and self.ort.applied)

    def explain_lines(self) -> list[str]:
        """--explain's lines: one a candidate that did not fuse (never wrapped: users grep them), or one saying none
        was refused."""
        if not self.refusals:
            return ["no candidate subgraph was refused, and no near miss (a GEMM before an unfused activation, a gated "
                    "MLP with an activation SwiGLU does not compute) was seen"]
        return ["candidates that did not fuse:"] + [f"  {r['node']} ({r['op_type']}): rule {r['rule']} refused: "
                                                    f"{r['reason']}" for r in self.refusals]

    def table(self) -> list[dict]:
        """One row per pattern and op (a pattern may write several: int4_linear's Int4SwiGLU and Int4Linear): matches,
        nodes removed and added, FLOPs and their share of the model's."""
        rows: dict[tuple[str, str], dict] = {}
        for m in self.matches:
            row = rows.setdefault((m.pattern, m.op), {"pattern": m.pattern, "op": m.op, "matches": 0,
                                                      "nodes_removed": 0, "nodes_added": 0, "flops": 0,
                                                      "details": {}})
            row["matches"] += 1
            if m.detail:  # e.g. SwiGLU's activations: {"gelu_tanh": 2}
                row["details"][m.detail] = row["details"].get(m.detail, 0) + 1
            row["nodes_removed"] += len(m.replaced)
            row["nodes_added"] += m.added
            row["flops"] = None if row["flops"] is None or m.flops is None else row["flops"] + m.flops
        for row in rows.values():
            row["flop_share"] = ((row["flops"] / self.total_flops)
                                 if row["flops"] is not None and self.total_flops else None)
        return list(rows.values())

    @property
    def flop_share(self) -> float | None:
        """Share of the model's MatMul/Gemm FLOPs inside onnxfuse ops (None with dynamic shapes)."""
        if not self.total_flops or self.fused_flops is None:
            return None
        return self.fused_flops / self.total_flops

    def report(self) -> dict:
        """The fusion report as JSON-ready data (what `onnxfuse fuse --json` prints and --report writes)."""
        return {"patterns": self.table(), "matches": [dataclasses.asdict(m) for m in self.matches],
                "nodes_before": self.nodes_before, "nodes_after": self.nodes_after, "total_flops": self.total_flops,
                "fused_flops": self.fused_flops, "flop_share": self.flop_share, "refusals": self.refusals,
                "already_fused": self.already_fused, "in_functions": self.in_functions,
                "ort_fusions": None if self.ort is None else self.ort.to_dict(),
                "nodes_after_ort": self.nodes_after_ort,
                "seconds": round(self.seconds, 3), "output": self.output, "left_to_ort": self.left_to_ort,
                "opset_upgrade": None if self.upgrade is None else self.upgrade.to_dict()}


class _ShapeInferenceLog:
    """Collects onnx_ir's shape-inference log records (it logs a traceback when inference fails) instead of
    letting them reach the user's terminal."""

    def __enter__(self):
        import logging
        self.log = logging.getLogger("onnx_ir.passes.common.shape_inference")
        self.records: list = []
        outer = self

        class _Catch(logging.Handler):
            def emit(self, record):
                outer.records.append(record)

        self.handler, self.propagate = _Catch(), self.log.propagate
        self.log.addHandler(self.handler)
        self.log.propagate = False
        return self

    def __exit__(self, *exc):
        self.log.removeHandler(self.handler)
        self.log.propagate = self.propagate

    def failure(self) -> BaseException | None:
        return next((r.exc_info[1] for r in self.records if r.exc_info and r.exc_info[1] is not None), None)


def infer_shapes(model: ir.Model) -> None:
    """Shape inference without weight data (dims suffice): cheap even for models with external data. The rules'
    checks use the shapes (output ranks, K and N); a model that ONNX type/shape inference rejects outright is one
    onnxruntime would reject too, so it stops here with one line instead of onnx_ir's logged traceback."""
    from onnx_ir.passes.common import ShapeInferencePass

    with _ShapeInferenceLog() as log:
        ShapeInferencePass(strict_mode=False)(model)
    error = log.failure()
    if error is not None:
        raise OnnxfuseError(f"the input model fails ONNX type and shape inference ({soundness.first_line(error)}); "
                            "onnxruntime would refuse it too: fix the model (onnx.shape_inference.infer_shapes(model, "
                            "check_type=True) shows it)")


def ort_stage(src: pathlib.Path, source: onnx.ModelProto | None,
              slower: dict[str, str] | None = None) -> tuple[ir.Model, ort_fusions.Stage1]:
    """Stage 1 on a fresh load of `src`: onnxruntime's fusions, checked against `source` (the original with its
    weights; None when they are in an external file, then unchecked). A fusion that changes the outputs is left out
    (each applied fusion is tried out in turn; if no single one explains it, stage 1 is dropped). `slower`: fusions
    measured slower on the target provider (cpu_policy.CPU_STAGE1_LEFT_OUT), left out with their reason where they
    would apply."""

    def load() -> ir.Model:
        m = ir.load(str(src))
        # onnxfuse's own functions must not be inlined by the ORT stage's optimizer (an already-fused input):
        # drop them; saving adds them back for the onnxfuse nodes there are.
        for key in [k for k, f in m.functions.items() if f.domain == DOMAIN]:
            del m.functions[key]
        return m

    def run(skip: set[str]) -> tuple[ir.Model, dict[str, int], dict[str, int]]:
        m = load()
        with _ShapeInferenceLog():  # its passes' failures are not the user's problem: they leave the model as is
            applied, intermediate = ort_fusions.apply(m, skip)
        return m, applied, intermediate

    model, applied, intermediate = run(set())
    policy = [{"fusion": n, "reason": why, "kind": "slower"} for n, why in (slower or {}).items()
              if n in applied or n in intermediate]
    base = {left["fusion"] for left in policy}
    if base:
        model, applied, intermediate = run(base)
    if not applied:
        return model, ort_fusions.Stage1({}, policy, False, "no onnxruntime fusion applies to this model",
                                         intermediate)
    ref = "its weights are too large for a CPU check" if source is None else ort_fusions.reference(source)
    if isinstance(ref, str):
        return model, ort_fusions.Stage1(applied, policy, False,
                                         f"not checked: {ref}; onnxfuse verify checks the result", intermediate)
    feeds, outputs = ref

    def proto(m: ir.Model) -> onnx.ModelProto:
        p = ir.serde.serialize_model(m)
        if not onnxio._all_data_inline(p):  # tensors the rules did not touch still point at the source's file
            from onnx.external_data_helper import load_external_data_for_model
            load_external_data_for_model(p, str(src.parent))
        return p

    diff = ort_fusions.compare(proto(model), feeds, outputs)
    if diff is None:
        return model, ort_fusions.Stage1(applied, policy, True, "", intermediate)
    for name in [*applied, *intermediate]:
        candidate, kept, kept_intermediate = run(base | {name})
        if ort_fusions.compare(proto(candidate), feeds, outputs) is None:
            return candidate, ort_fusions.Stage1(kept, [*policy, {"fusion": name, "reason": diff}], True, "",
                                                 kept_intermediate)
    changed = [{"fusion": n, "reason": diff} for n in [*applied, *intermediate]]
    return load(), ort_fusions.Stage1({}, [*policy, *changed], True,
                                      "no single fusion explains the difference: stage 1 left out")


def _op_counts(model: ir.Model) -> collections.Counter:
    """Node counts by op type over the main graph and its If/Loop/Scan bodies (onnxfuse nodes left out)."""
    return collections.Counter(n.op_type for g in _base.graphs(model.graph) for n in g if n.domain != DOMAIN)


@dataclasses.dataclass
class RuleStage:
    """What stage 2 did to a model: the recorder of its matches, node types removed (by count), the model's total
    and fused GEMM FLOPs (None where shapes are dynamic), the refusals (with explain) and the candidates inside
    model-local functions, which the rules leave alone."""
    recorder: _base.Recorder
    removed: dict[str, int]
    total_flops: int | None
    fused_flops: int | None
    refusals: list[dict]
    in_functions: int


def fuse_model(model: ir.Model, patterns: list[str] | None = None, explain: bool = False) -> RuleStage:
    """Stage 2 on an in-memory onnx_ir model: apply onnxfuse's rules for `patterns` (default all, PATTERNS order),
    in place. `fuse` is the entry point for files (stage 1, soundness gate, writing)."""
    patterns = list(PATTERNS) if not patterns else patterns
    unknown = [p for p in patterns if p not in RULES]
    if unknown:
        raise OnnxfuseError(f"--patterns: unknown pattern(s) {', '.join(unknown)}; choose from {', '.join(RULES)}")
    infer_shapes(model)
    total = model_flops(model)
    before = _op_counts(model)
    recorder = _base.Recorder()
    recorder.seed(model)
    stack_refusals = []
    for name in RULES:  # fixed order, whatever order the user listed them in
        if name in patterns:
            for rs in _as_list(RULES[name](recorder)):
                _base.apply(rs, model)
                if explain:  # graph passes (mlp_stack) say why during the real pass
                    if isinstance(rs, _base.GraphPass):
                        stack_refusals += rs.refusals
    if recorder.matches:
        # A Gemm(transB=1) weight the rules transposed into a new [K, N] initializer is dead now: drop it (and any
        # other node or initializer the rewrite orphaned) so the fused model does not carry the weights twice.
        from onnx_ir.passes.common import RemoveUnusedNodesPass
        RemoveUnusedNodesPass()(model)
    for graph in _base.graphs(model.graph):
        for node in graph:
            if node.domain == DOMAIN:
                # The rewriter copies the exporter's per-node metadata (stack traces, fx dumps) of one replaced node
                # onto the fused node, where it misleads: keep only onnxfuse's own keys.
                for key in [k for k in node.metadata_props if k.startswith("pkg.torch") or k == "namespace"]:
                    del node.metadata_props[key]
    in_functions = 0
    if not explain and any(f.domain != DOMAIN for f in model.functions.values()):
        tracer = _base.ExplainTracer()
        for name in RULES:
            if name in patterns:
                for rs in _as_list(RULES[name](_base.Recorder())):
                    _base.trace_functions(rs, model, tracer)
        in_functions = _candidates_in_functions(tracer)
    refusals = []
    if explain:
        # Over the fused model: what is left is what did not fuse. A throwaway recorder: nothing is rewritten.
        tracer = _base.ExplainTracer()
        scratch = _base.Recorder()
        scratch.seed(model)
        for name in RULES:
            if name in patterns:
                for rs in _as_list(RULES[name](scratch)):
                    _base.apply(rs, model, tracer=tracer)
        refusals = _explain.refusals(model, tracer, stack_refusals)
        in_functions = _candidates_in_functions(tracer)
    after = _op_counts(model)
    removed = {k: before[k] - after.get(k, 0) for k in before if before[k] - after.get(k, 0) > 0}
    fused = sum(m.flops for m in recorder.matches) if all(m.flops is not None for m in recorder.matches) else None
    return RuleStage(recorder, removed, total, fused, refusals, in_functions)


def _as_list(rule_sets):
    return rule_sets if isinstance(rule_sets, list) else [rule_sets]


def fuse(src: str | os.PathLike, out: str | os.PathLike | None = None, *, patterns: list[str] | None = None,
         report_path: str | os.PathLike | None = None, explain: bool = False, force: bool = False,
         write_unchanged: bool = False, external_data: bool | None = None, ort: bool = True, rules: bool = True,
         backend: str | None = None, provider: str | None = None, cpu_isa: str | None = None,
         keep_opset: bool = False) -> FuseResult:
    """Fuse the model at `src` and write it to `out` (nothing is written when nothing changed, unless
    `write_unchanged`). `ort=False` skips stage 1 (onnxruntime's fusions); `rules=False` skips stage 2 (onnxfuse's
    rules), which gives the model a user gets from onnxruntime's fusions alone (bench's ort-optimized variant).
    `backend` (auto|cpu|cuda|triton), when given, is written into every onnxfuse node's `backend` attribute (the kernel
    family the library runs for it; default auto). `provider="cpu"` leaves the patterns of CPU_LEFT_TO_ORT[family] to
    onnxruntime unless `patterns` names them (the result's left_to_ort says which and why); the family is `cpu_isa`
    (avx512, avx2, generic), default the host's (host.kernel_family()), and stage 1 leaves out the onnxruntime fusions
    of CPU_STAGE1_LEFT_OUT (measured slower on the CPU; the result's ort.left_out says so). A model whose opset is
    below what the rules' ops need is converted first (opset_upgrade; `keep_opset` keeps it; the result's `upgrade`
    says what happened). Raises OnnxfuseError with one line on bad input or when the soundness gate trips."""
    t0 = time.perf_counter()
    if provider not in (None, "cpu", "cuda"):
        raise OnnxfuseError(f"--provider must be cpu or cuda (got {provider!r})")
    patterns, family, left_to_ort = _provider_patterns(provider, cpu_isa, patterns)
    if backend is not None and backend not in BACKENDS:
        raise OnnxfuseError(f"--backend must be one of {', '.join(BACKENDS)} (got {backend!r})")
    src = pathlib.Path(src)
    proto = onnxio.load(src, load_external_data=False)  # validates the file with a clear error
    if out is not None:
        onnxio.check_output_path(out, force=force)
    if report_path is not None:
        onnxio.check_output_path(report_path, force=True)
    already = sum(1 for n in functions.nodes(proto.graph) if n.domain == DOMAIN)
    src_external = not onnxio._all_data_inline(proto)
    before = soundness.source_signature(proto)  # what the soundness gate holds the output to
    model = ir.load(str(src))  # external data stays on disk (memory-mapped on use) until written
    nodes_before = len(model.graph)
    infer_shapes(model)  # an input ONNX rejects stops here, before any work
    with tempfile.TemporaryDirectory(prefix="onnxfuse-opset-") as tmp:
        upgrade = None
        if rules and not keep_opset:
            stage_src, proto, upgrade = _upgrade_opset(src, proto, src_external, patterns, pathlib.Path(tmp))
            if stage_src != src:
                model = ir.load(str(stage_src))  # weights in memory: the temporary file goes at the end of this
        else:
            stage_src = src
        model, result = _stages(model, stage_src, proto, src_external and stage_src == src, ort, rules, provider,
                                patterns, explain, backend)
        result.nodes_before, result.already_fused, result.left_to_ort = nodes_before, already, left_to_ort
        result.upgrade = upgrade
        if result.changed or write_unchanged:
            _write(model, result, src, out, src_external, external_data, before)
    result.seconds = time.perf_counter() - t0
    if report_path is not None:
        onnxio.write_atomic(report_path, json.dumps(result.report(), indent=2))
    return result


def _upgrade_opset(src: pathlib.Path, proto: onnx.ModelProto, src_external: bool, patterns: list[str] | None,
                   tmp: pathlib.Path) -> tuple[pathlib.Path, onnx.ModelProto | None, opset_upgrade.Upgrade | None]:
    """(the model file the stages start from, its proto, what happened to its opset): `src` and `proto` as they are
    when the opset holds every selected rule's op; else the converted model, saved in `tmp` (opset_upgrade)."""
    have = opset_upgrade.model_opset(proto)
    if have is None or have >= opset_upgrade.needed_opset(list(PATTERNS) if not patterns else patterns):
        return src, proto, None
    full = proto
    if src_external:  # the converter needs the weights: load them where a CPU check could afford them anyway
        if _external_bytes(proto, src) > ort_fusions.CHECK_BYTE_LIMIT:
            return src, proto, opset_upgrade.Upgrade(have, None, False, "its weights are too large to convert here; "
                                                     "convert it with onnx.version_converter first")
        full = onnxio.load(src)
    converted, upgrade = opset_upgrade.upgrade(full)
    if converted is None:
        return src, proto, upgrade
    path = tmp / src.name
    onnxio.save(converted, path)
    return path, converted, upgrade


def _stages(model: ir.Model, src: pathlib.Path, proto: onnx.ModelProto | None, src_external: bool, ort: bool,
            rules: bool, provider: str | None, patterns: list[str] | None, explain: bool,
            backend: str | None) -> tuple[ir.Model, FuseResult]:
    """Stage 1 (onnxruntime's fusions, on a fresh load of `src`, checked against `proto`) and stage 2 (the rules) on
    `model`: the model to write and its FuseResult (the caller adds what it knows of the source)."""
    nodes_in = len(model.graph)
    stage1 = None
    if ort:
        if src_external:  # the check needs the weights: load them when a CPU check could afford them anyway
            proto = onnxio.load(src) if _external_bytes(proto, src) <= ort_fusions.CHECK_BYTE_LIMIT else None
        model, stage1 = ort_stage(src, proto, CPU_STAGE1_LEFT_OUT if provider == "cpu" else None)
    del proto
    nodes_after_ort = len(model.graph) if ort else None
    if rules:
        stage2 = fuse_model(model, patterns, explain)
    else:
        stage2 = RuleStage(_base.Recorder(), {}, None, None, [], 0)
    if backend is not None:
        for graph in _base.graphs(model.graph):
            for node in graph:
                if node.domain == DOMAIN:
                    node.attributes["backend"] = ir.AttrString("backend", backend)
    return model, FuseResult(None, stage2.recorder.matches, nodes_in, len(model.graph), stage2.removed,
                             stage2.total_flops, stage2.fused_flops, stage2.refusals, 0, 0.0,
                             in_functions=stage2.in_functions, ort=stage1, nodes_after_ort=nodes_after_ort)


def _candidates_in_functions(tracer) -> int:
    """Candidate roots the tracer met inside model-local functions (what a rule calls not a candidate is none)."""
    return len({id(r["root"]) for r in tracer.records if r["function"] and r["reason"] != _base.NOT_A_CANDIDATE})


def _provider_patterns(provider: str | None, cpu_isa: str | None, patterns: list[str] | None):
    """(patterns to apply, the CPU family whose table applies or None, {pattern: why it is left to onnxruntime}):
    provider="cpu" without an explicit --patterns list leaves the family's CPU_LEFT_TO_ORT patterns out; any other
    target (cuda, or none named) leaves GPU_LEFT_TO_ORT's out."""
    if cpu_isa is not None and provider != "cpu":
        raise OnnxfuseError("--cpu-isa goes with --provider cpu (it picks that provider's table of patterns)")
    if provider != "cpu":
        if patterns is not None:  # an explicit --patterns list fuses what it names
            return patterns, None, {}
        return [p for p in PATTERNS if p not in GPU_LEFT_TO_ORT], None, dict(GPU_LEFT_TO_ORT)
    target = cpu_isa or host.kernel_family()
    left = cpu_left_to_ort(target)  # an unknown family is an error either way
    if patterns is not None:  # an explicit --patterns list fuses what it names
        return patterns, None, {}
    left_to_ort = dict(left)
    return [p for p in PATTERNS if p not in left_to_ort], target, left_to_ort


def _write(model: ir.Model, result: FuseResult, src: pathlib.Path, out, src_external: bool, external_data,
           before) -> None:
    """Serialize the fused model (inline, or its weights streamed into '<out>.data'), with its functions and report,
    through the soundness gate when anything changed; sets result.model / result.output."""
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
        if result.changed:
            soundness.check(proto, src, before)
        result.model = proto
        if out is not None:
            onnxio.save(proto, out, external_data=False)
            result.output = str(out)
    elif out is not None:
        # Weights stream from the source's data file (or memory, for tensors the rules made) into the output's own
        # '<out>.data': the fused model never points at the source's weights file.
        _save_large(model, out, result, src, before if result.changed else None)


def _metadata_report(result: FuseResult) -> dict:
    return {"ort_fusions": None if result.ort is None else result.ort.to_dict(),
            "patterns": result.table(), "flop_share": result.flop_share, "nodes_before": result.nodes_before,
            "nodes_after": result.nodes_after,
            "nodes": [{"name": m.node, "op": m.op, "module": m.module, "replaced": len(m.replaced)}
                      for m in result.matches]}


def _external_bytes(proto: onnx.ModelProto, src: pathlib.Path) -> int:
    """Bytes of the external data files the model's tensors point at (each file once)."""
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data
    files = {ExternalDataInfo(t).location for t in _get_all_tensors(proto) if uses_external_data(t)}
    return sum((src.parent / f).stat().st_size for f in files if (src.parent / f).is_file())


def _fits_in_memory(src: pathlib.Path) -> bool:
    data = src.with_name(src.name + ".data")
    size = src.stat().st_size + (data.stat().st_size if data.exists() else 0)
    return size < onnxio.EXTERNAL_DATA_THRESHOLD


def _save_large(model: ir.Model, out, result: FuseResult, src: pathlib.Path, before: list | None) -> None:
    """Models with external data (any size, past protobuf's 2 GiB included): functions and metadata are added on
    the IR and onnx_ir streams the weights, tensor by tensor, into '<out>.data'. Both files are written in a
    temporary folder beside the output, checked by the soundness gate there, and renamed into place, so a failure
    leaves no partial output and an in-place fuse (out == src) never overwrites the weights it is reading."""
    used = {(n.op_type, n.overload) for g in _base.graphs(model.graph) for n in g if n.domain == DOMAIN}
    opset = _base.default_opset(model) or functions.ONNX_OPSET
    for op, overload in sorted(used):
        f = ir.serde.deserialize_function(functions.function_proto(op, overload, opset))
        model.functions[f.identifier()] = f
    if used:
        model.opset_imports.setdefault(DOMAIN, DOMAIN_VERSION)
    model.metadata_props[REPORT_KEY] = json.dumps(_metadata_report(result))
    out = pathlib.Path(out)
    parent = out.parent if str(out.parent) else pathlib.Path(".")
    data_name = out.name + ".data"
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=".onnxfuse-", dir=parent))
    try:
        ir.save(model, str(tmp / out.name), external_data=data_name)
        if before is not None:  # the gate, before anything is renamed into place
            soundness.check(tmp / out.name, src, before)
        if (tmp / data_name).exists():
            os.replace(tmp / data_name, parent / data_name)
        os.replace(tmp / out.name, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.output = str(out)
