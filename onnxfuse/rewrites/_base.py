"""The one adapter between onnxfuse's rules and onnxscript's pattern rewriter (its module paths move between
releases: only this file imports them).

A rule is a `FusionRule`: `pattern()` spells the subgraph as an exporter emits it, `check()` refuses with a reason
(`MatchResult.fail`) unless the semantics hold, `rewrite()` emits one onnxfuse node through `self.emit()`, which
names and annotates it for Netron and records the match for the fusion report.
"""
from __future__ import annotations

import ast
import dataclasses
import math

import numpy as np
from onnxscript import ir
from onnxscript.rewriter import MatchingTracer, MatchResult, MatchStatus, RewriteRuleClassBase, RewriteRuleSet

from ..schema import DOMAIN, OPS

FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
KERNELS_DOC = (
    "kernels: cpu (CPU EP); cuda, triton (CUDA EP)",
    "chosen: backend=auto picks per node at run time:",
    "  cpu on the CPU EP; triton on the CUDA EP",
    "  (measured faster), cuda where no cubin fits",
    "  override: the node's backend attribute",
    "  (onnxfuse fuse --backend)",
)


def _shape_txt(dims_: list | None) -> str:
    return "?" if dims_ is None else "[" + ",".join(str(d) for d in dims_) + "]"


@dataclasses.dataclass
class Match:
    pattern: str
    op: str
    node: str
    module: str
    replaced: list[tuple[str, str]]
    shapes: dict[str, list]
    dtype: str
    flops: int | None


class Recorder:
    """Collects the matches of one fuse run (for the report, node names and doc strings)."""

    def __init__(self):
        self.matches: list[Match] = []
        self.names: set[str] = set()

    def unique(self, name: str) -> str:
        out, i = name, 1
        while out in self.names:
            i += 1
            out = f"{name}#{i}"
        self.names.add(out)
        return out


def const(value: ir.Value | None) -> np.ndarray | None:
    """The constant behind a value (initializer or Constant node), or None."""
    if value is None or value.const_value is None:
        return None
    return value.const_value.numpy()


def dims(value: ir.Value) -> list | None:
    """Static dims where known (symbolic ones as their names), or None when the rank is unknown."""
    if value.shape is None:
        return None
    return [d if isinstance(d, int) else str(d) for d in value.shape]


def module_path(nodes: list[ir.Node]) -> str:
    """The PyTorch module a group of nodes came from: the deepest module all of them share.

    The dynamo exporter records module scopes in node metadata ('pkg.torch.onnx.name_scopes'); the TorchScript
    exporter encodes them in node names ('/model/layers.0/mlp/gate_proj/MatMul').
    """
    paths = []
    for n in nodes:
        scopes = n.metadata_props.get("pkg.torch.onnx.name_scopes")
        if scopes:
            try:
                parts = ast.literal_eval(scopes)
                if len(parts) >= 2:
                    paths.append(parts[-2].split("."))
                    continue
            except (ValueError, SyntaxError):
                pass
        if n.name and n.name.startswith("/"):
            # TorchScript scopes: '/model/layers.0/mlp/MatMul', but Sequential children repeat their parent:
            # '/bottom/bottom.0/base/Gemm' is module bottom.0.base.
            path = ""
            for seg in [s for s in n.name.split("/") if s][:-1]:
                path = seg if not path or seg.startswith(path + ".") else f"{path}.{seg}"
            paths.append(path.split(".") if path else [])
    return common_module(paths)


def common_module(paths: list[list[str]]) -> str:
    """The longest dotted module prefix all paths (split on '.') share, or 'root'."""
    paths = [p for p in paths if p and p != [""]]
    if not paths:
        return "root"
    common = []
    for parts in zip(*paths):
        if all(p == parts[0] for p in parts):
            common.append(parts[0])
        else:
            break
    return ".".join(common) or "root"


class FusionRule(RewriteRuleClassBase):
    """Base of every onnxfuse rule: subclasses set `op` (a schema op) and `pattern_name` (the report's name)."""

    op: str = ""
    pattern_name: str = ""
    # the node types whose module scope names the fused node (GEMMs, not the activation after them)
    naming_ops = ("MatMul", "Gemm")

    def __init__(self, recorder: Recorder, variant: str):
        super().__init__(name=f"{self.pattern_name}/{variant}")
        self.recorder = recorder
        self._matched: list[ir.Node] = []

    # onnxscript calls check() right before rewrite() for the same match: keep its nodes for the annotation.
    def remember(self, context) -> None:
        self._matched = list(context.nodes)

    def emit(self, op, op_type: str, inputs: list, attrs: dict, shapes: dict, dtype: ir.DataType,
             flops: int | None):
        out = getattr(op, op_type)(*inputs, _domain=DOMAIN, **attrs)
        node = out.producer()
        matched = self._matched
        naming = [n for n in matched if n.op_type in self.naming_ops] or matched
        module = module_path(naming)
        replaced = [(n.name or "?", n.op_type) for n in matched]
        annotate(node, self.recorder, self.pattern_name, self.name, op_type, module, replaced, shapes, dtype, flops)
        return out


def annotate(node: ir.Node, recorder: Recorder, pattern_name: str, rule_name: str, op_type: str, module: str,
             replaced: list[tuple[str, str]], shapes: dict, dtype: ir.DataType, flops: int | None,
             extra_doc: tuple[str, ...] = ()) -> None:
    """Name a fused node `onnxfuse/<pattern>/<module>`, write its Netron doc string and metadata, record the match."""
    node.name = recorder.unique(f"onnxfuse/{pattern_name}/{module}")
    schema = OPS[op_type]
    # Netron shows each line unwrapped in a narrow panel: one fact per line, short lines.
    node.doc_string = "\n".join([
        schema.math,
        f"module: {module}",
        f"rule: {rule_name}",
        f"replaced {len(replaced)} nodes:",
        *(f"  {name} ({t})" for name, t in replaced),
        "shapes:",
        *(f"  {k} {_shape_txt(v)}" for k, v in shapes.items()),
        f"dtype: {dtype.name.lower() if dtype is not None else '?'}",
        *KERNELS_DOC,
        *extra_doc,
    ])
    node.metadata_props["onnxfuse.pattern"] = pattern_name
    node.metadata_props["onnxfuse.module"] = module
    node.metadata_props["onnxfuse.replaced"] = ";".join(f"{n}:{t}" for n, t in replaced)
    recorder.matches.append(Match(pattern_name, op_type, node.name, module, replaced, shapes,
                                  dtype.name.lower() if dtype is not None else "?", flops))


def check_float_dtypes(result: MatchResult, **values: ir.Value) -> ir.DataType | None:
    """All given values share one float element type (the kernels' T); else record why not."""
    types = {name: v.dtype for name, v in values.items() if v is not None}
    known = {t for t in types.values() if t is not None}
    if len(known) > 1:
        result.fail("element types differ: " + ", ".join(f"{k} {t.name.lower() if t else '?'}" for k, t in types.items()))
        return None
    dtype = known.pop() if known else None
    if dtype is not None and dtype not in FLOAT_TYPES:
        result.fail(f"element type {dtype.name.lower()} is not float/float16/bfloat16")
        return None
    return dtype


def weight_kn(result: MatchResult, w: ir.Value, name: str, trans: bool = False) -> np.ndarray | None:
    """A constant 2-D weight in [K, N] layout (transposed from a Gemm's transB=1 layout), or None with a reason."""
    arr = const(w)
    if arr is None:
        result.fail(f"{name} is not a constant (it is computed or a graph input): the kernels need fixed weights",
                    w)
        return None
    if arr.ndim != 2:
        result.fail(f"{name} has rank {arr.ndim}, expected a 2-D weight", w)
        return None
    return np.ascontiguousarray(arr.T) if trans else arr


def bias_n(result: MatchResult, b: ir.Value | None, n: int, dtype) -> np.ndarray | None:
    """A bias that broadcasts along the last axis only, as [N]; or None with a reason."""
    arr = const(b)
    if arr is None:
        result.fail("the bias is not a constant", b)
        return None
    shape = list(arr.shape)
    if any(d != 1 for d in shape[:-1]) or (shape and shape[-1] not in (1, n)):
        result.fail(f"the bias of shape {shape} does not broadcast along the last axis only (N={n})", b)
        return None
    return np.broadcast_to(arr.reshape(-1), (n,)).copy()


def new_initializer(op, recorder: Recorder, name: str, array: np.ndarray) -> ir.Value:
    """A new initializer with a name unique in this fuse run (a shared weight gets its own copy, never a clash)."""
    name = recorder.unique(name)
    return op.initializer(ir.tensor(array, name=name), name=name)


def gemm_flops(x: ir.Value, k: int, n: int) -> int | None:
    d = dims(x)
    if d is None or not all(isinstance(v, int) for v in d):
        return None
    return 2 * math.prod(d[:-1]) * k * n


def rows_of(x: ir.Value) -> str:
    d = dims(x)
    return "?" if d is None else "x".join(str(v) for v in d[:-1])


class ExplainTracer(MatchingTracer):
    """Records candidate subgraphs that matched structurally but were refused, with the refusing reason."""

    def __init__(self):
        super().__init__()
        self.refusals: list[dict] = []

    def log(self, rule, container, node, match_result, status):
        reason = match_result.reason or ""
        if status == MatchStatus.CONDITION_FAILED or (status == MatchStatus.NO_MATCH and "other uses" in reason):
            self.refusals.append({"rule": rule.name, "node": node.name or node.op_type, "op_type": node.op_type,
                                  "reason": reason or "check failed"})


def rule_set(rules) -> RewriteRuleSet:
    return RewriteRuleSet([r.rule(*args) for r, args in rules], commute=True)
