"""Model-local ONNX functions for the onnxfuse ops: their bodies are the subgraphs the ops replace.

A fused model carries one function per onnxfuse op it uses. onnxruntime inlines the function when the kernel
library is not registered (so the model stays runnable and meaningful anywhere) and runs the custom kernel when it
is; onnx.checker and shape inference see through the function to type every fused node.
"""
from __future__ import annotations

import onnx
from onnx import AttributeProto, helper

import math

from .schema import (DOMAIN, DOMAIN_VERSION, GATE_ACTIVATIONS, GELU_TANH_COEFF, ONNX_OPSET, OPS, QUICK_GELU_ALPHA,
                     STACK_ACTIVATIONS, stack_input_names, stack_overload)

# SwiGLU activations whose body needs typed constants (Constant + CastLike, opset 15); the others need opset 13.
GATE_ACTIVATIONS_WITH_CONSTANTS = ("gelu", "gelu_tanh", "quick_gelu")


def _scale_constant(out: str) -> onnx.NodeProto:
    """Constant(value_float = @scale): the node attribute flows into the body when the function is inlined."""
    node = helper.make_node("Constant", [], [out])
    attr = AttributeProto(name="value_float", ref_attr_name="scale", type=AttributeProto.FLOAT)
    node.attribute.append(attr)
    return node


def _typed_constant(name: str, value: float, like: str) -> list[onnx.NodeProto]:
    """`name` = value in the element type of `like` (Constant, then CastLike: the body serves every T)."""
    mk = helper.make_node
    return [mk("Constant", [], [name + "_f"], value_float=float(value)), mk("CastLike", [name + "_f", like], [name])]


def _swiglu_body(activation: str) -> list[onnx.NodeProto]:
    """SwiGLU's body for one activation: g = X @ W_gate, u = X @ W_up, Y = act(g) * u, with act spelled as PyTorch
    defines it (in T: this is what runs without the kernel library)."""
    mk = helper.make_node
    nodes = [mk("MatMul", ["X", "W_gate"], ["g"]), mk("MatMul", ["X", "W_up"], ["u"])]
    if activation == "silu":
        nodes += [mk("Sigmoid", ["g"], ["sg"]), mk("Mul", ["g", "sg"], ["act"])]
    elif activation == "quick_gelu":
        nodes += [*_typed_constant("alpha", QUICK_GELU_ALPHA, "g"), mk("Mul", ["g", "alpha"], ["ag"]),
                  mk("Sigmoid", ["ag"], ["sg"]), mk("Mul", ["g", "sg"], ["act"])]
    elif activation in ("gelu", "gelu_tanh"):
        nodes += [*_typed_constant("half", 0.5, "g"), *_typed_constant("one", 1.0, "g")]
        if activation == "gelu":  # 0.5 * g * (1 + erf(g / sqrt(2)))
            nodes += [*_typed_constant("sqrt2", math.sqrt(2.0), "g"), mk("Div", ["g", "sqrt2"], ["z"]),
                      mk("Erf", ["z"], ["t"])]
        else:  # 0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 * g^3)))
            nodes += [*_typed_constant("kappa", GELU_TANH_COEFF, "g"),
                      *_typed_constant("beta", math.sqrt(2.0 / math.pi), "g"),
                      mk("Mul", ["g", "g"], ["g2"]), mk("Mul", ["g2", "g"], ["g3"]),
                      mk("Mul", ["kappa", "g3"], ["kg3"]), mk("Add", ["g", "kg3"], ["inner"]),
                      mk("Mul", ["beta", "inner"], ["z"]), mk("Tanh", ["z"], ["t"])]
        nodes += [mk("Add", ["one", "t"], ["onept"]), mk("Mul", ["half", "g"], ["hg"]),
                  mk("Mul", ["hg", "onept"], ["act"])]
    elif activation == "relu":
        nodes.append(mk("Relu", ["g"], ["act"]))
    elif activation == "sigmoid":
        nodes.append(mk("Sigmoid", ["g"], ["act"]))
    else:
        raise ValueError(f"SwiGLU: activation {activation!r} is not one of {', '.join(GATE_ACTIVATIONS)}")
    return nodes + [mk("Mul", ["act", "u"], ["Y"])]


def _body(op: str) -> list[onnx.NodeProto]:
    mk = helper.make_node
    if op in ("LinearRelu", "LinearSigmoid"):
        act = "Relu" if op == "LinearRelu" else "Sigmoid"
        return [mk("MatMul", ["X", "W"], ["xw"]), mk("Add", ["xw", "bias"], ["z"]), mk(act, ["z"], ["Y"])]
    if op in ("LoRALinear", "LoRALinearRelu"):
        last = "Y" if op == "LoRALinear" else "z"
        nodes = [mk("MatMul", ["X", "W"], ["xw"]), mk("Add", ["xw", "bias"], ["base"]),
                 mk("MatMul", ["X", "A"], ["xa"]), mk("MatMul", ["xa", "B"], ["xab"]),
                 _scale_constant("s32"), mk("CastLike", ["s32", "X"], ["s"]), mk("Mul", ["xab", "s"], ["branch"]),
                 mk("Add", ["base", "branch"], [last])]
        if op == "LoRALinearRelu":
            nodes.append(mk("Relu", ["z"], ["Y"]))
        return nodes
    if op == "Embedding":
        return [mk("Gather", ["table", "ids"], ["Y"], axis=0)]
    if op == "RotaryEmbedding":
        # D = last dim of X (Shape with start, opset 15), halves by Slice, rotate_half = concat(-second, first)
        i64 = onnx.TensorProto.INT64
        return [mk("Shape", ["X"], ["d"], start=-1), mk("Constant", [], ["two"], value=helper.make_tensor("", i64, [1], [2])),
                mk("Div", ["d", "two"], ["half"]),
                mk("Constant", [], ["zero"], value=helper.make_tensor("", i64, [1], [0])),
                mk("Constant", [], ["last"], value=helper.make_tensor("", i64, [1], [-1])),
                mk("Slice", ["X", "zero", "half", "last"], ["first"]),
                mk("Slice", ["X", "half", "d", "last"], ["second"]),
                mk("Neg", ["second"], ["neg_second"]), mk("Concat", ["neg_second", "first"], ["rot"], axis=-1),
                mk("Mul", ["X", "cos"], ["xc"]), mk("Mul", ["rot", "sin"], ["rs"]), mk("Add", ["xc", "rs"], ["Y"])]
    raise KeyError(op)


def _stack_body(activations: list[str]) -> list[onnx.NodeProto]:
    """MLPStack's body for one activation list: MatMul, Add, activation per layer."""
    mk = helper.make_node
    nodes, h = [], "X"
    for i, act in enumerate(activations, start=1):
        if act not in STACK_ACTIVATIONS:
            raise ValueError(f"MLPStack: activation {act!r} is not one of {', '.join(STACK_ACTIVATIONS)}")
        out = "Y" if i == len(activations) else f"h{i}"
        nodes += [mk("MatMul", [h, f"W_{i}"], [f"xw{i}"]), mk("Add", [f"xw{i}", f"bias_{i}"], [f"z{i}"]),
                  mk("Relu" if act == "relu" else "Sigmoid", [f"z{i}"], [out])]
        h = out
    return nodes


def function_proto(op: str, overload: str = "", opset: int = ONNX_OPSET) -> onnx.FunctionProto:
    """The model-local function of `op`; for MLPStack, of the overload naming its activations (relu.relu.sigmoid),
    since an ONNX function has a fixed number of inputs; for SwiGLU, of the overload naming its activation (gelu,
    ...; the empty overload is silu, what nodes written before the activation attribute carry). `opset` is the
    model's default-domain opset: a function must import the same version as the model (onnx.checker), and the
    rules only fuse where the body is valid in it (rewrites/_base.py MIN_OPSET)."""
    schema = OPS[op]
    defaults = []
    for a in schema.attrs:
        default = overload if op == "SwiGLU" and a.name == "activation" and overload else a.default
        defaults.append(helper.make_attribute(a.name, default))
    if op == "SwiGLU":
        inputs, body = list(schema.inputs), _swiglu_body(overload or "silu")
    elif schema.variadic:
        acts = overload.split(".") if overload else []
        if not acts or stack_overload(acts) != overload:
            raise ValueError(f"{op}: function overload {overload!r} does not name the layers' activations")
        inputs, body = stack_input_names(len(acts)), _stack_body(acts)
    else:
        inputs, body = list(schema.inputs), _body(op)
    f = helper.make_function(
        DOMAIN, op, inputs, list(schema.outputs), body,
        opset_imports=[helper.make_opsetid("", opset)],
        attributes=[], attribute_protos=defaults, doc_string=f"{schema.math}. {schema.doc}")
    f.overload = overload
    return f


def nodes(graph: onnx.GraphProto):
    """Every node of `graph` and of the If/Loop/Scan bodies nested in it."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for g in ([attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)):
                yield from nodes(g)


def model_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), ONNX_OPSET)


def add_functions(model: onnx.ModelProto) -> None:
    """Give every onnxfuse op (and overload) used in the model, control-flow bodies included, its function (once,
    in the model's opset), and import the domain."""
    used = {(n.op_type, n.overload) for n in nodes(model.graph) if n.domain == DOMAIN}
    have = {(f.name, f.overload) for f in model.functions if f.domain == DOMAIN}
    opset = model_opset(model)
    for op, overload in sorted(used - have):
        model.functions.append(function_proto(op, overload, opset))
    if used and not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, DOMAIN_VERSION))
