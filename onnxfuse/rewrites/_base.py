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

from ..ops._family import DEFAULT_MIN_OPSET
from ..schema import DOMAIN, OPS, op_def

FLOAT_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
# The lowest default-domain opset in which each op's model-local function body is valid (its family's `min_opset`,
# onnxfuse/ops/): the bodies use MatMul, Add, Mul, Relu, Sigmoid (bfloat16 kernels for Relu since opset 14), for
# LoRA CastLike and for RotaryEmbedding Shape's start attribute (opset 15). A model of an older opset keeps those
# subgraphs (the function is written in the model's own opset: onnx.checker requires it).
MIN_OPSET = {op: op_def(op).min_opset for op in OPS}
BF16_MIN_OPSET = 14
# Inputs that are weights (their shapes are the rule's business: weight_kn, a lookup table), not operands an
# elementwise op broadcasts; every other constant input may broadcast the result.
_WEIGHT_INPUTS = {("MatMul", 1), ("Gemm", 1), ("Gather", 0), ("MatMulNBits", 1), ("MatMulNBits", 2), ("MatMulNBits", 3)}
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
    detail: str = ""  # what distinguishes nodes of one op (SwiGLU's activation), for the report
    added: int = 1    # nodes the match added: the op, and any it needs beside it (the per-table bags' concatenation)


class Recorder:
    """Collects the matches of one fuse run (for the report, node names and doc strings).

    Names it makes (nodes, new initializers) are unique against every name already in the model (`seed`): values
    and nodes of the main graph, of If/Loop/Scan bodies and of model-local functions, so a second fuse pass over a
    fused model, or a model that already holds a tensor called `W_KxN`, never loses a tensor to a clash.
    """

    def __init__(self):
        self.matches: list[Match] = []
        self.names: set[str] = set()
        self._derived: dict[tuple, ir.Value] = {}

    def seed(self, model: ir.Model) -> None:
        for graph in (model.graph, *model.functions.values()):
            for v in (*graph.inputs, *graph.outputs):
                self.names.add(v.name)
            for node in ir.traversal.RecursiveGraphIterator(graph):
                self.names.add(node.name)
                self.names.update(v.name for v in node.outputs if v is not None)
                for attr in node.attributes.values():
                    for g in _attr_graphs(attr):
                        self.names.update(g.initializers)
                        self.names.update(v.name for v in g.inputs)
        self.names.update(model.graph.initializers)
        self.names.discard(None)

    def unique(self, name: str) -> str:
        out, i = name, 1
        while out in self.names:
            i += 1
            out = f"{name}#{i}"
        self.names.add(out)
        return out

    def derived(self, op, graph, source: ir.Value, suffix: str, make) -> ir.Value:
        """A new initializer computed from constant `source` (its [K, N] transpose, say), made once per graph: a
        weight shared by several matched nodes is stored once in its new layout."""
        key = (id(graph), id(source), suffix)
        if key not in self._derived:
            self._derived[key] = new_initializer(op, self, f"{source.name}{suffix}", make())
        return self._derived[key]


def _attr_graphs(attr: ir.Attr) -> list[ir.Graph]:
    if attr.type == ir.AttributeType.GRAPH:
        return [attr.value]
    if attr.type == ir.AttributeType.GRAPHS:
        return list(attr.value)
    return []


def graphs(graph: ir.Graph) -> list[ir.Graph]:
    """`graph` and every If/Loop/Scan body nested in it (what the rules rewrite; model-local functions are not)."""
    out = [graph]
    for node in graph:
        for attr in node.attributes.values():
            for g in _attr_graphs(attr):
                out += graphs(g)
    return out


def node_label(node: ir.Node) -> str:
    """A node as the model names it: its name, else its op type and first output."""
    if node.name:
        return node.name
    out = node.outputs[0].name if node.outputs and node.outputs[0] is not None else "?"
    return f"{node.op_type}->{out}"


def default_opset(model: ir.Model) -> int | None:
    return model.opset_imports.get("", model.opset_imports.get("ai.onnx"))


# A check's reason for a structural match that is no candidate at all (a Gather on run-time data for the embedding
# rule): `fuse --explain` leaves it out instead of listing every such node.
NOT_A_CANDIDATE = "not a candidate"


def not_constant(value: ir.Value | None, role: str) -> str | None:
    """None when `value` is a true constant (an initializer that is not a graph input, or a Constant node's output);
    otherwise why it is not, naming the value and its `role` ("the weight", "input 2 of node_Add_3"). An initializer
    listed among the graph inputs is only a default that a caller may override (onnxruntime's own fusions treat it
    as non-constant too)."""
    if value is None:
        return f"{role} is missing"
    name = f"{value.name} ({role})" if role else value.name
    if value.is_graph_input():
        if value.const_value is not None:
            return (f"{name} is an initializer that is also a graph input: only a default that a caller may "
                    "override, so not a constant (remove it from the graph inputs to let it fuse)")
        return f"{name} is a graph input (fed at run time), not a constant"
    if value.const_value is not None:
        return None
    producer = value.producer()
    if producer is None:
        return f"{name} is not a constant"
    return f"{name} is computed by {node_label(producer)} ({producer.op_type}), not a constant"


def const(value: ir.Value | None) -> np.ndarray | None:
    """The constant behind a value (an initializer that is not a graph input, or a Constant node), or None."""
    if not_constant(value, "") is not None:
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
        self._graph = None

    # onnxscript calls check() right before rewrite() for the same match: keep its nodes for the annotation.
    def remember(self, context) -> None:
        self._matched = list(context.nodes)
        self._graph = context.graph_or_function

    def guard(self, context, result: MatchResult, x: ir.Value, op_type: str | None = None,
              runtime: tuple = ()) -> bool:
        """The checks every rule shares, run before its own (see `guard_nodes`). `runtime` names the other inputs
        the op reads at run time like X (RotaryEmbedding's cos and sin). Records the first reason; False then."""
        return guard_nodes(context.nodes, context.model, result, x, op_type or self.op, runtime=runtime)

    def guard_output(self, context, result: MatchResult, x: ir.Value, n: int) -> bool:
        """The replaced subgraph's output, where shape inference knows it, is exactly what the fused op returns:
        X's leading dims, then N, in X's element type."""
        return guard_output_value(context.output_values[0], result, x, n)

    def emit(self, op, op_type: str, inputs: list, attrs: dict, shapes: dict, dtype: ir.DataType,
             flops: int | None, outputs: int = 1):
        """The onnxfuse node (its output, or a tuple of `outputs` of them), named and annotated."""
        if outputs > 1:
            out = getattr(op, op_type)(*inputs, _domain=DOMAIN, _outputs=outputs, **attrs)
            node = out[0].producer()
        else:
            out = getattr(op, op_type)(*inputs, _domain=DOMAIN, **attrs)
            node = out.producer()
        matched = self._matched
        naming = [n for n in matched if n.op_type in self.naming_ops] or matched
        module = module_path(naming)
        replaced = [(n.name or "?", n.op_type) for n in matched]
        annotate(node, self.recorder, self.pattern_name, self.name, op_type, module, replaced, shapes, dtype, flops)
        return out


def guard_nodes(nodes, model: ir.Model, result: MatchResult, x: ir.Value, op_type: str,
                min_opset: int | None = None, runtime: tuple = ()) -> bool:
    """The checks every rule shares (`FusionRule.guard`; graph passes call it directly): every input of the matched
    `nodes` other than X is a true constant (the rewrite bakes or re-lays them out, and the kernels may pack them
    once), no constant broadcasts the result to a rank above X's (`X[M,K] @ W + b[1,1,N]` is [1, M, N]; the fused
    op returns X's rank), and the model's opset can hold the op's function body (`min_opset` raises the op's
    floor, e.g. for a body with typed constants). `runtime` names the other inputs the op reads at run time like X
    (RotaryEmbedding's cos and sin): they need not be constants, and the rule checks their shapes itself. Records
    the first reason; False then."""
    inside = {id(n) for n in nodes}
    xd = dims(x)
    for node in nodes:
        for i, v in enumerate(node.inputs):
            if v is None or v is x or any(v is r for r in runtime) or \
                    (v.producer() is not None and id(v.producer()) in inside):
                continue
            reason = not_constant(v, f"input {i} of {node_label(node)}")
            if reason:
                result.fail(reason, v)
                return False
            if (node.op_type, i) in _WEIGHT_INPUTS:
                continue  # a weight: its rank and shape are the rule's business (weight_kn, a table)
            rank = len(v.const_value.shape)
            if (xd is None and rank > 1) or (xd is not None and rank > len(xd)):
                shape = list(v.const_value.shape)
                result.fail(f"{v.name} of shape {shape} broadcasts the result of {node_label(node)} to rank {rank}"
                            f", above the rank of X {x.name} ({'unknown' if xd is None else len(xd)}): the fused "
                            "op returns X's rank", v)
                return False
    opset = default_opset(model)
    need = max(MIN_OPSET.get(op_type, DEFAULT_MIN_OPSET), min_opset or 0,
               BF16_MIN_OPSET if x.dtype == ir.DataType.BFLOAT16 else 0)
    if opset is not None and opset < need:
        result.fail(f"the model's opset {opset} is below {need}, the lowest in which {op_type}'s function body "
                    "(what runs without the kernel library) is valid; convert the model to a newer opset", x)
        return False
    return True


def guard_output_value(out: ir.Value, result: MatchResult, x: ir.Value, n: int) -> bool:
    """`out` (the replaced subgraph's output), where shape inference knows it, is exactly what the fused op returns:
    X's leading dims, then N, in X's element type."""
    xd, od = dims(x), dims(out)
    if xd is not None and od is not None:
        want = xd[:-1] + [n]
        same = len(od) == len(want) and all(not (isinstance(a, int) and isinstance(b, int)) or a == b
                                            for a, b in zip(od, want))
        if not same:
            result.fail(f"the replaced subgraph's output {out.name} has shape {od}, the fused op would return "
                        f"{want} (rank {len(want)}): a broadcast changes the rank or a dim", out)
            return False
    if out.dtype is not None and x.dtype is not None and out.dtype != x.dtype:
        result.fail(f"the replaced subgraph's output {out.name} is {out.dtype.name.lower()}, X {x.name} is "
                    f"{x.dtype.name.lower()}: the fused op returns X's type", out)
        return False
    return True


def annotate(node: ir.Node, recorder: Recorder, pattern_name: str, rule_name: str, op_type: str, module: str,
             replaced: list[tuple[str, str]], shapes: dict, dtype: ir.DataType, flops: int | None,
             extra_doc: tuple[str, ...] = (), detail: str = "", added: int = 1) -> None:
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
                                  dtype.name.lower() if dtype is not None else "?", flops, detail, added))


def check_float_dtypes(result: MatchResult, **values: ir.Value) -> ir.DataType | None:
    """All given values share one float element type (the kernels' T); else record why not."""
    types = {name: v.dtype for name, v in values.items() if v is not None}
    known = {t for t in types.values() if t is not None}
    if len(known) > 1:
        result.fail("element types differ: " + ", ".join(
            f"{k} {values[k].name} {t.name.lower() if t else '?'}" for k, t in types.items()))
        return None
    dtype = known.pop() if known else None
    if dtype is not None and dtype not in FLOAT_TYPES:
        result.fail(f"element type {dtype.name.lower()} of "
                    f"{', '.join(v.name for v in values.values() if v is not None)}"
                    " is not float/float16/bfloat16")
        return None
    return dtype


def weight_kn(result: MatchResult, w: ir.Value, name: str, trans: bool = False) -> np.ndarray | None:
    """A constant 2-D weight in [K, N] layout (transposed from a Gemm's transB=1 layout), or None with a reason."""
    reason = not_constant(w, name)
    if reason:
        result.fail(f"{reason}: the fused op's weights are fixed at fuse time", w)
        return None
    arr = w.const_value.numpy()
    if arr.ndim != 2:
        result.fail(f"{name} {w.name} has rank {arr.ndim}, expected a 2-D weight", w)
        return None
    return np.ascontiguousarray(arr.T) if trans else arr


def bias_n(result: MatchResult, b: ir.Value | None, n: int, dtype) -> np.ndarray | None:
    """A bias that broadcasts along the last axis only, as [N]; or None with a reason."""
    reason = not_constant(b, "the bias")
    if reason:
        result.fail(reason, b)
        return None
    arr = b.const_value.numpy()
    shape = list(arr.shape)
    if any(d != 1 for d in shape[:-1]) or (shape and shape[-1] not in (1, n)):
        result.fail(f"the bias {b.name} of shape {shape} does not broadcast along the last axis only (N={n})", b)
        return None
    return np.broadcast_to(arr.reshape(-1), (n,)).copy()


def new_initializer(op, recorder: Recorder, name: str, array: np.ndarray) -> ir.Value:
    """A new initializer whose name is unique in the whole model (see Recorder.seed)."""
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
    """Records, for `fuse --explain`, every candidate that matched a pattern's structure but was not rewritten: a
    check refused it, or a value inside it has another use (the matcher's "other uses"), or it sits in a model-local
    function, which onnxfuse does not rewrite. Each record keeps the matched nodes so that `explain.py` can name the
    values involved and drop the lines that a larger candidate already covers."""

    def __init__(self):
        super().__init__()
        self.records: list[dict] = []

    def log(self, rule, container, node, match_result, status):
        reason = match_result.reason or ""
        in_function = isinstance(container, ir.Function)
        if status == MatchStatus.CONDITION_FAILED or (status == MatchStatus.NO_MATCH and "other uses" in reason) \
                or (in_function and status == MatchStatus.SUCCESS):
            self.records.append({"rule": rule.name, "root": node, "nodes": list(match_result.nodes),
                                 "status": status.name, "reason": reason,
                                 "function": f"{container.domain}.{container.name}" if in_function else None})


class GraphPass:
    """A rule written as a graph pass instead of a pattern, for subgraphs of a varying number of nodes (gated MLPs in
    every spelling, MLP stacks, DLRM interactions): `apply_to_model(model, tracer)` rewrites the main graph and its
    If/Loop/Scan bodies and returns the count (with a tracer, the --explain re-run, it changes nothing);
    `refusals` holds why candidates did not fuse, recorded by the real pass; `trace_function` says what would have
    matched inside a model-local function (default: nothing). `fuse` runs these beside the rewriter's rule sets."""

    def __init__(self, recorder: Recorder):
        self.recorder = recorder
        self.refusals: list[dict] = []

    def apply_to_model(self, model: ir.Model, tracer=None) -> int:
        raise NotImplementedError

    def trace_function(self, model: ir.Model, function: ir.Function, tracer) -> None:
        return None


def rule_set(rules) -> RewriteRuleSet:
    return RewriteRuleSet([r.rule(*args) for r, args in rules], commute=True)


def apply(rules, model: ir.Model, tracer: ExplainTracer | None = None) -> int:
    """Apply a rule set (or a GraphPass) to the main graph and its If/Loop/Scan bodies, never
    to model-local functions: a function holds no initializers for the constants a rewrite makes, and its weights
    are its parameters. With a tracer nothing changes; the functions are traced too, so --explain can say that a
    candidate inside one was left alone."""
    saved = dict(model.functions)
    model.functions.clear()
    try:
        count = rules.apply_to_model(model, tracer=tracer)
    finally:
        model.functions.update(saved)
    if tracer is not None:
        trace_functions(rules, model, tracer)
    return count


def trace_functions(rules, model: ir.Model, tracer: ExplainTracer) -> None:
    """Run a rule set over the model-local functions with a tracer only (nothing changes): what would have matched
    there is what `fuse` reports as left alone. A GraphPass takes part through its `trace_function`."""
    if isinstance(rules, GraphPass):
        for function in list(model.functions.values()):
            if function.domain != DOMAIN:
                rules.trace_function(model, function, tracer)
        return
    if not isinstance(rules, RewriteRuleSet):
        return
    from onnxscript.optimizer import basic_constant_propagation

    for function in list(model.functions.values()):
        if function.domain != DOMAIN:
            basic_constant_propagation(function)  # Constant nodes' values, as apply_to_model does for functions
            # the per-graph entry point of the rewriter (no public one takes a single function)
            rules._apply_to_graph_or_function(model, function, verbose=None, tracer=tracer)
