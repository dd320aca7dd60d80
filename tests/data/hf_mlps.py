"""Factories for `onnxfuse verify --module tests/data/hf_mlps.py:<name>`: transformers' own gated-MLP modules as a user
would bring them (hidden 256, input 2 x 8, random weights from a seed), returning (module, inputs) as `verify
--module` expects. One factory per module and dtype: `llama`, `phi3_fp16`, `mistral_gelu`, ... (see FACTORIES).

The gate weights are drawn with a larger spread than nn.Linear's default so that the gate's pre-activations cover
[-6, 6], where the activations differ most (gelu and its tanh approximation differ by up to 5e-4 there)."""
from __future__ import annotations

import functools

import torch
import transformers

HIDDEN, INTERMEDIATE, TOKENS = 256, 512, (2, 8)
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def _mlp_class(module: str, name: str):
    import importlib
    return getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)


# name -> (transformers module, MLP class, config class, config field of the activation, default activation)
MODULES = {
    "llama": ("llama", "LlamaMLP", "LlamaConfig", "hidden_act", "silu"),
    "mistral": ("mistral", "MistralMLP", "MistralConfig", "hidden_act", "silu"),
    "qwen2": ("qwen2", "Qwen2MLP", "Qwen2Config", "hidden_act", "silu"),
    "qwen3": ("qwen3", "Qwen3MLP", "Qwen3Config", "hidden_act", "silu"),
    "phi3": ("phi3", "Phi3MLP", "Phi3Config", "hidden_act", "silu"),
    "gemma": ("gemma", "GemmaMLP", "GemmaConfig", "hidden_act", "gelu_pytorch_tanh"),
    "gemma2": ("gemma2", "Gemma2MLP", "Gemma2Config", "hidden_activation", "gelu_pytorch_tanh"),
}
# transformers' hidden_act -> the SwiGLU activation it fuses into
FUSED_ACTIVATION = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                    "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "quick_gelu": "quick_gelu", "relu": "relu",
                    "sigmoid": "sigmoid"}
# Mistral with other activations (the hidden_act variants).
MISTRAL_ACTIVATIONS = ("gelu", "quick_gelu", "relu", "sigmoid", "gelu_new", "gelu_fast", "gelu_pytorch_tanh")


def build(name: str, dtype: str = "fp32", act: str | None = None, seed: int = 0):
    """(module, {"x": input}) for MODULES[name] with activation `act` (default: the model's own)."""
    module_name, cls_name, config_name, field, default = MODULES[name]
    config = getattr(transformers, config_name)(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                                                **{field: act or default})
    torch.manual_seed(seed)
    mlp = _mlp_class(module_name, cls_name)(config).eval()
    with torch.no_grad():
        for lin_name, lin in mlp.named_children():
            if isinstance(lin, torch.nn.Linear):
                std = (2.0 if lin_name in ("gate_proj", "gate_up_proj") else 1.0) / lin.in_features ** 0.5
                lin.weight.normal_(0.0, std)
    mlp = mlp.to(DTYPES[dtype])
    x = torch.randn(*TOKENS, HIDDEN, generator=torch.Generator().manual_seed(seed + 1)).to(DTYPES[dtype])
    return mlp, {"x": x}


def activation_of(name: str, act: str | None = None) -> str:
    """The SwiGLU activation a module fuses into."""
    return FUSED_ACTIVATION[act or MODULES[name][4]]


FACTORIES: dict[str, tuple[str, str, str | None]] = {}
for _name in MODULES:
    for _dtype in DTYPES:
        FACTORIES[_name + ("" if _dtype == "fp32" else f"_{_dtype}")] = (_name, _dtype, None)
for _act in MISTRAL_ACTIVATIONS:
    for _dtype in DTYPES:
        FACTORIES[f"mistral_{_act}" + ("" if _dtype == "fp32" else f"_{_dtype}")] = ("mistral", _dtype, _act)
for _factory, (_name, _dtype, _act) in FACTORIES.items():
    globals()[_factory] = functools.partial(build, _name, _dtype, _act)
