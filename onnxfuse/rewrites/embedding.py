"""embedding: a lookup in a constant table (Gather on axis 0) -> `Embedding`.

    Y = table[ids]        table [V, D] constant, ids int64 of any shape, Y = ids.shape + [D]

What both exporters emit for `nn.Embedding` (a decoder's token embedding): Gather(weight, input_ids) with axis 0.
onnxruntime's CUDA Gather moves one element per thread; at prefill sizes (2048 tokens x 4096 fp16 of a Llama-2-7B
embedding) it takes about 44 us on an H100 where copying the rows 16 bytes at a time takes about a quarter of that.
It runs last, so that a rule that consumes Gathers as part of a larger pattern sees them first.

Refused: rows under MIN_ROW_BYTES (nothing to gain), a table that is not a true constant (a graph input, an
initializer a caller may override) or not 2-D, ids that are not int64 (the kernels index with int64), a Gather on
another axis, element types other than float/float16/bfloat16.
"""
from __future__ import annotations

from onnxscript import ir
from onnxscript.rewriter import MatchResult

from ..ops.embedding import EMBEDDING
from ._base import NOT_A_CANDIDATE, FusionRule, check_float_dtypes, dims, not_constant, rule_set


# Rows narrower than this are left to onnxruntime: the copy is too small for the vector loads to matter (a DLRM
# table of 16 fp32 values), and the lookup costs one launch either way.
MIN_ROW_BYTES = 256


class Embedding(FusionRule):
    op = EMBEDDING.name
    pattern_name = "embedding"
    naming_ops = ("Gather",)

    def __init__(self, recorder):
        super().__init__(recorder, "gather")

    def pattern(self, op, table, ids):
        return op.Gather(table, ids, _outputs=["y"])

    def check(self, context, table, ids, y, **_):
        self.remember(context)
        result = MatchResult()
        if table.const_value is None:  # a Gather on run-time data (a column of ids, say): no lookup table
            return result.fail(NOT_A_CANDIDATE, table)
        if not self.guard(context, result, ids):
            return result
        axis = y.producer().attributes.get_int("axis", 0)
        if axis != 0:
            return result.fail(f"{y.producer().name or 'the Gather'} gathers on axis {axis}, not rows (axis 0)", y)
        if ids.dtype is not None and ids.dtype != ir.DataType.INT64:
            return result.fail(f"ids {ids.name} are {ids.dtype.name.lower()}, the kernels take int64", ids)
        if check_float_dtypes(result, table=table) is None and not result:
            return result
        reason = not_constant(table, "the table")
        if reason:
            return result.fail(reason, table)
        shape = [int(d) for d in table.const_value.shape]  # dims only: the table's data is not read
        if len(shape) != 2:
            return result.fail(f"the table {table.name} has rank {len(shape)}, not 2", table)
        if shape[1] * table.dtype.itemsize < MIN_ROW_BYTES:
            return result.fail(f"the table {table.name}'s rows are {shape[1] * table.dtype.itemsize} bytes: below "
                               f"{MIN_ROW_BYTES} a lookup is bound by the launch, and onnxruntime's Gather is as fast",
                               table)
        want = (dims(ids) or []) + [shape[1]]
        got = dims(y)
        if dims(ids) is None or (got is not None and (len(got) != len(want) or any(
                isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(got, want)))):
            return result.fail(f"the lookup {y.name} has shape {got}, not ids.shape + [D] = {want}", y)
        self._shape = shape
        return result

    def rewrite(self, op, table, ids, **_):
        shapes = {"table": self._shape, "ids": dims(ids)}
        return self.emit(op, self.op, [table, ids], {"backend": "auto"}, shapes, table.dtype, 0)


def rules(recorder):
    return rule_set([(Embedding, (recorder,))])
