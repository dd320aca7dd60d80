"""CachedAttention: a decoder's attention over its KV cache as onnxruntime's GroupQueryAttention (com.microsoft, the
node onnxruntime-genai's builder writes) computes it from packed QKV: rotary on the new query and key, the new key and
value written into the cache, causal attention of each query head over its KV head's keys (rules:
onnxfuse/rewrites/cached_attention.py).

Why an op of its own: at decode (one new token after a long context) onnxruntime's CPU kernel spends 270 us a layer
on SmolLM2-135M at context 2048 (genai's own session, 2 threads: 8.1 of 31 ms a step in its 30 nodes), where a
flash-decoding loop that reads each KV row once for the query heads that share it takes about half of that
(scripts/cpu_decode_attention_probe.cc). The CPU kernel runs that loop for calls with a past and hands first prompts
(fp32) to onnxruntime's own kernel through InvokeOp, whose GEMMs are faster there. On the CUDA EP a decode step is
one kernel of its own (DecodeAttention, kernels/cuda/cached_attention.cu: blocks per query head and key split, a KV
head's query heads reading its rows from L2), and prompts go to onnxruntime's CUDA kernel through InvokeOp (backend
auto).
"""
from __future__ import annotations

from ._family import BACKEND, Attr, OpDef, OpFamily, OpSchema

CACHED_ATTENTION = OpSchema(
    "CachedAttention",
    ("query", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"),
    ("Y", "present_key", "present_value"),
    "q, k = rotary(query's heads at positions p_b + s); present = past with k, v written at rows p_b + s; "
    "Y[b, s, h] = softmax_j<=p_b+s(qk_scale * q[b, s, h] . present_key[b, h // G, j]) @ present_value[b, h // G]",
    (Attr("num_heads", "int", 1, "query heads H"),
     Attr("kv_num_heads", "int", 1, "key/value heads Hkv (H a multiple of it: G = H / Hkv query heads share one)"),
     Attr("qk_scale", "float", 0.0, "the scores' scale; 0 means 1 / sqrt(D)"),
     Attr("rotary_interleaved", "int", 0, "1: rotary on pairs (2i, 2i + 1); 0: on halves (i, i + R / 2)"),
     BACKEND),
    "query is packed [B, S, (H + 2 Hkv) D] (queries, then keys, then values of the new tokens); past_key and "
    "past_value [B, Hkv, P, D]; seqlens_k [B] int32, each sequence's total length minus 1 after this call; "
    "total_sequence_length a scalar int32 (the batch's largest total); cos_cache and sin_cache [positions, R / 2] "
    "(rotary on the first R <= D dims of each head). A first prompt (S == total_sequence_length) has no past: "
    "sequence b's positions are 0 .. S - 1 and its valid rows the first seqlens_k[b] + 1 (right padding after). "
    "A later call appends S tokens at p_b = seqlens_k[b] + 1 - S. present_key/value are [B, Hkv, L, D], L = "
    "max(P, total_sequence_length): past's rows, zeros after them, the new rows written at p_b; when present is "
    "bound to past's own buffer (genai's past_present_share_buffer) only the new rows are written. Y's rows past a "
    "sequence's valid ones are 0. Each row attends to its own keys only: a later token's key or value, NaN or Inf "
    "included, never reaches it (onnxruntime's CPU kernel, which the CPU kernel calls for fp32 first prompts, lets "
    "one through its probabilities x V GEMM as 0 x NaN). Scores and softmax in fp32.")


def rotate(x, cos, sin, interleaved: bool):
    """x [..., S, D] rotated by cos/sin [..., S, R / 2] on its first R dims (the rest unchanged): pairs (i, i + R / 2),
    or (2i, 2i + 1) when interleaved."""
    import torch

    r = cos.shape[-1] * 2
    xr, rest = x[..., :r], x[..., r:]
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., : r // 2], xr[..., r // 2:]
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((out, rest), dim=-1)


def layout(attrs: dict, query_shape, past_shape, total: int) -> dict:
    """The dims of a call: B, S, H, Hkv, D, P (past rows), L (present rows), first (a first prompt)."""
    h, hkv = int(attrs.get("num_heads", 1)), int(attrs.get("kv_num_heads", 1))
    b, s, width = (int(v) for v in query_shape)
    d = width // (h + 2 * hkv)
    p = int(past_shape[2])
    return dict(B=b, S=s, H=h, Hkv=hkv, D=d, P=p, L=max(p, int(total)), first=s == int(total))


def reference(inputs, attrs: dict):
    """(Y, present_key, present_value) in fp32 math, returned in the query's type."""
    import torch

    query, past_k, past_v, seqlens, total, cos, sin = inputs
    t = query.dtype
    dims = layout(attrs, query.shape, past_k.shape, int(total.reshape(-1)[0]))
    b_, s_, h, hkv, d, p, length = (dims[k] for k in ("B", "S", "H", "Hkv", "D", "P", "L"))
    interleaved = bool(int(attrs.get("rotary_interleaved", 0)))
    scale = float(attrs.get("qk_scale", 0.0)) or d ** -0.5
    q = query.float()
    qh = q[..., : h * d].reshape(b_, s_, h, d).transpose(1, 2)
    kh = q[..., h * d:(h + hkv) * d].reshape(b_, s_, hkv, d).transpose(1, 2)
    vh = q[..., (h + hkv) * d:].reshape(b_, s_, hkv, d).transpose(1, 2)
    pk = torch.zeros(b_, hkv, length, d, device=q.device)
    pv = torch.zeros(b_, hkv, length, d, device=q.device)
    pk[:, :, :p], pv[:, :, :p] = past_k.float(), past_v.float()
    y = torch.zeros(b_, h, s_, d, device=q.device)
    group = h // hkv
    for i in range(b_):
        tot = int(seqlens[i]) + 1
        past = 0 if dims["first"] else tot - s_
        rows = min(s_, tot - past)
        pos = torch.arange(past, past + rows, device=q.device)
        c, sn = cos.float()[pos], sin.float()[pos]
        qi = rotate(qh[i, :, :rows], c, sn, interleaved)
        ki = rotate(kh[i, :, :rows], c, sn, interleaved)
        # through the output type, as the kernels store the new rows before reading them back
        pk[i, :, past:past + rows] = ki.to(t).float()
        pv[i, :, past:past + rows] = vh[i, :, :rows].to(t).float()
        # each row over its own keys 0 .. past + s only: a later token's key or value (NaN, Inf) never reaches it
        keys, values = pk[i].repeat_interleave(group, 0), pv[i].repeat_interleave(group, 0)  # [H, L, D]
        for row in range(rows):
            n = past + row + 1
            scores = torch.einsum("hd,hnd->hn", qi[:, row], keys[:, :n]) * scale
            y[i, :, row] = torch.einsum("hn,hnd->hd", torch.softmax(scores, dim=-1), values[:, :n])
    return y.transpose(1, 2).reshape(b_, s_, h * d).to(t), pk.to(t), pv.to(t)


def _ref_attr(name: str, kind: str):
    from onnx import AttributeProto

    return AttributeProto(name=name, ref_attr_name=name, type=AttributeProto.FLOAT if kind == "float"
                          else AttributeProto.INT)


def body(overload: str):
    """onnxruntime's com.microsoft GroupQueryAttention node itself (key and value empty: packed QKV), the op's
    attributes passed through (qk_scale as its scale: 0 means 1 / sqrt(D) in both)."""
    from onnx import helper

    node = helper.make_node(
        "GroupQueryAttention", ["query", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length",
                                "cos_cache", "sin_cache"], ["Y", "present_key", "present_value"],
        domain="com.microsoft", do_rotary=1, local_window_size=-1, softcap=0.0)
    for name, kind in (("num_heads", "int"), ("kv_num_heads", "int"), ("rotary_interleaved", "int")):
        node.attribute.append(_ref_attr(name, kind))
    scale = _ref_attr("qk_scale", "float")
    scale.name = "scale"
    node.attribute.append(scale)
    return list(CACHED_ATTENTION.inputs), [node]


def out_shape(shapes: dict, attrs: dict) -> list:
    """Y's shape: [B, S, H D]."""
    h, hkv = int(attrs.get("num_heads", 1)), int(attrs.get("kv_num_heads", 1))
    b, s, width = shapes["query"]
    return [b, s, h * (width // (h + 2 * hkv))]


def out_shapes(shapes: dict, attrs: dict) -> list:
    """Every output's shape: Y, then present_key and present_value [B, Hkv, P + S, D], what a call with separate
    past and present buffers and total_sequence_length = P + S (every doctor case) returns (L depends on that
    input's value, which shapes do not carry)."""
    y = out_shape(shapes, attrs)
    b, hkv, p, d = shapes["past_key"]
    return [y, [b, hkv, p + shapes["query"][1], d], [b, hkv, p + shapes["query"][1], d]]


# Doctor entries: (B, S, past rows or None for a first prompt, H, Hkv, D, rotary dims R, interleaved). Decode after a
# context (SmolLM2's heads; a 7B layer's 32 heads of 128 at 1023 keys), a batch of 2 with interleaved pairs, GQA
# groups of 4 with a partial rotary on a first prompt, a later prompt of 5 tokens.
DOCTOR_SHAPES = ((1, 1, 100, 9, 3, 64, 64, 0), (2, 1, 300, 4, 2, 128, 128, 1), (2, 37, None, 8, 2, 64, 32, 0),
                 (1, 5, 40, 4, 4, 32, 32, 0), (1, 1, 1023, 32, 32, 128, 128, 0), (1, 1, 700, 16, 2, 64, 64, 0))


def doctor_entry(entry) -> tuple[dict, dict, tuple]:
    """Input shapes (and the present rows, `present`) and the heads; the report's (M, K, N) are B S, the keys after
    the call and H D."""
    b, s, past, h, hkv, d, rdim, inter = entry
    p = past or 0
    total = s + p
    shapes = {"query": [b, s, (h + 2 * hkv) * d], "past_key": [b, hkv, p, d], "past_value": [b, hkv, p, d],
              "seqlens_k": [b], "total_sequence_length": [], "cos_cache": [total + 3, rdim // 2],
              "sin_cache": [total + 3, rdim // 2]}
    attrs = {"num_heads": h, "kv_num_heads": hkv, "rotary_interleaved": inter}
    label = f"H{h}/{hkv} D{d} R{rdim}" + (" interleaved" if inter else "") + (" prompt" if past is None else "")
    return shapes, attrs, (b * s, total, h * d, 0, label)


def doctor_inputs(op: OpDef, dtype, shapes: dict, seed: int, device: str = "cpu") -> list:
    """query and the past ~N(0, 1); every sequence at the full length (seqlens_k = P + S - 1, total P + S); cos and
    sin of the usual rotary angles (base 10000) per position. `shapes` may name the query alone (the doctor's second
    X)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(*shapes["query"], generator=g, device=device).to(dtype)
    if "past_key" not in shapes:
        return [q]
    b, s = shapes["query"][:2]
    p = shapes["past_key"][2]
    pk = torch.randn(*shapes["past_key"], generator=g, device=device).to(dtype)
    pv = torch.randn(*shapes["past_value"], generator=g, device=device).to(dtype)
    seqlens = torch.full((b,), p + s - 1, dtype=torch.int32, device=device)
    total = torch.tensor(p + s, dtype=torch.int32, device=device)
    positions, half = shapes["cos_cache"]
    angle = torch.arange(positions, device=device)[:, None] / 10000 ** (
        torch.arange(half, device=device)[None, :] / half)
    return [q, pk, pv, seqlens, total, torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)]


FAMILY = OpFamily("cached_attention", (
    OpDef(18, CACHED_ATTENTION, reference, body, out_shape, DOCTOR_SHAPES, doctor_entry,
          int32_inputs=("seqlens_k", "total_sequence_length"), cpu_inputs=("total_sequence_length",),
          out_shapes=out_shapes, doctor_inputs=doctor_inputs, weighted=False),
))
