"""Factories for `onnxfuse verify --module tests/data/hf_decoders.py:<name>`: tiny transformers decoders a user
would bring besides Llama (grouped-query attention: 4 query heads, 2 key/value heads), random weights from a seed,
returning (module, inputs) as `verify --module` expects."""
from __future__ import annotations

import torch
import transformers


class LastHidden(torch.nn.Module):
    """The decoder's last hidden state for input_ids (what the ONNX export returns)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).last_hidden_state


_SHAPES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)


def _build(cls, config):
    torch.manual_seed(0)
    module = LastHidden(cls(config)).eval()
    inputs = {"input_ids": torch.randint(0, _SHAPES["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))}
    return module, inputs


def mistral():
    return _build(transformers.MistralModel, transformers.MistralConfig(**_SHAPES, sliding_window=None))


def qwen2():
    return _build(transformers.Qwen2Model, transformers.Qwen2Config(**_SHAPES))
