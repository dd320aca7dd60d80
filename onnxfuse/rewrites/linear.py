"""linear: a MatMul by a constant weight that no other rule took -> `Linear`; the same MatMul feeding onnxruntime's
residual add and RMS norm (com.microsoft SkipSimplifiedLayerNormalization) -> `LinearSkipRMSNorm`.

    Y = X @ W        W [K, N] constant, X [..., K] (rank >= 2), float16 or bfloat16
    sum = X @ W + skip; Y = sum * rsqrt(mean(sum^2) + epsilon) * gamma        (gamma [N] constant)

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

LinearSkipRMSNorm (an opt-in pattern, linear_skip_norm: fuse --patterns): what genai's builder writes after o_proj and
down_proj (the product as the norm's skip, the residual as its input, or the other way round: the add commutes), 64
norm kernels of 2 us each a 7B decode step (generate/genai-L32-linear-slots-decode-profile-p128.txt). Not fused by
default: genai's 32-layer model decoded 1.5-2.0 % slower with it than with Linear and onnxruntime's own norm in the
same run (4.505 against 4.419 ms/token at context 128 in genai's graph, 4.861 against 4.791 at 2048; its norm kernel
2.9 us a call against onnxruntime's 2.0; with the norm in the GEMV's epilogue 4.480 against 4.331,
generate/genai-L32-split*.json). Besides Linear's refusals: a norm with a bias (its fourth input) or without an
epsilon attribute, whose mean or inv_std_var output is used, whose gamma is not a constant [N] or whose residual is
not [..., N] like the product, and the product used elsewhere too (onnxscript's "other uses"); its MatMul then fuses
as Linear. Its sum output may be unused (the final norm's).
"""
from __future__ import annotations

from onnxscript import ir
from onnxscript.rewriter import MatchResult

from ..ops.linear import LINEAR, LINEAR_SKIP_RMS_NORM
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
        if weight_kn(self, context, result, x, w) is not None:
            self.guard_output(context, result, x, self._kn[1])
        return result

    def rewrite(self, op, x, w, **_):
        k, n = self._kn
        shapes = {"X": dims(x), "W": [k, n]}
        return self.emit(op, self.op, [x, w], {"backend": "auto"}, shapes, x.dtype or w.dtype, gemm_flops(x, k, n))


def weight_kn(rule, context, result: MatchResult, x: ir.Value, w: ir.Value, runtime: tuple = ()
              ) -> tuple[int, int] | None:
    """Linear's checks of X and its weight (both rules'): (K, N), also kept as rule._kn; None with the reason in
    `result`. `runtime`: the matched nodes' other inputs read at run time like X (the norm's residual)."""
    if w.const_value is None:  # a product of two activations (attention's scores): no weight to stream
        result.fail(NOT_A_CANDIDATE, w)
        return None
    if w.dtype not in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        # fp32 (or integer) MatMuls are not candidates: the GEMV is 16-bit, and onnxruntime's MatMul runs the
        # cuBLAS GEMM the op would (--explain does not list every fp32 projection of a model)
        result.fail(NOT_A_CANDIDATE, w)
        return None
    if not rule.guard(context, result, x, runtime=runtime):
        return None
    xd = dims(x)
    if xd is not None and len(xd) < 2:
        result.fail(f"X {x.name} has rank {len(xd)}: a rank-1 MatMul is a vector product", x)
        return None
    if check_float_dtypes(result, X=x, W=w) is None and not result:
        return None
    reason = not_constant(w, "the weight")
    if reason:
        result.fail(f"{reason}: the fused op's weight is fixed at fuse time", w)
        return None
    shape = [int(d) for d in w.const_value.shape]  # dims only: the weight's data is not read
    if len(shape) != 2:
        result.fail(f"the weight {w.name} has rank {len(shape)}, expected [K, N]", w)
        return None
    k, n = shape
    if xd is not None and isinstance(xd[-1], int) and xd[-1] != k:
        result.fail(f"X {x.name} ends in {xd[-1]}, the weight {w.name} has K = {k}", w)
        return None
    if n % 8:
        result.fail(f"the weight {w.name} is {n} wide, not a multiple of 8 (the GEMV's 16-byte loads)", w)
        return None
    if n > MAX_N:
        result.fail(f"the weight {w.name} is {n} wide: above {MAX_N}, past the widths the op was measured faster "
                    "at in a model (onnxruntime's MatMul keeps it)", w)
        return None
    rule._kn = (k, n)
    return k, n


class LinearSkipRMSNorm(FusionRule):
    """MatMul(X, W) as input `product_at` (0 or 1) of a SkipSimplifiedLayerNormalization with `outputs` outputs: 4
    (output, mean, inv_std_var, input_skip_bias_sum; the middle two unused) or 1 (the final norm's)."""
    op = LINEAR_SKIP_RMS_NORM.name
    pattern_name = "linear"
    naming_ops = ("MatMul",)

    def __init__(self, recorder, product_at: int, outputs: int):
        super().__init__(recorder, f"matmul_skip_rms_norm/{'skip' if product_at else 'input'}/{outputs}")
        self.product_at, self.n_outputs = product_at, outputs

    def pattern(self, op, x, w, residual, gamma):
        p = op.MatMul(x, w)
        ins = (p, residual) if self.product_at == 0 else (residual, p)
        if self.n_outputs == 1:
            return op.SkipSimplifiedLayerNormalization(*ins, gamma, _domain="com.microsoft", _allow_other_inputs=True,
                                                       _allow_other_attributes=True)
        y, mean, inv, s = op.SkipSimplifiedLayerNormalization(*ins, gamma, _domain="com.microsoft",
                                                              _allow_other_inputs=True, _allow_other_attributes=True,
                                                              _outputs=["y", "mean", "inv_std_var", "s"])
        return y, s  # mean and inv_std_var are not the pattern's outputs: onnxscript refuses them with uses

    def check(self, context, x, w, residual, gamma, **_):
        self.remember(context)
        result = MatchResult()
        norm = context.root
        if len(context.output_values) != (2 if self.n_outputs == 4 else 1) or len(norm.outputs) != self.n_outputs:
            return result.fail(NOT_A_CANDIDATE, x)  # the other variant's form (onnxscript binds what it can)
        if weight_kn(self, context, result, x, w, runtime=(residual,)) is None:
            return result
        k, n = self._kn
        other = sorted(set(norm.attributes) - {"epsilon"})
        if other:
            return result.fail(f"{norm.name} has attributes {other} the op does not know", norm.outputs[0])
        if check_float_dtypes(result, X=x, skip=residual, gamma=gamma) is None and not result:
            return result
        gd = list(gamma.const_value.shape)
        if gd != [n]:
            return result.fail(f"gamma {gamma.name} has shape {gd}, the op takes [N] = [{n}]", gamma)
        xd, rd = dims(x), dims(residual)
        if xd is None or rd is None or rd != xd[:-1] + [n]:
            # the kernels read the residual as X's rows: a broadcast one, or one whose shape fuse cannot show equal
            return result.fail(f"the residual {residual.name} has shape {rd}, not X's leading dims and N "
                               f"({None if xd is None else xd[:-1] + [n]}): a broadcast residual stays onnxruntime's",
                               residual)
        if "epsilon" not in norm.attributes:  # genai's builder and stage 1 write it; the op takes it as given
            return result.fail(f"{norm.name} has no epsilon attribute: the op takes the norm's epsilon as written "
                               "(onnxruntime's default for it is its own)", norm.outputs[0])
        self._eps = norm.attributes.get_float("epsilon", 0.0)
        if len(norm.inputs) > 3 and norm.inputs[3] is not None:
            return result.fail(f"{norm.name} has a bias (its fourth input): the op adds none", norm.inputs[3])
        self.guard_output(context, result, x, n)
        return result

    def rewrite(self, op, x, w, residual, gamma, **_):
        k, n = self._kn
        eps = self._eps
        shapes = {"X": dims(x), "W": [k, n], "skip": dims(residual), "gamma": [n]}
        out = self.emit(op, self.op, [x, w, residual, gamma], {"epsilon": eps, "backend": "auto"}, shapes,
                        x.dtype or w.dtype, gemm_flops(x, k, n), outputs=2)
        return out[0] if self.n_outputs == 1 else out


def rules(recorder):
    """Every MatMul by a constant 16-bit weight that no other rule took: Linear."""
    return rule_set([(Linear, (recorder,))])


def skip_norm_rules(recorder):
    """The opt-in pattern linear_skip_norm (fuse.OPT_IN_PATTERNS; fuse --patterns ...,linear_skip_norm), run before
    linear's: the norms' products as LinearSkipRMSNorm."""
    return rule_set([(LinearSkipRMSNorm, (recorder, at, outputs)) for outputs in (4, 1) for at in (1, 0)])
