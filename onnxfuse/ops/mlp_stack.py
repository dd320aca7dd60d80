"""MLPStack: a chain of Linear+activation layers in one op (rules: onnxfuse/rewrites/mlp_stack.py)."""
from __future__ import annotations

from ._family import ACTIVATIONS, BACKEND, Attr, OpDef, OpFamily, OpSchema, matmul_out_shape

# How an MLPStack node runs on the GPU: auto (the library decides by shape), fused (one kernel for the whole stack,
# each program carrying a block of rows through every layer; Triton backend), layers (one GEMM launch per layer) or
# grid (one persistent kernel whose programs split every layer's tiles and meet at a grid barrier between layers;
# Triton backend). Codes are the index.
STACK_MODES = ("auto", "fused", "layers", "grid")
# Per-layer activations MLPStack supports, and the most layers one node may have (the Triton kernel's unrolling).
STACK_ACTIVATIONS = tuple(ACTIVATIONS)
MAX_STACK_LAYERS = 4

MLP_STACK = OpSchema(
    "MLPStack", ("X", "W_i", "bias_i"), ("Y",),
    "h_0 = X; h_i = act_i(h_{i-1} @ W_i + bias_i) for i = 1..L; Y = h_L",
    (Attr("activations", "string", "relu", "the layers' activations joined by dots, each relu or sigmoid "
                                           "(e.g. relu.relu.sigmoid; L = their number)"),
     Attr("stack_mode", "string", "auto", "how the GPU runs the stack: auto|fused|layers|grid (fused: one Triton "
                                          "kernel for all layers, a block of rows per program; grid: one persistent "
                                          "Triton kernel splitting each layer across the SMs; layers: one GEMM launch "
                                          "per layer; auto: by shape)"),
     BACKEND),
    "A chain of Linear+activation layers (a DLRM bottom or top MLP) in one op: on the GPU one kernel keeps the "
    "intermediate activations of a row block on chip instead of a launch and an HBM round trip per layer. "
    "Inputs X, W_1, bias_1, ..., W_L, bias_L; the node's function overload names the activations "
    "(e.g. relu.relu.sigmoid), so the model-local function body matches the node's depth.",
    variadic=True)


def stack_overload(activations) -> str:
    """The function overload of an MLPStack node: its activations joined with dots (relu.relu.sigmoid)."""
    return ".".join(activations)


def stack_input_names(n_layers: int) -> list[str]:
    names = ["X"]
    for i in range(1, n_layers + 1):
        names += [f"W_{i}", f"bias_{i}"]
    return names


def reference(inputs, attrs: dict):
    import torch

    x = inputs[0].float()
    acts = str(attrs.get("activations", "")).split(".")
    if len(inputs) != 1 + 2 * len(acts):
        raise ValueError(f"MLPStack: {len(inputs)} inputs for {len(acts)} activations (need 1 + 2 per layer)")
    y = x
    for i, act in enumerate(acts):
        z = y @ inputs[1 + 2 * i].float() + inputs[2 + 2 * i].float()
        # Intermediates are rounded to the op's type between layers, as the unfused graph stores them.
        y = (torch.relu(z) if act == "relu" else torch.sigmoid(z)).to(inputs[0].dtype).float()
    return y.to(inputs[0].dtype)


def stack_body(activations: list[str]) -> list:
    """MLPStack's body for one activation list: MatMul, Add, activation per layer."""
    from onnx import helper

    mk = helper.make_node
    nodes, h = [], "X"
    for i, act in enumerate(activations, start=1):
        if act not in STACK_ACTIVATIONS:
            raise ValueError(f"MLPStack: activation {act!r} is not one of {', '.join(STACK_ACTIVATIONS)}")
        out = "Y" if i == len(activations) else f"h{i}"
        nodes += [mk("MatMul", [h, f"W_{i}"], [f"xw{i}"]), mk("Add", [f"xw{i}", f"bias_{i}"], [f"z{i}"]),
                  mk("Relu" if act == "relu" else "Sigmoid", [f"z{i}"], [out])]
        h = out
    return nodes


def body(overload: str):
    """The function of the overload naming the layers' activations (relu.relu.sigmoid): an ONNX function has a
    fixed number of inputs, so there is one per depth and activation list."""
    acts = overload.split(".") if overload else []
    if not acts or stack_overload(acts) != overload:
        raise ValueError(f"MLPStack: function overload {overload!r} does not name the layers' activations")
    return stack_input_names(len(acts)), stack_body(acts)


def stack_shapes(m: int, widths) -> dict[str, list[int]]:
    shapes = {"X": [m, widths[0]]}
    for i, (k, n) in enumerate(zip(widths[:-1], widths[1:]), start=1):
        shapes[f"W_{i}"], shapes[f"bias_{i}"] = [k, n], [n]
    return shapes


def doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(M, layer widths, activations)."""
    m, widths, acts = entry
    return stack_shapes(m, widths), {"activations": acts}, (m, widths[0], widths[-1], 0,
                                                            "-".join(map(str, widths)) + " " + acts)


FAMILY = OpFamily("mlp_stack", (
    # Doctor shapes: DLRM's bottom MLP, an odd narrow stack, DLRM's top MLP, and a stack that runs per layer (M
    # between the grid and row-block ranges) with a first layer on the persistent TMA build.
    OpDef(5, MLP_STACK, reference, body, matmul_out_shape,
          ((1, (13, 512, 256, 64, 16), "relu.relu.relu.relu"), (37, (129, 67, 33, 1), "relu.relu.sigmoid"),
           (256, (367, 512, 256, 1), "relu.relu.sigmoid"), (2050, (1040, 2576, 48), "relu.sigmoid")),
          doctor_entry, overload=lambda attrs: attrs.get("activations", "")),
), cpp_name="MLPStack")
