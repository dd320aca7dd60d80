"""LoRALinear, LoRALinearRelu: a LoRA-adapted linear, base GEMM and rank-r branch in one op (rules:
onnxfuse/rewrites/lora_linear.py)."""
from __future__ import annotations

from ._family import (BACKEND, DOCTOR_LARGE, DOCTOR_MEDIUM, DOCTOR_TMA, Attr, OpDef, OpFamily, OpSchema,
                      doctor_gemm_entry, matmul_out_shape)

_SCALE = Attr("scale", "float", 1.0, "LoRA scaling alpha / r")
LORA_LINEAR = OpSchema(
    "LoRALinear", ("X", "W", "A", "B", "bias"), ("Y",), "Y = X @ W + bias + scale * ((X @ A) @ B)",
    (_SCALE, BACKEND),
    "A LoRA-adapted linear (peft or plain PyTorch), base GEMM and rank-r branch in one op.")
LORA_LINEAR_RELU = OpSchema(
    "LoRALinearRelu", ("X", "W", "A", "B", "bias"), ("Y",), "Y = relu(X @ W + bias + scale * ((X @ A) @ B))",
    (_SCALE, BACKEND),
    "A LoRA-adapted linear followed by ReLU (the DLRM lecture's fused add*mul+relu case).")
# The bodies use CastLike (the scale in T): opset 15.
MIN_OPSET = 15


def _reference(relu: bool):
    def reference(inputs, attrs):
        import torch

        x = inputs[0].float()
        w, a, bm, b = (t.float() for t in inputs[1:5])
        y = x @ w + b + float(attrs.get("scale", 1.0)) * ((x @ a) @ bm)
        if relu:
            y = torch.relu(y)
        return y.to(inputs[0].dtype)
    return reference


def _scale_constant(out: str):
    """Constant(value_float = @scale): the node attribute flows into the body when the function is inlined."""
    from onnx import AttributeProto, helper

    node = helper.make_node("Constant", [], [out])
    attr = AttributeProto(name="value_float", ref_attr_name="scale", type=AttributeProto.FLOAT)
    node.attribute.append(attr)
    return node


def _body(relu: bool):
    def body(overload: str):
        from onnx import helper

        mk = helper.make_node
        last = "z" if relu else "Y"
        nodes = [mk("MatMul", ["X", "W"], ["xw"]), mk("Add", ["xw", "bias"], ["base"]),
                 mk("MatMul", ["X", "A"], ["xa"]), mk("MatMul", ["xa", "B"], ["xab"]),
                 _scale_constant("s32"), mk("CastLike", ["s32", "X"], ["s"]), mk("Mul", ["xab", "s"], ["branch"]),
                 mk("Add", ["base", "branch"], [last])]
        if relu:
            nodes.append(mk("Relu", ["z"], ["Y"]))
        return list(LORA_LINEAR.inputs), nodes
    return body


def _op(index: int, schema: OpSchema, doctor_shapes) -> OpDef:
    relu = schema is LORA_LINEAR_RELU
    return OpDef(index, schema, _reference(relu), _body(relu), matmul_out_shape, tuple(doctor_shapes),
                 lambda entry: doctor_gemm_entry(schema, entry), min_opset=MIN_OPSET)


# Doctor shapes (M, K, N, r): small, odd and one realistic each, plus the size classes' shapes (_family.py).
FAMILY = OpFamily("lora_linear", (
    _op(3, LORA_LINEAR, [(1, 256, 256, 16), (37, 129, 67, 7), (200, 512, 512, 16), (*DOCTOR_MEDIUM, 16),
                         (*DOCTOR_TMA, 16)]),
    _op(4, LORA_LINEAR_RELU, [(1, 256, 256, 16), (37, 129, 67, 7), (200, 512, 512, 64), (*DOCTOR_LARGE, 16),
                              (*DOCTOR_TMA, 64)]),
), cpp_name="LoRALinear")
