"""Exporters: every model kind exports, passes onnx.checker, carries a recipe, and verifies against PyTorch."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from onnxfuse import cli, export, verify, zoo

CASES = {
    "llama": dict(kind="llama", num_hidden_layers=1),
    "llama-mlp": dict(kind="llama", mlp_only=True),
    "llama-lora": dict(kind="llama", lora_rank=8),
    "dlrm": dict(kind="dlrm"),
    "dlrm-lora": dict(kind="dlrm", lora_rank=4),
}


@pytest.mark.parametrize("case", list(CASES))
def test_export_checks_and_verifies(exported, case):
    kw = dict(CASES[case])
    path = exported(kw.pop("kind"), **kw)
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version <= 13
    recipe = export.read_recipe(model)
    assert recipe["kind"] in ("llama", "dlrm") and recipe["seed"] == 0 and recipe["dtype"] == "fp32"
    res = verify.verify(path)
    assert res.passed, res.outputs
    assert all(o.max_rel_err < 1e-4 for o in res.outputs)


def test_recipe_rebuilds_identical_weights(exported):
    path = exported("llama", lora_rank=8)
    recipe = export.read_recipe(onnx.load(str(path)))
    spec = zoo.spec_from_dict("llama", recipe["spec"])
    a = zoo.build_module("llama", spec, recipe["seed"], recipe["dtype"]).state_dict()
    b = zoo.build_module("llama", spec, recipe["seed"], recipe["dtype"]).state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the peft B matrices are non-zero, so the LoRA branch changes the output
    lora_b = [v for k, v in a.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)


def test_verify_catches_a_wrong_model(exported, tmp_path):
    """verify must fail (exit 1) on a model whose weights differ from the recipe's module."""
    path = exported("dlrm")
    model = onnx.load(str(path))
    init = next(i for i in model.graph.initializer if i.name.endswith("weight") and "bottom" in i.name)
    arr = onnx.numpy_helper.to_array(init).copy()
    arr[0, 0] += 1.0
    init.CopyFrom(onnx.numpy_helper.from_array(arr, init.name))
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    assert not verify.verify(bad).passed
    assert cli.main(["verify", str(bad), "-q"]) == 1


def test_fp16_and_dynamic_exports_verify(exported, tmp_path):
    assert verify.verify(exported("llama", dtype="fp16")).passed
    spec = zoo.LlamaSpec.from_preset("tiny")
    res = export.export("llama", spec, tmp_path / "dyn.onnx", dynamic=True)
    m = onnx.load(str(res.path))
    dims = m.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and dims[1].dim_param, "batch and sequence must be symbolic"
    assert verify.verify(res.path).passed


def test_torchscript_exporter_and_external_data(tmp_path):
    spec = zoo.DlrmSpec.from_preset("small")
    res = export.export("dlrm", spec, tmp_path / "ts.onnx", exporter="torchscript", external_data=True)
    assert res.exporter == "torchscript"
    assert (tmp_path / "ts.onnx.data").exists()
    assert verify.verify(res.path).passed


def test_dlrm_structure():
    spec = zoo.DlrmSpec.from_preset("small")
    m = zoo.build_dlrm(spec, 0, "fp32")
    linears = [l for l in m.bottom if isinstance(l, torch.nn.Linear)]
    assert [l.out_features for l in linears] == [512, 256, 64, 16] and linears[0].in_features == 13
    top = [l for l in m.top if isinstance(l, torch.nn.Linear)]
    assert top[0].in_features == 16 + 27 * 26 // 2 and [l.out_features for l in top] == [512, 256, 1]
    assert len(m.embeddings) == 26 and all(e.embedding_dim == 16 for e in m.embeddings)
    batch = zoo.criteo_batch(spec, 8, 0)
    assert batch["dense"].shape == (8, 13) and batch["sparse"].shape == (8, 26)
    out = m(**batch)
    assert out.shape == (8, 1) and torch.all((out > 0) & (out < 1))
    # the lecture's modulus hash
    ids = torch.tensor([[5, 2**31]])
    assert torch.equal(zoo.modulus_hash(ids, torch.tensor([3, 10])), torch.tensor([[0, (2**31 + 1) % 10]]))


def test_cli_export_json_and_bad_input(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert cli.main(["export", "llama", "--preset", "tiny", "--mlp-only", "-o", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["op_counts"] == {"MatMul": 3, "Mul": 2, "Sigmoid": 1}
    # existing output without --force: refused, file untouched
    before = out.read_bytes()
    assert cli.main(["export", "llama", "--preset", "tiny", "--mlp-only", "-o", str(out)]) == 2
    assert out.read_bytes() == before
    err = capsys.readouterr().err
    assert "--force" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("argv,needle", [
    (["export", "llama", "--preset", "tiny", "--hidden-size", "63"], "divisible"),
    (["export", "llama", "--preset", "tiny", "--layers", "0"], "must be positive"),
    (["export", "llama", "--preset", "tiny", "--lora-rank", "4", "--lora-targets", "nope"], "unknown module"),
    (["export", "dlrm", "--preset", "small", "--bottom-mlp", "512-8"], "embedding dim"),
    (["export", "dlrm", "--preset", "small", "-o", "/nonexistent-dir/x.onnx"], "does not exist"),
    (["verify", "/nonexistent.onnx"], "no such file"),
])
def test_bad_arguments_one_line_exit_2(tmp_path, capsys, argv, needle):
    if "-o" not in argv and argv[0] == "export":
        argv = argv + ["-o", str(tmp_path / "x.onnx")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.onnx").exists()
    assert not list(tmp_path.glob(".onnxfuse-*"))


def test_run_writes_outputs_and_checks_inputs(exported, tmp_path, capsys):
    path = exported("dlrm")
    out = tmp_path / "o.npz"
    assert cli.main(["run", str(path), "-o", str(out), "-q"]) == 0
    with np.load(out) as data:
        assert data["probability"].shape == (32, 1)
    bad = tmp_path / "in.npz"
    np.savez(bad, dense=np.zeros((32, 13), np.float64), sparse=np.zeros((32, 26), np.int64))
    assert cli.main(["run", str(path), "--inputs", str(bad)]) == 2
    assert "float32" in capsys.readouterr().err


def test_bf16_models_are_fed_and_read_through_float_casts():
    """numpy has no bf16: verify wraps bf16 graph inputs/outputs in Casts so a bf16 model can be checked."""
    from onnx import TensorProto, helper
    from onnxfuse import runtime
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    assert verify._has_bf16_io(m)
    wrapped = verify._float_io(m)
    assert not verify._has_bf16_io(wrapped)
    x = np.array([1.0, 1.00390625, -3.1], np.float32)  # 1 + 2^-8 is not representable in bf16: rounds to 1
    y = runtime.session(wrapped, "cpu").run(None, {"x": x})[0]
    np.testing.assert_array_equal(y, torch.tensor(x).bfloat16().float().numpy())


def test_bf16_on_cpu_names_the_fix(exported, capsys):
    path = exported("llama", dtype="bf16", mlp_only=True)
    assert cli.main(["verify", str(path)]) == 2
    assert "--provider cuda" in capsys.readouterr().err
