"""The GEMM FLOPs of a model's main graph: what fuse reports as the share inside onnxfuse ops, what stage 1 uses to
decide whether a CPU check is affordable, and what bench divides by. Its own module so that fuse and ort_fusions,
which both need it, do not import each other."""
from __future__ import annotations

from onnxscript import ir


def model_flops(model: ir.Model) -> int | None:
    """FLOPs of the main graph's MatMul/Gemm nodes (2 * output elements * K); None if a shape is not static."""
    total = 0
    for node in model.graph:
        if node.op_type not in ("MatMul", "Gemm") or node.domain not in ("", "ai.onnx"):
            continue
        out, a = node.outputs[0], node.inputs[0]
        if out.shape is None or a.shape is None or not out.shape.is_static() or not a.shape.is_static():
            return None
        k = a.shape[-1] if not (node.op_type == "Gemm" and node.attributes.get_int("transA", 0)) else a.shape[0]
        numel = 1
        for d in out.shape:
            numel *= d
        total += 2 * numel * k
    return total
