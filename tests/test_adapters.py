"""LoRA adapters as model inputs (issue 30, onnxfuse/adapters.py): `export --lora-as-inputs` writes a model whose
adapter weights are inputs (zero defaults: the base model) plus an onnxruntime adapter file; `fuse` keeps them as
LoRALinear inputs; the fused model serves adapters swapped per run (onnxruntime's LoraAdapter or plain feeds) with
the numbers of the PyTorch module carrying that adapter."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from onnxfuse import adapters, cli, export, fuse, runtime, zoo
from onnxfuse.errors import OnnxfuseError

RANK = 4


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The tiny Llama MLP with r=4 adapters on gate/up/down, exported with --lora-as-inputs and fused."""
    d = tmp_path_factory.mktemp("adapters")
    spec = zoo.LlamaSpec.from_preset("tiny", mlp_only=True, lora_rank=RANK)
    res = export.export("llama", spec, d / "m.onnx", lora_as_inputs=True)
    fused = fuse.fuse(d / "m.onnx", d / "f.onnx")
    return spec, res, fused, d


def _module(spec, params: dict[str, np.ndarray] | None):
    """The exported module with `params` (input name -> [K, r] / [r, N] array) as its adapter; None: the base
    model (every lora_B zero)."""
    module = zoo.build_module("llama", spec, 0, "fp32")
    with torch.no_grad():
        for name, sub in module.named_modules():
            if hasattr(sub, "lora_A") and hasattr(sub.lora_A, "keys"):
                if params is None:
                    sub.lora_B["default"].weight.zero_()
                else:
                    sub.lora_A["default"].weight.copy_(torch.from_numpy(params[f"{name}.lora_A"].T))
                    sub.lora_B["default"].weight.copy_(torch.from_numpy(params[f"{name}.lora_B"].T))
    return module


def _torch(module, x):
    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


def test_export_lifts_the_adapter_to_inputs_with_zero_defaults(exported):
    spec, res, _, _ = exported
    model = onnx.load(str(res.path))
    names = sorted(f"{m}.lora_{k}" for m in ("gate_proj", "up_proj", "down_proj") for k in "AB")
    assert sorted(i.name for i in model.graph.input if i.name != "x") == names
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    assert all(not inits[n].any() for n in names)
    assert res.adapter_path == res.path.with_name("m.onnx_adapter") and res.adapter_path.is_file()
    params = adapters.read_adapter(res.adapter_path)
    assert sorted(params) == names
    assert params["gate_proj.lora_A"].shape == (spec.hidden_size, RANK)
    assert params["down_proj.lora_B"].shape == (RANK, spec.hidden_size)


def test_fused_model_keeps_the_adapter_inputs(exported):
    """gate and up with their adapters and act * up are one LoRASwiGLU, down one LoRALinear: every adapter input
    stays an op input under its name."""
    _, _, fused, d = exported
    assert sorted(m.op for m in fused.matches) == ["LoRALinear", "LoRASwiGLU"]
    model = onnx.load(str(d / "f.onnx"))
    lora = next(n for n in model.graph.node if n.op_type == "LoRALinear")
    gated = next(n for n in model.graph.node if n.op_type == "LoRASwiGLU")
    assert list(lora.input[2:4]) == ["down_proj.lora_A", "down_proj.lora_B"]
    assert list(gated.input[3:7]) == ["gate_proj.lora_A", "gate_proj.lora_B", "up_proj.lora_A", "up_proj.lora_B"]


@pytest.mark.parametrize("which", ["m.onnx", "f.onnx"])
def test_onnxruntime_lora_adapter_gives_the_peft_numbers(exported, which):
    spec, res, _, d = exported
    x = zoo.make_inputs("llama", spec, 0, "fp32")["x"].numpy()
    sess = runtime.session(str(d / which), library=which == "f.onnx")
    adapter = ort.LoraAdapter()
    adapter.Load(str(res.adapter_path))
    opts = ort.RunOptions()
    opts.add_active_adapter(adapter)
    params = adapters.read_adapter(res.adapter_path)
    np.testing.assert_allclose(sess.run(None, {"x": x}, opts)[0], _torch(_module(spec, params), x),
                               rtol=1e-5, atol=1e-5)
    # no adapter: the zero defaults, the base model
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _torch(_module(spec, None), x), rtol=1e-5, atol=1e-5)


def test_adapters_swap_on_one_fused_session(exported, tmp_path):
    """Two adapters in turn, and back, on the same session: each run equals the module with that adapter."""
    spec, res, _, d = exported
    x = zoo.make_inputs("llama", spec, 0, "fp32")["x"].numpy()
    first = adapters.read_adapter(res.adapter_path)
    rng = np.random.default_rng(7)
    second = {k: (rng.standard_normal(v.shape) * 0.1).astype(np.float32) for k, v in first.items()}
    path2 = adapters.write_adapter(tmp_path / "second.onnx_adapter", second)
    assert set(adapters.read_adapter(path2)) == set(second)
    sess = runtime.session(str(d / "f.onnx"), library=True)
    for params in (first, second, first):
        np.testing.assert_allclose(sess.run(None, {"x": x, **params})[0], _torch(_module(spec, params), x),
                                   rtol=1e-5, atol=1e-5)


def test_verify_feeds_the_exported_adapter(exported):
    _, res, _, d = exported
    assert cli.main(["verify", str(res.path), "-q"]) == 0
    assert cli.main(["verify", str(d / "f.onnx"), "-q"]) == 0


def test_bad_requests_are_one_line_errors(tmp_path):
    plain = zoo.LlamaSpec.from_preset("tiny", mlp_only=True)
    with pytest.raises(OnnxfuseError, match="--lora-rank"):
        export.export("llama", plain, tmp_path / "a.onnx", lora_as_inputs=True)
    with pytest.raises(OnnxfuseError, match="bf16"):
        export.export("llama", zoo.LlamaSpec.from_preset("tiny", mlp_only=True, lora_rank=2), tmp_path / "b.onnx",
                      dtype="bf16", lora_as_inputs=True)
    assert not list(tmp_path.iterdir())
    with pytest.raises(OnnxfuseError, match="does not exist"):
        adapters.read_adapter(tmp_path / "missing.onnx_adapter")


def test_adapter_slots_swap_under_iobinding(exported):
    """AdapterSlots: the adapter inputs bound once, swapped by copying into the same buffers (what a CUDA graph
    replay needs; tests/test_gpu.py runs it under enable_cuda_graph)."""
    spec, res, _, d = exported
    x = zoo.make_inputs("llama", spec, 0, "fp32")["x"].numpy()
    first = adapters.read_adapter(res.adapter_path)
    second = {k: v[::-1].copy() for k, v in first.items()}
    sess = runtime.session(str(d / "f.onnx"), library=True)
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("y")
    slots = adapters.AdapterSlots(sess, io, first)
    for i, params in enumerate((first, second, first)):
        if i:
            slots.load(params)
        sess.run_with_iobinding(io)
        np.testing.assert_allclose(io.copy_outputs_to_cpu()[0], _torch(_module(spec, params), x), rtol=1e-5,
                                   atol=1e-5)
    # preloaded adapters, activated by one copy into the slots (the views stay bound)
    slots.preload("first", first)
    slots.preload("second", second)
    for name, params in (("second", second), ("first", first), ("second", second)):
        slots.activate(name)
        sess.run_with_iobinding(io)
        np.testing.assert_allclose(io.copy_outputs_to_cpu()[0], _torch(_module(spec, params), x), rtol=1e-5,
                                   atol=1e-5)
    with pytest.raises(OnnxfuseError, match="was not preloaded"):
        slots.activate("third")
    with pytest.raises(OnnxfuseError, match="same rank"):
        slots.load({k: np.zeros((v.shape[0], v.shape[1] + 1), v.dtype) for k, v in first.items()})
    with pytest.raises(OnnxfuseError, match="same layers"):
        slots.load({"gate_proj.lora_A": first["gate_proj.lora_A"]})
    with pytest.raises(OnnxfuseError, match="not inputs of the model"):
        adapters.AdapterSlots(sess, sess.io_binding(), {"q_proj.lora_A": first["gate_proj.lora_A"]})
