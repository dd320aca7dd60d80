"""mlp_stack: a chain of Linear+activation layers -> one `MLPStack` node.

    h_0 = X;  h_i = act_i(h_{i-1} @ W_i + bias_i), i = 1..L;  Y = h_L        act_i in {relu, sigmoid}

Runs after `linear_act`, on its output: consecutive `LinearRelu` / `LinearSigmoid` nodes where each one's output
feeds only the next one's X (a DLRM bottom MLP 13-512-256-64-16, its top MLP ending in the sigmoid). A chain is
a variable-length pattern, which the pattern rewriter cannot spell, so this is a small graph pass with the same
contract as the rules: it records each match for the report, names and annotates the node for Netron, and with
`--explain` says why two adjacent layers were not chained.

Why: at DLRM sizes every layer is a few microseconds of GPU work, so the chain is bound by per-layer launches and
the HBM round trip of each intermediate. One MLPStack node runs as ONE Triton kernel on the GPU (each program
keeps its row block's activations on chip, in L1/L2, through all layers), and as a loop of the fused CPU GEMM on
the CPU. Refused: an intermediate used by anything else or returned as a graph output (it must exist in memory),
layers of different element types. Chains longer than MAX_STACK_LAYERS (4, what one kernel launch unrolls)
become several stacks.

An ONNX function has a fixed number of inputs, so each node names its function by overload: the activations
joined with dots (`relu.relu.relu.relu`), and the fused model carries one function per overload used.
"""
from __future__ import annotations

from onnxscript import ir

from ..ops.linear_act import LINEAR_RELU, LINEAR_SIGMOID
from ..ops.mlp_stack import MLP_STACK
from ..schema import DOMAIN, MAX_STACK_LAYERS, stack_overload
from . import _base

LAYER_OPS = {LINEAR_RELU.name: "relu", LINEAR_SIGMOID.name: "sigmoid"}
PATTERN = "mlp_stack"
STACK_DOC = ("GPU: one Triton kernel for the whole",
             "  stack while M is small (row blocks keep",
             "  their activations on chip), else one",
             "  GEMM launch per layer; cuda backend:",
             "  one launch per layer",
             "  override: the node's stack_mode attribute",
             "  (auto|fused|layers)")


def _is_layer(node: ir.Node | None) -> bool:
    return node is not None and node.domain == DOMAIN and node.op_type in LAYER_OPS


def _next_layer(node: ir.Node, refusals: list[dict] | None) -> ir.Node | None:
    """The layer this one feeds, if the pair can be chained; else None (with the reason, when the consumer is a
    layer that could have been chained)."""
    out = node.outputs[0]
    layer_users = [u for u in out.uses() if _is_layer(u.node)]
    if not layer_users:
        return None

    def refuse(reason: str) -> None:
        if refusals is not None:
            refusals.append({"rule": f"{PATTERN}/chain", "node": _base.node_label(node), "op_type": node.op_type,
                             "reason": reason})

    if out.is_graph_output():
        refuse(f"the output {out.name} of this layer is a graph output, so it must be written to memory")
        return None
    if len(out.uses()) != 1:
        refuse(f"the output {out.name} of this layer has {len(out.uses())} uses; a stack only chains a layer whose "
               "output feeds the next layer alone")
        return None
    use = layer_users[0]
    if use.idx != 0:
        refuse(f"the output {out.name} feeds input {use.idx} of {_base.node_label(use.node)}, not its X")
        return None
    if out.dtype is not None and use.node.outputs[0].dtype is not None and out.dtype != use.node.outputs[0].dtype:
        refuse("the two layers have different element types")
        return None
    return use.node


def _common_module(nodes: list[ir.Node]) -> str:
    return _base.common_module([n.metadata_props.get("onnxfuse.module", "root").split(".") for n in nodes])


def _width(value: ir.Value | None, axis: int):
    d = _base.dims(value) if value is not None else None
    return d[axis] if d else "?"


class MLPStackPass(_base.GraphPass):
    """Chains LinearRelu/LinearSigmoid nodes into MLPStack nodes. Its refusals: why adjacent layers were not chained,
    recorded during the real pass (the explain re-run sees the stacks, no longer the layers)."""

    def chains(self, graph: ir.Graph, refusals: list[dict] | None = None) -> list[list[ir.Node]]:
        nxt: dict[int, ir.Node] = {}
        has_prev: set[int] = set()
        layers = [n for n in graph if _is_layer(n)]
        for n in layers:
            m = _next_layer(n, refusals)
            if m is not None:
                nxt[id(n)] = m
                has_prev.add(id(m))
        out = []
        for n in layers:
            if id(n) in has_prev:
                continue
            chain = [n]
            while id(chain[-1]) in nxt:
                chain.append(nxt[id(chain[-1])])
            # Longer chains become several stacks of at most MAX_STACK_LAYERS; a lone layer stays as it is.
            for i in range(0, len(chain), MAX_STACK_LAYERS):
                part = chain[i:i + MAX_STACK_LAYERS]
                if len(part) >= 2:
                    out.append(part)
        return out

    def apply_to_model(self, model: ir.Model, tracer=None) -> int:
        """Chain the layers of the main graph and of its If/Loop/Scan bodies. With a tracer (the --explain re-run
        over the fused model) nothing changes: the refusals were recorded by the real pass."""
        if tracer is not None:
            return 0
        self.refusals = []
        count = 0
        for graph in _base.graphs(model.graph):
            for chain in self.chains(graph, self.refusals):
                self._replace(graph, chain)
                count += 1
        return count

    def _replace(self, graph: ir.Graph, chain: list[ir.Node]) -> None:
        acts = [LAYER_OPS[n.op_type] for n in chain]
        inputs = [chain[0].inputs[0]]
        for n in chain:
            inputs += [n.inputs[1], n.inputs[2]]
        backend = chain[0].attributes.get_string("backend", "auto") if "backend" in chain[0].attributes else "auto"
        node = ir.Node(DOMAIN, MLP_STACK.name, inputs,
                       [ir.AttrString("activations", stack_overload(acts)), ir.AttrString("backend", backend)],
                       overload=stack_overload(acts), num_outputs=1)
        old_out = chain[-1].outputs[0]
        node.outputs[0].dtype = old_out.dtype
        node.outputs[0].shape = old_out.shape
        # The matches of the layers become one match of the stack: the report counts final nodes.
        names = {n.name for n in chain}
        layer_matches = [m for m in self.recorder.matches if m.node in names]
        self.recorder.matches[:] = [m for m in self.recorder.matches if m.node not in names]
        replaced = [r for m in layer_matches for r in m.replaced] or [(n.name or "?", n.op_type) for n in chain]
        flops = None if not layer_matches or any(m.flops is None for m in layer_matches) \
            else sum(m.flops for m in layer_matches)
        shapes = {"X": _base.dims(inputs[0])}
        for i, n in enumerate(chain, start=1):
            shapes[f"W_{i}"] = [_width(n.inputs[1], 0), _width(n.inputs[1], 1)]
        dims = [str(_width(chain[0].inputs[1], 0))] + [str(_width(n.inputs[1], 1)) for n in chain]
        _base.annotate(node, self.recorder, PATTERN, f"{PATTERN}/{len(chain)}-layers", MLP_STACK.name,
                       _common_module(chain), replaced, shapes, inputs[0].dtype, flops,
                       extra_doc=(f"layers: {'-'.join(dims)}", f"activations: {', '.join(acts)}", *STACK_DOC))
        # Stack names replace the per-layer names (free them so a later stack may reuse one).
        self.recorder.names.difference_update(names)
        ir.convenience.replace_nodes_and_values(graph, chain[-1], chain, [node], [old_out], [node.outputs[0]])


def rules(recorder):
    return MLPStackPass(recorder)
