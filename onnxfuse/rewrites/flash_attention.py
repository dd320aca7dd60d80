"""flash_attention: onnxruntime's MultiHeadAttention with an additive bias -> `FlashAttention`.

    Y = softmax(scale * Q K^T + bias) V per head, Q [B, S, H D], K and V [B, S_kv, H D], bias [B|1, H|1, S, S_kv]

What onnxscript's `optimize_for_ort` (stage 1 of `fuse`) makes of an exported SDPA whose mask is a tensor: a
com.microsoft MultiHeadAttention with query, key, value and attention_bias (the exporters build the bias from the
causal mask and the attention_mask input: 0 where a key counts, finfo.min where not). onnxruntime runs it with
cuDNN's flash kernel over every key (on an H100, a Llama-2-7B layer at 2048 tokens: 223-229 us), since a bias
tensor says nothing it can skip on. The fused op's kernel skips the key tiles the bias masks and checks that doing
so changed nothing (onnxfuse/ops/flash_attention.py): on an H100, 151 against onnxruntime's 227 us there, 476
against 886 at 4096 (benchmarks/results/h100-2026-11-28/attention/). The bias stays an input: the rule needs no
proof about how it was built. (Telling onnxruntime's node that it is causal instead, unidirectional=1, would be
faster too but wrong where a query row has every key masked: left padding, error 1.0 in
benchmarks/results/h100-2026-11-27/attention/.)

Refused: a node with any other input (a projection bias, a key padding mask, past keys and values, a packed or 4-D
key or value) or a second output, a negative scale, unidirectional=1 (onnxruntime's causal masking, not the bias's),
float32 (the GPU kernel is for 16-bit types; float32 stays onnxruntime's), a head size other than the Triton kernel's
64 and 128 (onnxruntime's is as good elsewhere), fewer keys than MIN_TOKENS or a number unknown at fuse time (where
the op measured slower than onnxruntime's), V's width other than Q's, a bias that does not broadcast as [B|1, H|1,
S, S_kv].
"""
from __future__ import annotations

from onnxscript import ir
from onnxscript.rewriter import MatchResult

from ..ops.flash_attention import FLASH_ATTENTION
from ._base import FusionRule, check_float_dtypes, dims, rule_set

HEAD_SIZES = (64, 128)  # the Triton kernel's (triton/flash_attention.py CONFIGS, cuda/flash_attention.cu)
# The fewest keys (S_kv, known at fuse time) from which the op is faster than onnxruntime's MultiHeadAttention: one
# node, fp16, 32 heads of 128, a causal bias, H100 (scripts/flash_attention_vs_ort.py,
# benchmarks/results/h100-2026-11-28/attention/): 0.84-0.93x at 128-512 keys (the bias and key passes cost about
# 25 us of fixed time there), 1.25x at 1024, 1.50x at 2048, 1.86x at 4096.
MIN_TOKENS = 1024
_KNOWN_ATTRS = {"num_heads", "scale", "unidirectional", "mask_filter_value"}


class FlashAttention(FusionRule):
    op = FLASH_ATTENTION.name
    pattern_name = "flash_attention"
    naming_ops = ("MultiHeadAttention",)

    def __init__(self, recorder):
        super().__init__(recorder, "mha_bias")

    def pattern(self, op, q, k, v):
        # every MultiHeadAttention with one output, so that check() can say why one with other inputs stays
        return op.MultiHeadAttention(q, k, v, _domain="com.microsoft", _allow_other_attributes=True,
                                     _allow_other_inputs=True, _outputs=["y"])

    def check(self, context, q, k, v, y, **_):
        self.remember(context)
        result = MatchResult()
        node = y.producer()
        ins = list(node.inputs) + [None] * (6 - len(node.inputs))
        if len(node.inputs) != 6 or ins[3] is not None or ins[4] is not None or ins[5] is None:
            given = [name for name, x_ in zip(("query", "key", "value", "bias", "key_padding_mask",
                                               "attention_bias", "past_key", "past_value", "past_sequence_length",
                                               "cache_indirection"), node.inputs) if x_ is not None]
            return result.fail(f"{node.name} has the inputs {given}: only query, key, value and attention_bias are "
                               "fused", y)
        bias = ins[5]
        other = sorted(set(node.attributes) - _KNOWN_ATTRS)
        if other:
            return result.fail(f"{node.name} has attributes {other} the op does not know", y)
        if node.attributes.get_int("unidirectional", 0):
            return result.fail(f"{node.name} is unidirectional (onnxruntime's own causal mask): only a bias masks "
                               "keys in the fused op", y)
        if node.attributes.get_float("scale", 0.0) < 0:
            return result.fail(f"{node.name} has a negative scale: the op's kernels take a positive one "
                               "(0: 1 / sqrt(D))", y)
        if not self.guard(context, result, q, runtime=(k, v, bias)):
            return result
        dtype = check_float_dtypes(result, Q=q, K=k, V=v, bias=bias)
        if dtype is None:
            return result if result.reason else result.fail("the element type of Q is unknown", q)
        if dtype == ir.DataType.FLOAT:
            return result.fail("float32 attention stays onnxruntime's (the GPU kernel is for float16/bfloat16)", q)
        h = node.attributes.get_int("num_heads", 0)
        qd, kd, vd, bd = dims(q), dims(k), dims(v), dims(bias)
        if any(d_ is None or len(d_) != 3 for d_ in (qd, kd, vd)):
            return result.fail(f"Q, K and V must be 3-D [B, S, H D]; got {qd}, {kd}, {vd}", q)
        hd = qd[2]
        if not isinstance(hd, int) or h <= 0 or hd % h or kd[2] != hd or vd[2] != hd:
            return result.fail(f"Q, K and V must have one known width H D with {h} heads; got {qd}, {kd}, {vd}", q)
        if hd // h not in HEAD_SIZES:
            return result.fail(f"head size {hd // h}: the GPU kernel is compiled for {HEAD_SIZES}", q)
        if not isinstance(kd[1], int) or kd[1] < MIN_TOKENS:
            return result.fail(f"{kd[1]} keys: the op is faster than onnxruntime's MultiHeadAttention from "
                               f"{MIN_TOKENS} keys, measured (a sequence length known at fuse time)", k)
        if bd is None or len(bd) != 4 or not _dim_ok(bd[0], qd[0]) or not _dim_ok(bd[1], h) or \
                bd[2] != qd[1] or bd[3] != kd[1]:
            return result.fail(f"the bias {bias.name} {bd} does not broadcast as [B|1, H|1, S, S_kv] over Q {qd} and "
                               f"K {kd} with {h} heads", bias)
        if not self.guard_output(context, result, q, hd):
            return result
        self._heads, self._bias = h, bias
        return result

    def rewrite(self, op, q, k, v, y, **_):
        bias = self._bias
        node = y.producer()
        attrs = {"num_heads": self._heads, "qk_scale": node.attributes.get_float("scale", 0.0), "backend": "auto"}
        shapes = {"Q": dims(q), "K": dims(k), "V": dims(v), "bias": dims(bias)}
        qd, kd = dims(q), dims(k)
        flops = None
        if all(isinstance(x_, int) for x_ in (*qd, kd[1])):
            flops = 4 * qd[0] * qd[1] * kd[1] * qd[2]
        return self.emit(op, self.op, [q, k, v, bias], attrs, shapes, q.dtype, flops)


def _dim_ok(dim, full) -> bool:
    """A bias dim that broadcasts: 1, or the full one (a symbolic dim only where it has the same name)."""
    return dim == 1 or dim == full


def rules(recorder):
    return [rule_set([(FlashAttention, (recorder,))])]
