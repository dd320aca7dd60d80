"""genai's model builder, run as `python -m onnxfuse.genai._builder ARGS` (its own CLI, ARGS passed through), with
one adaptation to transformers 5.

onnxruntime-genai 0.18's builder reads Gemma 3's rotary settings in transformers 4's form: `rope_theta` and
`rope_local_base_freq` attributes and one flat `rope_parameters` dict. transformers 5 keeps one dict per layer type
(`{"full_attention": {...}, "sliding_attention": {...}}`), and the builder stops with KeyError 'rope_type'. The
config the builder loads is given the 4.x attributes from those dicts (global layers: full_attention's theta; local
ones: sliding_attention's), and nothing else changes: the weights and every other field are the checkpoint's.
`onnxfuse verify DIR` checks the result against transformers, and the family matrix in tests/test_genai.py runs it
on a Gemma 3 with both layer types.
"""
from __future__ import annotations

import runpy
import sys


def _adapt(config):
    rope = getattr(config, "rope_parameters", None)
    if getattr(config, "model_type", "") == "gemma3_text" and isinstance(rope, dict) and "sliding_attention" in rope:
        full, local = dict(rope["full_attention"]), rope["sliding_attention"]
        config.rope_local_base_freq = local["rope_theta"]
        config.rope_theta = full["rope_theta"]
        object.__setattr__(config, "rope_parameters", full)  # past transformers' own validation of the field
    return config


def run(argv: list[str]) -> None:
    import transformers
    load = transformers.AutoConfig.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):
        return _adapt(load(cls, *args, **kwargs))

    transformers.AutoConfig.from_pretrained = classmethod(from_pretrained)
    sys.argv = ["onnxruntime_genai.models.builder", *argv]
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__")


if __name__ == "__main__":
    run(sys.argv[1:])
