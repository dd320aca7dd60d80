"""The LoRA side of the swiglu pass (rewrites/swiglu.py): a gated MLP whose gate and/or up projection is a LoRALinear
becomes one LoRASwiGLU (`replace_lora`), and a LoRASwiGLU whose activation feeds only the down projection's
LoRALinear becomes one LoRAGatedMLP with it (`gated_mlps`): the down adapter's X @ A then comes out of the gated
kernel's epilogue instead of a pass of its own over the [M, N] activation (issue 30; H100, the Llama-2-7B MLP with
rank-16 adapters against the base MLP: the mixed batch of 8 rows 1.19x -> 1.15x, 16 tokens 1.057x -> 1.044x, 2048
tokens neutral; README). The functions take the pass (`sw`) for its recorder, refusals and weight helper."""
from __future__ import annotations

import dataclasses

import numpy as np
from onnxscript import ir

from ..ops.lora_linear import LORA_LINEAR, LORA_LINEAR_RELU
from ..ops.swiglu import LORA_GATED_MLP, LORA_SWIGLU
from ..schema import DOMAIN, swiglu_overload
from . import _base

PATTERN = "swiglu"


@dataclasses.dataclass
class _Shim:
    """The `op.initializer` the rules get from the pattern rewriter, for this graph pass."""
    graph: ir.Graph

    def initializer(self, tensor, name: str) -> ir.Value:
        value = ir.Value(name=name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype),
                         const_value=tensor)
        self.graph.register_initializer(value)
        return value


def is_lora(node: ir.Node | None) -> bool:
    """A LoRA-adapted projection the lora_linear rule fused before this pass (LoRALinear: X, W [K, N], A, B, bias,
    attribute scale): with a zero bias it is a gated MLP's projection with its adapter (LoRASwiGLU)."""
    return node is not None and node.domain == DOMAIN and node.op_type == LORA_LINEAR.name


def replace_lora(sw, graph: ir.Graph, cand) -> None:
    """One LoRASwiGLU for a gated MLP whose gate and/or up projection is a LoRALinear (zero bias): its W, A, B and
    scale; a projection without an adapter gets a zero one of the other's rank (constants: what it adds is 0)."""
    gate, up, rec = cand.gate, cand.up, sw.recorder
    shim = _Shim(graph)
    x = gate.x
    k, n = cand.wg.shape
    rank = next(int(p.gemm.inputs[2].shape[1]) for p in (gate, up) if is_lora(p.gemm))
    parts = {}
    for side, p, w_kn, trans in (("gate", gate, cand.wg, cand.trans[0]), ("up", up, cand.wu, cand.trans[1])):
        if is_lora(p.gemm):
            parts[side] = (p.gemm.inputs[1], p.gemm.inputs[2], p.gemm.inputs[3],
                           float(p.gemm.attributes.get_float("scale", 1.0)))
            continue
        w = sw._weight_kn(shim, graph, p, w_kn, trans)
        za = rec.derived(shim, graph, p.gemm.inputs[1], f"_zero_A{rank}",
                         lambda: np.zeros((k, rank), dtype=w_kn.dtype))
        zb = rec.derived(shim, graph, p.gemm.inputs[1], f"_zero_B{rank}",
                         lambda: np.zeros((rank, n), dtype=w_kn.dtype))
        parts[side] = (w, za, zb, 1.0)
    act = cand.activation
    (wg, ag, bg, sg), (wu, au, bu, su) = parts["gate"], parts["up"]
    node = ir.Node(DOMAIN, LORA_SWIGLU.name, [x, wg, wu, ag, bg, au, bu],
                   [ir.AttrString("activation", act), ir.AttrFloat32("scale_gate", sg),
                    ir.AttrFloat32("scale_up", su), ir.AttrString("backend", "auto")],
                   overload=swiglu_overload(act), num_outputs=1)
    old_out = cand.mul.outputs[0]
    node.outputs[0].dtype = old_out.dtype
    node.outputs[0].shape = old_out.shape
    rg, ru = int(ag.shape[1]), int(au.shape[1])
    base = _base.gemm_flops(x, k, n)
    flops = None if base is None else 2 * base + base // n * (rg + ru) + base // k * (rg + ru)
    shapes = {"X": _base.dims(x), "W_gate": [k, n], "W_up": [k, n], "A_gate": [k, rg], "B_gate": [rg, n],
              "A_up": [k, ru], "B_up": [ru, n]}
    fed = any(v.is_graph_input() for v in (ag, bg, au, bu))
    extra = [f"activation: {act}", f"  spelled: {cand.spelling}"[:64], f"LoRA ranks {rg} / {ru}",
             "adapters: " + ("graph inputs" if fed else "constants")]
    # the LoRALinear matches this one absorbs leave the report: their original nodes are this match's
    replaced = []
    for m in cand.nodes:
        prior = next((mt for mt in rec.matches if mt.node == m.name), None) if is_lora(m) else None
        if prior is not None:
            rec.matches.remove(prior)
            replaced += prior.replaced
        else:
            replaced.append((m.name or "?", m.op_type))
    _base.annotate(node, rec, PATTERN, f"{PATTERN}/lora/{act}", LORA_SWIGLU.name,
                   _base.module_path([gate.gemm, up.gemm]), replaced, shapes, x.dtype or wg.dtype, flops,
                   extra_doc=tuple(extra), detail=act)
    node.metadata_props["onnxfuse.activation"] = act
    ir.convenience.replace_nodes_and_values(graph, cand.mul, cand.nodes, [node], [old_out], [node.outputs[0]])


def gated_mlps(sw, graph: ir.Graph, tracer) -> int:
    """Each LoRASwiGLU whose activation feeds only a LoRALinear (as its X) becomes one LoRAGatedMLP with that down
    projection. A LoRASwiGLU feeding a LoRALinear (or LoRALinearRelu) that cannot join it is left, with the reason
    among the pass's refusals (`fuse --explain`). Returns the number made (each replaces two fused nodes by one)."""
    count = 0
    for node in list(graph):
        if node.domain != DOMAIN or node.op_type != LORA_SWIGLU.name:
            continue
        h = node.outputs[0]
        uses = list(h.uses())
        downs = [u for u in uses if u.node.domain == DOMAIN
                 and u.node.op_type in (LORA_LINEAR.name, LORA_LINEAR_RELU.name)]
        if not downs:
            continue  # a plain down projection: LoRASwiGLU and its GEMM, nothing to join
        down, index = downs[0].node, downs[0].idx
        reason = None
        if h.is_graph_output():
            reason = f"its activation {h.name} is a graph output"
        elif len(uses) != 1:
            reason = f"its activation {h.name} has {len(uses)} uses"
        elif down.op_type != LORA_LINEAR.name:
            reason = f"the down projection is a {down.op_type}"
        elif index != 0 or down.graph is not graph:
            reason = "the down projection does not take the activation as its X"
        if reason is not None:
            if tracer is None:
                sw.refusals.append({"rule": f"{PATTERN}/lora_mlp", "node": _base.node_label(node),
                                    "op_type": node.op_type,
                                    "reason": f"{LORA_SWIGLU.name} stays apart from its down projection: {reason}"})
            continue
        if tracer is None:
            join_down(sw, graph, node, down)
            count += 1
    return count


def join_down(sw, graph: ir.Graph, gated: ir.Node, down: ir.Node) -> None:
    """Replace `gated` (LoRASwiGLU) and `down` (the LoRALinear on its activation) by one LoRAGatedMLP; their two report
    entries become its one."""
    rec = sw.recorder
    attrs = gated.attributes
    act = attrs["activation"].value if "activation" in attrs else "silu"
    new = ir.Node(DOMAIN, LORA_GATED_MLP.name, [*gated.inputs, *down.inputs[1:5]],
                  [ir.AttrString("activation", act),
                   ir.AttrFloat32("scale_gate", attrs.get_float("scale_gate", 1.0)),
                   ir.AttrFloat32("scale_up", attrs.get_float("scale_up", 1.0)),
                   ir.AttrFloat32("scale_down", down.attributes.get_float("scale", 1.0)),
                   ir.AttrString("backend", attrs["backend"].value if "backend" in attrs else "auto")],
                  overload=gated.overload, num_outputs=1)
    out = down.outputs[0]
    new.outputs[0].dtype = out.dtype
    new.outputs[0].shape = out.shape
    prior = [mt for mt in rec.matches if mt.node in (gated.name, down.name)]
    for mt in prior:
        rec.matches.remove(mt)
    replaced = [r for mt in prior for r in mt.replaced]
    shapes = {}
    for mt in prior:  # LoRASwiGLU's names as they are, the down projection's as W_down, A_down, B_down, bias_down
        for k, v in mt.shapes.items():
            if mt.op == LORA_SWIGLU.name:
                shapes[k] = v
            elif k != "X":
                shapes["bias_down" if k == "bias" else f"{k}_down"] = v
    flops = None if not prior or any(mt.flops is None for mt in prior) else sum(mt.flops for mt in prior)
    ranks = [v.shape[1] if v.shape is not None else "?" for v in (gated.inputs[3], gated.inputs[5], down.inputs[2])]
    fed = any(v.is_graph_input() for v in (*gated.inputs[3:7], *down.inputs[2:4]))
    extra = [f"activation: {act}", "LoRA ranks " + " / ".join(str(r) for r in ranks),
             "adapters: " + ("graph inputs" if fed else "constants"), "down X @ A: in the gated kernel's epilogue"]
    module = _base.common_module([mt.module.split(".") for mt in prior]) if prior else "root"
    _base.annotate(new, rec, PATTERN, f"{PATTERN}/lora_mlp/{act}", LORA_GATED_MLP.name, module, replaced, shapes,
                   out.dtype, flops, extra_doc=tuple(extra), detail=act)
    new.metadata_props["onnxfuse.activation"] = act
    ir.convenience.replace_nodes_and_values(graph, down, [gated, down], [new], [out], [new.outputs[0]])
