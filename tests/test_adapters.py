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
    """gate, up and down with their adapters and act * up are one LoRAGatedMLP: every adapter input stays an op
    input under its name."""
    _, _, fused, d = exported
    assert [m.op for m in fused.matches] == ["LoRAGatedMLP"]
    model = onnx.load(str(d / "f.onnx"))
    gated = next(n for n in model.graph.node if n.op_type == "LoRAGatedMLP")
    assert list(gated.input[3:7]) == ["gate_proj.lora_A", "gate_proj.lora_B", "up_proj.lora_A", "up_proj.lora_B"]
    assert list(gated.input[8:10]) == ["down_proj.lora_A", "down_proj.lora_B"]


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


def test_lora_as_inputs_with_external_data(exported, tmp_path):
    """With the weights in <out>.data (a 7B model's path: the exporter's weights file is moved into place, not loaded
    and rewritten) the same adapter is lifted: only the adapter-shaped tensors are read from it, the adapter file
    equals the in-memory export's, and the model gives the peft numbers with the adapter fed and the base model's
    without."""
    spec, res, _, _ = exported
    ext = export.export("llama", spec, tmp_path / "m.onnx", lora_as_inputs=True, external_data=True)
    assert ext.data_path == tmp_path / "m.onnx.data" and ext.data_path.is_file()
    first, lifted = adapters.read_adapter(res.adapter_path), adapters.read_adapter(ext.adapter_path)
    assert sorted(first) == sorted(lifted) and all(np.array_equal(first[k], lifted[k]) for k in first)
    graph = onnx.load(str(ext.path), load_external_data=False).graph
    lifted_inits = [i for i in graph.initializer if i.name in lifted]
    assert len(lifted_inits) == len(lifted) and not any(i.external_data for i in lifted_inits)
    assert any(i.external_data for i in graph.initializer)  # the base weights stay in the .data file
    x = zoo.make_inputs("llama", spec, 0, "fp32")["x"].numpy()
    sess = runtime.session(str(ext.path))
    np.testing.assert_allclose(sess.run(None, {"x": x, **lifted})[0], _torch(_module(spec, lifted), x), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _torch(_module(spec, None), x), rtol=1e-5, atol=1e-5)


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


# ------------------------------------------------------------------------------------------------ mixed batches
N_ADAPTERS = 3


@pytest.fixture(scope="module")
def multi(tmp_path_factory):
    """The tiny Llama MLP exported with --adapters 3: the LoRA MLP one MultiLoRAGatedMLP over stacked adapters."""
    d = tmp_path_factory.mktemp("multi")
    spec = zoo.LlamaSpec.from_preset("tiny", mlp_only=True, lora_rank=RANK)
    res = export.export("llama", spec, d / "m.onnx", lora_as_inputs=True, multi_adapters=N_ADAPTERS)
    return spec, res, d


def _random_adapter(like: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(v.shape) * 0.2).astype(np.float32) for k, v in like.items()}


def _scaled(params: dict[str, np.ndarray], factor: float) -> dict[str, np.ndarray]:
    """The adapter with B times `factor`: what a scale of factor x the exported one gives in the peft module."""
    return {k: v * factor if k.endswith(".lora_B") else v for k, v in params.items()}


def test_multi_adapter_export_writes_stacked_inputs_and_one_index(multi):
    spec, res, _ = multi
    model = onnx.load(str(res.path))
    ops = [n.op_type for n in model.graph.node if n.domain == "onnxfuse"]
    assert ops == ["MultiLoRAGatedMLP"]  # the gated MLP and down in one op
    shapes = {i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert shapes["gate_proj.lora_A"] == [N_ADAPTERS, spec.hidden_size, RANK]
    assert shapes["down_proj.lora_B"] == [N_ADAPTERS, RANK, spec.hidden_size]
    assert shapes["up_proj.lora_scales"] == [N_ADAPTERS]
    assert shapes[adapters.ADAPTER_INDEX] == [shapes["x"][0]]
    inits = {i.name for i in model.graph.initializer}
    assert adapters.ADAPTER_INDEX not in inits and "gate_proj.lora_scales" in inits  # the index has no default
    assert export.read_recipe(model)["multi_adapters"] == N_ADAPTERS


@pytest.mark.parametrize("library", [True, False], ids=["kernel", "function-body"])
def test_multi_adapter_rows_equal_each_row_run_alone(multi, library):
    """Rows mixing adapters (and a row with none) in one run equal each row run alone through the peft module that
    carries its adapter at its scale; a second mix on the same session too."""
    spec, res, d = multi
    x = zoo.make_inputs("llama", spec, 0, "fp32")["x"].numpy()
    exported = adapters.read_adapter(res.adapter_path)
    ads = [exported, _random_adapter(exported, 1), _random_adapter(exported, 2)]
    base_scale = 2.0  # the export's lora_alpha / r (alpha defaults to 2 r)
    scales = [base_scale, 0.5, 3.0]
    feeds = adapters.stack_adapters(ads, scales)
    sess = runtime.session(str(res.path), library=library)
    for index in ([2, -1], [0, 1], [1, 1]):
        y = sess.run(None, {"x": x, **feeds, adapters.ADAPTER_INDEX: np.array(index, np.int64)})[0]
        for row, j in enumerate(index):
            module = _module(spec, None if j < 0 else _scaled(ads[j], scales[j] / base_scale))
            ref = _torch(module, x[row:row + 1])[0]
            # fp32 within 1e-5 of the row's largest output (the adapters move the outputs to about +-10)
            np.testing.assert_allclose(y[row], ref, rtol=0, atol=1e-5 * max(1.0, float(np.abs(ref).max())),
                                       err_msg=f"index {index}, row {row}")


def test_multi_adapter_bad_index_and_stacks_are_errors(multi):
    spec, res, _ = multi
    x = zoo.make_inputs("llama", spec, 0, "fp32")["x"].numpy()
    exported = adapters.read_adapter(res.adapter_path)
    feeds = adapters.stack_adapters([exported], [2.0], n=N_ADAPTERS)
    assert feeds["gate_proj.lora_A"].shape[0] == N_ADAPTERS and not feeds["gate_proj.lora_A"][1:].any()
    assert feeds["gate_proj.lora_scales"].tolist() == [2.0, 0.0, 0.0]
    sess = runtime.session(str(res.path), library=True)
    with pytest.raises(Exception, match=r"adapter_index\[1\] = 3 names no adapter"):
        sess.run(None, {"x": x, **feeds, adapters.ADAPTER_INDEX: np.array([0, 3], np.int64)})
    with pytest.raises(OnnxfuseError, match="one each"):
        adapters.stack_adapters([exported, exported], [2.0])
    with pytest.raises(OnnxfuseError, match="other layers"):
        adapters.stack_adapters([exported, {"gate_proj.lora_A": exported["gate_proj.lora_A"]}], [1.0, 1.0])
    with pytest.raises(OnnxfuseError, match="for 2 slots"):
        adapters.stack_adapters([exported] * 3, [1.0] * 3, n=2)
    plain = zoo.LlamaSpec.from_preset("tiny", mlp_only=True)
    with pytest.raises(OnnxfuseError, match="--lora-rank"):
        export.export("llama", plain, res.path.with_name("p.onnx"), lora_as_inputs=True, multi_adapters=2)


def test_multi_adapter_gated_mlp_with_one_projection_adapted(tmp_path):
    """Adapters on gate and down only: the MLP is still one MultiLoRAGatedMLP (up's zero adapter stacked as a
    constant), and mixed rows equal each row's module."""
    spec = zoo.LlamaSpec.from_preset("tiny", mlp_only=True, lora_rank=RANK, lora_targets=("gate_proj", "down_proj"))
    res = export.export("llama", spec, tmp_path / "m.onnx", lora_as_inputs=True, multi_adapters=2)
    model = onnx.load(str(res.path))
    assert [n.op_type for n in model.graph.node if n.domain == "onnxfuse"] == ["MultiLoRAGatedMLP"]
    assert not any(i.name.startswith("up_proj") for i in model.graph.input)
    x = zoo.make_inputs("llama", spec, 0, "fp32")["x"].numpy()
    exported = adapters.read_adapter(res.adapter_path)
    ads = [exported, _random_adapter(exported, 4)]
    feeds = adapters.stack_adapters(ads, [2.0, 2.0])
    sess = runtime.session(str(res.path), library=True)
    y = sess.run(None, {"x": x, **feeds, adapters.ADAPTER_INDEX: np.array([1, 0], np.int64)})[0]
    for row, j in enumerate([1, 0]):
        ref = _torch(_module(spec, ads[j]), x[row:row + 1])[0]
        np.testing.assert_allclose(y[row], ref, rtol=0, atol=1e-5 * max(1.0, float(np.abs(ref).max())))
