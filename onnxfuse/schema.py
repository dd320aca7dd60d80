"""The onnxfuse ONNX domain: the registry of every fused op (its inputs, outputs, attributes and math) and the
domain's vocabulary.

Each op family is one module of `onnxfuse/ops/` (`onnxfuse/ops/__init__.py` lists them): its ops' schemas, PyTorch
references, function bodies, overloads, output shapes, minimum opsets and doctor cases (`ops._family.OpDef`). This
module builds the registry from them: `OPS` (name -> OpSchema) and `op_def(name)` (name -> OpDef). Rules
(`onnxfuse/rewrites/<family>.py`), the kernel library (`onnxfuse/kernels/*/<op>.*`), Netron annotations, the
model-local ONNX functions that keep a fused model runnable without the library, the doctor and the tests all read
it instead of repeating it. The vocabulary is defined in `ops/_family.py` (shared) and the family modules (their own
attributes' values) and re-exported here, so the families never import this module (no import cycle).

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

from . import ops
from .ops._family import (ACTIVATIONS, BACKENDS, DOMAIN, DOMAIN_VERSION, IR_VERSION, ONNX_OPSET, TYPES, Attr, OpDef,
                          OpSchema)
from .ops._family import BACKEND as _BACKEND  # noqa: F401  (schema._BACKEND: every op's backend attribute)
from .ops.embedding import EMBEDDING
from .ops.embedding_interaction import (EMBEDDING_BAG_INTERACTION, EMBEDDING_INTERACTION, HASHES, INTERACTIONS,
                                        embedding_overload, interaction_width)
from .ops.linear_act import LINEAR_RELU, LINEAR_SIGMOID
from .ops.lora_linear import LORA_LINEAR, LORA_LINEAR_RELU
from .ops.mlp_stack import (MAX_STACK_LAYERS, MLP_STACK, STACK_ACTIVATIONS, STACK_MODES, stack_input_names,
                            stack_overload)
from .ops.rotary_embedding import ROTARY_EMBEDDING
from .ops.swiglu import GATE_ACTIVATIONS, GELU_TANH_COEFF, QUICK_GELU_ALPHA, SWIGLU, gate_activation, swiglu_overload

__all__ = ["ACTIVATIONS", "BACKENDS", "DOMAIN", "DOMAIN_VERSION", "EMBEDDING", "EMBEDDING_BAG_INTERACTION",
           "EMBEDDING_INTERACTION", "EMBEDDING_OPS", "FAMILY_OF",
           "GATE_ACTIVATIONS", "GELU_TANH_COEFF", "HASHES", "INTERACTIONS", "IR_VERSION", "LINEAR_RELU",
           "LINEAR_SIGMOID", "LORA_LINEAR", "LORA_LINEAR_RELU", "MAX_STACK_LAYERS", "MLP_STACK", "ONNX_OPSET", "OPS",
           "QUICK_GELU_ALPHA", "ROTARY_EMBEDDING", "STACK_ACTIVATIONS", "STACK_MODES", "SWIGLU", "TYPES", "Attr",
           "OpDef", "OpSchema", "embedding_overload", "gate_activation", "interaction_width", "op_def", "reference",
           "stack_input_names", "stack_overload", "swiglu_overload"]


def _registry() -> dict[str, OpDef]:
    """Every family's ops by name, in their `index` order (the domain's op table: OPS, the generated C++ header,
    the library's op list, the doctor's rows)."""
    defs = sorted((d for family in ops.FAMILIES for d in family.ops), key=lambda d: d.index)
    if [d.index for d in defs] != list(range(len(defs))) or len({d.name for d in defs}) != len(defs):
        raise ValueError("onnxfuse.ops: op indices must be 0..n-1 and op names unique: "
                         + ", ".join(f"{d.index} {d.name}" for d in defs))
    return {d.name: d for d in defs}


_DEFS = _registry()
OPS: dict[str, OpSchema] = {name: d.schema for name, d in _DEFS.items()}
# op name -> its family's name (its rules' module, fuse's pattern name).
FAMILY_OF: dict[str, str] = {d.name: family.name for family in ops.FAMILIES for d in family.ops}
# The embedding ops: their function overload names the interaction (and EmbeddingInteraction's hash), since the
# function body differs (embedding_overload).
EMBEDDING_OPS = tuple(s.name for s in ops.embedding_interaction.OPS)

def op_def(op: str) -> OpDef:
    """The definition of `op` (its schema, reference, function body, overload, output shape, doctor cases)."""
    if op not in _DEFS:
        raise KeyError(f"unknown onnxfuse op {op!r}; known: {', '.join(OPS)}")
    return _DEFS[op]


def reference(op: str, inputs, attrs: dict | None = None):
    """PyTorch reference of an op (fp32 math on whatever tensors are given); tests and `doctor` compare to it."""
    return op_def(op).reference(inputs, attrs or {})
