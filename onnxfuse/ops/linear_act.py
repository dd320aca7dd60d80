"""LinearRelu, LinearSigmoid: a Linear layer with its activation (rules: onnxfuse/rewrites/linear_act.py)."""
from __future__ import annotations

from ._family import (BACKEND, DOCTOR_LARGE, DOCTOR_MEDIUM, DOCTOR_TMA, OpDef, OpFamily, OpSchema, doctor_gemm_entry,
                      matmul_out_shape)

LINEAR_RELU = OpSchema(
    "LinearRelu", ("X", "W", "bias"), ("Y",), "Y = relu(X @ W + bias)", (BACKEND,),
    "A Linear layer with its ReLU: Gemm/MatMul + Add + Relu (DLRM MLP layers).")
LINEAR_SIGMOID = OpSchema(
    "LinearSigmoid", ("X", "W", "bias"), ("Y",), "Y = sigmoid(X @ W + bias)", (BACKEND,),
    "A Linear layer with its sigmoid: the prediction head of DLRM's top MLP.")
# activation -> (the ONNX op of the unfused graph, the fused op's schema)
ACTIVATIONS = {"relu": ("Relu", LINEAR_RELU), "sigmoid": ("Sigmoid", LINEAR_SIGMOID)}


def _reference(activation: str):
    def reference(inputs, attrs):
        import torch

        x, w, b = (t.float() for t in inputs[:3])
        z = x @ w + b
        y = torch.relu(z) if activation == "relu" else torch.sigmoid(z)
        return y.to(inputs[0].dtype)
    return reference


def _body(activation: str):
    def body(overload: str):
        from onnx import helper

        mk = helper.make_node
        act = ACTIVATIONS[activation][0]
        return list(ACTIVATIONS[activation][1].inputs), [
            mk("MatMul", ["X", "W"], ["xw"]), mk("Add", ["xw", "bias"], ["z"]), mk(act, ["z"], ["Y"])]
    return body


def _op(index: int, activation: str, doctor_shapes) -> OpDef:
    schema = ACTIVATIONS[activation][1]
    return OpDef(index, schema, _reference(activation), _body(activation), matmul_out_shape, tuple(doctor_shapes),
                 lambda entry: doctor_gemm_entry(schema, entry))


# Doctor shapes (M, K, N, r = 0): small, odd and one realistic each, plus the size classes' shapes (_family.py).
FAMILY = OpFamily("linear_act", (
    _op(0, "relu", [(1, 13, 512, 0), (37, 129, 67, 0), (256, 512, 256, 0), (16, 256, 512, 0), (*DOCTOR_MEDIUM, 0),
                    (*DOCTOR_LARGE, 0), (*DOCTOR_TMA, 0)]),
    _op(1, "sigmoid", [(1, 256, 1, 0), (37, 129, 67, 0), (256, 512, 256, 0), (*DOCTOR_TMA, 0)]),
))
