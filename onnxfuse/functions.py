"""Model-local ONNX functions for the onnxfuse ops: their bodies are the subgraphs the ops replace.

A fused model carries one function per onnxfuse op it uses. onnxruntime inlines the function when the kernel
library is not registered (so the model stays runnable and meaningful anywhere) and runs the custom kernel when it
is; onnx.checker and shape inference see through the function to type every fused node.
"""
from __future__ import annotations

import onnx
from onnx import AttributeProto, helper

from .ops.swiglu import GATE_ACTIVATIONS_WITH_CONSTANTS  # noqa: F401  (functions.GATE_ACTIVATIONS_WITH_CONSTANTS)
from .ops._family import split_optional_overload
from .schema import DOMAIN, DOMAIN_VERSION, ONNX_OPSET, OPS, op_def


def function_proto(op: str, overload: str = "", opset: int = ONNX_OPSET) -> onnx.FunctionProto:
    """The model-local function of `op`; for MLPStack, of the overload naming its activations (relu.relu.sigmoid),
    since an ONNX function has a fixed number of inputs; for SwiGLU, of the overload naming its activation (gelu,
    ...; the empty overload is silu, what nodes written before the activation attribute carry); for an op with
    optional inputs (Int4Linear's zero points), of the overload with its suffix when they are present. `opset` is the
    model's default-domain opset: a function must import the same version as the model (onnx.checker), and the
    rules only fuse where the body is valid in it (each op's `min_opset`, onnxfuse/ops/). The body comes from the
    op's family (schema.op_def(op).body)."""
    schema, definition = OPS[op], op_def(op)
    base, _ = split_optional_overload(overload, definition.optional_overload)  # "silu.zp": silu's, with zero points
    defaults = []
    for a in schema.attrs:
        default = base if a.name == definition.overload_attr and base else a.default
        defaults.append(helper.make_attribute(a.name, default))
    inputs, body = definition.body(overload)
    # a body of onnxruntime's contrib ops (CachedAttention's GroupQueryAttention) imports their domain too
    extra = sorted({n.domain for n in body if n.domain not in ("", "ai.onnx")})
    f = helper.make_function(
        DOMAIN, op, inputs, list(schema.outputs), body,
        opset_imports=[helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in extra)],
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
    imported = {o.domain for o in model.opset_import}
    for f in model.functions:  # the domains the bodies use (com.microsoft), which the model must import as well
        for o in f.opset_import:
            if o.domain not in imported and o.domain not in ("", "ai.onnx"):
                model.opset_import.append(helper.make_opsetid(o.domain, o.version))
                imported.add(o.domain)
