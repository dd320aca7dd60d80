"""FlashAttention: the rule on onnxruntime's MultiHeadAttention with an attention bias (hand-built nodes and a real
Llama export with a 64-wide head), near-misses that must stay unfused, and the fused model's numbers on the CPU
(the kernel library and the function body) against onnxruntime running the original node and PyTorch."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from onnxfuse import fuse, runtime, schema, soundness, testing, zoo
from onnxfuse.ops.flash_attention import FLASH_ATTENTION
from onnxfuse.rewrites import flash_attention as rule

OP = FLASH_ATTENTION.name


@pytest.fixture(autouse=True)
def short_sequences_fuse(request, monkeypatch):
    """The rule fuses from rule.MIN_TOKENS keys (1024, where the GPU kernel wins); these graphs are short, so the CPU
    runs them quickly: the threshold is lowered here, except in the test of the threshold itself."""
    if "threshold" not in request.node.name:
        monkeypatch.setattr(rule, "MIN_TOKENS", 1)


def _mha_graph(b=2, s=40, skv=40, h=2, d=64, bias_shape=None, dtype=TensorProto.FLOAT16, attrs=None,
               key_padding=False, kv_rank=3, outputs=1):
    """Y = MultiHeadAttention(Q, K, V, bias: [B, 1, S, S_kv] by default); the knobs spell near-misses."""
    bias_shape = bias_shape or [b, 1, s, skv]
    kv = [b, skv, h * d] if kv_rank == 3 else [b, h, skv, d]
    inputs = [helper.make_tensor_value_info("Q", dtype, [b, s, h * d]), helper.make_tensor_value_info("K", dtype, kv),
              helper.make_tensor_value_info("V", dtype, kv), helper.make_tensor_value_info("bias", dtype, bias_shape)]
    names = ["Q", "K", "V", "", "", "bias"]
    if key_padding:
        inputs.append(helper.make_tensor_value_info("kpm", TensorProto.INT32, [b, skv]))
        names[4] = "kpm"
    outs = ["Y"] + (["present_k", "present_v"] if outputs > 1 else [])
    node = helper.make_node("MultiHeadAttention", names, outs, domain="com.microsoft", num_heads=h, **(attrs or {}))
    shapes = {"Y": [b, s, h * d], "present_k": [b, h, skv, d], "present_v": [b, h, skv, d]}
    g = helper.make_graph([node], "mha", inputs, [helper.make_tensor_value_info(o, dtype, shapes[o]) for o in outs])
    return helper.make_model(g, ir_version=10, opset_imports=[helper.make_opsetid("", 18),
                                                              helper.make_opsetid("com.microsoft", 1)])


def _feeds(model, seed=0, pad=0):
    """Q, K, V ~N(0, 1); the bias a causal mask (-65504) with `pad` masked keys at the start of every row."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in model.graph.input:
        shape = [x.dim_value for x in i.type.tensor_type.shape.dim]
        dt = helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
        if i.name == "bias":
            s, skv = shape[2], shape[3]
            r, c = np.arange(s)[:, None], np.arange(skv)[None, :]
            masked = (c > r + (skv - s)) | (c < pad)
            out[i.name] = np.broadcast_to(np.where(masked, -65504.0, 0.5 * rng.standard_normal((s, skv))),
                                          shape).astype(dt)
        elif i.name == "kpm":
            out[i.name] = np.ones(shape, np.int32)
        else:
            out[i.name] = rng.standard_normal(shape).astype(dt)
    return out


def _fuse(tmp_path, model, name="m", **kw):
    src, dst = tmp_path / f"{name}.onnx", tmp_path / f"{name}.fused.onnx"
    onnx.save(model, str(src))
    res = fuse.fuse(src, dst, force=True, write_unchanged=True, **kw)
    return src, dst, res


def _ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


@pytest.mark.parametrize("bias_shape", [None, [1, 1, 40, 40], [1, 2, 40, 40], [2, 2, 40, 40]])
@pytest.mark.parametrize("pad", [0, 3])
def test_mha_with_a_bias_fuses_and_matches_onnxruntime_and_pytorch(tmp_path, bias_shape, pad):
    model = _mha_graph(bias_shape=bias_shape)
    src, dst, res = _fuse(tmp_path, model)
    assert [m.op for m in res.matches] == [OP] and _ops(dst) == [OP]
    fused = onnx.load(str(dst))
    soundness.check_model(fused)
    node = fused.graph.node[0]
    assert {a.name: helper.get_attribute_value(a) for a in node.attribute}["num_heads"] == 2
    feeds = _feeds(model, pad=pad)
    ref = runtime.session(str(src), "cpu", library=False).run(None, feeds)[0].astype(np.float32)
    torch_ref = schema.reference(OP, [torch.from_numpy(feeds[n]) for n in ("Q", "K", "V", "bias")],
                                 {"num_heads": 2}).float().numpy()
    for library in (True, False):  # the CPU kernel, then the function body (no library)
        out = runtime.session(str(dst), "cpu", library=library).run(None, feeds)[0].astype(np.float32)
        testing.assert_close(out, torch_ref, torch.float16, f"library={library} against PyTorch")
        testing.assert_close(out, ref, torch.float16, f"library={library} against onnxruntime's node")


def test_the_scale_attribute_is_kept(tmp_path):
    model = _mha_graph(attrs={"scale": 0.3})
    src, dst, _ = _fuse(tmp_path, model)
    node = onnx.load(str(dst)).graph.node[0]
    assert node.op_type == OP and abs(helper.get_attribute_value(
        next(a for a in node.attribute if a.name == "qk_scale")) - 0.3) < 1e-7
    feeds = _feeds(model)
    ref = runtime.session(str(src), "cpu", library=False).run(None, feeds)[0].astype(np.float32)
    out = runtime.session(str(dst), "cpu").run(None, feeds)[0].astype(np.float32)
    testing.assert_close(out, ref, torch.float16, "scale 0.3")


@pytest.mark.parametrize("knob,reason", [
    (dict(attrs={"unidirectional": 1}), "unidirectional"),
    (dict(attrs={"scale": -0.125}), "negative scale"),
    (dict(key_padding=True), "inputs"),
    (dict(dtype=TensorProto.FLOAT), "float32"),
    (dict(d=32), "head size 32"),
    (dict(d=80), "head size 80"),
    (dict(bias_shape=[2, 1, 1, 40]), "does not broadcast"),
    (dict(bias_shape=[1, 3, 40, 40]), "does not broadcast"),
    (dict(kv_rank=4), "3-D"),
    (dict(outputs=3), None),  # present_key / present_value: not the rule's pattern at all
])
def test_near_misses_stay_onnxruntimes_with_a_reason(tmp_path, knob, reason):
    model = _mha_graph(**knob)
    _, dst, res = _fuse(tmp_path, model)
    assert OP not in _ops(dst) and not res.matches
    if reason is None:
        return
    _, _, explained = _fuse(tmp_path, model, name="x", explain=True)
    reasons = [r["reason"] for r in explained.refusals if r["rule"].startswith("flash_attention")]
    assert any(reason in r for r in reasons), explained.refusals


def test_the_threshold_leaves_short_or_unknown_sequences_to_onnxruntime(tmp_path):
    assert rule.MIN_TOKENS == 1024
    _, dst, res = _fuse(tmp_path, _mha_graph(), explain=True)
    assert OP not in _ops(dst)
    assert any("40 keys" in r["reason"] for r in res.refusals if r["rule"].startswith("flash_attention")), res.refusals
    model = _mha_graph(s=1024, skv=1024, b=1, h=1)
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "kv_len"  # K's length unknown at fuse time
    model.graph.input[2].type.tensor_type.shape.dim[1].dim_param = "kv_len"
    _, dst, res = _fuse(tmp_path, model, name="dyn", explain=True)
    assert OP not in _ops(dst)
    _, dst, res = _fuse(tmp_path, _mha_graph(s=1023, skv=1023, b=1, h=1), name="short")
    assert OP not in _ops(dst)
    _, dst, res = _fuse(tmp_path, _mha_graph(s=1024, skv=1024, b=1, h=1), name="long")
    assert _ops(dst) == [OP]


def test_the_cpu_provider_leaves_it_to_onnxruntime(tmp_path):
    _, dst, res = _fuse(tmp_path, _mha_graph(), provider="cpu")
    assert OP not in _ops(dst)
    assert "flash_attention" in res.left_to_ort


def test_a_llama_export_with_64_wide_heads_fuses_its_attention(tmp_path):
    """A two-layer Llama (hidden 128, 2 heads of 64) exported in fp16 through onnxscript's SDPA fusion: each layer's
    MultiHeadAttention with the mask's bias becomes FlashAttention, and the fused decoder's output matches the
    unfused one's on the CPU (the causal bias over the mask input; the input's padding keeps key 0 only, as the
    bench's)."""
    from onnxfuse import export

    spec = zoo.LlamaSpec.from_preset("tiny", hidden_size=128, num_attention_heads=2, num_key_value_heads=2,
                                     num_hidden_layers=2, seq=48)
    src = tmp_path / "llama.onnx"
    export.export("llama", spec, src, seed=0, dtype="fp16", exporter="auto", force=True)
    dst = tmp_path / "llama.fused.onnx"
    res = fuse.fuse(src, dst, force=True)
    assert sum(m.op == OP for m in res.matches) == 2
    feeds = {k: v.numpy() for k, v in zoo.llama_inputs(spec, 0, "fp16").items()}
    ref = runtime.session(str(src), "cpu", library=False).run(None, feeds)[0].astype(np.float32)
    out = runtime.session(str(dst), "cpu").run(None, feeds)[0].astype(np.float32)
    testing.assert_close(out, ref, torch.float16, "fused Llama against unfused", kind="graph")


def test_doctor_inputs_recover_each_entrys_left_padding():
    """doctor_inputs gets shapes only and finds an entry's padding by (S, S_kv): the entries must differ there, and
    the bias it builds masks exactly the entry's first `pad` keys of every row beside the causal mask."""
    from onnxfuse.ops import flash_attention as op_module
    entries = op_module.DOCTOR_SHAPES
    assert len({(e[1], e[2]) for e in entries}) == len(entries)
    for entry in entries:
        shapes, _, _ = op_module.doctor_entry(entry)
        bias = op_module.doctor_inputs(None, torch.float32, shapes, seed=0)[3]
        s, skv, pad = entry[1], entry[2], entry[6]
        j = torch.arange(skv)[None, :]
        i = torch.arange(s)[:, None]
        expected = (j > i + (skv - s)) | (j < pad)
        assert torch.equal((bias == -65504.0).any(dim=(0, 1)), expected), entry
