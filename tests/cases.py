"""The exported test models the fuse tests share (tests/test_fuse_exports.py, tests/test_ort_fusions.py,
tests/rewrites/): which models, the onnxfuse ops each must get, and how to export one and feed it."""
from __future__ import annotations

import pathlib

import numpy as np

from onnxfuse import runtime

DATA = pathlib.Path(__file__).parent / "data"
# model -> (spec overrides, expected onnxfuse op counts, nodes each match removes by op type)
CASES = {
    "llama2": (dict(kind="llama", num_hidden_layers=2), {"SwiGLU": 2, "RotaryEmbedding": 4}),
    # gate, up and down with their adapters and act * up: one LoRAGatedMLP
    "llama-lora": (dict(kind="llama", lora_rank=8), {"LoRAGatedMLP": 1, "RotaryEmbedding": 2}),
    # bottom 13-512-256-64-16 (4 x relu) and top 367-512-256-1 (relu, relu, sigmoid): one MLPStack each; the hash,
    # the 26 lookups and the dot interaction between them: one EmbeddingInteraction
    "dlrm": (dict(kind="dlrm"), {"MLPStack": 2, "EmbeddingInteraction": 1}),
    "dlrm-lora": (dict(kind="dlrm", lora_rank=4), {"LoRALinearRelu": 6, "LoRALinear": 1, "EmbeddingInteraction": 1}),
}
COMBOS = [(e, d) for e in ("dynamo", "torchscript") for d in ("fp32", "fp16")]


# 16-bit Llamas: the projections no other rule takes become Linear (q, k, v, o and down a layer; q, k, v and o where
# LoRAGatedMLP holds the MLP); fp32 MatMuls stay onnxruntime's.
LINEARS_16BIT = {"llama2": 10, "llama-lora": 4}


def expected_ops(case: str, dtype: str) -> dict[str, int]:
    """CASES' op counts, plus the token Embedding where its rows pass the rule's threshold (the tiny Llama's 64
    values are 256 bytes in fp32, 128 in fp16) and the 16-bit Llamas' Linear nodes."""
    want = dict(CASES[case][1])
    if CASES[case][0]["kind"] == "llama" and dtype == "fp32":
        want["Embedding"] = 1
    if dtype != "fp32" and case in LINEARS_16BIT:
        want["Linear"] = LINEARS_16BIT[case]
    return want


def valid_feeds(sess, seed):
    """Random feeds the models accept: non-negative categorical ids, an all-ones attention mask."""
    feeds = runtime.random_feeds(sess, seed=seed)
    if "sparse" in feeds:
        feeds["sparse"] = np.abs(feeds["sparse"])
    if "attention_mask" in feeds:
        feeds["attention_mask"] = np.ones_like(feeds["attention_mask"])
    return feeds


def export_case(exported, case, exporter, dtype):
    kw = dict(CASES[case][0])
    return exported(kw.pop("kind"), exporter=exporter, dtype=dtype, **kw)
