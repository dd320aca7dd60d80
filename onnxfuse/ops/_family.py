"""The contract of an op family (`OpDef`, `OpFamily`) and the vocabulary every family shares.

An op family is one module of `onnxfuse/ops/`, named like its rules (`onnxfuse/rewrites/<family>.py`) and its
kernels; it declares, per op, everything the Python side knows about it: the schema, the PyTorch reference, the
model-local function body, the function overload, the output shape, and what `onnxfuse doctor` runs. This module
imports nothing of onnxfuse: `onnxfuse.schema` re-exports its vocabulary and builds the registry from the families
(`onnxfuse/ops/__init__.py` lists them), so the families import from here, never from schema (no import cycle).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

DOMAIN = "onnxfuse"
DOMAIN_VERSION = 1
# Standard ONNX opset the exporters and the function bodies use.
ONNX_OPSET = 18
# Highest IR version onnxruntime 1.31 accepts is 13; 10 is what the dynamo exporter writes and all we need.
IR_VERSION = 10

TYPES = ("float", "float16", "bfloat16")
BACKENDS = ("auto", "cpu", "cuda", "triton")
# Activation codes the kernels share (0 means none); MLPStack's `activations` names one per layer.
ACTIVATIONS = {"relu": 1, "sigmoid": 2}
# The lowest default-domain opset of a function body that needs nothing newer than MatMul, Add, Mul, Relu, Sigmoid
# (bfloat16 kernels for Relu since opset 14: rewrites/_base.py BF16_MIN_OPSET).
DEFAULT_MIN_OPSET = 13

# Shapes the doctor's GEMM ops share, (M, K, N): aligned shapes of the size classes of triton/table.py (M <= 16,
# <= 128, larger with enough tiles to fill the SMs) so that every tuned Triton config (triton/tuned.json;
# onnxfuse.tune.doctor_coverage checks) runs in `onnxfuse doctor`.
DOCTOR_MEDIUM, DOCTOR_LARGE = (64, 256, 256), (2048, 32, 2560)  # aligned; the large one has >= 160 tiles of any tile
# The persistent TMA kernels (triton/table.py TMA_*: K >= TMA_MIN_K, large class, tiles >= SMs): M, K and N not
# multiples of the tile, so the descriptors' zero fill at every edge is checked.
DOCTOR_TMA = (1100, 1040, 3856)


@dataclass(frozen=True)
class Attr:
    name: str
    kind: str  # "float" | "string" | "int"
    default: object
    doc: str


@dataclass(frozen=True)
class OpSchema:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    math: str
    attrs: tuple[Attr, ...] = field(default_factory=tuple)
    doc: str = ""
    # Variadic ops (MLPStack) repeat the inputs after the first one per layer: X, W_1, bias_1, W_2, bias_2, ...
    variadic: bool = False
    # Trailing inputs a node may leave out (Int4Linear's zero points): all present or all absent; a node with them
    # carries its OpDef's optional_overload (see overload_with_optional).
    optional: tuple[str, ...] = ()

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs)


BACKEND = Attr("backend", "string", "auto",
               "kernel family: auto|cpu|cuda|triton (set it with onnxfuse fuse --backend or runtime.session(backend=))")


def overload_with_optional(base: str, suffix: str) -> str:
    """The overload of a node whose optional inputs are present: its base overload (an activation, or empty) and the
    op's suffix, "silu.zp" or "zp" (an ONNX function has a fixed number of inputs: the optional ones get a body of
    their own)."""
    return f"{base}.{suffix}" if base else suffix


def split_optional_overload(overload: str, suffix: str) -> tuple[str, bool]:
    """(base overload, whether the optional inputs are present) of a node's overload (overload_with_optional's
    inverse; an op without optional inputs has suffix "")."""
    if suffix and overload == suffix:
        return "", True
    if suffix and overload.endswith("." + suffix):
        return overload[:-len(suffix) - 1], True
    return overload, False


def no_overload(attrs: dict) -> str:
    """The overload of an op with one function body: empty."""
    return ""


def matmul_out_shape(shapes: dict, attrs: dict) -> list:
    """Y's shape of a GEMM op: X's leading dims, then the last weight's columns (W, W_up, W_L)."""
    weights = [v for k, v in shapes.items() if k.startswith("W")]
    return list(shapes["X"][:-1]) + [weights[-1][-1]]


def skip_rms_norm(a, b, gamma, eps: float, dtype):
    """(normed, sum) as onnxruntime's residual add and RMS norm (com.microsoft SkipSimplifiedLayerNormalization) give
    them, for the ops that take it in (LinearSkipRMSNorm after its product, the SkipRMSNormInt4 ops before theirs): sum
    = a + b rounded to dtype (a in fp32), normed = its RMS norm times gamma in fp32 math, rounded to dtype."""
    import torch

    s = (a + b.float()).to(dtype)
    sf = s.float()
    return (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()).to(dtype), s


def skip_norm_node(inputs: list[str], normed: str):
    """onnxruntime's SkipSimplifiedLayerNormalization node of a function body: `inputs` (input, skip, gamma), outputs
    `normed` and "sum" (mean and inv_std_var unused), epsilon the function's attribute."""
    from onnx import AttributeProto, helper

    norm = helper.make_node("SkipSimplifiedLayerNormalization", inputs, [normed, "", "", "sum"], domain="com.microsoft")
    norm.attribute.append(AttributeProto(name="epsilon", ref_attr_name="epsilon", type=AttributeProto.FLOAT))
    return norm


def doctor_gemm_entry(schema: OpSchema, entry) -> tuple[dict, dict, tuple]:
    """A GEMM op's doctor entry (M, K, N, r): its input shapes, no extra attributes, the report's (M, K, N, r, "")."""
    m, k, n, r = entry
    return gemm_input_shapes(schema, m, k, n, r), {}, (m, k, n, r, "")


def gemm_input_shapes(schema: OpSchema, m: int, k: int, n: int, r: int) -> dict[str, list[int]]:
    """The doctor's input shapes of a GEMM op of M rows, K in, N out and LoRA rank r."""
    dims = {"X": [m, k], "W": [k, n], "W_gate": [k, n], "W_up": [k, n], "A": [k, r], "B": [r, n], "bias": [n]}
    return {name: dims[name] for name in schema.inputs}


def random_inputs(op: OpDef, dtype, shapes: dict, seed: int, device: str = "cpu") -> list:
    """The doctor's random inputs, rounded to the torch dtype `dtype`: weights scaled so outputs stay O(1), the
    integer inputs (ids) drawn in [-V, V) for a table of V rows (negative ids count from the end)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for name, shp in shapes.items():
        if name in op.int_inputs:
            v = shapes["table"][0]
            out.append(torch.randint(-v, v, tuple(shp), generator=g, device=device, dtype=torch.int64))
            continue
        t = torch.randn(*shp, generator=g, device=device, dtype=torch.float32)
        if name in ("W", "W_gate", "W_up", "A") or name.startswith("W_"):
            t = t / max(shp[0], 1) ** 0.5
        elif name == "B":
            t = t / max(shp[0], 1) ** 0.5 * 0.5
        elif name == "bias" or name.startswith("bias_"):
            t = t * 0.5
        out.append(t.to(dtype))
    return out


@dataclass(frozen=True)
class OpDef:
    """One op of a family: its schema and the callables every generic module (functions, testing, doctor, the
    rules' opset guard) dispatches to instead of naming the op.

    index: the op's place in the domain's op table (schema.OPS, the generated C++ header's structs, the library's
    op list, the doctor's rows): the order the ops were added in; a new op takes the next index.
    reference(inputs, attrs): the PyTorch reference (fp32 math on the given tensors, Y in the first input's type).
    body(overload): (the function's input names, its nodes): the model-local ONNX function of one overload.
    overload(attrs): the function overload a node with these attributes carries ("" for one body).
    overload_attr: the attribute a non-empty overload names the value of (SwiGLU's activation): the function's
    default of that attribute is the overload.
    out_shape(shapes, attrs): Y's shape from the inputs' shapes ({name: shape} in the node's order).
    min_opset: the lowest default-domain opset in which every body is valid (the rules fuse only from there).
    int_inputs: inputs fed as int64 (ids, bags, table layout), never cast to the op's type T.
    int32_inputs: inputs fed as int32 (CachedAttention's sequence lengths), never cast to T.
    cpu_inputs: inputs the CUDA kernels read in host memory (CachedAttention's total_sequence_length, which sizes an
    output): the doctor binds them on the CPU in its CUDA-graph rows, as onnxruntime's own GroupQueryAttention wants.
    out_shapes(shapes, attrs): every output's shape, for an op with more outputs than Y (None: Y's alone).
    byte_inputs: inputs fed as uint8 (Int4Linear's packed weights), never cast to T.
    doctor_shapes: `onnxfuse doctor`'s default entries; doctor_entry(entry): (input shapes, extra node attributes,
    the report's (M, K, N, r, label)); doctor_inputs(dtype, shapes, seed, device): inputs as torch tensors of the
    torch dtype (shapes may name the first float input alone: the doctor's second X).
    weighted: the inputs after X are weights (the doctor's special rows also run them as initializers).
    optional_overload: the suffix of the overload of a node that has the schema's optional inputs (Int4Linear's "zp";
    the body gets the whole overload and declares them).
    special_type_max: the doctor's special rows include the type's largest value (testing.with_special_rows); False
    where whether such a row overflows depends on where the kernels round an intermediate that the fp32 reference
    keeps (LoRASwiGLU's X @ A, rounded to the input type by its GPU kernels as the unfused 16-bit graph does, then
    multiplied through the gating product; the int4 GEMV's fp32 lane sums). NaN, +-Inf, -0 and subnormals are
    checked either way.
    """
    index: int
    schema: OpSchema
    reference: Callable
    body: Callable
    out_shape: Callable
    doctor_shapes: tuple
    doctor_entry: Callable
    overload: Callable = no_overload
    overload_attr: str | None = None
    min_opset: int = DEFAULT_MIN_OPSET
    int_inputs: tuple[str, ...] = ()
    int32_inputs: tuple[str, ...] = ()
    cpu_inputs: tuple[str, ...] = ()
    out_shapes: Callable | None = None
    byte_inputs: tuple[str, ...] = ()
    doctor_inputs: Callable | None = None
    weighted: bool = True
    optional_overload: str = ""
    special_type_max: bool = True

    @property
    def name(self) -> str:
        return self.schema.name

    def node_overload(self, attrs: dict, input_names) -> str:
        """The overload of a node with these attributes and inputs (the optional inputs' suffix when present)."""
        base = self.overload(attrs)
        if self.schema.optional and any(n in self.schema.optional for n in input_names):
            return overload_with_optional(base, self.optional_overload)
        return base

    def all_out_shapes(self, shapes: dict, attrs: dict) -> list:
        """Every output's shape (out_shapes, or Y's alone)."""
        if self.out_shapes is not None:
            return self.out_shapes(shapes, attrs)
        return [self.out_shape(shapes, attrs)]

    def make_doctor_inputs(self, dtype, shapes: dict, seed: int, device: str = "cpu") -> list:
        if self.doctor_inputs is not None:
            return self.doctor_inputs(self, dtype, shapes, seed, device)
        return random_inputs(self, dtype, shapes, seed, device)


@dataclass(frozen=True)
class OpFamily:
    """A family: its snake name (the rules' `onnxfuse/rewrites/<name>.py`, fuse's pattern name, the kernel files
    `kernels/{cpu,cuda,triton}/<name>.*`) and its ops.

    cpp_name: the family's name in the kernel library's C++ (`Register<cpp_name>()`, `Register<cpp_name>Cuda()`, listed
    in the generated header's ONNXFUSE_OP_FAMILIES); empty: the snake name in CamelCase (linear_act -> LinearAct).
    """
    name: str
    ops: tuple[OpDef, ...]
    cpp_name: str = ""

    @property
    def kernel_name(self) -> str:
        return self.cpp_name or "".join(part[:1].upper() + part[1:] for part in self.name.split("_"))
