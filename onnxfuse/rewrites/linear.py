"""linear: a MatMul by a constant weight that no other rule took -> `Linear`.

    Y = X @ W        W [K, N] constant, X [..., K] (rank >= 2), float16 or bfloat16

Why: a decode step multiplies one row by each projection, and reading the weight is the whole cost. genai's fp16
model runs o_proj and down_proj as cuBLAS split-K GEMMs plus a reduction kernel each; the op's GEMV (one launch, the
K slices summed in the kernel) read them 1.13-1.20x faster alone on an H200 with the weights past the L2
(benchmarks/results/h200-2026-11-29/generate/fp16-gemv-probe-l2-cold*.txt), and genai's 32-layer 7B-shape model
decoded 1.023-1.031x faster with it (generate/genai-L32-linear-slots.json); more rows run cuBLASLt's GEMM as
onnxruntime does. The family runs last, so a projection that a gated MLP, a LoRA branch or an activation's rule fuses
is theirs.

Not candidates: a MatMul of two activations, and fp32 ones (the GEMV is 16-bit; onnxruntime's MatMul runs the same
cuBLAS GEMM). Refused: a weight that is not a true constant, not 2-D, or whose width is not a multiple of 8 (the
GEMV's 16-byte loads) or above MAX_N (the widths measured in a model), a rank-1 X, mixed element types. The CPU
provider leaves the family to onnxruntime (cpu_policy: MLAS reads one row at the host's rate).
"""
from __future__ import annotations

from onnxscript import ir
from onnxscript.rewriter import MatchResult

from ..ops.linear import LINEAR
from ._base import NOT_A_CANDIDATE, FusionRule, check_float_dtypes, dims, gemm_flops, not_constant, rule_set

# Widths above this stay onnxruntime's MatMul: the GEMV measured 1.13-1.20x cuBLAS alone and a faster model at
# N = 4096 (a 7B model's o_proj and down_proj); alone 0.97-1.05x at 12288 (a packed qkv) and 1.00-1.02x at 49152
# (lm_head) (fp16-gemv-probe-l2-cold*.txt); widths between (a grouped-head qkv of 6144) are not measured yet.
MAX_N = 4096


class Linear(FusionRule):
    op = LINEAR.name
    pattern_name = "linear"
    naming_ops = ("MatMul",)

    def __init__(self, recorder):
        super().__init__(recorder, "matmul")

    def pattern(self, op, x, w):
        return op.MatMul(x, w, _outputs=["y"])

    def check(self, context, x, w, y, **_):
        self.remember(context)
        result = MatchResult()
        if w.const_value is None:  # a product of two activations (attention's scores): no weight to stream
            return result.fail(NOT_A_CANDIDATE, w)
        if w.dtype not in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
            # fp32 (or integer) MatMuls are not candidates: the GEMV is 16-bit, and onnxruntime's MatMul runs the
            # cuBLAS GEMM the op would (--explain does not list every fp32 projection of a model)
            return result.fail(NOT_A_CANDIDATE, w)
        if not self.guard(context, result, x):
            return result
        xd = dims(x)
        if xd is not None and len(xd) < 2:
            return result.fail(f"X {x.name} has rank {len(xd)}: a rank-1 MatMul is a vector product", x)
        if check_float_dtypes(result, X=x, W=w) is None and not result:
            return result
        reason = not_constant(w, "the weight")
        if reason:
            return result.fail(f"{reason}: the fused op's weight is fixed at fuse time", w)
        shape = [int(d) for d in w.const_value.shape]  # dims only: the weight's data is not read
        if len(shape) != 2:
            return result.fail(f"the weight {w.name} has rank {len(shape)}, expected [K, N]", w)
        k, n = shape
        if xd is not None and isinstance(xd[-1], int) and xd[-1] != k:
            return result.fail(f"X {x.name} ends in {xd[-1]}, the weight {w.name} has K = {k}", w)
        if n % 8:
            return result.fail(f"the weight {w.name} is {n} wide, not a multiple of 8 (the GEMV's 16-byte loads)", w)
        if n > MAX_N:
            return result.fail(f"the weight {w.name} is {n} wide: above {MAX_N} the op's GEMV measured no faster than "
                               "cuBLAS, onnxruntime's MatMul", w)
        if not self.guard_output(context, result, x, n):
            return result
        self._kn = (k, n)
        return result

    def rewrite(self, op, x, w, **_):
        k, n = self._kn
        shapes = {"X": dims(x), "W": [k, n]}
        return self.emit(op, self.op, [x, w], {"backend": "auto"}, shapes, x.dtype or w.dtype, gemm_flops(x, k, n))


def rules(recorder):
    return rule_set([(Linear, (recorder,))])
