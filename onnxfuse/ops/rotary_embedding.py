"""RotaryEmbedding: rotary position embedding, rotate-half convention (rules: onnxfuse/rewrites/rotary_embedding.py)."""
from __future__ import annotations

from ._family import BACKEND, OpDef, OpFamily, OpSchema

ROTARY_EMBEDDING = OpSchema(
    "RotaryEmbedding", ("X", "cos", "sin"), ("Y",),
    "Y = X * cos + rotate_half(X) * sin, rotate_half(X) = concat(-X[..., D/2:], X[..., :D/2])", (BACKEND,),
    "Rotary position embedding (the rotate-half convention of Llama, Mistral, Qwen2): X is [..., D] with D even, "
    "cos and sin broadcast to X's shape (same rank, each dim 1 or X's; last dim D). One elementwise pass instead of "
    "the exporters' Slice/Neg/Concat/Mul/Mul/Add (six kernels and five intermediates per tensor).")
# The body reads D with Shape's start attribute: opset 15.
MIN_OPSET = 15


def reference(inputs, attrs: dict):
    import torch

    x = inputs[0].float()
    cos, sin = inputs[1].float(), inputs[2].float()
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    y = x * cos + rot * sin
    return y.to(inputs[0].dtype)


def body(overload: str):
    """D = last dim of X (Shape with start, opset 15), halves by Slice, rotate_half = concat(-second, first)."""
    import onnx
    from onnx import helper

    mk = helper.make_node
    i64 = onnx.TensorProto.INT64
    return list(ROTARY_EMBEDDING.inputs), [
        mk("Shape", ["X"], ["d"], start=-1), mk("Constant", [], ["two"], value=helper.make_tensor("", i64, [1], [2])),
        mk("Div", ["d", "two"], ["half"]),
        mk("Constant", [], ["zero"], value=helper.make_tensor("", i64, [1], [0])),
        mk("Constant", [], ["last"], value=helper.make_tensor("", i64, [1], [-1])),
        mk("Slice", ["X", "zero", "half", "last"], ["first"]),
        mk("Slice", ["X", "half", "d", "last"], ["second"]),
        mk("Neg", ["second"], ["neg_second"]), mk("Concat", ["neg_second", "first"], ["rot"], axis=-1),
        mk("Mul", ["X", "cos"], ["xc"]), mk("Mul", ["rot", "sin"], ["rs"]), mk("Add", ["xc", "rs"], ["Y"])]


def out_shape(shapes: dict, attrs: dict) -> list:
    return list(shapes["X"])


def doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(X shape, cos/sin shape); the report's M is X's rows, K and N its last dim."""
    x, cs = entry
    rows = 1
    for v in x[:-1]:
        rows *= v
    return {"X": list(x), "cos": list(cs), "sin": list(cs)}, {}, (rows, x[-1], x[-1], 0, f"X{list(x)} cos{list(cs)}")


FAMILY = OpFamily("rotary_embedding", (
    # Doctor shapes: decode (one token), an odd head dim broadcast along heads, a 7B-like layer in the untransposed
    # [B, S, H, D] layout with cos/sin [B, S, 1, D], and a 2-D X.
    OpDef(6, ROTARY_EMBEDDING, reference, body, out_shape,
          (((1, 1, 32, 128), (1, 1, 1, 128)), ((2, 3, 5, 34), (2, 1, 5, 34)), ((1, 512, 32, 128), (1, 512, 1, 128)),
           ((37, 64), (37, 64))),
          doctor_entry, min_opset=MIN_OPSET, weighted=False),
))
