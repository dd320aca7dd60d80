"""Embedding: a lookup in a constant embedding table (rules: onnxfuse/rewrites/embedding.py)."""
from __future__ import annotations

from ._family import BACKEND, OpDef, OpFamily, OpSchema

EMBEDDING = OpSchema(
    "Embedding", ("table", "ids"), ("Y",), "Y = table[ids]", (BACKEND,),
    "A lookup in a constant embedding table (Gather on axis 0: a token embedding): table [V, D] of type T, ids int64 "
    "of any shape (negative ids count from the end), Y = ids.shape + [D]. The GPU kernels copy rows 16 bytes at a "
    "time (onnxruntime's Gather moves one element per thread: 4x the time for a [2048] x 4096 fp16 lookup); an id "
    "out of [-V, V) gives a row of zeros on the GPU and an error on the CPU, where onnxruntime's Gather errors.")


def reference(inputs, attrs: dict):
    import torch

    table, ids = inputs
    v = table.shape[0]
    return table[torch.where(ids < 0, ids + v, ids).long()]


def body(overload: str):
    from onnx import helper

    return list(EMBEDDING.inputs), [helper.make_node("Gather", ["table", "ids"], ["Y"], axis=0)]


def out_shape(shapes: dict, attrs: dict) -> list:
    return list(shapes["ids"]) + [shapes["table"][1]]


def doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """(table [V, D], ids shape); the report's M is the number of ids, K and N the table's shape."""
    table, ids = entry
    n = 1
    for v in ids:
        n *= v
    return {"table": list(table), "ids": list(ids)}, {}, (n, table[0], table[1], 0, f"ids{list(ids)}")


FAMILY = OpFamily("embedding", (
    # Doctor shapes: a Llama vocabulary row width, an odd row (no 16-byte vectors), decode. The ids are drawn in
    # [-V, V) (negative ids count from the end).
    OpDef(7, EMBEDDING, reference, body, out_shape,
          (((1000, 4096), (2, 64)), ((77, 33), (5, 3)), ((32000, 128), (1,))),
          doctor_entry, int_inputs=("ids",), weighted=False),
))
