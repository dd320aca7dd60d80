"""peft LoRA adapters through genai's model builder (`export hf SOURCE --adapter [NAME=]PEFT_DIR ...`, issue 30).

The builder takes one adapter (`--extra_options adapter_path=DIR`) and bakes it: beside each adapted projection's
MatMul, MatMul(x, `<proj>.lora_A.MatMul.weight`) -> MatMul(., `<proj>.lora_B.MatMul.weight`) -> Add, with peft's
scaling (lora_alpha / r, or / sqrt(r) with use_rslora) folded into B. Those initializers become graph inputs of the
same names with zero defaults (a run without an adapter is the base model), and each adapter's weights go to
`<NAME>.onnx_adapter` in the folder (onnxruntime's adapter format), which genai loads with
`og.Adapters(model).load(path, NAME)` + `generator.set_active_adapter(adapters, NAME)` and plain onnxruntime with
`LoraAdapter` + `RunOptions.add_active_adapter`. Every adapter after the first is built the same way in a scratch
folder for its weights; all must have the same names and shapes (one model serves adapters of one layout).
"""
from __future__ import annotations

import json
import pathlib

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import OnnxfuseError

ADAPTER_SUFFIXES = (".lora_A.MatMul.weight", ".lora_B.MatMul.weight")
EXTENSION = ".onnx_adapter"


def parse(specs: list[str], allow_pickle: bool = False) -> dict[str, pathlib.Path]:
    """`[NAME=]DIR` values -> {name: folder} (name default: the folder's name), each checked to be a peft LoRA
    adapter folder this export can take. Raises OnnxfuseError with one line."""
    out: dict[str, pathlib.Path] = {}
    for spec in specs:
        name, sep, folder = spec.partition("=")
        if not sep:
            name, folder = pathlib.Path(spec.rstrip("/")).name, spec
        path = pathlib.Path(folder)
        if not name or not name.replace("-", "_").replace(".", "_").isidentifier():
            raise OnnxfuseError(f"--adapter {spec}: the adapter's name {name!r} must be letters, digits, '_', '-' or "
                                "'.'; give NAME=DIR")
        if name in out:
            raise OnnxfuseError(f"--adapter {spec}: a second adapter named {name!r}; give NAME=DIR")
        _check_folder(path, allow_pickle)
        out[name] = path
    return out


def _check_folder(path: pathlib.Path, allow_pickle: bool) -> None:
    cfg_path = path / "adapter_config.json"
    if not cfg_path.is_file():
        raise OnnxfuseError(f"--adapter {path}: no adapter_config.json there; give a folder peft's save_pretrained "
                            "wrote")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise OnnxfuseError(f"--adapter {path}: adapter_config.json is not JSON ({e})") from None
    if cfg.get("peft_type") != "LORA":
        raise OnnxfuseError(f"--adapter {path}: a {cfg.get('peft_type')} adapter; only LoRA adapters are exported")
    if cfg.get("use_dora"):
        raise OnnxfuseError(f"--adapter {path}: a DoRA adapter (use_dora): its magnitude vector rescales the whole "
                            "weight, which genai's builder does not bake; merge it into the checkpoint instead")
    if not (path / "adapter_model.safetensors").is_file():
        if not (path / "adapter_model.bin").is_file():
            raise OnnxfuseError(f"--adapter {path}: no adapter_model.safetensors (or .bin) there")
        if not allow_pickle:
            raise OnnxfuseError(f"--adapter {path}: its weights are a pickle (adapter_model.bin), which can run code "
                                "when loaded; convert them to safetensors, or pass --allow-pickle if you trust it")


def lift(decoder: pathlib.Path) -> dict[str, np.ndarray]:
    """The builder's adapter initializers of the decoder at `decoder` become graph inputs of the same names with
    zero defaults, in place (the file is rewritten in its own layout). Returns their values (name -> array)."""
    from ..adapters import as_zero_default_input
    model = onnx.load(str(decoder))
    params = {init.name: as_zero_default_input(model.graph, init)
              for init in model.graph.initializer if init.name.endswith(ADAPTER_SUFFIXES)}
    if not params:
        raise OnnxfuseError(f"{decoder}: genai's builder wrote no LoRA weights (*{ADAPTER_SUFFIXES[0]}); does the "
                            "adapter target this model's projections?")
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer) or \
        (decoder.with_name(decoder.name + ".data")).exists()
    from .. import onnxio
    onnxio.save(model, decoder, external_data=external or None)
    return params


def weights(decoder: pathlib.Path) -> dict[str, np.ndarray]:
    """The adapter initializers of a decoder the builder wrote with an adapter (name -> array), without changing it."""
    model = onnx.load(str(decoder))
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer if i.name.endswith(ADAPTER_SUFFIXES)}


def check_same_layout(first: str, params: dict[str, np.ndarray], name: str, other: dict[str, np.ndarray]) -> None:
    """One model serves adapters of one layout: the same weight names and shapes as the first adapter."""
    if set(other) != set(params):
        diff = sorted(set(other) ^ set(params))[:3]
        raise OnnxfuseError(f"--adapter {name}: it adapts other projections than {first} ({', '.join(diff)} ...); "
                            "export adapters of the same target modules together")
    bad = [k for k in params if other[k].shape != params[k].shape]
    if bad:
        raise OnnxfuseError(f"--adapter {name}: {bad[0]} is {list(other[bad[0]].shape)}, {first}'s "
                            f"{list(params[bad[0]].shape)}: export adapters of the same rank together")
