"""Decoders a user brings besides Llama (Mistral, Qwen2: grouped-query attention), exported as a user would with
torch.onnx.export, through both stages of `onnxfuse fuse` and `onnxfuse verify --module`."""
from __future__ import annotations

import importlib.util
import pathlib

import onnx
import pytest
import torch

from onnxfuse import cli

FACTORIES = pathlib.Path(__file__).parent / "data" / "hf_decoders.py"


def _factory(name):
    spec = importlib.util.spec_from_file_location("hf_decoders", FACTORIES)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, name)()


@pytest.mark.parametrize("name", ["mistral", "qwen2"])
def test_gqa_decoder_fuses_in_two_stages_and_verifies(tmp_path, name, capsys):
    module, inputs = _factory(name)
    src = tmp_path / f"{name}.onnx"
    torch.onnx.export(module, (inputs["input_ids"],), str(src), input_names=["input_ids"],
                      output_names=["last_hidden_state"], dynamo=True, opset_version=18)
    dst = tmp_path / f"{name}.fused.onnx"
    assert cli.main(["fuse", str(src), "-o", str(dst)]) == 0
    out = capsys.readouterr().out
    assert "rms_normalization" in out and "stage 1 checked" in out
    ops = [n.op_type for n in onnx.load(str(dst), load_external_data=False).graph.node]
    assert ops.count("SwiGLU") == 2 and "SkipSimplifiedLayerNormalization" in ops
    assert cli.main(["verify", str(dst), "--module", f"{FACTORIES}:{name}"]) == 0
    assert "PASS" in capsys.readouterr().out
