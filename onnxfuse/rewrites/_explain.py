"""`fuse --explain`: for every candidate that did not fuse, the node, the rule and the reason, in the model's own names.

Three sources, run over the model after fusing (so fused subgraphs are gone and only what stayed is explained):
  * the rules' own refusals (a check failed), recorded by `_base.ExplainTracer`; the swiglu pass records there too,
    for every gated MLP (a Mul of two projections of the same input, one through an activation) it did not fuse,
    including which activation it saw when SwiGLU does not compute that one (`rewrites/swiglu.py`);
  * the matcher's "other uses" refusals, turned into which value has which other consumer (or is a graph output);
  * structural near-misses that no rule even matched: a GEMM followed by an activation no op fuses (Tanh, LeakyRelu,
    GELU, ...).
A line that a larger candidate's line already covers (the gate projection's Linear+Sigmoid inside a refused SwiGLU,
say) is dropped, as are duplicates from the several spellings of one rule.
"""
from __future__ import annotations

from onnxscript import ir

from ._base import NOT_A_CANDIDATE, ExplainTracer, const, graphs, node_label

GEMMS = ("MatMul", "Gemm")
# Activations that follow a Linear layer in real models but that no onnxfuse op fuses after a GEMM.
UNFUSED_ACTIVATIONS = ("Tanh", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus",
                       "Softsign", "Gelu", "Mish", "ThresholdedRelu", "PRelu", "Clip", "Erf", "Swish", "Exp")
_DEFAULT = ("", "ai.onnx")


def refusals(model: ir.Model, tracer: ExplainTracer, stack_refusals: list[dict]) -> list[dict]:
    rows: list[tuple[frozenset, dict]] = []
    for rec in tracer.records:
        if rec["reason"] == NOT_A_CANDIDATE:
            continue
        nodes = rec["nodes"] or [rec["root"]]
        anchor = next((n for n in nodes if n.op_type in GEMMS), rec["root"])
        if rec["function"] and rec["status"] == "SUCCESS":
            reason = (f"inside model-local function {rec['function']}: onnxfuse rewrites the main graph and If/Loop/"
                      "Scan bodies, not functions (inline the function first, e.g. with onnxscript.optimizer)")
        elif "other uses" in rec["reason"]:
            reason = _other_uses(nodes, rec["root"])
        else:
            reason = rec["reason"] or "a check refused it"
            if rec["function"]:
                reason = f"inside model-local function {rec['function']}: {reason}"
        rows.append((frozenset(id(n) for n in nodes),
                     {"rule": rec["rule"], "node": node_label(anchor), "op_type": anchor.op_type, "reason": reason}))
    covered = set().union(*(ids for ids, _ in rows)) if rows else set()
    rows += [(frozenset([id(n)]), r) for n, r in _near_misses(model, covered)]
    out, seen = [], set()
    for ids, row in rows:
        if any(ids < other for other, _ in rows):
            continue  # a larger candidate's line covers these nodes
        key = (row["node"], row["reason"])
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out + [r for r in stack_refusals if (r["node"], r["reason"]) not in seen]


def _other_uses(nodes: list[ir.Node], root: ir.Node) -> str:
    inside = {id(n) for n in nodes}
    parts = []
    for n in nodes:
        if n is root:
            continue
        for v in n.outputs:
            if v is None:
                continue
            if v.is_graph_output():
                parts.append(f"{v.name} is a graph output")
            for use in v.uses():
                if id(use.node) not in inside:
                    parts.append(f"{v.name} is also used by {node_label(use.node)} ({use.node.op_type})")
    if not parts:
        return "a value inside the candidate has another use, so it cannot be replaced"
    return "; ".join(dict.fromkeys(parts)) + ": the fused op would not produce it, so the subgraph cannot be replaced"


def _consumers(value: ir.Value) -> list[ir.Node]:
    return [u.node for u in value.uses()]


def _near_misses(model: ir.Model, covered: set[int]):
    for graph in graphs(model.graph):
        for node in graph:
            if node.op_type not in GEMMS or node.domain not in _DEFAULT or id(node) in covered:
                continue
            if len(node.inputs) < 2 or const(node.inputs[1]) is None or node.outputs[0] is None:
                continue
            label = node_label(node)
            out = node.outputs[0]
            steps = [node]
            users = _consumers(out)
            if len(users) == 1 and users[0].op_type == "Add" and users[0].domain in _DEFAULT and \
                    any(const(v) is not None for v in users[0].inputs if v is not out):
                steps.append(users[0])
                users = _consumers(users[0].outputs[0])
            if len(users) == 1 and users[0].op_type in UNFUSED_ACTIVATIONS and users[0].domain in _DEFAULT:
                act = users[0]
                via = f" and bias add {node_label(steps[1])}" if len(steps) > 1 else ""
                yield node, {"rule": "linear_act/structure", "node": label, "op_type": node.op_type,
                             "reason": f"{label}{via} is followed by {node_label(act)} ({act.op_type}): linear_act "
                                       "fuses Relu or Sigmoid after a Linear layer, not " + act.op_type}
