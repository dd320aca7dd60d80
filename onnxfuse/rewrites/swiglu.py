"""swiglu: the gate and up projections of a gated MLP with act(gate) * up -> `SwiGLU` (attribute `activation`).

    Y = act(X @ W_gate) * (X @ W_up)        (then down_proj stays a plain MatMul/Gemm on Y)
    with LoRA adapters: LoRASwiGLU, and with one on down_proj too the whole MLP one LoRAGatedMLP (_lora_mlp.py)
    act: silu (Llama, Mistral, Qwen2/3, Phi-3), gelu_tanh (Gemma, Gemma2: GeGLU), gelu (erf), quick_gelu, relu
         (ReGLU), sigmoid (GLU)

Spellings matched, as both exporters and onnxruntime's stage-1 fusions write them (fp32, fp16, bf16):
  * projections: MatMul on [K, N] weights or Gemm(transB=0|1) without bias, one per gate and up; or Phi-3's merged
    spelling, one GEMM on a [K, 2N] weight whose output is cut into gate | up by Split (num_outputs=2 or split
    [N, N]) or by two Slices on the last axis (`chunk(2)`). The merged weight is cut into two [K, N] halves at fuse
    time, so the kernels are the separate-projection kernels;
  * activations, each as a formula in any association and commutation of its Mul/Add nodes (Div by a constant is
    Mul by its inverse, Neg is Mul by -1, g*g*g is Pow(g, 3)):
      silu        g*sigmoid(g), g/(1+exp(-g)), g*reciprocal(1+exp(-g)), Swish (opset 24, alpha 1), QuickGelu(alpha=1)
      quick_gelu  the same with 1.702*g inside, Swish(alpha=1.702), com.microsoft QuickGelu
      gelu        0.5*g*(1+erf(g/sqrt(2))), Gelu (opset 20, approximate="none"), com.microsoft Gelu
      gelu_tanh   0.5*g*(1+tanh(sqrt(2/pi)*(g+0.044715*g^3))) and its expanded forms (transformers' gelu_new,
                  gelu_fast), Gelu(approximate="tanh"), com.microsoft FastGelu without bias
      relu, sigmoid  Relu(g), Sigmoid(g)
    Every constant must be the activation's constant rounded to the constant's own element type, within one unit in
    the last place (an fp16 graph stores 0.044715 as 0.04471): 0.0447 or x/1.5 in an fp32 graph are refused.

Why a graph pass and not pattern rules: the formulas above come in dozens of associations and operand orders (the
tanh form alone has seven commutative nodes, 2^7 orders per association), so they are matched by flattening the
product and sum trees into a small expression and comparing it with each activation's formula
(_activation_forms.py); the pass keeps the rules' contract: the shared guard (`_base.guard_nodes`: constants are
true constants, no broadcast raises the rank, the model's opset holds the function body), the output check, no
intermediate with another use, a report entry and a Netron annotation per match, and, for `fuse --explain`, a
reason for every gated MLP it did not fuse (including which activation it saw when that activation is not one
SwiGLU computes).

Why this granularity (measured on an H200, fp16, Llama MLP h4096/i11008, 2048 tokens, torch): the three GEMMs alone
take 0.875 ms and the MLP with its activation 0.919 ms, while merging gate+up into one GEMM with a *separate*
silu*mul was slower (0.998 ms), as was Liger-Kernel's standalone silu*mul. So the win is hiding the activation in
the epilogue of the gate/up GEMM (one kernel computing both products and writing act(g)*u once: the g and u
intermediates never reach memory), not a standalone elementwise op. The down projection is a plain GEMM that
onnxruntime already runs at cuBLAS speed; keeping it out keeps the op's output allocated by onnxruntime and its
scratch-free kernels safe under CUDA-graph capture. At decode sizes the same op reads W_gate and W_up once.
"""
from __future__ import annotations

import dataclasses

import numpy as np
from onnxscript import ir
from onnxscript.rewriter import MatchResult

from .. import functions
from ..ops.swiglu import LORA_SWIGLU, SWIGLU
from ..schema import DOMAIN, GATE_ACTIVATIONS, swiglu_overload
from . import _base, _explain
from ._activation_forms import BUDGET, DEFAULT_DOMAINS, Expressions, Miss, Prod, Var, classify, free_variables
from ._lora_mlp import _Shim, gated_mlps, replace_lora
from ._lora_mlp import is_lora as _lora

PATTERN = "swiglu"
OP = SWIGLU.name
LINEARS = ("MatMul", "Gemm")
SELECTS = ("Split", "Slice")
# Activations whose function body needs typed constants (CastLike: opset 15).
_CASTLIKE_OPSET = 15


# ------------------------------------------------------------------------------------------------ projections

@dataclasses.dataclass
class Projection:
    """Where one operand of the gating product comes from: a GEMM of X, or a column range of one (`select`: a Split
    output or a Slice)."""
    value: ir.Value
    gemm: ir.Node
    select: ir.Node | None = None

    @property
    def x(self) -> ir.Value:
        return self.gemm.inputs[0]


def _gemm(node: ir.Node | None) -> bool:
    return node is not None and node.domain in DEFAULT_DOMAINS and node.op_type in LINEARS and len(node.inputs) >= 2 \
        and node.inputs[0] is not None and node.inputs[1] is not None


def projection(value: ir.Value, graph: ir.Graph) -> Projection | None:
    """`value` as a projection of some X made in `graph` (a value of an outer scope is not one: the match could not
    replace its nodes), or a LoRALinear's output (refused, with the reason, by _projections). MatMulNBits' outputs
    are the int4_linear rules' (Int4SwiGLU): this pass leaves those gated MLPs to them."""
    node = value.producer()
    if node is None or node.graph is not graph:
        return None
    if _gemm(node) or _lora(node):
        return Projection(value, node)
    if node.domain in DEFAULT_DOMAINS and node.op_type in SELECTS and node.inputs and node.inputs[0] is not None:
        gemm = node.inputs[0].producer()
        if _gemm(gemm) and gemm.graph is graph:
            return Projection(value, gemm, node)
    return None


def _product_leaves(value: ir.Value, graph: ir.Graph, out: list, budget: list) -> list:
    """The values a product tree (Mul, Div, Neg, Reciprocal) multiplies, without looking further: a cheap test
    before reading a Mul's whole expression."""
    node = value.producer()
    if budget[0] > 0 and node is not None and node.graph is graph and node.domain in DEFAULT_DOMAINS and \
            node.op_type in ("Mul", "Div", "Neg", "Reciprocal") and None not in node.inputs:
        budget[0] -= 1
        for v in node.inputs:
            _product_leaves(v, graph, out, budget)
    else:
        out.append(value)
    return out


def _int_list(value: ir.Value | None) -> list[int] | None:
    if value is None or value.const_value is None:
        return None
    arr = value.const_value.numpy()
    return [int(v) for v in arr.reshape(-1)] if arr.dtype.kind in "iu" else None


def _columns(p: Projection, total: int, rank: int | None, result: MatchResult) -> tuple[int, int] | None:
    """The [start, stop) column range of the GEMM's output that `p.select` takes, or None with a reason."""
    node, label = p.select, _base.node_label(p.select)

    def last_axis(axis: int) -> bool:
        return axis == -1 or (rank is not None and axis == rank - 1)

    if node.op_type == "Split":
        axis = node.attributes.get_int("axis", 0) if "axis" in node.attributes else 0
        if not last_axis(axis):
            result.fail(f"{label} splits axis {axis}, not the last axis of {p.gemm.outputs[0].name}", p.value)
            return None
        outs = len(node.outputs)
        sizes = None
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            sizes = _int_list(node.inputs[1])
            if sizes is None:
                result.fail(f"{label}'s split sizes {node.inputs[1].name} are not a constant", p.value)
                return None
        elif "split" in node.attributes:
            sizes = list(node.attributes.get_ints("split"))
        elif "num_outputs" in node.attributes:
            n = node.attributes.get_int("num_outputs")
            chunk = -(-total // n)
            sizes = [min(chunk, max(total - i * chunk, 0)) for i in range(n)]
        elif total % outs == 0:
            sizes = [total // outs] * outs
        if sizes is None or len(sizes) != outs or sum(sizes) != total:
            result.fail(f"{label} does not cut {p.gemm.outputs[0].name} ({total} columns) into its outputs' sizes",
                        p.value)
            return None
        i = next(k for k, v in enumerate(node.outputs) if v is p.value)
        start = sum(sizes[:i])
        return start, start + sizes[i]
    starts, ends = _int_list(node.inputs[1]) if len(node.inputs) > 1 else None, \
        _int_list(node.inputs[2]) if len(node.inputs) > 2 else None
    # absent axes mean [0, 1, ...] (ONNX), so one unlabelled range slices axis 0
    axes = _int_list(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else [0]
    steps = _int_list(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
    if starts is None or ends is None or axes is None or steps is None:
        result.fail(f"{label}'s starts/ends/axes/steps are not all constants (fold them first, e.g. with fuse's "
                    "stage 1, which is on by default)", p.value)
        return None
    if not (len(starts) == len(ends) == len(axes) == len(steps) == 1) or not last_axis(axes[0]):
        result.fail(f"{label} does not slice the last axis of {p.gemm.outputs[0].name} alone", p.value)
        return None
    if steps[0] != 1:
        result.fail(f"{label} slices with step {steps[0]}, not 1", p.value)
        return None

    def clamp(i: int) -> int:
        return min(max(i + total if i < 0 else i, 0), total)

    return clamp(starts[0]), clamp(ends[0])


# ------------------------------------------------------------------------------------------------ the pass

@dataclasses.dataclass
class Candidate:
    mul: ir.Node
    nodes: list[ir.Node]
    gate: Projection
    up: Projection
    activation: str = ""
    spelling: str = ""
    wg: np.ndarray | None = None
    wu: np.ndarray | None = None
    trans: tuple = (False, False)
    gate_cols: tuple | None = None
    up_cols: tuple | None = None
    kn: tuple | None = None       # (K, N), set by _weights (int4 weights are no [K, N] arrays)
    int4: tuple | None = None     # (K, N, n_blocks, block) of both int4 projections
    lora: bool = False            # a projection carries its LoRA adapter (a LoRALinear): LoRASwiGLU


class SwiGLUPass(_base.GraphPass):
    """Finds gated MLPs and replaces each with one SwiGLU node. Its refusals: why gated MLPs were not fused, from
    the last real pass (a later rule may take part of a refused candidate: linear_act fuses a ReLU gate's
    Linear+Relu, and the explain re-run over the fused model would no longer see it as a gated MLP)."""

    op = OP
    pattern = PATTERN
    rule_prefix = PATTERN  # the report's rule: <rule_prefix>/<activation>
    takes_lora = True      # LoRALinear projections become LoRASwiGLU (the int4 subclass takes none)

    # -------------------------------------------------------------------------------------------- entry points

    def apply_to_model(self, model: ir.Model, tracer=None) -> int:
        """Fuse every gated MLP of the main graph and its If/Loop/Scan bodies. With a tracer (`fuse --explain`'s
        re-run over the fused model) nothing changes: each gated MLP left records why it did not fuse."""
        from onnxscript.optimizer import basic_constant_propagation

        count = 0
        if tracer is None:
            self.refusals = []
        for graph in _base.graphs(model.graph):
            basic_constant_propagation(graph)  # Constant nodes' values (what the pattern rewriter does first)
            # Outermost products first (consumers come after producers): the gating Mul before the Mul inside its
            # activation, so a match takes the whole product; then the matches are replaced in graph order.
            nodes = list(graph)
            claimed: set[int] = set()
            matches = []
            for mul in reversed(nodes):
                if id(mul) in claimed or not _is_mul(mul):
                    continue
                found = self.analyze(model, graph, mul)
                if found is None:
                    continue
                cand, result = found
                if tracer is not None:
                    if not result:
                        tracer.records.append(self._record(cand, result, None))
                elif not result:
                    anchor = next((n for n in cand.nodes if n.op_type in LINEARS or n is cand.gate.gemm), cand.mul)
                    self.refusals.append({"rule": self._record(cand, result, None)["rule"],
                                          "node": _base.node_label(anchor), "op_type": anchor.op_type,
                                          "reason": result.reason})
                elif not any(id(n) in claimed for n in cand.nodes):
                    claimed.update(id(n) for n in cand.nodes)
                    matches.append(cand)
            for cand in reversed(matches):
                self._replace(graph, cand)
                count += 1
            if self.takes_lora:  # a LoRASwiGLU and the LoRALinear on its activation: one LoRAGatedMLP
                count += gated_mlps(self, graph, tracer)
        return count

    def trace_function(self, model: ir.Model, function: ir.Function, tracer) -> None:
        """What would have fused inside a model-local function, which onnxfuse does not rewrite (for --explain)."""
        from onnxscript.optimizer import basic_constant_propagation

        basic_constant_propagation(function)
        name = f"{function.domain}.{function.name}"
        for mul in reversed(list(function)):
            if _is_mul(mul):
                found = self.analyze(model, function.graph, mul)
                if found is not None:
                    tracer.records.append(self._record(found[0], found[1], name))

    def _record(self, cand: Candidate, result: MatchResult, function: str | None) -> dict:
        ok = bool(result)
        return {"rule": f"{self.rule_prefix}/{cand.activation or 'gated'}", "root": cand.mul, "nodes": list(cand.nodes),
                "status": "SUCCESS" if ok else "CONDITION_FAILED", "reason": "" if ok else result.reason,
                "function": function}

    # -------------------------------------------------------------------------------------------- matching

    def projection_of(self, value: ir.Value, graph: ir.Graph) -> Projection | None:
        """What this pass takes as a projection (a subclass takes other linear ops: rewrites/int4_linear.py)."""
        return projection(value, graph)

    def analyze(self, model: ir.Model, graph: ir.Graph, mul: ir.Node) -> tuple[Candidate, MatchResult] | None:
        """None when `mul` is not the gating product of a gated MLP (no projection of X times a function of another
        projection of the same X); else the candidate and whether it fuses (a failed MatchResult says why)."""
        leaves = _product_leaves(mul.outputs[0], graph, [], [BUDGET])
        if not any(self.projection_of(v, graph) is not None for v in leaves):
            return None
        ex = Expressions(graph)
        root = ex.build(mul.outputs[0])
        if not isinstance(root, Prod):
            return None
        best = None
        for i, (factor, e) in enumerate(root.factors):
            if e != 1 or not isinstance(factor, Var):
                continue
            up = self.projection_of(factor.value, graph)
            if up is None:
                continue
            rest = root.factors[:i] + root.factors[i + 1:]
            act = rest[0][0] if len(rest) == 1 and rest[0][1] == 1 else Prod(rest)
            variables = list(free_variables(act).values())
            if len(variables) != 1:
                continue
            gate = self.projection_of(variables[0], graph)
            # g * sigmoid(g) alone is silu(g), not a gated MLP with W_up = W_gate (that would run the GEMM twice)
            if gate is None or gate.x is not up.x or gate.value is up.value:
                continue
            nodes = self._nodes(graph, mul, ex, gate, up)
            cand = Candidate(mul, nodes, gate, up)
            result, stage = self._check(model, cand, act)
            if result:
                return cand, result
            if best is None or stage > best[2]:
                best = (cand, result, stage)
        return None if best is None else best[:2]

    @staticmethod
    def _nodes(graph: ir.Graph, mul: ir.Node, ex: Expressions, gate: Projection, up: Projection) -> list[ir.Node]:
        """The nodes a match replaces, in graph order: the product and activation, the projections."""
        chosen = {id(mul): mul, **ex.nodes}
        for p in (gate, up):
            chosen[id(p.gemm)] = p.gemm
            if p.select is not None:
                chosen[id(p.select)] = p.select
        order = {id(n): i for i, n in enumerate(graph)}
        return sorted(chosen.values(), key=lambda n: order.get(id(n), -1))

    def _check(self, model: ir.Model, cand: Candidate, act) -> tuple[MatchResult, int]:
        """Whether the candidate fuses, and how far it got (for picking the most telling refusal)."""
        result = MatchResult()
        gate, up, mul = cand.gate, cand.up, cand.mul
        try:
            cand.activation, cand.spelling = classify(act, gate.value)
        except Miss as miss:
            return result.fail(f"the gate {gate.value.name} and up {up.value.name} projections of {gate.x.name} "
                               f"meet in {_base.node_label(mul)}, but the gate's activation is {miss}: {self.op} "
                               f"computes {', '.join(GATE_ACTIVATIONS)}", gate.value), 1
        if not self._projections(cand, result):
            return result, 2
        if not self._uses(cand, result):
            return result, 3
        x = gate.x
        min_opset = _CASTLIKE_OPSET if cand.activation in functions.GATE_ACTIVATIONS_WITH_CONSTANTS or cand.lora \
            else None
        # adapters fed at run time (LoRALinear inputs that are graph inputs) stay op inputs, as in lora_linear
        runtime = tuple(v for p in (gate, up) if _lora(p.gemm) for v in p.gemm.inputs[2:4] if v.is_graph_input())
        if not _base.guard_nodes(cand.nodes, model, result, x, self.op, min_opset, runtime=runtime):
            return result, 4
        if not self._weights(cand, result):
            return result, 5
        k, n = cand.kn
        xd = _base.dims(x)
        if xd is not None and len(xd) < 2:
            return result.fail(f"X {x.name} has rank {len(xd)}, expected [..., K]", x), 6
        if xd is not None and isinstance(xd[-1], int) and xd[-1] != k:
            return result.fail(f"X {x.name} ends in {xd[-1]}, the weights have K = {k}", x), 6
        if not _base.guard_output_value(mul.outputs[0], result, x, n):
            return result, 6
        return result, 7

    def _projections(self, cand: Candidate, result: MatchResult) -> bool:
        gate, up = cand.gate, cand.up
        for p in {id(gate.gemm): gate, id(up.gemm): up}.values():
            node = p.gemm
            if _lora(node):
                if not self.takes_lora:
                    result.fail(f"{'the gate' if p is gate else 'the up'} projection {p.value.name} carries a LoRA "
                                f"adapter ({_base.node_label(node)}): {self.op} has no form with adapters", p.value)
                    return False
                bias = node.inputs[4] if len(node.inputs) > 4 else None
                b = bias.const_value.numpy() if bias is not None and bias.const_value is not None else None
                if b is None or np.any(b != 0):
                    result.fail(f"{'the gate' if p is gate else 'the up'} projection {p.value.name} "
                                f"({_base.node_label(node)}) adds a bias: {LORA_SWIGLU.name}'s projections have none",
                                p.value)
                    return False
                if node.attributes.get_string("backend", "auto") != "auto":
                    result.fail(f"{_base.node_label(node)} has backend="
                                f"{node.attributes.get_string('backend', 'auto')}: a projection with a chosen "
                                "backend is kept as it is", p.value)
                    return False
                cand.lora = True
                continue
            if node.op_type == "Gemm":
                a = node.attributes
                if a.get_int("transA", 0) or a.get_float("alpha", 1.0) != 1.0:
                    result.fail(f"{_base.node_label(node)} is a Gemm with transA=1 or alpha != 1: not fused",
                                node.outputs[0])
                    return False
                if len(node.inputs) > 2 and node.inputs[2] is not None:
                    result.fail(f"{_base.node_label(node)} adds a bias ({node.inputs[2].name}): SwiGLU's projections "
                                "have none", node.outputs[0])
                    return False
        if (gate.select is None) != (up.select is None):
            p = gate if gate.select is not None else up
            result.fail(f"only one of gate and up ({p.value.name}) is a column range of a projection "
                        f"({_base.node_label(p.gemm)}); the other has its own", p.value)
            return False
        if gate.select is None:
            return True
        if gate.gemm is not up.gemm:
            result.fail(f"gate {gate.value.name} and up {up.value.name} are column ranges of two different "
                        f"projections ({_base.node_label(gate.gemm)}, {_base.node_label(up.gemm)})", up.value)
            return False
        merged = gate.gemm.outputs[0]
        od = _base.dims(merged)
        w = gate.gemm.inputs[1]
        total = od[-1] if od and isinstance(od[-1], int) else None
        if total is None and w.const_value is not None and len(w.const_value.shape) == 2:
            trans = gate.gemm.op_type == "Gemm" and gate.gemm.attributes.get_int("transB", 0)
            total = int(w.const_value.shape[0 if trans else 1])
        if total is None:
            result.fail(f"the width of {merged.name} is unknown", merged)
            return False
        rank = len(od) if od is not None else None
        g_cols = _columns(gate, total, rank, result)
        u_cols = _columns(up, total, rank, result) if g_cols is not None else None
        if g_cols is None or u_cols is None:
            return False
        half = total // 2
        if total % 2 or sorted([g_cols, u_cols]) != [(0, half), (half, total)]:
            result.fail(f"gate {gate.value.name} takes columns [{g_cols[0]}, {g_cols[1]}) and up {up.value.name} "
                        f"[{u_cols[0]}, {u_cols[1]}) of {merged.name} ({total} columns): not its two halves", up.value)
            return False
        cand.gate_cols, cand.up_cols = g_cols, u_cols
        return True

    @staticmethod
    def _uses(cand: Candidate, result: MatchResult) -> bool:
        inside = {id(n) for n in cand.nodes}
        for node in cand.nodes:
            if node is cand.mul:
                continue
            for v in node.outputs:
                if v is not None and (v.is_graph_output() or any(id(u.node) not in inside for u in v.uses())):
                    result.fail(_explain._other_uses(cand.nodes, cand.mul), v)
                    return False
        return True

    @staticmethod
    def _weights(cand: Candidate, result: MatchResult) -> bool:
        gate, up = cand.gate, cand.up
        if _base.check_float_dtypes(result, X=gate.x, W_gate=gate.gemm.inputs[1], W_up=up.gemm.inputs[1]) is None \
                and not result:
            return False

        def trans(p: Projection) -> bool:
            return p.gemm.op_type == "Gemm" and bool(p.gemm.attributes.get_int("transB", 0))

        cand.trans = (trans(gate), trans(up))
        if gate.select is not None:
            w = _base.weight_kn(result, gate.gemm.inputs[1], "the merged gate/up weight", cand.trans[0])
            if w is None:
                return False
            cand.wg = np.ascontiguousarray(w[:, cand.gate_cols[0]:cand.gate_cols[1]])
            cand.wu = np.ascontiguousarray(w[:, cand.up_cols[0]:cand.up_cols[1]])
            cand.kn = cand.wg.shape
            return True
        cand.wg = _base.weight_kn(result, gate.gemm.inputs[1], "the gate weight", cand.trans[0])
        cand.wu = _base.weight_kn(result, up.gemm.inputs[1], "the up weight", cand.trans[1]) \
            if cand.wg is not None else None
        if cand.wg is None or cand.wu is None:
            return False
        if cand.lora:
            adapters = [v for p in (gate, up) if _lora(p.gemm) for v in p.gemm.inputs[2:4]]
            if _base.check_float_dtypes(result, X=gate.x, **{v.name: v for v in adapters}) is None and not result:
                return False
            from ..kernels.ops_header import triton_table
            most = int(triton_table().MAX_LORA_RANK)  # the GPU kernels' largest rank
            ranks = [int(p.gemm.inputs[2].shape[1]) for p in (gate, up) if _lora(p.gemm)]
            if max(ranks) > most:
                result.fail(f"an adapter of rank {max(ranks)}: {LORA_SWIGLU.name} takes ranks up to {most}",
                            gate.value)
                return False
        if cand.wg.shape != cand.wu.shape:
            result.fail(f"the gate weight {gate.gemm.inputs[1].name} {list(cand.wg.shape)} and the up weight "
                        f"{up.gemm.inputs[1].name} {list(cand.wu.shape)} differ in shape", up.gemm.inputs[1])
            return False
        cand.kn = cand.wg.shape
        return True

    # -------------------------------------------------------------------------------------------- rewriting

    def _replace(self, graph: ir.Graph, cand: Candidate) -> None:
        if cand.lora:
            return replace_lora(self, graph, cand)
        gate, up, rec = cand.gate, cand.up, self.recorder
        shim = _Shim(graph)
        x = gate.x
        k, n = cand.wg.shape
        if gate.select is not None:
            w = gate.gemm.inputs[1]
            wg = rec.derived(shim, graph, w, f"_gate{cand.gate_cols[0]}_KxN", lambda: cand.wg)
            wu = rec.derived(shim, graph, w, f"_up{cand.up_cols[0]}_KxN", lambda: cand.wu)
        else:
            wg = self._weight_kn(shim, graph, gate, cand.wg, cand.trans[0])
            wu = self._weight_kn(shim, graph, up, cand.wu, cand.trans[1])
        act = cand.activation
        node = ir.Node(DOMAIN, OP, [x, wg, wu],
                       [ir.AttrString("activation", act), ir.AttrString("backend", "auto")],
                       overload=swiglu_overload(act), num_outputs=1)
        old_out = cand.mul.outputs[0]
        node.outputs[0].dtype = old_out.dtype
        node.outputs[0].shape = old_out.shape
        merged = gate.select is not None
        if merged:  # the merged projection's module is a child of the MLP (gate_up_proj): name the MLP
            module = _base.module_path([gate.gemm]).rsplit(".", 1)
            module = module[0] if len(module) == 2 else "root"
        else:
            module = _base.module_path([gate.gemm, up.gemm])
        flops = _base.gemm_flops(x, k, n)
        shapes = {"X": _base.dims(x), "W_gate": [k, n], "W_up": [k, n]}
        linear = ("merged " + "/".join(dict.fromkeys(n.op_type for n in (gate.select, up.select)))) if merged \
            else "/".join(dict.fromkeys(p.gemm.op_type for p in (gate, up)))
        extra = [f"activation: {act}", f"  spelled: {cand.spelling}"[:64]]
        if merged:
            extra += [f"merged weight {gate.gemm.inputs[1].name}"[:64],
                      f"  cut at fuse time: gate cols [{cand.gate_cols[0]},{cand.gate_cols[1]})",
                      f"  up cols [{cand.up_cols[0]},{cand.up_cols[1]})"]
        rule = f"{PATTERN}/{act}" + (" (merged gate_up)" if merged else "")
        _base.annotate(node, rec, PATTERN, rule, OP, module, [(m.name or "?", m.op_type) for m in cand.nodes],
                       shapes, x.dtype or gate.gemm.inputs[1].dtype, None if flops is None else 2 * flops,
                       extra_doc=tuple(extra), detail=act)
        node.metadata_props["onnxfuse.activation"] = act
        node.metadata_props["onnxfuse.projections"] = linear
        ir.convenience.replace_nodes_and_values(graph, cand.mul, cand.nodes, [node], [old_out], [node.outputs[0]])


    def _weight_kn(self, shim: _Shim, graph: ir.Graph, p: Projection, w_kn: np.ndarray, trans: bool) -> ir.Value:
        """A projection's weight as the ops take it, [K, N]: its own initializer, or (a Gemm with transB) the
        transpose, made once per graph."""
        w = p.gemm.inputs[1]
        return w if not trans else self.recorder.derived(shim, graph, w, "_KxN", lambda: w_kn)

def _is_mul(node: ir.Node) -> bool:
    return node.op_type == "Mul" and node.domain in DEFAULT_DOMAINS and len(node.inputs) == 2 \
        and None not in node.inputs and len(node.outputs) == 1


def rules(recorder):
    return SwiGLUPass(recorder)
