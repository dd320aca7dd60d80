"""Differential test of the whole pipeline: for random small Llama / DLRM / LoRA configs, export -> fuse -> run on
the CPU with the kernel library registered equals the PyTorch module (`onnxfuse.verify.verify`), and every
fusable subgraph was fused.

A seeded list of configs (sizes that are odd, not multiples of 16, GQA, several layers, LoRA ranks, both DLRM
interactions, fp32 and fp16), plus a hypothesis test that draws more (2 examples in the quick profile, more with
ONNXFUSE_HYPOTHESIS_PROFILE=nightly).
"""
from __future__ import annotations

import collections
import os

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from onnxfuse import schema, export, fuse, verify, zoo
from onnxfuse.rewrites.linear import MAX_N

QUICK = os.environ.get("ONNXFUSE_HYPOTHESIS_PROFILE", "quick") == "quick"

CONFIGS = {
    "llama-fp32-gqa-2l": ("llama", "fp32", dict(hidden_size=48, intermediate_size=100, num_attention_heads=4,
                                                num_key_value_heads=2, num_hidden_layers=2, batch=1, seq=7)),
    "llama-fp16-lora4": ("llama", "fp16", dict(hidden_size=40, intermediate_size=72, num_attention_heads=2,
                                               num_key_value_heads=2, lora_rank=4, batch=2, seq=5)),
    "llama-mlp-fp32-lora3-alpha5": ("llama", "fp32", dict(hidden_size=24, intermediate_size=57, mlp_only=True,
                                                          lora_rank=3, lora_alpha=5.0, batch=3, seq=3)),
    "dlrm-fp32-dot": ("dlrm", "fp32", dict(bottom_mlp=(24, 8), top_mlp=(33, 1), embedding_dim=8, table_cap=50,
                                           interaction="dot", batch=5)),
    "dlrm-fp16-cat-lora3": ("dlrm", "fp16", dict(bottom_mlp=(17, 12), top_mlp=(20, 9, 1), embedding_dim=12,
                                                 table_cap=30, interaction="cat", lora_rank=3, batch=4)),
    "dlrm-fp32-cat-batch1-lora1": ("dlrm", "fp32", dict(bottom_mlp=(5,), top_mlp=(7, 1), embedding_dim=5,
                                                        table_cap=9, interaction="cat", lora_rank=1, batch=1)),
}


def expected_ops(kind: str, spec, dtype: str = "fp32") -> dict[str, int]:
    if kind == "llama":
        layers = 1 if spec.mlp_only else spec.num_hidden_layers
        rotary = {} if spec.mlp_only else {"RotaryEmbedding": 2 * spec.num_hidden_layers}  # q and k per layer
        # 16-bit: the projections no other rule takes are Linear where their width is a multiple of 8 (q, k, v, o;
        # down where no adapter holds the MLP)
        kv = spec.num_key_value_heads * (spec.hidden_size // spec.num_attention_heads)
        widths = ([] if spec.mlp_only else [spec.hidden_size, kv, kv, spec.hidden_size]) + (
            [] if spec.lora_rank else [spec.hidden_size])
        count = layers * sum(n % 8 == 0 and n <= MAX_N for n in widths) if dtype != "fp32" else 0
        linears = {"Linear": count} if count else {}
        if spec.lora_rank:  # gate/up/down with their adapters and act * up: one LoRAGatedMLP
            return {"LoRAGatedMLP": layers, **rotary, **linears}
        return {"SwiGLU": layers, **rotary, **linears}
    relu_layers = len(spec.bottom_mlp) + len(spec.top_mlp) - 1
    # the hash, the lookups and the interaction (dot or cat) between the MLPs: one EmbeddingInteraction
    if spec.lora_rank:
        return {"LoRALinearRelu": relu_layers, "LoRALinear": 1, "EmbeddingInteraction": 1}
    # each MLP of two or more layers becomes MLPStack nodes of at most 4 layers; a lone layer stays a Linear op
    out: collections.Counter = collections.Counter({"EmbeddingInteraction": 1})
    for sizes, last in ((spec.bottom_mlp, "LinearRelu"), (spec.top_mlp, "LinearSigmoid")):
        for i in range(0, len(sizes), schema.MAX_STACK_LAYERS):
            part = sizes[i:i + schema.MAX_STACK_LAYERS]
            if len(part) >= 2:
                out["MLPStack"] += 1
            else:
                out[last if i + 1 == len(sizes) else "LinearRelu"] += 1
    return dict(out)


def make_spec(kind: str, overrides: dict):
    if kind == "llama":
        return zoo.LlamaSpec.from_preset("tiny", **overrides)
    return zoo.DlrmSpec.from_preset("small", **overrides)


def roundtrip(tmp_path, kind: str, dtype: str, spec, seed: int = 0) -> None:
    spec.validate()
    src = export.export(kind, spec, tmp_path / "m.onnx", seed=seed, dtype=dtype, force=True).path
    res = fuse.fuse(src, tmp_path / "f.onnx", force=True)
    got = collections.Counter(m.op for m in res.matches)
    assert dict(got) == expected_ops(kind, spec, dtype), dict(got)
    fused = onnx.load(str(tmp_path / "f.onnx"))
    assert sum(1 for n in fused.graph.node if n.domain == "onnxfuse") == sum(got.values())
    out = verify.verify(tmp_path / "f.onnx", provider="cpu", library=True)
    assert out.library and out.fused_nodes == sum(got.values())
    assert out.passed, [(o.name, o.max_rel_err, o.tolerance) for o in out.outputs]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_pipeline_equals_pytorch(tmp_path, name):
    kind, dtype, overrides = CONFIGS[name]
    roundtrip(tmp_path, kind, dtype, make_spec(kind, overrides), seed=len(name))


@st.composite
def configs(draw):
    kind = draw(st.sampled_from(["llama", "dlrm"]))
    dtype = draw(st.sampled_from(["fp32", "fp16"]))
    lora = draw(st.sampled_from([0, 0, 1, 2, 5]))
    if kind == "llama":
        heads = draw(st.sampled_from([1, 2, 4]))
        kv = draw(st.sampled_from([h for h in (1, 2, 4) if heads % h == 0]))
        overrides = dict(hidden_size=heads * 2 * draw(st.integers(2, 10)), intermediate_size=draw(st.integers(3, 90)),
                         num_attention_heads=heads, num_key_value_heads=kv, num_hidden_layers=draw(st.integers(1, 2)),
                         mlp_only=draw(st.booleans()), batch=draw(st.integers(1, 2)), seq=draw(st.integers(1, 9)),
                         lora_rank=lora)
    else:
        dim = draw(st.integers(2, 12))
        bottom = tuple(draw(st.lists(st.integers(2, 30), max_size=2))) + (dim,)
        top = tuple(draw(st.lists(st.integers(2, 30), min_size=1, max_size=2))) + (1,)
        overrides = dict(bottom_mlp=bottom, top_mlp=top, embedding_dim=dim, table_cap=draw(st.integers(2, 60)),
                         interaction=draw(st.sampled_from(["dot", "cat"])), batch=draw(st.integers(1, 6)),
                         lora_rank=lora)
    return kind, dtype, overrides, draw(st.integers(0, 1000))


@(settings(max_examples=2) if QUICK else settings(max_examples=60))
@given(configs())
def test_pipeline_random_configs(tmp_path_factory, cfg):
    kind, dtype, overrides, seed = cfg
    roundtrip(tmp_path_factory.mktemp("pipeline"), kind, dtype, make_spec(kind, overrides), seed=seed)
