"""FlashAttention: multi-head attention with an additive bias, as onnxruntime's MultiHeadAttention computes it from
3-D Q, K, V and an attention_bias (rules: onnxfuse/rewrites/flash_attention.py)."""
from __future__ import annotations

from ._family import BACKEND, Attr, OpDef, OpFamily, OpSchema

FLASH_ATTENTION = OpSchema(
    "FlashAttention", ("Q", "K", "V", "bias"), ("Y",),
    "Y[b, s, h] = softmax_j(qk_scale * Q[b, s, h] . K[b, j, h] + bias[b, h, s, j]) @ V[b, j, h] per head h",
    (Attr("num_heads", "int", 1, "heads H: Q, K and V are [B, S, H * D] (head h is columns h D .. h D + D - 1)"),
     Attr("qk_scale", "float", 0.0, "the scores' scale; 0 means 1 / sqrt(D)"), BACKEND),
    "Multi-head attention with an additive bias [B or 1, H or 1, S, S_kv] (the exporters' attention mask: 0 where a "
    "key counts, a large negative value where it is masked), Q [B, S, H D], K and V [B, S_kv, H D]. The GPU kernel "
    "streams K and V through a flash loop and skips the key tiles the bias masks (a causal mask's upper half, left "
    "padding) where that changes nothing: it checks after the loop that every skipped term would have been exactly "
    "0 (the tile's largest bias, the block's and the tile's largest |q| and |k|, non-finite keys and values) and "
    "takes the tiles where it would not.")
# The body reads D with Shape's start attribute: opset 15.
MIN_OPSET = 15


def reference(inputs, attrs: dict):
    import torch

    q, k, v, bias = (t.float() for t in inputs)
    h = int(attrs.get("num_heads", 1))
    b, s, hd = q.shape
    d = hd // h
    scale = float(attrs.get("qk_scale", 0.0)) or d ** -0.5
    qh = q.reshape(b, s, h, d).transpose(1, 2)
    kh = k.reshape(b, k.shape[1], h, d).transpose(1, 2)
    vh = v.reshape(b, v.shape[1], h, d).transpose(1, 2)
    p = torch.softmax(qh @ kh.transpose(-1, -2) * scale + bias, dim=-1)
    return (p @ vh).transpose(1, 2).reshape(b, s, hd).to(inputs[0].dtype)


def _attr_constant(out: str, attr: str, kind: str):
    """Constant(value_<kind> = @attr): the node attribute flows into the body when the function is inlined."""
    from onnx import AttributeProto, helper

    node = helper.make_node("Constant", [], [out])
    node.attribute.append(AttributeProto(name=f"value_{kind}", ref_attr_name=attr,
                                         type=AttributeProto.FLOAT if kind == "float" else AttributeProto.INT))
    return node


def body(overload: str):
    """Heads split by Reshape [0, 0, H, -1] and Transpose, the scores by MatMul, scaled (scale, or 1 / sqrt(D) where
    it is 0), the bias added, Softmax on the last axis, MatMul with V, heads merged back."""
    import onnx
    from onnx import helper

    mk = helper.make_node
    i64 = onnx.TensorProto.INT64

    def ints(name, *vals):
        return mk("Constant", [], [name], value=helper.make_tensor(name, i64, [len(vals)], list(vals)))

    return list(FLASH_ATTENTION.inputs), [
        _attr_constant("h", "num_heads", "int"), ints("axis0", 0), mk("Unsqueeze", ["h", "axis0"], ["h1"]),
        ints("zz", 0, 0), ints("minus1", -1), mk("Concat", ["zz", "h1", "minus1"], ["split"], axis=0),
        mk("Reshape", ["Q", "split"], ["q4"]), mk("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
        mk("Reshape", ["K", "split"], ["k4"]), mk("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        mk("Reshape", ["V", "split"], ["v4"]), mk("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
        # the scale: the attribute, or 1 / sqrt(D) where it is 0 (D = Q's last dim / H)
        mk("Shape", ["Q"], ["hd"], start=-1), mk("Div", ["hd", "h1"], ["d"]),
        mk("Cast", ["d"], ["df"], to=onnx.TensorProto.FLOAT), mk("Sqrt", ["df"], ["sq"]),
        mk("Reciprocal", ["sq"], ["inv"]), _attr_constant("s_attr", "qk_scale", "float"),
        mk("Constant", [], ["fzero"], value_float=0.0), mk("Equal", ["s_attr", "fzero"], ["unset"]),
        mk("Where", ["unset", "inv", "s_attr"], ["s32"]), mk("CastLike", ["s32", "Q"], ["s"]),
        mk("MatMul", ["qh", "kt"], ["qk"]), mk("Mul", ["qk", "s"], ["scaled"]), mk("Add", ["scaled", "bias"], ["z"]),
        mk("Softmax", ["z"], ["p"], axis=-1), mk("MatMul", ["p", "vh"], ["o"]),
        mk("Transpose", ["o"], ["o4"], perm=[0, 2, 1, 3]), ints("merge", 0, 0, -1),
        mk("Reshape", ["o4", "merge"], ["Y"])]


def out_shape(shapes: dict, attrs: dict) -> list:
    return list(shapes["Q"])


# Doctor entries: (B, S, S_kv, H, D, bias planes (B or 1, H or 1), left padding keys). The bias is a causal mask of
# -65504 (the exporters' finfo(float16).min) over a random bias, with `pad` masked keys at the start of every row:
# the Triton kernel's skipped tiles (above the diagonal) and its fallback (rows with every key masked) both run. Head
# sizes 64 and 128, the Triton kernel's (the CPU tests and the CUDA kernel take any).
DOCTOR_SHAPES = ((2, 100, 100, 2, 64, (2, 1), 0), (1, 256, 256, 4, 128, (1, 1), 70), (1, 1, 77, 4, 64, (1, 4), 0),
                 (2, 130, 130, 2, 64, (1, 2), 3), (1, 300, 300, 2, 128, (1, 1), 0))


def doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """The inputs' shapes and num_heads; the report's (M, K, N) are the rows B S, S_kv and H D."""
    b, s, skv, h, d, planes, pad = entry
    shapes = {"Q": [b, s, h * d], "K": [b, skv, h * d], "V": [b, skv, h * d], "bias": [planes[0], planes[1], s, skv]}
    return shapes, {"num_heads": h}, (b * s, skv, h * d, 0, f"H{h} D{d} bias{list(planes)} pad{pad}")


def doctor_inputs(op: OpDef, dtype, shapes: dict, seed: int, device: str = "cpu") -> list:
    """Q, K, V ~N(0, 1); the bias N(0, 1/4) with a causal mask (key j > i + S_kv - S) and the entry's left padding
    (the keys before the first unmasked one of the doctor's entry, recovered from the shapes: see DOCTOR_SHAPES) at
    -65504. `shapes` may name Q alone (the doctor's second X)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(*shapes["Q"], generator=g, device=device)
    if "K" not in shapes:
        return [q.to(dtype)]
    k = torch.randn(*shapes["K"], generator=g, device=device)
    v = torch.randn(*shapes["V"], generator=g, device=device)
    bias = torch.randn(*shapes["bias"], generator=g, device=device) * 0.5
    s, skv = shapes["bias"][2], shapes["bias"][3]
    pad = next((e[6] for e in DOCTOR_SHAPES if e[1] == s and e[2] == skv), 0)
    i = torch.arange(s, device=device)[:, None]
    j = torch.arange(skv, device=device)[None, :]
    masked = (j > i + (skv - s)) | (j < pad)
    bias = torch.where(masked, torch.tensor(-65504.0, device=device), bias)
    return [q.to(dtype), k.to(dtype), v.to(dtype), bias.to(dtype)]


FAMILY = OpFamily("flash_attention", (
    OpDef(17, FLASH_ATTENTION, reference, body, out_shape, DOCTOR_SHAPES, doctor_entry, min_opset=MIN_OPSET,
          doctor_inputs=doctor_inputs, weighted=False),
))
