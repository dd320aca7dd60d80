"""The onnxfuse ONNX domain: one place that names every fused op, its inputs, outputs, attributes and math.

Rules (`onnxfuse/rewrites/<op>.py`), the kernel library (`onnxfuse/kernels/*/<op>.*`), Netron annotations, the
model-local ONNX functions that keep a fused model runnable without the library, and the tests all read this module
instead of repeating it.

Layout conventions (shared by every op):
  * X is ``[..., K]`` (any leading dims, flattened to M rows by the kernels; row-major, contiguous).
  * Weights are ``[K, N]`` row-major, the layout of ONNX ``MatMul``'s second input (what the TorchScript exporter
    and the dynamo exporter on 3-D activations emit). A ``Gemm(transB=1)`` weight is transposed once at fuse time.
  * LoRA ``A`` is ``[K, r]`` and ``B`` is ``[r, N]`` (so the branch is ``(X @ A) @ B``).
  * Bias is always present, ``[N]`` (a zero bias is added by the rule where the source had none), so one function
    body serves every node of an op.
  * All tensors of a node share one element type T in {float, float16, bfloat16}; kernels accumulate in fp32 and
    compute transcendentals in fp32.
  * Every op has a string attribute ``backend`` in {auto, cpu, cuda, triton}; ``auto`` lets the library choose.
    It is set in the model: ``onnxfuse fuse --backend`` when fusing, or ``runtime.session(..., backend=)`` on an
    in-memory copy when running.

The kernel library does not repeat any of this: the build generates the C/C++ header ``onnxfuse_ops.h`` from this
module (and the Triton kernel table in ``kernels/triton/table.py``); see ``onnxfuse/kernels/ops_header.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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
# SwiGLU's gate activations (its `activation` attribute), each as PyTorch defines it and computed in fp32 by every
# kernel: silu x*sigmoid(x); gelu 0.5*x*(1+erf(x/sqrt(2))) (torch's gelu, approximate='none'); gelu_tanh
# 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))) (approximate='tanh'); quick_gelu x*sigmoid(1.702*x); relu; sigmoid.
# The code is the index (a separate space from ACTIVATIONS, whose codes MLPStack's kernels read); silu, code 0, is
# the default, so SwiGLU nodes written before the attribute existed keep their meaning.
GATE_ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "quick_gelu", "relu", "sigmoid")
QUICK_GELU_ALPHA = 1.702
GELU_TANH_COEFF = 0.044715
# How an MLPStack node runs on the GPU: auto (the library decides by shape), fused (one kernel for the whole stack,
# each program carrying a block of rows through every layer; Triton backend), layers (one GEMM launch per layer) or
# grid (one persistent kernel whose programs split every layer's tiles and meet at a grid barrier between layers;
# Triton backend). Codes are the index.
STACK_MODES = ("auto", "fused", "layers", "grid")
# How EmbeddingInteraction / EmbeddingBagInteraction combine the dense vector with the embeddings (attribute
# `interaction`): "dot" is DLRM's pairwise dot products (strict lower triangle, after the dense vector), "cat" the
# plain concatenation of all vectors. Codes are the index.
INTERACTIONS = ("dot", "cat")
# The categorical-id hash of EmbeddingInteraction (attribute `hash`): "none" looks the id up as it is, "mod" is
# onnxfuse's DLRM hash (id + 1) mod cardinality (Python's modulus: always in [0, cardinality)). Codes are the index.
HASHES = ("none", "mod")


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

    @property
    def attr_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.attrs)


_BACKEND = Attr("backend", "string", "auto",
                "kernel family: auto|cpu|cuda|triton (set it with onnxfuse fuse --backend or runtime.session(backend=))")

LINEAR_RELU = OpSchema(
    "LinearRelu", ("X", "W", "bias"), ("Y",), "Y = relu(X @ W + bias)", (_BACKEND,),
    "A Linear layer with its ReLU: Gemm/MatMul + Add + Relu (DLRM MLP layers).")
LINEAR_SIGMOID = OpSchema(
    "LinearSigmoid", ("X", "W", "bias"), ("Y",), "Y = sigmoid(X @ W + bias)", (_BACKEND,),
    "A Linear layer with its sigmoid: the prediction head of DLRM's top MLP.")
SWIGLU = OpSchema(
    "SwiGLU", ("X", "W_gate", "W_up"), ("Y",), "Y = act(X @ W_gate) * (X @ W_up)",
    (Attr("activation", "string", "silu", "the gate's activation: " + "|".join(GATE_ACTIVATIONS) + " (gelu: erf "
          "form; gelu_tanh: approximate='tanh'; quick_gelu: x*sigmoid(1.702x)); absent means silu"), _BACKEND),
    "The gate and up projections of a gated MLP (Llama/Mistral/Qwen SwiGLU, Gemma GeGLU, Phi-3's merged gate_up_proj, "
    "ReGLU, GLU) with act(gate) * up in their epilogue; the down projection stays a plain MatMul/Gemm. The node's "
    "function overload names the activation (empty: silu, as written before the attribute existed).")
LORA_LINEAR = OpSchema(
    "LoRALinear", ("X", "W", "A", "B", "bias"), ("Y",), "Y = X @ W + bias + scale * ((X @ A) @ B)",
    (Attr("scale", "float", 1.0, "LoRA scaling alpha / r"), _BACKEND),
    "A LoRA-adapted linear (peft or plain PyTorch), base GEMM and rank-r branch in one op.")
LORA_LINEAR_RELU = OpSchema(
    "LoRALinearRelu", ("X", "W", "A", "B", "bias"), ("Y",), "Y = relu(X @ W + bias + scale * ((X @ A) @ B))",
    (Attr("scale", "float", 1.0, "LoRA scaling alpha / r"), _BACKEND),
    "A LoRA-adapted linear followed by ReLU (the DLRM lecture's fused add*mul+relu case).")

MLP_STACK = OpSchema(
    "MLPStack", ("X", "W_i", "bias_i"), ("Y",),
    "h_0 = X; h_i = act_i(h_{i-1} @ W_i + bias_i) for i = 1..L; Y = h_L",
    (Attr("activations", "string", "relu", "the layers' activations joined by dots, each relu or sigmoid "
                                           "(e.g. relu.relu.sigmoid; L = their number)"),
     Attr("stack_mode", "string", "auto", "how the GPU runs the stack: auto|fused|layers|grid (fused: one Triton "
                                          "kernel for all layers, a block of rows per program; grid: one persistent "
                                          "Triton kernel splitting each layer across the SMs; layers: one GEMM launch "
                                          "per layer; auto: by shape)"),
     _BACKEND),
    "A chain of Linear+activation layers (a DLRM bottom or top MLP) in one op: on the GPU one kernel keeps the "
    "intermediate activations of a row block on chip instead of a launch and an HBM round trip per layer. "
    "Inputs X, W_1, bias_1, ..., W_L, bias_L; the node's function overload names the activations "
    "(e.g. relu.relu.sigmoid), so the model-local function body matches the node's depth.",
    variadic=True)

ROTARY_EMBEDDING = OpSchema(
    "RotaryEmbedding", ("X", "cos", "sin"), ("Y",),
    "Y = X * cos + rotate_half(X) * sin, rotate_half(X) = concat(-X[..., D/2:], X[..., :D/2])", (_BACKEND,),
    "Rotary position embedding (the rotate-half convention of Llama, Mistral, Qwen2): X is [..., D] with D even, "
    "cos and sin broadcast to X's shape (same rank, each dim 1 or X's; last dim D). One elementwise pass instead of "
    "the exporters' Slice/Neg/Concat/Mul/Mul/Add (six kernels and five intermediates per tensor).")

EMBEDDING = OpSchema(
    "Embedding", ("table", "ids"), ("Y",), "Y = table[ids]", (_BACKEND,),
    "A lookup in a constant embedding table (Gather on axis 0: a token embedding): table [V, D] of type T, ids int64 "
    "of any shape (negative ids count from the end), Y = ids.shape + [D]. The GPU kernels copy rows 16 bytes at a "
    "time (onnxruntime's Gather moves one element per thread: 4x the time for a [2048] x 4096 fp16 lookup); an id "
    "out of [-V, V) gives a row of zeros on the GPU and an error on the CPU, where onnxruntime's Gather errors.")


_INTERACTION = Attr("interaction", "string", "dot",
                    "dot (pairwise dot products of the n vectors, strict lower triangle i > j in row-major order, "
                    "after the dense vector: d + n(n-1)/2 columns) or cat (the n vectors concatenated: n*d columns)")
_EMBEDDING_DOC = (
    "table is every embedding table of the model concatenated at fuse time ([R, d], R = the sum of their rows); "
    "table_offsets[f] is the first row of feature f's table and cardinality[f] its number of rows (the modulus "
    "of the hash). A negative id counts from the end of its table, as ONNX Gather does (id + cardinality[f]); an "
    "id still outside [0, cardinality[f]), or a row outside the table, contributes a zero vector (where the "
    "unfused graph fails, and PyTorch raises): never an out-of-bounds read. Embeddings are rounded to T (as the unfused graph stores them); dot products accumulate in fp32. "
    "The vectors are v_0 = X[b] and v_{f+1} = the embedding of feature f, so n = F + 1.")
EMBEDDING_INTERACTION = OpSchema(
    "EmbeddingInteraction", ("X", "ids", "table", "table_offsets", "cardinality"), ("Y",),
    "e_f = table[table_offsets[f] + h(ids[:, f])]; Y = interaction(X, e_0..e_{F-1})",
    (_INTERACTION,
     Attr("hash", "string", "none", "none (h(id) = id) or mod (h(id) = (id + 1) mod cardinality[f], Python's "
                                    "modulus: onnxfuse's DLRM)"),
     _BACKEND),
    "DLRM's embedding lookups and feature interaction in one op (one id per feature and sample): X [B, d] the "
    "bottom MLP's output, ids [B, F] int64. " + _EMBEDDING_DOC)
EMBEDDING_BAG_INTERACTION = OpSchema(
    "EmbeddingBagInteraction", ("X", "indices", "offsets", "table", "table_offsets", "cardinality"), ("Y",),
    "e_f[b] = sum_{p in bag(f, b)} table[table_offsets[f] + indices[f, p]]; Y = interaction(X, e_0..e_{F-1})",
    (_INTERACTION, _BACKEND),
    "The original DLRM's nn.EmbeddingBag(mode='sum') lookups (multi-hot bags given by offsets) and its feature "
    "interaction in one op: X [B, d], indices [F, N] int64, offsets [F, B] int64; bag(f, b) is the positions "
    "[offsets[f, b], offsets[f, b + 1]) (the last bag ends at N), clamped to [0, N], empty when the end is not "
    "past the start. " + _EMBEDDING_DOC)

OPS: dict[str, OpSchema] = {s.name: s for s in (LINEAR_RELU, LINEAR_SIGMOID, SWIGLU, LORA_LINEAR, LORA_LINEAR_RELU,
                                                MLP_STACK, ROTARY_EMBEDDING, EMBEDDING, EMBEDDING_INTERACTION,
                                                EMBEDDING_BAG_INTERACTION)}
# The embedding ops: their function overload names the interaction (and EmbeddingInteraction's hash), since the
# function body differs (embedding_overload).
EMBEDDING_OPS = ("EmbeddingInteraction", "EmbeddingBagInteraction")
# Per-layer activations MLPStack supports, and the most layers one node may have (the Triton kernel's unrolling).
STACK_ACTIVATIONS = tuple(ACTIVATIONS)
MAX_STACK_LAYERS = 4

# A/B experiment knobs of the Triton kernels: optional int attributes, read only by a library built with
# experiments (`onnxfuse build --experiments`, which also compiles the variant cubins they select). 0 is the
# default kernel; a default library refuses a node that asks for another value. Not part of the ops' contract
# (the function bodies ignore them), so they live apart from OPS.
EXPERIMENT_ATTRS: dict[str, Attr] = {a.name: a for a in (
    Attr("small_cfg", "int", 0, "Triton decode-path (M <= 16) tile variant 0|1|2 (fp16/bf16, aligned)"),
    Attr("lora_onepass", "int", 0, "Triton LoRA: 0 two-phase (X @ A into scratch, then the GEMM), 1 one-pass kernel"),
    Attr("stack_cfg", "int", 0, "Triton one-kernel MLPStack column-tile variant 0|1|2 (128/64/256 wide; fp16/bf16)"),
)}
# Which ops read which experiment attribute.
EXPERIMENT_OPS: dict[str, tuple[str, ...]] = {
    "small_cfg": ("LinearRelu", "LinearSigmoid", "SwiGLU", "LoRALinear", "LoRALinearRelu", "MLPStack"),
    "lora_onepass": ("LoRALinear", "LoRALinearRelu"),
    "stack_cfg": ("MLPStack",),
}


def stack_overload(activations) -> str:
    """The function overload of an MLPStack node: its activations joined with dots (relu.relu.sigmoid)."""
    return ".".join(activations)


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


def stack_input_names(n_layers: int) -> list[str]:
    names = ["X"]
    for i in range(1, n_layers + 1):
        names += [f"W_{i}", f"bias_{i}"]
    return names


def embedding_overload(op: str, interaction: str, hash_: str = "none") -> str:
    """The function overload of an embedding op node: 'dot.mod', 'cat.none' (EmbeddingInteraction), 'dot' / 'cat'
    (EmbeddingBagInteraction)."""
    if interaction not in INTERACTIONS or hash_ not in HASHES:
        raise ValueError(f"{op}: interaction {interaction!r} / hash {hash_!r} not in {INTERACTIONS} / {HASHES}")
    return f"{interaction}.{hash_}" if op == "EmbeddingInteraction" else interaction


def interaction_width(n_vectors: int, dim: int, interaction: str) -> int:
    """Columns of an embedding op's output: d + n(n-1)/2 for dot, n*d for cat."""
    return dim + n_vectors * (n_vectors - 1) // 2 if interaction == "dot" else n_vectors * dim


def _embedding_reference(op: str, inputs, attrs: dict):
    import torch

    x = inputs[0]
    if op == "EmbeddingInteraction":
        ids, table, toff, card = inputs[1:5]
        ids = ids.long()
        h = ids if attrs.get("hash", "none") == "none" else torch.remainder(ids + 1, card.clamp(min=1))
        h = torch.where(h < 0, h + card, h)  # ONNX Gather's negative ids
        rows = toff + h
        valid = (h >= 0) & (h < card) & (rows >= 0) & (rows < table.shape[0])
        emb = table[torch.where(valid, rows, 0)].float() * valid[..., None]       # [B, F, d]
    else:
        indices, offsets, table, toff, card = inputs[1:6]
        n_idx = indices.shape[1]
        f_count, batch = offsets.shape
        ends = torch.cat([offsets[:, 1:], torch.full((f_count, 1), n_idx, dtype=offsets.dtype)], 1)
        start, end = offsets.clamp(0, n_idx), ends.clamp(0, n_idx)
        indices = torch.where(indices < 0, indices + card[:, None], indices)
        rows = toff[:, None] + indices
        valid = (indices >= 0) & (indices < card[:, None]) & (rows >= 0) & (rows < table.shape[0])
        g = table[torch.where(valid, rows, 0)].float() * valid[..., None]         # [F, N, d]
        p = torch.arange(n_idx)
        member = (start[..., None] <= p) & (p < end[..., None])                  # [F, B, N]
        emb = (member.double() @ g.double()).float().transpose(0, 1)             # [B, F, d]
    emb = emb.to(x.dtype).float()  # the unfused graph stores the looked-up (pooled) rows in T
    t = torch.cat([x.float()[:, None], emb], 1)                                  # [B, n, d]
    if attrs.get("interaction", "dot") == "dot":
        n = t.shape[1]
        li, lj = torch.tril_indices(n, n, offset=-1)
        y = torch.cat([x.float(), (t @ t.transpose(1, 2))[:, li, lj]], 1)
    else:
        y = t.reshape(t.shape[0], -1)
    return y.to(x.dtype)


def reference(op: str, inputs, attrs: dict | None = None):
    """PyTorch reference of an op (fp32 math on whatever tensors are given); tests and `doctor` compare to it."""
    import torch

    attrs = attrs or {}
    if op == "Embedding":
        table, ids = inputs
        v = table.shape[0]
        return table[torch.where(ids < 0, ids + v, ids).long()]
    if op in EMBEDDING_OPS:
        return _embedding_reference(op, inputs, attrs)
    x = inputs[0].float()
    if op in ("LinearRelu", "LinearSigmoid"):
        w, b = inputs[1].float(), inputs[2].float()
        z = x @ w + b
        y = torch.relu(z) if op == "LinearRelu" else torch.sigmoid(z)
    elif op == "SwiGLU":
        g, u = x @ inputs[1].float(), x @ inputs[2].float()
        y = gate_activation(str(attrs.get("activation", "silu") or "silu"), g) * u
    elif op in ("LoRALinear", "LoRALinearRelu"):
        w, a, bm, b = (t.float() for t in inputs[1:5])
        y = x @ w + b + float(attrs.get("scale", 1.0)) * ((x @ a) @ bm)
        if op == "LoRALinearRelu":
            y = torch.relu(y)
    elif op == "RotaryEmbedding":
        cos, sin = inputs[1].float(), inputs[2].float()
        half = x.shape[-1] // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        y = x * cos + rot * sin
    elif op == "MLPStack":
        acts = str(attrs.get("activations", "")).split(".")
        if len(inputs) != 1 + 2 * len(acts):
            raise ValueError(f"MLPStack: {len(inputs)} inputs for {len(acts)} activations (need 1 + 2 per layer)")
        y = x
        for i, act in enumerate(acts):
            z = y @ inputs[1 + 2 * i].float() + inputs[2 + 2 * i].float()
            # Intermediates are rounded to the op's type between layers, as the unfused graph stores them.
            y = (torch.relu(z) if act == "relu" else torch.sigmoid(z)).to(inputs[0].dtype).float()
    else:
        raise KeyError(f"unknown onnxfuse op {op!r}; known: {', '.join(OPS)}")
    return y.to(inputs[0].dtype)
