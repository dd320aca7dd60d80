"""Linear: a MatMul by a constant weight, for the decode GEMV (rules: onnxfuse/rewrites/linear.py)."""
from __future__ import annotations

from ._family import (BACKEND, DOCTOR_LARGE, DOCTOR_MEDIUM, DOCTOR_TMA, OpDef, OpFamily, OpSchema, doctor_gemm_entry,
                      matmul_out_shape)

LINEAR = OpSchema(
    "Linear", ("X", "W"), ("Y",), "Y = X @ W", (BACKEND,),
    "A MatMul by a constant weight W [K, N] (X [..., K]): a decoder's projections that no other op takes (genai's "
    "o_proj and down_proj). One row (a decode step) runs a split-K GEMV that streams W once with the next rows' loads "
    "in flight and sums its K slices in the kernel (the last block of a column tile to finish adds the others' "
    "partials); more rows, fp32 and widths that are not multiples of 8 run cuBLASLt's GEMM, as onnxruntime's MatMul.")


def reference(inputs, attrs: dict):
    x, w = (t.float() for t in inputs[:2])
    return (x @ w).to(inputs[0].dtype)


def body(overload: str):
    from onnx import helper

    return list(LINEAR.inputs), [helper.make_node("MatMul", ["X", "W"], ["Y"])]


# Doctor shapes (M, K, N, r = 0): one row at a decoder's width (the GEMV's 16 column tiles) and at ragged K and N (a
# partial column tile), a width that is not a multiple of 8 (cuBLASLt at one row), then more rows and the GEMM
# size classes (_family.py).
FAMILY = OpFamily("linear", (
    OpDef(19, LINEAR, reference, body, matmul_out_shape,
          ((1, 4096, 4096, 0), (1, 1037, 264, 0), (1, 64, 67, 0), (3, 129, 520, 0), (*DOCTOR_MEDIUM, 0),
           (*DOCTOR_LARGE, 0), (*DOCTOR_TMA, 0)),
          lambda entry: doctor_gemm_entry(LINEAR, entry)),
))
