"""The onnxfuse op families: one module per family, named like its rules (`onnxfuse/rewrites/<family>.py`) and its
kernels, declaring its ops' schemas, PyTorch references, function bodies and doctor cases (`_family.OpDef`).

`FAMILIES` lists them once, in the order `onnxfuse fuse` applies their rules (stage 2): LoRA first (a LoRA-wrapped
projection must not be half-taken by the plain-linear rules), then SwiGLU, RotaryEmbedding, FlashAttention (one
onnxruntime MultiHeadAttention node: no other family's pattern holds it), CachedAttention (one com.microsoft
GroupQueryAttention node, likewise), Linear+activation, the MLP-stack pass that chains consecutive Linear+activation
nodes, and the embedding-interaction ops before the plain Embedding (DLRM's lookups belong to the interaction op);
Int4Linear (onnxruntime's MatMulNBits): no other family's pattern contains that op; Linear last, a MatMul by a
constant weight that no family before it took (it would otherwise take the projections that the gated-MLP, LoRA and
activation rules fuse). `onnxfuse.schema` builds the registry from it (OPS, in each op's `index` order). Nothing here
imports torch or onnx at load time: `import onnxfuse.schema` stays light.
"""
from __future__ import annotations

from . import (cached_attention, embedding, embedding_interaction, flash_attention, int4_linear, linear, linear_act,
               lora_linear, mlp_stack, rotary_embedding, swiglu)
from ._family import OpDef, OpFamily

FAMILIES: tuple[OpFamily, ...] = tuple(module.FAMILY for module in (
    lora_linear, swiglu, rotary_embedding, flash_attention, cached_attention, linear_act, mlp_stack,
    embedding_interaction, embedding, int4_linear, linear))

__all__ = ["FAMILIES", "OpDef", "OpFamily", "cached_attention", "embedding", "embedding_interaction", "flash_attention",
           "int4_linear", "linear", "linear_act", "lora_linear", "mlp_stack", "rotary_embedding", "swiglu"]
