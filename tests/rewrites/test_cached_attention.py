"""CachedAttention: the rule on onnxruntime's GroupQueryAttention (the node genai's builder writes), near-misses that
must stay unfused with a reason, the provider policy, and the CPU kernel's numbers (decode after a context, first
prompts with right padding, a later prompt, shared and separate KV buffers, interleaved and partial rotary, GQA groups,
16-bit types) against PyTorch and against onnxruntime running the original node."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from onnxfuse import fuse, runtime, schema, soundness, testing
from onnxfuse.errors import OnnxfuseError  # noqa: F401  (the errors a bad call raises are onnxruntime's here)
from onnxfuse.ops.cached_attention import CACHED_ATTENTION

OP = CACHED_ATTENTION.name
# The CPU table that fuses the op (cpu_policy: a host without AVX2 leaves it to onnxruntime), named so that the rule's
# tests hold on any host; the kernels still run this host's code.
FUSING_FAMILY = "avx2"
ONNX_TYPE = {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16, torch.bfloat16: TensorProto.BFLOAT16}


def _gqa_model(h=4, hkv=2, d=32, rdim=32, dtype=TensorProto.FLOAT, attrs=None, inputs=None, outputs=3,
               seqlens_type=TensorProto.INT32, past_len="p"):
    """One com.microsoft GroupQueryAttention over packed QKV, as genai's builder writes it; the knobs spell
    near-misses (attributes, other inputs, a fourth output)."""
    names = inputs or ["q", "", "", "pk", "pv", "sl", "tl", "cos", "sin"]
    a = dict(num_heads=h, kv_num_heads=hkv, scale=0.0, local_window_size=-1, softcap=0.0, do_rotary=1,
             rotary_interleaved=0)
    a.update(attrs or {})
    outs = ["y", "ok", "ov"] + (["qk"] if outputs > 3 else [])
    node = helper.make_node("GroupQueryAttention", names, outs, domain="com.microsoft", name="attn", **a)
    width = (h + 2 * hkv) * d
    declared = {"q": helper.make_tensor_value_info("q", dtype, ["b", "s", width]),
                "k": helper.make_tensor_value_info("k", dtype, ["b", "s", hkv * d]),
                "v": helper.make_tensor_value_info("v", dtype, ["b", "s", hkv * d]),
                "pk": helper.make_tensor_value_info("pk", dtype, ["b", hkv, past_len, d]),
                "pv": helper.make_tensor_value_info("pv", dtype, ["b", hkv, past_len, d]),
                "sl": helper.make_tensor_value_info("sl", seqlens_type, ["b"]),
                "tl": helper.make_tensor_value_info("tl", TensorProto.INT32, []),
                "cos": helper.make_tensor_value_info("cos", dtype, [64, rdim // 2]),
                "sin": helper.make_tensor_value_info("sin", dtype, [64, rdim // 2]),
                "pos": helper.make_tensor_value_info("pos", TensorProto.INT64, ["b", "s"])}
    out_shapes = {"y": ["b", "s", h * d], "ok": ["b", hkv, "t", d], "ov": ["b", hkv, "t", d], "qk": ["b", h, "s", "t"]}
    graph = helper.make_graph([node], "gqa", [declared[n] for n in names if n],
                              [helper.make_tensor_value_info(o, dtype, out_shapes[o]) for o in outs])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18),
                                                                  helper.make_opsetid("com.microsoft", 1)])


def _caches(rdim, positions=64):
    ang = np.arange(positions)[:, None] / 10000 ** (np.arange(rdim // 2)[None, :] / (rdim // 2))
    return torch.from_numpy(np.cos(ang).astype(np.float32)), torch.from_numpy(np.sin(ang).astype(np.float32))


# (B, S, past lengths or None (first prompt), seqlens_k after, H, Hkv, D, R, interleaved, P buffer or None)
CASES = [
    (1, 7, None, [6], 4, 2, 32, 32, 0, None),          # a first prompt
    (2, 6, None, [5, 3], 8, 2, 64, 64, 0, None),       # a batch of prompts, the second right-padded
    (2, 1, [9, 4], [9, 4], 4, 4, 32, 16, 1, 12),       # decode, sequences of two lengths, interleaved partial rotary
    (1, 3, [8], [10], 6, 2, 64, 32, 0, 20),            # a later prompt of 3 tokens
    (1, 1, [40], [40], 9, 3, 64, 64, 0, 41),           # SmolLM2's heads after 40 tokens
    (1, 1, [33], [33], 10, 2, 48, 48, 0, 34),          # groups of 5, head size 48 (the decode loop's odd ends)
    (1, 6, [0], [5], 8, 8, 64, 64, 0, 16, 16),         # a prompt as genai's CUDA-graph mode feeds it: no past, total
                                                       # its static mask's length (16), not S
    (3, 6, [0, 0, 0], [5, 5, 5], 8, 8, 64, 64, 0, 16, 16),  # a batch of them (genai's graph mode at batch 3)
]


def _inputs(case, dtype=torch.float32, seed=0):
    b, s, past, seqlens, h, hkv, d, rdim, inter, buf = case[:10]
    g = torch.Generator().manual_seed(seed)
    p = buf if past is not None else 0
    q = torch.randn(b, s, (h + 2 * hkv) * d, generator=g).to(dtype)
    pk, pv = (torch.randn(b, hkv, p, d, generator=g).to(dtype) for _ in range(2))
    total = s if past is None else case[10] if len(case) > 10 else max(seqlens) + 1
    cos, sin = _caches(rdim)
    return [q, pk, pv, torch.tensor(seqlens, dtype=torch.int32), torch.tensor(total, dtype=torch.int32),
            cos.to(dtype), sin.to(dtype)], {"num_heads": h, "kv_num_heads": hkv, "rotary_interleaved": inter}


def _valid(case):
    """Per sequence (rows of Y that count, rows of present that count)."""
    b, s, past, seqlens = case[:4]
    out = []
    for i in range(b):
        rows = seqlens[i] + 1 if past is None else s
        start = 0 if past is None else seqlens[i] + 1 - s
        out.append((rows, start + rows))
    return out


def _run_onnxruntime_node(case, ins, dtype, share=False):
    """Y, present_key, present_value from onnxruntime's own GroupQueryAttention (CPU EP) on the same inputs."""
    h, hkv, d, rdim, inter = case[4:9]
    model = _gqa_model(h, hkv, d, rdim, ONNX_TYPE[dtype], attrs={"rotary_interleaved": inter})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return _bound_run(sess, ["q", "pk", "pv", "sl", "tl", "cos", "sin"], ["y", "ok", "ov"], ins, share)


def _bound_run(sess, in_names, out_names, ins, share):
    """Every output as fp32 numpy, bound to torch tensors (numpy has no bfloat16); with `share`, present_key and
    present_value bound to past_key's and past_value's own buffers (genai's past_present_share_buffer)."""
    q, pk = ins[0], ins[1]
    h_d = q.shape[2] - 2 * pk.shape[1] * pk.shape[3]
    total = int(ins[4])
    y = torch.empty(q.shape[0], q.shape[1], h_d, dtype=q.dtype)
    kv = [t.clone() for t in ins[1:3]]
    present = kv if share else [torch.empty(pk.shape[0], pk.shape[1], max(pk.shape[2], total), pk.shape[3],
                                            dtype=q.dtype) for _ in range(2)]
    io = sess.io_binding()
    for name, t in zip(in_names, [ins[0], *kv, *ins[3:]]):
        io.bind_ortvalue_input(name, testing.ortvalue(t))
    for name, t in zip(out_names, [y, *present]):
        io.bind_ortvalue_output(name, testing.ortvalue(t))
    sess.run_with_iobinding(io)
    return [t.float().numpy() for t in (y, *present)]


def _compare(got, want, case, dtype, what):
    for i, (rows, kv_rows) in enumerate(_valid(case)):
        testing.assert_close(got[0][i, :rows], want[0][i, :rows], dtype, f"{what}: Y of sequence {i}")
        for j in (1, 2):
            testing.assert_close(got[j][i, :, :kv_rows], want[j][i, :, :kv_rows], dtype,
                                 f"{what}: present {j} of sequence {i}")


def _onnxruntime_takes(case) -> bool:
    """onnxruntime's GroupQueryAttention refuses a batch of prompts with past context ("batch_size must be 1 when
    sequence_length > 1 and past context is given"), which genai's CUDA-graph mode feeds at batch > 1; the op runs
    them (on the CPU its own loop, on the CUDA EP onnxruntime's kernel a sequence a call)."""
    b, s, past = case[:3]
    return not (b > 1 and s > 1 and past is not None)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}S{c[1]}{'prompt' if c[2] is None else 'past'}H{c[4]}")
def test_reference_is_what_onnxruntimes_node_computes(case):
    if not _onnxruntime_takes(case):
        pytest.skip("onnxruntime's node refuses a batch of prompts with past context")
    ins, attrs = _inputs(case)
    ref = [t.float().numpy() for t in schema.reference(OP, ins, attrs)]
    _compare(_run_onnxruntime_node(case, ins, torch.float32), ref, case, "float", "onnxruntime")


def _kernel_model(case, dtype):
    ins, attrs = _inputs(case, dtype)
    names = list(CACHED_ATTENTION.inputs)
    shapes = {n: list(t.shape) for n, t in zip(names, ins)}
    return ins, attrs, testing.op_model(OP, testing.dtype_name(dtype), shapes, attrs)


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}S{c[1]}{'prompt' if c[2] is None else 'past'}H{c[4]}")
def test_cpu_kernel_matches_pytorch_and_onnxruntime(case, dtype, share):
    if share and case[2] is None:
        pytest.skip("a first prompt has no past buffer to share")
    ins, attrs, model = _kernel_model(case, dtype)
    sess = runtime.session(model, "cpu")
    got = _bound_run(sess, list(CACHED_ATTENTION.inputs), list(CACHED_ATTENTION.outputs), ins, share)
    ref = [t.float().numpy() for t in schema.reference(OP, ins, attrs)]
    _compare(got, ref, case, dtype, "kernel against PyTorch")
    if not share:  # separate buffers: every row of present is defined (past's, zeros, the new ones)
        for j in (1, 2):
            testing.assert_close(got[j], ref[j], dtype, f"present {j}, every row")
    if dtype != torch.bfloat16 and _onnxruntime_takes(case):  # onnxruntime's CPU kernel has no bfloat16
        _compare(got, _run_onnxruntime_node(case, ins, dtype, share), case, dtype, "kernel against onnxruntime")


def test_a_decode_loop_on_one_shared_buffer_follows_onnxruntime(tmp_path):
    """genai's way: one KV buffer of max length bound as past and present, a prompt, then token after token; the fused
    node's outputs at every step against onnxruntime's node on its own buffer."""
    h, hkv, d, buf = 6, 2, 64, 24
    model = _gqa_model(h, hkv, d, d)
    src, dst = tmp_path / "gqa.onnx", tmp_path / "gqa.fused.onnx"
    onnx.save(model, str(src))
    res = fuse.fuse(src, dst, provider="cpu", cpu_isa=FUSING_FAMILY, ort=False, write_unchanged=True)
    assert [m.op for m in res.matches] == [OP]
    sessions = [runtime.session(str(src), "cpu", library=False), runtime.session(str(dst), "cpu")]
    g = torch.Generator().manual_seed(3)
    caches = [[testing.ortvalue(torch.zeros(1, hkv, buf, d)) for _ in range(2)] for _ in sessions]
    cos, sin = _caches(d)
    length = 0
    for step, s in enumerate([5, 1, 1, 1, 1]):
        q = torch.randn(1, s, (h + 2 * hkv) * d, generator=g)
        length += s
        feeds = {"q": q, "sl": torch.tensor([length - 1], dtype=torch.int32),
                 "tl": torch.tensor(length, dtype=torch.int32), "cos": cos, "sin": sin}
        ys = []
        for sess, kv in zip(sessions, caches):
            io = sess.io_binding()
            for name, t in feeds.items():
                io.bind_ortvalue_input(name, testing.ortvalue(t))
            io.bind_ortvalue_input("pk", kv[0])
            io.bind_ortvalue_input("pv", kv[1])
            io.bind_output("y")
            io.bind_ortvalue_output("ok", kv[0])
            io.bind_ortvalue_output("ov", kv[1])
            sess.run_with_iobinding(io)
            ys.append(io.get_outputs()[0].numpy())
        testing.assert_close(ys[1], ys[0], "float", f"step {step}")
        for a, b in zip(*caches):
            testing.assert_close(b.numpy()[:, :, :length], a.numpy()[:, :, :length], "float", f"cache at {step}")


def test_the_rule_fuses_for_the_cpu_keeps_names_and_runs_without_the_library(tmp_path):
    model = _gqa_model()
    src, dst = tmp_path / "gqa.onnx", tmp_path / "gqa.fused.onnx"
    onnx.save(model, str(src))
    res = fuse.fuse(src, dst, provider="cpu", cpu_isa=FUSING_FAMILY, ort=False, write_unchanged=True)
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    assert [(n.domain, n.op_type) for n in fused.graph.node] == [(schema.DOMAIN, OP)]
    assert [o.name for o in fused.graph.output] == ["y", "ok", "ov"]
    node = fused.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["num_heads"] == 4 and attrs["kv_num_heads"] == 2 and res.matches[0].op == OP
    case = (2, 1, [9, 4], [9, 4], 4, 2, 32, 32, 0, 12)
    ins, _ = _inputs(case)
    feeds = dict(zip(["q", "pk", "pv", "sl", "tl", "cos", "sin"], (t.numpy() for t in ins)))
    want = runtime.session(str(src), "cpu", library=False).run(None, feeds)
    for library in (True, False):  # the CPU kernel, then the function body (onnxruntime's node again)
        got = runtime.session(str(dst), "cpu", library=library).run(None, feeds)
        _compare(got, want, case, "float", f"library={library}")


def test_the_cuda_provider_fuses_grouped_and_ungrouped_heads_and_a_cpu_without_avx2_leaves_them(tmp_path):
    grouped, mha = tmp_path / "gqa.onnx", tmp_path / "mha.onnx"
    onnx.save(_gqa_model(h=4, hkv=2), str(grouped))
    onnx.save(_gqa_model(h=4, hkv=4), str(mha))
    for provider in ("cuda", None):
        for src in (mha, grouped):
            res = fuse.fuse(src, tmp_path / f"{src.stem}-{provider}.onnx", provider=provider, ort=False)
            assert [m.op for m in res.matches] == [OP] and "cached_attention" not in res.left_to_ort
    res = fuse.fuse(grouped, tmp_path / "cpu.onnx", provider="cpu", cpu_isa=FUSING_FAMILY, ort=False)
    assert [m.op for m in res.matches] == [OP]  # the CPU's decode loop reads each KV row once for its query heads
    res = fuse.fuse(grouped, tmp_path / "generic.onnx", provider="cpu", cpu_isa="generic", ort=False,
                    write_unchanged=True)
    assert not res.matches and "without AVX2" in res.left_to_ort["cached_attention"]


@pytest.mark.parametrize("knob,reason", [
    (dict(inputs=["q", "k", "v", "pk", "pv", "sl", "tl", "cos", "sin"], h=4, hkv=2), "packed QKV"),
    (dict(inputs=["q", "", "", "pk", "pv", "sl", "tl", "cos", "sin", "pos"]), "position_ids"),
    (dict(inputs=["q", "", "", "pk", "pv", "sl", "tl"]), "cos/sin"),
    (dict(attrs={"do_rotary": 0}), "do_rotary=0"),
    (dict(attrs={"local_window_size": 16}), "local window"),
    (dict(attrs={"softcap": 30.0}), "softcap"),
    (dict(attrs={"smooth_softmax": 1}), "smooth_softmax"),
    (dict(attrs={"scale": -0.1}), "negative scale"),
    (dict(attrs={"some_new_knob": 1}), "does not know"),
    (dict(d=512, rdim=64), "head size 512"),
    (dict(h=6, hkv=4), "not a positive multiple"),
    (dict(rdim=48, d=32), "wider than the head size"),
    (dict(seqlens_type=TensorProto.INT64), "not int32"),
    (dict(dtype=TensorProto.DOUBLE), "not float/float16/bfloat16"),
    (dict(outputs=4), None),  # output_qk: not the rule's pattern at all
])
def test_near_misses_stay_onnxruntimes_with_a_reason(tmp_path, knob, reason):
    model = _gqa_model(**knob)
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    res = fuse.fuse(src, tmp_path / "f.onnx", provider="cpu", cpu_isa=FUSING_FAMILY, ort=False, write_unchanged=True)
    assert not res.matches
    if reason is None:
        return
    explained = fuse.fuse(src, tmp_path / "x.onnx", provider="cpu", cpu_isa=FUSING_FAMILY, ort=False,
                          write_unchanged=True, explain=True)
    reasons = [r["reason"] for r in explained.refusals if r["rule"].startswith("cached_attention")]
    assert any(reason in r for r in reasons), explained.refusals


@pytest.mark.parametrize("seqlens,total,s,needle", [
    ([12], 10, 1, "present rows"),     # a past of 12 rows with total_sequence_length 10
    ([7], 2, 3, "below the query's length"),
    ([5], 3, 3, "must be in [1, S = 3]"),  # a first prompt longer than its rows
])
def test_lengths_that_do_not_fit_are_an_error_naming_them(seqlens, total, s, needle):
    ins = [torch.randn(1, s, 8 * 32), torch.randn(1, 2, 8, 32), torch.randn(1, 2, 8, 32),
           torch.tensor(seqlens, dtype=torch.int32), torch.tensor(total, dtype=torch.int32), *_caches(32)]
    if needle.startswith("must be in [1"):
        ins[1], ins[2] = torch.randn(1, 2, 0, 32), torch.randn(1, 2, 0, 32)
    with pytest.raises(Exception, match=OP) as e:
        testing.run_op(OP, ins, {"num_heads": 4, "kv_num_heads": 2})
    assert needle in str(e.value)


def _bound_run_cuda_shared(sess, ins):
    """_bound_run(share=True) on the CUDA EP: past and present bound to the same device buffers (fp16), as genai binds
    them; the other inputs and Y through host memory."""
    dev = [t.clone().cuda() for t in ins[1:3]]
    q = ins[0]
    y = torch.empty(q.shape[0], q.shape[1], q.shape[2] - 2 * ins[1].shape[1] * ins[1].shape[3], dtype=q.dtype)
    io = sess.io_binding()
    for name, t in zip(CACHED_ATTENTION.inputs, ins):
        if name in ("past_key", "past_value"):
            continue
        io.bind_ortvalue_input(name, testing.ortvalue(t))
    for i, name in ((0, "past_key"), (1, "past_value")):
        io.bind_input(name, "cuda", 0, np.float16, list(dev[i].shape), dev[i].data_ptr())
    io.bind_ortvalue_output("Y", testing.ortvalue(y))
    for i, name in ((0, "present_key"), (1, "present_value")):
        io.bind_output(name, "cuda", 0, np.float16, list(dev[i].shape), dev[i].data_ptr())
    sess.run_with_iobinding(io)
    return [t.float().cpu().numpy() for t in (y, *dev)]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["auto", "cuda"])
@pytest.mark.parametrize("share,dtype", [(False, torch.float16), (False, torch.bfloat16), (True, torch.float16)])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}S{c[1]}{'prompt' if c[2] is None else 'past'}H{c[4]}")
def test_cuda_kernels_match_pytorch(case, dtype, share, backend):
    """The CUDA EP's op: backend auto hands first prompts of 16-bit types to onnxruntime's GroupQueryAttention
    (InvokeOp) and fixes the rows it leaves (a right-padded batch's Y and present rows); decode runs the split-KV
    kernel (grouped query heads too); backend cuda runs the op's own kernels throughout."""
    import onnxruntime
    if share and case[2] is None:
        pytest.skip("a first prompt has no past buffer to share")
    onnxruntime.preload_dlls()
    ins, attrs, model = _kernel_model(case, dtype)
    sess = runtime.session(model, "cuda", backend=backend, cpu_fallback=False)
    got = (_bound_run_cuda_shared(sess, ins) if share else
           _bound_run(sess, list(CACHED_ATTENTION.inputs), list(CACHED_ATTENTION.outputs), ins, False))
    ref = [t.float().numpy() for t in schema.reference(OP, ins, attrs)]
    _compare(got, ref, case, dtype, f"CUDA EP, backend {backend}")
    if not share:
        for j in (1, 2):
            testing.assert_close(got[j], ref[j], dtype, f"present {j}, every row")
        if case[2] is None:  # a first prompt: Y's rows past each sequence's valid ones are 0
            for i, (rows, _) in enumerate(_valid(case)):
                assert not got[0][i, rows:].any(), f"Y rows past sequence {i}'s valid ones"
