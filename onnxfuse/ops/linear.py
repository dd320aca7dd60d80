"""Linear: a MatMul by a constant weight, for the decode GEMV, and LinearSkipRMSNorm: that MatMul with the residual
add and RMS norm after it (onnxruntime's SkipSimplifiedLayerNormalization) in its epilogue (rules:
onnxfuse/rewrites/linear.py)."""
from __future__ import annotations

from ._family import (BACKEND, DOCTOR_LARGE, DOCTOR_MEDIUM, DOCTOR_TMA, Attr, OpDef, OpFamily, OpSchema,
                      doctor_gemm_entry, matmul_out_shape, skip_norm_node, skip_rms_norm)

LINEAR = OpSchema(
    "Linear", ("X", "W"), ("Y",), "Y = X @ W", (BACKEND,),
    "A MatMul by a constant weight W [K, N] (X [..., K]): a decoder's projections that no other op takes (genai's "
    "o_proj and down_proj). One row (a decode step) runs a split-K GEMV that streams W once with the next rows' loads "
    "in flight and sums its K slices in the kernel (the last block of a column tile to finish adds the others' "
    "partials); more rows, fp32 and widths that are not multiples of 8 run cuBLASLt's GEMM, as onnxruntime's MatMul.")

LINEAR_SKIP_RMS_NORM = OpSchema(
    "LinearSkipRMSNorm", ("X", "W", "skip", "gamma"), ("Y", "sum"),
    "sum = X @ W + skip; Y = sum * rsqrt(mean(sum^2 over the last dim) + epsilon) * gamma",
    (Attr("epsilon", "float", 1e-5, "added to the mean square before the square root (the norm's epsilon)"), BACKEND),
    "A projection by a constant weight W [K, N] (X [..., K]), the residual add and the RMS norm after it, as a decoder "
    "writes them after o_proj and down_proj and onnxruntime fuses the add and the norm (com.microsoft "
    "SkipSimplifiedLayerNormalization): skip is the residual, X.shape[:-1] + [N]; gamma [N]; sum (the residual for "
    "the next layer) is rounded to T and Y normalizes that rounded sum, as onnxruntime's kernel does. On the CUDA EP "
    "one row (a decode step) runs Linear's GEMV into sum and one norm kernel (ONNXFUSE_LINEAR_NORM_EPILOGUE=1: one "
    "kernel, the norm in the GEMV's epilogue), more rows cuBLASLt's GEMM and the norm kernel. Fused only by the "
    "opt-in pattern linear_skip_norm: measured slower in a model than Linear and onnxruntime's own norm.")


def reference(inputs, attrs: dict):
    x, w = (t.float() for t in inputs[:2])
    return (x @ w).to(inputs[0].dtype)


def body(overload: str):
    from onnx import helper

    return list(LINEAR.inputs), [helper.make_node("MatMul", ["X", "W"], ["Y"])]


def skip_norm_reference(inputs, attrs: dict):
    """(Y, sum) in fp32 math: sum (the fp32 product plus skip) rounded to X's type, Y the norm of that rounded sum, in
    X's type."""
    x, w, skip, gamma = inputs
    return skip_rms_norm(x.float() @ w.float(), skip, gamma, float(attrs.get("epsilon", 1e-5)), x.dtype)


def skip_norm_body(overload: str):
    """The MatMul and onnxruntime's com.microsoft SkipSimplifiedLayerNormalization (the nodes the rule replaced: the
    product as its skip, the residual as its input), epsilon passed through."""
    from onnx import helper

    return list(LINEAR_SKIP_RMS_NORM.inputs), [helper.make_node("MatMul", ["X", "W"], ["P"]),
                                               skip_norm_node(["skip", "P", "gamma"], "Y")]


def skip_norm_out_shapes(shapes: dict, attrs: dict) -> list:
    """Y and sum: X's leading dims, then N."""
    y = matmul_out_shape(shapes, attrs)
    return [y, list(y)]


def skip_norm_doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(M, K, N): X [M, K], W [K, N], skip [M, N], gamma [N]."""
    m, k, n = entry
    return {"X": [m, k], "W": [k, n], "skip": [m, n], "gamma": [n]}, {}, (m, k, n, 0, "")


# Doctor shapes (M, K, N, r = 0): one row at a decoder's width (the GEMV's 16 column tiles) and at ragged K and N (a
# partial column tile), a width that is not a multiple of 8 (cuBLASLt at one row), then more rows and the GEMM
# size classes (_family.py).
FAMILY = OpFamily("linear", (
    OpDef(19, LINEAR, reference, body, matmul_out_shape,
          ((1, 4096, 4096, 0), (1, 1037, 264, 0), (1, 64, 67, 0), (3, 129, 520, 0), (*DOCTOR_MEDIUM, 0),
           (*DOCTOR_LARGE, 0), (*DOCTOR_TMA, 0)),
          lambda entry: doctor_gemm_entry(LINEAR, entry)),
    # A 7B decoder's o_proj and down_proj at one row (the GEMV's 16 column tiles, then the last tile's norm), ragged K
    # and N (a partial tile), a width not a multiple of 8 and more rows (cuBLASLt and the norm kernel), a batch of 8
    # decode rows, the GEMM size classes.
    OpDef(20, LINEAR_SKIP_RMS_NORM, skip_norm_reference, skip_norm_body, matmul_out_shape,
          ((1, 4096, 4096), (1, 11008, 4096), (1, 1037, 264), (1, 64, 67), (3, 129, 520), (8, 4096, 4096),
           DOCTOR_MEDIUM, DOCTOR_LARGE),
          skip_norm_doctor_entry, out_shapes=skip_norm_out_shapes),
))
