"""LoRALinear, LoRALinearRelu: a LoRA-adapted linear, base GEMM and rank-r branch in one op (rules:
onnxfuse/rewrites/lora_linear.py); MultiLoRALinear: the same with a stack of adapters and one adapter per batch row
(punica's BGMV for decode rows, SGMV for prefill sequences), written by `export --adapters N`
(onnxfuse/adapters.py)."""
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
MULTI_LORA_LINEAR = OpSchema(
    "MultiLoRALinear", ("X", "W", "A", "B", "bias", "scales", "adapter_index"), ("Y",),
    "Y[i] = X[i] @ W + bias + scales[j] * ((X[i] @ A[j]) @ B[j]), j = adapter_index[i] (no adapter where j < 0); "
    "i runs over X's first axis",
    (BACKEND,),
    "A linear with a stack of n LoRA adapters (A [n, K, r], B [n, r, N], scales [n]) of which each batch row of X "
    "(its first axis: a decode row of [b, K], a sequence of [b, s, K]) uses the one adapter_index [b] names, -1 for "
    "none: a batch mixing adapters in one op (punica's BGMV / SGMV). An index >= n is an error on the CPU; the GPU "
    "kernels, which cannot stop a CUDA graph, write NaN in that row.")
# The bodies use CastLike (the scale in T) and Shape(start=): opset 15.
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


def multi_delta(x, a, bm, scales, index):
    """The adapters' term of a mixed batch in fp32: scales[j] * (X[i] @ A[j]) @ B[j] for each batch row i of X (its
    first axis; j = index[i]), exactly 0 where j < 0; an index >= n raises IndexError (as the body's Gather)."""
    import torch

    index = index.long()
    if index.shape != (x.shape[0],):
        raise ValueError(f"adapter_index {list(index.shape)} must be [X.shape[0]] = [{x.shape[0]}]")
    if bool((index >= a.shape[0]).any()):
        raise IndexError(f"adapter_index {index.tolist()} names an adapter >= n = {a.shape[0]}")
    pick = index.clamp(min=0)
    x3 = x.float().reshape(x.shape[0], -1, x.shape[-1])
    delta = (x3 @ a.float()[pick]) @ bm.float()[pick] * scales.float()[pick][:, None, None]
    delta = torch.where((index >= 0)[:, None, None], delta, torch.zeros((), dtype=delta.dtype))
    return delta.reshape(*x.shape[:-1], bm.shape[-1])


def multi_reference(inputs, attrs):
    """MultiLoRALinear in fp32: the base plus each batch row's adapter (multi_delta)."""
    x, w, a, bm, b, scales, index = inputs
    return (x.float() @ w.float() + b.float() + multi_delta(x, a, bm, scales, index)).to(x.dtype)


def multi_branch_nodes(a: str, b: str, scales: str, base: str, out: str, p: str, x: str = "X") -> list:
    """Standard-ONNX nodes of a mixed batch's adapter term (names prefixed `p`) over the value `x` (default the
    function's input X; adapter_index the function's input): each batch row's adapter gathered (the index clamped at
    0), batched MatMuls over x as [b, s, K], the rows whose index is < 0 zeroed by a Where, then reshaped to `base`'s
    shape as `out`."""
    from onnx import TensorProto, helper

    mk = helper.make_node

    def ints(name, *vals):
        return mk("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(vals)], list(vals)))

    return [mk("Constant", [], [p + "zero"], value_int=0), mk("Max", ["adapter_index", p + "zero"], [p + "pick"]),
            mk("Less", ["adapter_index", p + "zero"], [p + "none"]),
            mk("Gather", [a, p + "pick"], [p + "A_rows"], axis=0),
            mk("Gather", [b, p + "pick"], [p + "B_rows"], axis=0),
            mk("Gather", [scales, p + "pick"], [p + "s_rows"], axis=0),
            ints(p + "lead", 0, -1), mk("Shape", [x], [p + "k"], start=-1),
            mk("Concat", [p + "lead", p + "k"], [p + "x3_shape"], axis=0),
            mk("Reshape", [x, p + "x3_shape"], [p + "x3"]), mk("MatMul", [p + "x3", p + "A_rows"], [p + "xa"]),
            mk("MatMul", [p + "xa", p + "B_rows"], [p + "xab"]), ints(p + "axes", 1, 2),
            mk("Unsqueeze", [p + "s_rows", p + "axes"], [p + "s3"]), mk("Mul", [p + "xab", p + "s3"], [p + "scaled"]),
            mk("Unsqueeze", [p + "none", p + "axes"], [p + "none3"]), mk("Constant", [], [p + "zf"], value_float=0.0),
            mk("CastLike", [p + "zf", x], [p + "zt"]), mk("Where", [p + "none3", p + "zt", p + "scaled"], [p + "b3"]),
            mk("Shape", [base], [p + "y_shape"]), mk("Reshape", [p + "b3", p + "y_shape"], [out])]


def _multi_body(overload: str):
    """MultiLoRALinear's function: X @ W + bias plus multi_branch_nodes' term (opset 15: Shape(start), CastLike)."""
    from onnx import helper

    mk = helper.make_node
    nodes = [mk("MatMul", ["X", "W"], ["xw"]), mk("Add", ["xw", "bias"], ["base"])]
    nodes += multi_branch_nodes("A", "B", "scales", "base", "branch", "")
    return list(MULTI_LORA_LINEAR.inputs), nodes + [mk("Add", ["base", "branch"], ["Y"])]


def multi_doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(b, s, K, N, r, n): X [b, K] (s = 1: decode rows) or [b, s, K] (prefill sequences), n adapters of rank r."""
    b, s, k, n, r, na = entry
    x = [b, k] if s == 1 else [b, s, k]
    shapes = {"X": x, "W": [k, n], "A": [na, k, r], "B": [na, r, n], "bias": [n], "scales": [na],
              "adapter_index": [b]}
    return shapes, {}, (b * s, k, n, r, f"{na} adapters, {b}x{s}")


def multi_doctor_inputs(op, dtype, shapes: dict, seed: int, device: str = "cpu") -> list:
    """Weights scaled so outputs stay O(1), scales in [0.5, 2), and an index per batch row drawn from [-1, n) with
    the first row -1 (no adapter) where there are two or more and, where there are rows enough, every adapter used."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for name, shp in shapes.items():
        if name == "adapter_index":
            na, b = next(v for k, v in shapes.items() if k[0] == "A")[0], shp[0]
            idx = torch.randint(-1, na, (b,), generator=g, device=device)
            ordered = torch.arange(-1, na, device=device)[:b]
            idx[:len(ordered)] = ordered[torch.randperm(len(ordered), generator=g, device=device)]
            if b > 1:
                idx[0] = -1
            out.append(idx.to(torch.int64))
            continue
        t = torch.randn(*shp, generator=g, device=device, dtype=torch.float32)
        if name.startswith("scales"):
            t = torch.rand(*shp, generator=g, device=device) * 1.5 + 0.5
        elif name[0] in "WA":
            t = t / max(shp[-2], 1) ** 0.5
        elif name[0] == "B":
            t = t / max(shp[-2], 1) ** 0.5 * 0.5
        elif name == "bias":
            t = t * 0.5
        out.append(t.to(dtype))
    return out


def multi_out_shape(shapes: dict, attrs: dict) -> list:
    return list(shapes["X"][:-1]) + [shapes["W"][-1]]


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
    # MultiLoRALinear (b, s, K, N, r, n): decode rows each with its own adapter (and one without), one row, ragged K
    # and N, ranks 7 / 16 / 64, prefill sequences (the segmented form), more rows than adapters.
    OpDef(13, MULTI_LORA_LINEAR, multi_reference, _multi_body, multi_out_shape,
          ((8, 1, 256, 256, 16, 8), (1, 1, 256, 320, 16, 4), (5, 1, 129, 67, 7, 3), (3, 40, 256, 384, 16, 2),
           (4, 100, 520, 264, 64, 3), (32, 1, 512, 512, 32, 6), (2, 600, 256, 256, 16, 2)),
          multi_doctor_entry, min_opset=MIN_OPSET, int_inputs=("adapter_index",), doctor_inputs=multi_doctor_inputs),
), cpp_name="LoRALinear")
