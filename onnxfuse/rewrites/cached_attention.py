"""cached_attention: onnxruntime's GroupQueryAttention (com.microsoft) over packed QKV with rotary -> `CachedAttention`.

    q, k = rotary(query's heads); present = past + (k, v) at each sequence's end; Y = causal softmax(q K^T) V

What onnxruntime-genai's model builder writes for a Llama-family decoder (one node a layer, its inputs the packed QKV
projection, the layer's past_key_values, the mask-derived seqlens_k and total_sequence_length, and the shared
cos/sin caches). The fused op computes the same (onnxfuse/ops/cached_attention.py) with its own decode loop on the
CPU and its own decode kernel on CUDA; its function body is the original node, so the fused model runs anywhere
onnxruntime does.

Refused, each with its reason: separate key and value inputs (the op takes packed QKV), position_ids, attention_bias
or head_sink, a fourth output (output_qk), do_rotary=0, a local window (local_window_size != -1), softcap or
smooth_softmax, attributes the op does not know, a negative scale, element types other than one float type shared by
query, caches and cos/sin, heads that do not divide the query's width or H not a multiple of Hkv, a head size above
MAX_HEAD_SIZE or odd, a rotary width above the head size. Which providers it fuses for: cpu_policy.py (`fuse
--provider cpu` fuses it where the host has AVX2; on the CUDA provider, or none named, it fuses, grouped query heads
too).
"""
from __future__ import annotations

from onnxscript import ir
from onnxscript.rewriter import MatchResult

from ..ops.cached_attention import CACHED_ATTENTION
from ._base import FusionRule, check_float_dtypes, dims, rule_set

MAX_HEAD_SIZE = 256  # the kernels' per-thread accumulators (CPU: on the stack; CUDA: a warp's registers)
_KNOWN_ATTRS = {"num_heads", "kv_num_heads", "scale", "do_rotary", "rotary_interleaved", "local_window_size",
                "softcap", "smooth_softmax", "qk_output"}
_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache",
           "sin_cache", "position_ids", "attention_bias", "head_sink")


class CachedAttention(FusionRule):
    op = CACHED_ATTENTION.name
    pattern_name = "cached_attention"
    naming_ops = ("GroupQueryAttention",)

    def __init__(self, recorder):
        super().__init__(recorder, "gqa_packed_rotary")

    def pattern(self, op, query):
        # every GroupQueryAttention with three outputs, so that check() can say why one with other inputs stays
        return op.GroupQueryAttention(query, _domain="com.microsoft", _allow_other_attributes=True,
                                      _allow_other_inputs=True, _outputs=["y", "present_key", "present_value"])

    def check(self, context, query, y, present_key, present_value, **_):
        self.remember(context)
        result = MatchResult()
        node = y.producer()
        ins = dict(zip(_INPUTS, list(node.inputs) + [None] * (len(_INPUTS) - len(node.inputs))))
        reason = _input_reason(node, ins) or _attribute_reason(node)
        if reason:
            return result.fail(reason, y)
        runtime = tuple(ins[n] for n in _INPUTS[3:9])
        if not self.guard(context, result, query, runtime=runtime):
            return result
        dtype = check_float_dtypes(result, query=query, past_key=ins["past_key"], past_value=ins["past_value"],
                                   cos_cache=ins["cos_cache"], sin_cache=ins["sin_cache"])
        if dtype is None:
            return result if result.reason else result.fail("the element type of the query is unknown", query)
        for name in ("seqlens_k", "total_sequence_length"):
            if ins[name].dtype not in (None, ir.DataType.INT32):
                return result.fail(f"{name} {ins[name].name} is {ins[name].dtype.name.lower()}, not int32", ins[name])
        h = node.attributes.get_int("num_heads", 0)
        hkv = node.attributes.get_int("kv_num_heads", 0)
        reason = _head_reason(h, hkv, dims(query), dims(ins["past_key"]), dims(ins["cos_cache"]))
        if reason:
            return result.fail(reason, query)
        self._ins = ins
        return result

    def rewrite(self, op, query, y, present_key, present_value, **_):
        ins = self._ins
        node = y.producer()
        attrs = {"num_heads": node.attributes.get_int("num_heads", 1),
                 "kv_num_heads": node.attributes.get_int("kv_num_heads", 1),
                 "qk_scale": node.attributes.get_float("scale", 0.0),
                 "rotary_interleaved": node.attributes.get_int("rotary_interleaved", 0), "backend": "auto"}
        inputs = [query, *(ins[n] for n in CACHED_ATTENTION.inputs[1:])]
        shapes = {name: dims(v) for name, v in zip(CACHED_ATTENTION.inputs, inputs)}
        return self.emit(op, self.op, inputs, attrs, shapes, query.dtype, None, outputs=3)


def _input_reason(node: ir.Node, ins: dict) -> str | None:
    """Why the node's inputs are not the packed, rotary form the op takes (None when they are)."""
    extra = [n for n in ("key", "value", "position_ids", "attention_bias", "head_sink") if ins[n] is not None]
    if extra:
        return (f"{node.name} has the inputs {extra}: the op takes packed QKV in the query and no position_ids, "
                "attention_bias or head_sink")
    missing = [n for n in _INPUTS[3:9] if ins[n] is None]
    if missing:
        return f"{node.name} has no {missing}: the op needs the KV cache, the sequence lengths and cos/sin caches"
    if len(node.outputs) != 3:
        return f"{node.name} has {len(node.outputs)} outputs: the op returns Y, present_key and present_value"
    return None


def _attribute_reason(node: ir.Node) -> str | None:
    """Why the node's attributes ask for what the op does not compute (None when they do not)."""
    a = node.attributes
    other = sorted(set(a) - _KNOWN_ATTRS)
    if other:
        return f"{node.name} has attributes {other} the op does not know"
    if a.get_int("do_rotary", 0) != 1:
        return f"{node.name} has do_rotary=0: the op applies the rotary embedding itself (do_rotary=1)"
    if a.get_int("local_window_size", -1) != -1:
        return f"{node.name} has a local window ({a.get_int('local_window_size', -1)} keys): the op attends to all"
    if a.get_float("softcap", 0.0) != 0.0 or a.get_int("smooth_softmax", 0) or a.get_int("qk_output", 0):
        return f"{node.name} has softcap, smooth_softmax or qk_output set: the op computes a plain softmax"
    if a.get_float("scale", 0.0) < 0:
        return f"{node.name} has a negative scale: the op takes a positive one (0: 1 / sqrt(D))"
    return None


def _head_reason(h: int, hkv: int, qd, pd, cd) -> str | None:
    """Why the heads, the head size or the rotary width do not fit the op (None when they do)."""
    if h <= 0 or hkv <= 0 or h % hkv:
        return f"num_heads {h} is not a positive multiple of kv_num_heads {hkv}"
    if qd is None or len(qd) != 3 or (pd is not None and len(pd) != 4):
        return f"the query must be [B, S, (H + 2 Hkv) D] and the past [B, Hkv, P, D]; got {qd} and {pd}"
    width, d = qd[2], (pd[3] if pd is not None else None)
    if isinstance(width, int):
        if width % (h + 2 * hkv):
            return f"the query's width {width} is not (H + 2 Hkv) D for H {h}, Hkv {hkv}"
        d = width // (h + 2 * hkv)
    if not isinstance(d, int):
        return "the head size is unknown at fuse time (the query's width and the past's last dim are symbolic)"
    if d > MAX_HEAD_SIZE or d % 2:
        return f"head size {d}: the op's kernels take even head sizes up to {MAX_HEAD_SIZE}"
    if cd is not None and len(cd) == 2 and isinstance(cd[1], int) and 2 * cd[1] > d:
        return f"the rotary width {2 * cd[1]} (cos_cache's {cd[1]} columns) is wider than the head size {d}"
    return None


def rules(recorder):
    return [rule_set([(CachedAttention, (recorder,))])]
