"""SwiGLU: the gate and up projections of a gated MLP with act(gate) * up, and LoRASwiGLU: the same with a LoRA adapter
on each projection (rules: onnxfuse/rewrites/swiglu.py); MultiLoRASwiGLU: the same with a stack of adapters per
projection and one adapter per batch row (a mixed batch, written by `export --adapters N`: onnxfuse/adapters.py);
LoRAGatedMLP and MultiLoRAGatedMLP: the whole gated MLP with its adapters, LoRASwiGLU (MultiLoRASwiGLU) and the down
projection's LoRALinear (MultiLoRALinear) in one op, so the down adapter's X @ A comes out of the gated kernel's
epilogue instead of a pass of its own over the MLP activation."""
from __future__ import annotations

import math

from ._family import (BACKEND, DOCTOR_LARGE, DOCTOR_MEDIUM, Attr, OpDef, OpFamily, OpSchema, gemm_input_shapes,
                      matmul_out_shape)
from .lora_linear import MIN_OPSET as LORA_MIN_OPSET
from .lora_linear import multi_branch_nodes, multi_delta, multi_doctor_inputs, multi_reference

# SwiGLU's gate activations (its `activation` attribute), each as PyTorch defines it and computed in fp32 by every
# kernel: silu x*sigmoid(x); gelu 0.5*x*(1+erf(x/sqrt(2))) (torch's gelu, approximate='none'); gelu_tanh
# 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) (approximate='tanh'); quick_gelu x*sigmoid(1.702*x); relu; sigmoid.
# The code is the index (a separate space from ACTIVATIONS, whose codes MLPStack's kernels read); silu, code 0, is
# the default, so SwiGLU nodes written before the attribute existed keep their meaning.
GATE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "quick_gelu", "relu", "sigmoid")
QUICK_GELU_ALPHA = 1.702
GELU_TANH_COEFF = 0.044715
# SwiGLU activations whose body needs typed constants (Constant + CastLike, opset 15); the others need opset 13.
GATE_ACTIVATIONS_WITH_CONSTANTS = ("gelu", "gelu_tanh", "quick_gelu")

_ACT = Attr("activation", "string", "silu", "the gate's activation: " + "|".join(GATE_ACTIVATIONS) + " (gelu: erf "
             "form; gelu_tanh: approximate='tanh'; quick_gelu: x*sigmoid(1.702x)); absent means silu")
SWIGLU = OpSchema(
    "SwiGLU", ("X", "W_gate", "W_up"), ("Y",), "Y = act(X @ W_gate) * (X @ W_up)", (_ACT, BACKEND),
    "The gate and up projections of a gated MLP (Llama/Mistral/Qwen SwiGLU, Gemma GeGLU, Phi-3's merged gate_up_proj, "
    "ReGLU, GLU) with act(gate) * up in their epilogue; the down projection stays a plain MatMul/Gemm. The node's "
    "function overload names the activation (empty: silu, as written before the attribute existed).")


LORA_SWIGLU = OpSchema(
    "LoRASwiGLU", ("X", "W_gate", "W_up", "A_gate", "B_gate", "A_up", "B_up"), ("Y",),
    "Y = act(X @ W_gate + scale_gate * (X @ A_gate) @ B_gate) * (X @ W_up + scale_up * (X @ A_up) @ B_up)",
    (_ACT, Attr("scale_gate", "float", 1.0, "the gate adapter's scaling (alpha / r)"),
     Attr("scale_up", "float", 1.0, "the up adapter's scaling (alpha / r)"), BACKEND),
    "A gated MLP's gate and up projections, each with its LoRA adapter (A [K, r] and B [r, N]; the two ranks may "
    "differ, up to 64; a projection without one gets a zero adapter), with act(gate) * up in their epilogue: peft's "
    "adapters on gate_proj and up_proj, constants or graph inputs (adapters fed at run time). The overload names the "
    "activation, as SwiGLU's.")


MULTI_LORA_SWIGLU = OpSchema(
    "MultiLoRASwiGLU", ("X", "W_gate", "W_up", "A_gate", "B_gate", "A_up", "B_up", "scales_gate", "scales_up",
                        "adapter_index"), ("Y",),
    "Y[i] = act(X[i] @ W_gate + scales_gate[j] * (X[i] @ A_gate[j]) @ B_gate[j]) * (X[i] @ W_up + scales_up[j] * "
    "(X[i] @ A_up[j]) @ B_up[j]), j = adapter_index[i] (no adapter where j < 0); i runs over X's first axis",
    (_ACT, BACKEND),
    "LoRASwiGLU over a stack of n adapters per projection (A [n, K, r], B [n, r, N], scales [n]; the two ranks may "
    "differ, up to 64) with each batch row of X using the one adapter_index [b] names, -1 for none: a gated MLP in a "
    "batch that mixes adapters (MultiLoRALinear's contract). The overload names the activation, as SwiGLU's.")


_GATED_DOC = ("The down projection's adapter's X @ A is summed in the gated kernel's epilogue from each finished tile "
              "of the activation (fp32 atomics on the GPU: its last bits may vary from run to run), and the activation "
              "[M, N] lives in the op's scratch. The overload names the activation, as SwiGLU's.")
LORA_GATED_MLP = OpSchema(
    "LoRAGatedMLP", ("X", "W_gate", "W_up", "A_gate", "B_gate", "A_up", "B_up", "W_down", "A_down", "B_down",
                     "bias_down"), ("Y",),
    "H = LoRASwiGLU(X, W_gate, W_up, A_gate, B_gate, A_up, B_up) (in T); Y = H @ W_down + bias_down + scale_down * "
    "(H @ A_down) @ B_down",
    (_ACT, Attr("scale_gate", "float", 1.0, "the gate adapter's scaling (alpha / r)"),
     Attr("scale_up", "float", 1.0, "the up adapter's scaling (alpha / r)"),
     Attr("scale_down", "float", 1.0, "the down adapter's scaling (alpha / r)"), BACKEND),
    "A gated MLP with LoRA adapters on gate, up and down (peft's, constants or graph inputs; ranks up to 64, each its "
    "own): LoRASwiGLU followed by the down projection's LoRALinear, fused where the activation feeds only that "
    "projection. " + _GATED_DOC)
MULTI_LORA_GATED_MLP = OpSchema(
    "MultiLoRAGatedMLP", ("X", "W_gate", "W_up", "A_gate", "B_gate", "A_up", "B_up", "W_down", "A_down", "B_down",
                          "bias_down", "scales_gate", "scales_up", "scales_down", "adapter_index"), ("Y",),
    "H = MultiLoRASwiGLU(X, W_gate, W_up, A_gate, B_gate, A_up, B_up, scales_gate, scales_up, adapter_index) (in T); "
    "Y = MultiLoRALinear(H, W_down, A_down, B_down, bias_down, scales_down, adapter_index)",
    (_ACT, BACKEND),
    "LoRAGatedMLP over stacks of n adapters per projection with each batch row of X using the one adapter_index [b] "
    "names, -1 for none (MultiLoRASwiGLU's and MultiLoRALinear's contract). " + _GATED_DOC)


def swiglu_overload(activation: str) -> str:
    """The function overload of a SwiGLU node: its activation (silu, gelu, ...). Nodes written before the activation
    attribute existed carry the empty overload, whose function is silu's."""
    if activation not in GATE_ACTIVATIONS:
        raise ValueError(f"SwiGLU: activation {activation!r} is not one of {', '.join(GATE_ACTIVATIONS)}")
    return activation


def gate_activation(name: str, g):
    """SwiGLU's gate activation on a float32 torch tensor, as PyTorch defines it."""
    import torch

    F = torch.nn.functional
    if name == "silu":
        return F.silu(g)
    if name == "gelu":
        # gelu(+Inf) is +Inf (0.5 * g * (1 + erf(g / sqrt 2)), and onnxruntime's unfused graph), but PyTorch's
        # vectorised CPU gelu returns NaN for it on some builds (torch 2.11 on an AVX-512 Xeon; 2.13 on AVX2 gives
        # +Inf): pin the formula's value so the reference does not depend on the host.
        return torch.where(g == float("inf"), g, F.gelu(g))
    if name == "gelu_tanh":
        return F.gelu(g, approximate="tanh")
    if name == "quick_gelu":
        return g * torch.sigmoid(QUICK_GELU_ALPHA * g)
    if name == "relu":
        return torch.relu(g)
    if name == "sigmoid":
        return torch.sigmoid(g)
    raise ValueError(f"SwiGLU: activation {name!r} is not one of {', '.join(GATE_ACTIVATIONS)}")


def reference(inputs, attrs: dict):
    x = inputs[0].float()
    g, u = x @ inputs[1].float(), x @ inputs[2].float()
    y = gate_activation(str(attrs.get("activation", "silu") or "silu"), g) * u
    return y.to(inputs[0].dtype)


def _typed_constant(name: str, value: float, like: str) -> list:
    """`name` = value in the element type of `like` (Constant, then CastLike: the body serves every T)."""
    from onnx import helper

    mk = helper.make_node
    return [mk("Constant", [], [name + "_f"], value_float=float(value)), mk("CastLike", [name + "_f", like], [name])]


def _gelu_nodes(activation: str) -> list:
    """act = gelu(g) (erf form) or gelu_tanh(g), in T."""
    from onnx import helper

    mk = helper.make_node
    nodes = [*_typed_constant("half", 0.5, "g"), *_typed_constant("one", 1.0, "g")]
    if activation == "gelu":  # 0.5 * g * (1 + erf(g / sqrt(2)))
        nodes += [*_typed_constant("sqrt2", math.sqrt(2.0), "g"), mk("Div", ["g", "sqrt2"], ["z"]),
                  mk("Erf", ["z"], ["t"])]
    else:  # 0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 * g^3)))
        nodes += [*_typed_constant("kappa", GELU_TANH_COEFF, "g"),
                  *_typed_constant("beta", math.sqrt(2.0 / math.pi), "g"),
                  mk("Mul", ["g", "g"], ["g2"]), mk("Mul", ["g2", "g"], ["g3"]),
                  mk("Mul", ["kappa", "g3"], ["kg3"]), mk("Add", ["g", "kg3"], ["inner"]),
                  mk("Mul", ["beta", "inner"], ["z"]), mk("Tanh", ["z"], ["t"])]
    return nodes + [mk("Add", ["one", "t"], ["onept"]), mk("Mul", ["half", "g"], ["hg"]),
                    mk("Mul", ["hg", "onept"], ["act"])]


def swiglu_body(activation: str) -> list:
    """SwiGLU's body for one activation: g = X @ W_gate, u = X @ W_up, Y = act(g) * u, with act spelled as PyTorch
    defines it (in T: this is what runs without the kernel library)."""
    from onnx import helper

    mk = helper.make_node
    nodes = [mk("MatMul", ["X", "W_gate"], ["g"]), mk("MatMul", ["X", "W_up"], ["u"])]
    if activation == "silu":
        nodes += [mk("Sigmoid", ["g"], ["sg"]), mk("Mul", ["g", "sg"], ["act"])]
    elif activation == "quick_gelu":
        nodes += [*_typed_constant("alpha", QUICK_GELU_ALPHA, "g"), mk("Mul", ["g", "alpha"], ["ag"]),
                  mk("Sigmoid", ["ag"], ["sg"]), mk("Mul", ["g", "sg"], ["act"])]
    elif activation in ("gelu", "gelu_tanh"):
        nodes += _gelu_nodes(activation)
    elif activation == "relu":
        nodes.append(mk("Relu", ["g"], ["act"]))
    elif activation == "sigmoid":
        nodes.append(mk("Sigmoid", ["g"], ["act"]))
    else:
        raise ValueError(f"SwiGLU: activation {activation!r} is not one of {', '.join(GATE_ACTIVATIONS)}")
    return nodes + [mk("Mul", ["act", "u"], ["Y"])]


def body(overload: str):
    """The function of an overload naming the activation (gelu, ...; the empty overload is silu, what nodes written
    before the activation attribute carry)."""
    return list(SWIGLU.inputs), swiglu_body(overload or "silu")


def lora_reference(inputs, attrs: dict):
    x = inputs[0].float()
    wg, wu, ag, bg, au, bu = (t.float() for t in inputs[1:7])
    g = x @ wg + float(attrs.get("scale_gate", 1.0)) * ((x @ ag) @ bg)
    u = x @ wu + float(attrs.get("scale_up", 1.0)) * ((x @ au) @ bu)
    return (gate_activation(str(attrs.get("activation", "silu") or "silu"), g) * u).to(inputs[0].dtype)


def _scaled_branch(a: str, b: str, scale_attr: str, out: str, x: str = "X") -> list:
    """out = (x @ a) @ b * @scale_attr (the node attribute, in T)."""
    from onnx import AttributeProto, helper

    mk = helper.make_node
    const = mk("Constant", [], [out + "_s32"])
    const.attribute.append(AttributeProto(name="value_float", ref_attr_name=scale_attr, type=AttributeProto.FLOAT))
    return [mk("MatMul", [x, a], [out + "_xa"]), mk("MatMul", [out + "_xa", b], [out + "_xab"]), const,
            mk("CastLike", [out + "_s32", x], [out + "_s"]), mk("Mul", [out + "_xab", out + "_s"], [out])]


def lora_body(overload: str):
    """LoRASwiGLU's function for an activation: each projection's base GEMM plus its scaled rank-r branch, then
    SwiGLU's activation and product (opset 15: CastLike)."""
    from onnx import helper

    mk = helper.make_node
    nodes = _scaled_branch("A_gate", "B_gate", "scale_gate", "dg") + _scaled_branch("A_up", "B_up", "scale_up", "du")
    rest = swiglu_body(overload or "silu")
    # swiglu_body starts with g = X @ W_gate and u = X @ W_up: add the branches to them
    rest[0] = mk("MatMul", ["X", "W_gate"], ["g0"])
    rest[1] = mk("MatMul", ["X", "W_up"], ["u0"])
    nodes += rest[:2] + [mk("Add", ["g0", "dg"], ["g"]), mk("Add", ["u0", "du"], ["u"])] + rest[2:]
    return list(LORA_SWIGLU.inputs), nodes


def multi_lora_reference(inputs, attrs: dict):
    x, wg, wu, ag, bg, au, bu, sg, su, index = inputs
    g = x.float() @ wg.float() + multi_delta(x, ag, bg, sg, index)
    u = x.float() @ wu.float() + multi_delta(x, au, bu, su, index)
    return (gate_activation(str(attrs.get("activation", "silu") or "silu"), g) * u).to(x.dtype)


def multi_lora_body(overload: str):
    """MultiLoRASwiGLU's function: each projection's base GEMM plus its mixed-batch term (lora_linear's
    multi_branch_nodes), then SwiGLU's activation and product (opset 15)."""
    from onnx import helper

    mk = helper.make_node
    rest = swiglu_body(overload or "silu")
    nodes = [mk("MatMul", ["X", "W_gate"], ["g0"]), mk("MatMul", ["X", "W_up"], ["u0"])]
    nodes += multi_branch_nodes("A_gate", "B_gate", "scales_gate", "g0", "dg", "g_")
    nodes += multi_branch_nodes("A_up", "B_up", "scales_up", "u0", "du", "u_")
    nodes += [mk("Add", ["g0", "dg"], ["g"]), mk("Add", ["u0", "du"], ["u"])] + rest[2:]
    return list(MULTI_LORA_SWIGLU.inputs), nodes


def _lora_down(h, inputs, scale: float):
    """The down projection's LoRALinear on the activation h (in T): h @ W_down + bias_down + scale (h @ A_down) @
    B_down, in fp32."""
    hf = h.float()
    wd, ad, bd, bias = (t.float() for t in inputs)
    return hf @ wd + bias + scale * ((hf @ ad) @ bd)


def gated_reference(inputs, attrs: dict):
    """LoRAGatedMLP: LoRASwiGLU's reference (rounded to T, as the activation is stored), then LoRALinear's."""
    h = lora_reference(inputs[:7], attrs)
    return _lora_down(h, inputs[7:11], float(attrs.get("scale_down", 1.0))).to(inputs[0].dtype)


def multi_gated_reference(inputs, attrs: dict):
    """MultiLoRAGatedMLP: MultiLoRASwiGLU's reference (in T), then MultiLoRALinear's on it."""
    x, wg, wu, ag, bg, au, bu, wd, ad, bd, bias, sg, su, sd, index = inputs
    h = multi_lora_reference([x, wg, wu, ag, bg, au, bu, sg, su, index], attrs)
    return multi_reference([h, wd, ad, bd, bias, sd, index], {})


def _down_nodes(scale_attr: str) -> list:
    """The down projection's LoRALinear on H (names prefixed d_): H @ W_down + bias_down + (H @ A_down) @ B_down *
    @scale_attr, as Y."""
    from onnx import helper

    mk = helper.make_node
    return [mk("MatMul", ["H", "W_down"], ["d_xw"]), mk("Add", ["d_xw", "bias_down"], ["d_base"]),
            *_scaled_branch("A_down", "B_down", scale_attr, "d_branch", x="H"),
            mk("Add", ["d_base", "d_branch"], ["Y"])]


def _as_h(nodes: list) -> list:
    """A gated body's nodes with its output Y renamed H (the down projection's input)."""
    for nd in nodes:
        for i, o in enumerate(nd.output):
            if o == "Y":
                nd.output[i] = "H"
    return nodes


def gated_body(overload: str):
    """LoRAGatedMLP's function: LoRASwiGLU's body into H, then the down projection's LoRALinear (opset 15)."""
    return list(LORA_GATED_MLP.inputs), _as_h(lora_body(overload)[1]) + _down_nodes("scale_down")


def multi_gated_body(overload: str):
    """MultiLoRAGatedMLP's function: MultiLoRASwiGLU's body into H, then MultiLoRALinear's term on H (opset 15)."""
    from onnx import helper

    mk = helper.make_node
    nodes = _as_h(multi_lora_body(overload)[1])
    nodes += [mk("MatMul", ["H", "W_down"], ["d_xw"]), mk("Add", ["d_xw", "bias_down"], ["d_base"])]
    nodes += multi_branch_nodes("A_down", "B_down", "scales_down", "d_base", "d_branch", "d_", x="H")
    return list(MULTI_LORA_GATED_MLP.inputs), nodes + [mk("Add", ["d_base", "d_branch"], ["Y"])]


def gated_doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(M, K, N, r_gate, r_up, r_down, activation): X [M, K], the gated MLP's [K, N] weights with their adapters,
    W_down [N, K], A_down [N, r_down], B_down [r_down, K], bias_down [K]; scales 0.5, 2 and 0.75."""
    m, k, n, rg, ru, rd, act = entry
    shapes = {"X": [m, k], "W_gate": [k, n], "W_up": [k, n], "A_gate": [k, rg], "B_gate": [rg, n], "A_up": [k, ru],
              "B_up": [ru, n], "W_down": [n, k], "A_down": [n, rd], "B_down": [rd, k], "bias_down": [k]}
    attrs = {"activation": act, "scale_gate": 0.5, "scale_up": 2.0, "scale_down": 0.75}
    return shapes, attrs, (m, k, n, max(rg, ru, rd), f"{act} r{rg}/{ru}/{rd}")


def multi_gated_doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(b, s, K, N, r_gate, r_up, r_down, n, activation): MultiLoRASwiGLU's shapes, then the down projection's W_down
    [N, K], A_down [n, N, r_down], B_down [n, r_down, K], bias_down [K], scales_down [n]."""
    b, s, k, n, rg, ru, rd, na, act = entry
    shapes = {"X": [b, k] if s == 1 else [b, s, k], "W_gate": [k, n], "W_up": [k, n], "A_gate": [na, k, rg],
              "B_gate": [na, rg, n], "A_up": [na, k, ru], "B_up": [na, ru, n], "W_down": [n, k],
              "A_down": [na, n, rd], "B_down": [na, rd, k], "bias_down": [k], "scales_gate": [na], "scales_up": [na],
              "scales_down": [na], "adapter_index": [b]}
    return shapes, {"activation": act}, (b * s, k, n, max(rg, ru, rd), f"{act} r{rg}/{ru}/{rd} {na} adapters, {b}x{s}")


def multi_lora_doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(b, s, K, N, r_gate, r_up, n, activation): X [b, K] (s = 1) or [b, s, K], n adapters per projection."""
    b, s, k, n, rg, ru, na, act = entry
    shapes = {"X": [b, k] if s == 1 else [b, s, k], "W_gate": [k, n], "W_up": [k, n], "A_gate": [na, k, rg],
              "B_gate": [na, rg, n], "A_up": [na, k, ru], "B_up": [na, ru, n], "scales_gate": [na], "scales_up": [na],
              "adapter_index": [b]}
    return shapes, {"activation": act}, (b * s, k, n, max(rg, ru), f"{act} r{rg}/{ru} {na} adapters, {b}x{s}")


def lora_doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(M, K, N, r_gate, r_up, activation): W [K, N], A_gate [K, r_gate], B_gate [r_gate, N], the same for up;
    scales 0.5 and 2."""
    m, k, n, rg, ru, act = entry
    shapes = {"X": [m, k], "W_gate": [k, n], "W_up": [k, n], "A_gate": [k, rg], "B_gate": [rg, n], "A_up": [k, ru],
              "B_up": [ru, n]}
    return shapes, {"activation": act, "scale_gate": 0.5, "scale_up": 2.0}, (m, k, n, max(rg, ru), f"{act} r{rg}/{ru}")


def lora_doctor_inputs(op, dtype, shapes: dict, seed: int, device: str = "cpu") -> list:
    """X ~ N(0, 1), the weights scaled so each product is O(1): W and A by 1/sqrt(K), B by 0.5/sqrt(r)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for name, shp in shapes.items():
        t = torch.randn(*shp, generator=g, device=device, dtype=torch.float32)
        if name != "X":
            t = t / max(shp[0], 1) ** 0.5 * (0.5 if name.startswith("B") else 1.0)
        out.append(t.to(dtype))
    return out


def doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(M, K, N, r, activation), or (M, K, N, r): silu, the attribute's default."""
    m, k, n, r, *act = entry
    shapes = gemm_input_shapes(SWIGLU, m, k, n, r)
    return (shapes, {"activation": act[0]}, (m, k, n, r, act[0])) if act else (shapes, {}, (m, k, n, r, ""))


# Doctor shapes: every gate activation on each of these, silu on the size classes' shapes (_family.py).
_SHAPES = [(1, 256, 688, 0), (37, 129, 67, 0), (200, 1024, 512, 0)]
# LoRASwiGLU (M, K, N, r_gate, r_up, activation): decode and prefill rows, odd shapes and ranks (7, 5), two ranks,
# rank 64 (the largest), every activation once; the size classes' shapes at rank 16; and three shapes from
# triton/table.py LORA_SWIGLU_CUBLAS's rows and K up (the Triton launcher's cuBLASLt GEMMs, then the CUDA gate pass
# for 16-bit types, ranks to 16 and N a multiple of 64, else Triton's lora_gate): two aligned (one with ragged rows,
# rank 8 on the gate and another activation), one with ragged rows and N.
_LORA_SHAPES = ([(1, 256, 688, 16, 16, "silu"), (37, 129, 67, 7, 5, "gelu"), (200, 512, 512, 16, 64, "silu"),
                 (*DOCTOR_MEDIUM, 16, 16, "silu"), (*DOCTOR_LARGE, 16, 16, "silu"), (16, 256, 688, 8, 16, "silu"),
                 (2048, 2048, 256, 16, 8, "silu"), (2050, 2048, 320, 8, 16, "gelu"),
                 (2055, 2048, 200, 7, 16, "gelu_tanh")]
                + [(5, 96, 40, 8, 8, act) for act in GATE_ACTIVATIONS[2:]])
FAMILY = OpFamily("swiglu", (
    OpDef(2, SWIGLU, reference, body, matmul_out_shape,
          tuple([(*shape, act) for act in GATE_ACTIVATIONS for shape in _SHAPES]
                + [(*DOCTOR_MEDIUM, 0, "silu"), (*DOCTOR_LARGE, 0, "silu")]),
          # One-node models (testing.op_model, the doctor) carry the empty overload, as they always have: the kernel
          # reads the activation attribute (an unknown one must reach the kernel's error), while the rules write
          # swiglu_overload(activation) with that activation's function body.
          doctor_entry, overload_attr="activation"),
    # special rows without the type's max: the GPU kernels round X @ A to the input type (as a 16-bit PyTorch LoRA and
    # the unfused graph do), the fp32 reference does not, and act(g) * u multiplies the two terms' rounding
    OpDef(12, LORA_SWIGLU, lora_reference, lora_body, matmul_out_shape, tuple(_LORA_SHAPES), lora_doctor_entry,
          overload_attr="activation", min_opset=15, doctor_inputs=lora_doctor_inputs, special_type_max=False),
    # MultiLoRASwiGLU (b, s, K, N, r_gate, r_up, n, activation): 8 decode rows with 8 adapters (and one without), one
    # row, ragged shapes with two ranks, prefill sequences, rank 64, every activation once. Special rows as
    # LoRASwiGLU's.
    OpDef(14, MULTI_LORA_SWIGLU, multi_lora_reference, multi_lora_body, matmul_out_shape,
          tuple([(8, 1, 256, 688, 16, 16, 8, "silu"), (1, 1, 256, 320, 16, 16, 4, "silu"),
                 (5, 1, 129, 67, 7, 5, 3, "gelu"), (3, 40, 256, 384, 16, 16, 2, "silu"),
                 (4, 100, 520, 264, 16, 64, 3, "silu"), (2, 600, 256, 256, 16, 16, 2, "silu")]
                + [(4, 1, 96, 40, 8, 8, 3, act) for act in GATE_ACTIVATIONS[2:]]),
          multi_lora_doctor_entry, overload_attr="activation", min_opset=15, int_inputs=("adapter_index",),
          doctor_inputs=multi_doctor_inputs, special_type_max=False),
    # LoRAGatedMLP (M, K, N, r_gate, r_up, r_down, activation): decode rows, 16 tokens (the PDL launch), odd shapes and
    # three ranks, rank 64, the cuBLASLt path's rows and K (the gate pass's down sum: rank 16 and 8, one with ragged
    # rows and another activation; and Triton's lora_gate on a ragged N), every activation once. Special rows as
    # LoRASwiGLU's.
    OpDef(15, LORA_GATED_MLP, gated_reference, gated_body, matmul_out_shape,
          tuple([(1, 256, 688, 16, 16, 16, "silu"), (16, 256, 688, 8, 16, 16, "silu"), (37, 129, 67, 7, 5, 3, "gelu"),
                 (200, 512, 512, 16, 64, 32, "silu"), (*DOCTOR_MEDIUM, 16, 16, 16, "silu"),
                 (2048, 2048, 256, 16, 8, 16, "silu"), (2050, 2048, 320, 8, 16, 8, "gelu"),
                 (2055, 2048, 200, 7, 16, 5, "gelu_tanh")]
                + [(5, 96, 40, 8, 8, 8, act) for act in GATE_ACTIVATIONS[2:]]),
          gated_doctor_entry, overload_attr="activation", min_opset=LORA_MIN_OPSET, doctor_inputs=lora_doctor_inputs,
          special_type_max=False),
    # MultiLoRAGatedMLP (b, s, K, N, r_gate, r_up, r_down, n, activation): 8 decode rows with 8 adapters (and one
    # without), one row, ragged shapes with three ranks, prefill sequences, rank 64, every activation once.
    OpDef(16, MULTI_LORA_GATED_MLP, multi_gated_reference, multi_gated_body, matmul_out_shape,
          tuple([(8, 1, 256, 688, 16, 16, 16, 8, "silu"), (1, 1, 256, 320, 16, 16, 16, 4, "silu"),
                 (5, 1, 129, 67, 7, 5, 3, 3, "gelu"), (3, 40, 256, 384, 16, 16, 16, 2, "silu"),
                 (4, 100, 520, 264, 16, 64, 32, 3, "silu")]
                + [(4, 1, 96, 40, 8, 8, 8, 3, act) for act in GATE_ACTIVATIONS[2:]]),
          multi_gated_doctor_entry, overload_attr="activation", min_opset=LORA_MIN_OPSET,
          int_inputs=("adapter_index",), doctor_inputs=multi_doctor_inputs, special_type_max=False),
), cpp_name="SwiGLU")
