"""Model-local ONNX functions for the onnxfuse ops: their bodies are the subgraphs the ops replace.

A fused model carries one function per onnxfuse op it uses. onnxruntime inlines the function when the kernel
library is not registered (so the model stays runnable and meaningful anywhere) and runs the custom kernel when it
is; onnx.checker and shape inference see through the function to type every fused node.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import AttributeProto, helper, numpy_helper

import math

from .schema import (DOMAIN, DOMAIN_VERSION, EMBEDDING_OPS, GATE_ACTIVATIONS, GELU_TANH_COEFF, HASHES, INTERACTIONS,
                     ONNX_OPSET, OPS, QUICK_GELU_ALPHA, STACK_ACTIVATIONS, embedding_overload, stack_input_names,
                     stack_overload)

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


def _const(out: str, value, dtype=np.int64) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [out], value=numpy_helper.from_array(np.asarray(value, dtype=dtype), out))


def _embedding_body(op: str, interaction: str, hash_: str) -> list[onnx.NodeProto]:
    """The embedding ops' bodies, with the kernels' semantics (schema.py): a negative id counts from its table's
    end, an id still outside [0, cardinality[f]) or a row outside the table gives a zero vector (a Where, so an inf/NaN in the table never leaks into it); bags are a
    0/1 membership matrix [F, B, N] times the looked-up rows (exact for any offsets, and only the fallback path:
    it costs F*B*N elements); the strict lower triangle is selected with Compress over a Less(j, i) mask."""
    mk = helper.make_node
    nodes = [_const("zero", 0), _const("one", 1), _const("axis0", [0]), _const("axis1", [1]), _const("axis_last", [-1]),
             _const("zero_f", 0.0, np.float32), mk("CastLike", ["zero_f", "X"], ["zero_t"]),
             mk("Shape", ["table"], ["table_rows"], start=0, end=1)]

    def lookup(ids: str, card: str, offs: str, out: str) -> None:
        """out = table rows of ids (+ their table's offset), zero where the id or the row is out of range."""
        nodes.extend([
            # a negative id counts from the end of its table (ONNX Gather)
            mk("Less", [ids, "zero"], [f"{out}_neg"]), mk("Add", [ids, card], [f"{out}_wrapped"]),
            mk("Where", [f"{out}_neg", f"{out}_wrapped", ids], [f"{out}_id"]),
            mk("Add", [f"{out}_id", offs], [f"{out}_row"]),
            mk("GreaterOrEqual", [f"{out}_id", "zero"], [f"{out}_v1"]), mk("Less", [f"{out}_id", card], [f"{out}_v2"]),
            mk("GreaterOrEqual", [f"{out}_row", "zero"], [f"{out}_v3"]),
            mk("Less", [f"{out}_row", "table_rows"], [f"{out}_v4"]),
            mk("And", [f"{out}_v1", f"{out}_v2"], [f"{out}_v12"]), mk("And", [f"{out}_v3", f"{out}_v4"], [f"{out}_v34"]),
            mk("And", [f"{out}_v12", f"{out}_v34"], [f"{out}_ok"]),
            mk("Where", [f"{out}_ok", f"{out}_row", "zero"], [f"{out}_safe"]),
            mk("Gather", ["table", f"{out}_safe"], [f"{out}_g"], axis=0),
            mk("Unsqueeze", [f"{out}_ok", "axis_last"], [f"{out}_oku"]),
            mk("Where", [f"{out}_oku", f"{out}_g", "zero_t"], [out])])

    if op == "EmbeddingInteraction":
        ids = "ids"
        if hash_ == "mod":
            nodes += [mk("Add", ["ids", "one"], ["ids1"]), mk("Mod", ["ids1", "cardinality"], ["hashed"], fmod=0)]
            ids = "hashed"
        lookup(ids, "cardinality", "table_offsets", "emb")                     # [B, F, d]
    else:
        nodes += [
            # bag(f, b) = [clamp(offsets[f, b]), clamp(end[f, b])), end = the next offset, N for the last bag
            mk("Shape", ["indices"], ["n_idx1"], start=1, end=2), mk("Squeeze", ["n_idx1", "axis0"], ["n_idx"]),
            mk("Shape", ["offsets"], ["n_feat1"], start=0, end=1), mk("Concat", ["n_feat1", "axis1"], ["col_shape"], axis=0),
            mk("Reshape", ["n_idx1", _c(nodes, "shape11", [1, 1])], ["n_idx11"]),
            mk("Expand", ["n_idx11", "col_shape"], ["last_end"]),
            mk("Slice", ["offsets", "axis1", _c(nodes, "big", [2 ** 62]), "axis1"], ["next_off"]),
            mk("Concat", ["next_off", "last_end"], ["ends"], axis=1),
            mk("Max", ["offsets", "zero"], ["s0"]), mk("Min", ["s0", "n_idx"], ["starts"]),
            mk("Max", ["ends", "zero"], ["e0"]), mk("Min", ["e0", "n_idx"], ["stops"]),
            mk("Range", ["zero", "n_idx", "one"], ["pos"]),
            mk("Unsqueeze", ["starts", "axis_last"], ["starts3"]), mk("Unsqueeze", ["stops", "axis_last"], ["stops3"]),
            mk("LessOrEqual", ["starts3", "pos"], ["m1"]), mk("Less", ["pos", "stops3"], ["m2"]),
            mk("And", ["m1", "m2"], ["member"]),                                  # [F, B, N]
            mk("CastLike", ["member", "X"], ["member_t"]),
            mk("Unsqueeze", ["cardinality", "axis_last"], ["card_col"]),
            mk("Unsqueeze", ["table_offsets", "axis_last"], ["offs_col"])]
        lookup("indices", "card_col", "offs_col", "rows")                         # [F, N, d]
        nodes += [mk("MatMul", ["member_t", "rows"], ["pooled"]),                # [F, B, d]
                  mk("Transpose", ["pooled"], ["emb"], perm=[1, 0, 2])]           # [B, F, d]
    nodes += [mk("Unsqueeze", ["X", "axis1"], ["x3"]), mk("Concat", ["x3", "emb"], ["vectors"], axis=1)]  # [B, n, d]
    if interaction == "cat":
        nodes.append(mk("Flatten", ["vectors"], ["Y"], axis=1))
        return nodes
    nodes += [
        mk("Transpose", ["vectors"], ["vectors_t"], perm=[0, 2, 1]), mk("MatMul", ["vectors", "vectors_t"], ["gram"]),
        mk("Flatten", ["gram"], ["gram_flat"], axis=1),                           # [B, n*n]
        mk("Shape", ["vectors"], ["n_vec1"], start=1, end=2), mk("Squeeze", ["n_vec1", "axis0"], ["n_vec"]),
        mk("Range", ["zero", "n_vec", "one"], ["r"]),
        mk("Unsqueeze", ["r", "axis1"], ["ri"]), mk("Unsqueeze", ["r", "axis0"], ["rj"]),
        mk("Less", ["rj", "ri"], ["below"]), mk("Mul", ["ri", "n_vec"], ["ri_n"]), mk("Add", ["ri_n", "rj"], ["flat"]),
        mk("Reshape", ["flat", "axis_last"], ["flat1"]), mk("Reshape", ["below", "axis_last"], ["below1"]),
        mk("Compress", ["flat1", "below1"], ["pairs"], axis=0),                   # i > j, i-major
        mk("Gather", ["gram_flat", "pairs"], ["tri"], axis=1),
        mk("Concat", ["X", "tri"], ["Y"], axis=1)]
    return nodes


def _c(nodes: list, name: str, value) -> str:
    """A named int64 Constant appended to `nodes` (for the bag body's shapes); returns its name."""
    nodes.append(_const(name, value))
    return name


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
    elif op in EMBEDDING_OPS:
        parts = overload.split(".")
        interaction, hash_ = parts[0], (parts[1] if len(parts) > 1 else "none")
        if interaction not in INTERACTIONS or hash_ not in HASHES or embedding_overload(op, interaction, hash_) != overload:
            raise ValueError(f"{op}: function overload {overload!r} does not name the interaction"
                             + (" and hash" if op == "EmbeddingInteraction" else ""))
        inputs, body = list(schema.inputs), _embedding_body(op, interaction, hash_)
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
