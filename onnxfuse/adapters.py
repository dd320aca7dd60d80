"""LoRA adapters as model inputs (issue 30): one exported model serves any adapter of the same shapes.

`export ... --lora-as-inputs` turns each peft LoRA layer's A and B (as the exporter laid them out for the MatMuls,
[K, r] and [r, N]) into graph inputs named after the layer (`<module>.lora_A`, `<module>.lora_B`) whose default
initializers are zeros, so a run that feeds no adapter is the base model; the exported adapter's own weights go to
an onnxruntime adapter file (`.onnx_adapter`, `write_adapter`). `fuse` keeps such inputs as inputs of the
LoRALinear ops (nothing baked), so the fused model serves the same adapter files:

    adapter = onnxruntime.LoraAdapter(); adapter.Load("model.onnx_adapter")
    opts = onnxruntime.RunOptions(); opts.add_active_adapter(adapter)
    session.run(None, feeds, opts)

or feed the arrays (`read_adapter`) as inputs yourself, or bind them once with IOBinding and overwrite the bound
buffers to swap adapters between runs (onnxruntime's adapters do not apply to a run with a binding).
"""
from __future__ import annotations

import pathlib

import numpy as np
import onnx
from onnx import numpy_helper

from .errors import OnnxfuseError


def lora_layers(module) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The peft LoRA layers of a module: name -> (A [K, r], B [r, N]) of its active adapter, in the layout the
    exported MatMuls use (x @ A @ B), as numpy arrays of the module's dtype."""
    out = {}
    for name, sub in module.named_modules():
        lora_a, lora_b = getattr(sub, "lora_A", None), getattr(sub, "lora_B", None)
        if lora_a is None or lora_b is None or not hasattr(lora_a, "keys"):
            continue
        active = list(getattr(sub, "active_adapters", None) or lora_a.keys())
        if len(active) != 1:
            raise OnnxfuseError(f"{name}: {len(active)} active LoRA adapters; export one adapter at a time")
        a, b = lora_a[active[0]].weight.detach(), lora_b[active[0]].weight.detach()
        out[name] = (_numpy(a.T), _numpy(b.T))
    return out


def _numpy(t) -> np.ndarray:
    import torch

    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: compare the raw bits
        return t.contiguous().view(torch.int16).numpy().view(np.uint16)
    return t.contiguous().numpy()


def _array(init: onnx.TensorProto) -> np.ndarray:
    arr = numpy_helper.to_array(init)
    return arr.view(np.uint16) if init.data_type == onnx.TensorProto.BFLOAT16 and arr.dtype != np.uint16 else arr


def lift_lora_inputs(model: onnx.ModelProto, layers: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
    """Turn each layer's A and B initializers of `model` (found by value: the exporter names them val_N) into graph
    inputs `<layer>.lora_A` / `<layer>.lora_B` with zero defaults, in place. Returns the adapter's parameters
    (input name -> the weights that were there). Raises OnnxfuseError when a weight is not found exactly once."""
    graph = model.graph
    # the initializers of an adapter weight's shape, each decoded once: (name, array) per shape
    wanted = {arr.shape for pair in layers.values() for arr in pair}
    by_shape: dict[tuple, list[tuple[str, np.ndarray]]] = {}
    for init in graph.initializer:
        if tuple(init.dims) in wanted:
            by_shape.setdefault(tuple(init.dims), []).append((init.name, _array(init)))
    params: dict[str, np.ndarray] = {}
    renames: dict[str, str] = {}
    for layer, pair in layers.items():
        for kind, arr in zip(("lora_A", "lora_B"), pair):
            hits = [(n, a) for n, a in by_shape.get(arr.shape, []) if np.array_equal(a, arr)]
            if len(hits) != 1:
                raise OnnxfuseError(f"--lora-as-inputs: {layer}.{kind} {list(arr.shape)} found {len(hits)} times "
                                    "among the exported weights (expected once); export without --lora-as-inputs")
            name = f"{layer}.{kind}"
            renames[hits[0][0]] = name
            params[name] = hits[0][1]
    for init in graph.initializer:
        if init.name in renames:
            as_zero_default_input(graph, init, renames[init.name])
    for node in graph.node:
        node.input[:] = [renames.get(i, i) for i in node.input]
    return params


def as_zero_default_input(graph: onnx.GraphProto, init: onnx.TensorProto, name: str | None = None) -> np.ndarray:
    """Make initializer `init` a graph input `name` (default its own name) whose default is zeros of its type and
    shape, in place; returns the weights it held (bf16 as raw uint16 bits)."""
    weights = _array(init)
    elem, name = init.data_type, name or init.name
    init.CopyFrom(numpy_helper.from_array(np.zeros(tuple(init.dims), weights.dtype), name))
    init.data_type = elem  # bf16 kept as bf16 (its zeros are zero bits)
    graph.input.append(onnx.helper.make_tensor_value_info(name, elem, list(init.dims)))
    return weights


def write_adapter(path: str | pathlib.Path, params: dict[str, np.ndarray], adapter_version: int = 1,
                  model_version: int = 1) -> pathlib.Path:
    """Write `params` (input name -> array) as an onnxruntime adapter file (onnxruntime.AdapterFormat)."""
    import onnxruntime as ort

    path = pathlib.Path(path)
    fmt = ort.AdapterFormat()
    fmt.set_adapter_version(adapter_version)
    fmt.set_model_version(model_version)
    fmt.set_parameters({name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr))
                        for name, arr in params.items()})
    tmp = path.with_name(path.name + ".tmp")
    fmt.export_adapter(str(tmp))
    tmp.replace(path)
    return path


def read_adapter(path: str | pathlib.Path) -> dict[str, np.ndarray]:
    """An adapter file's parameters as numpy arrays (input name -> array), to feed or bind as inputs."""
    import onnxruntime as ort

    if not pathlib.Path(path).is_file():
        raise OnnxfuseError(f"adapter file {path} does not exist")
    fmt = ort.AdapterFormat.read_adapter(str(path))
    # copies: the OrtValues view the file's buffer, which goes with `fmt`
    return {name: np.array(value.numpy(), copy=True) for name, value in fmt.get_parameters().items()}


class AdapterSlots:
    """A session's adapter inputs bound once to an IOBinding, in buffers on the session's device; `load` copies
    another adapter (same names, shapes and dtypes) into the same buffers, so the bound inputs, and a CUDA graph
    onnxruntime captured over them (`enable_cuda_graph`), stay valid across a swap. onnxruntime's own LoraAdapter
    does not apply to runs with a binding; this is the IOBinding form of it.

        io = session.io_binding(); io.bind_ortvalue_input("x", x_value); io.bind_ortvalue_output("y", y_value)
        slots = AdapterSlots(session, io, read_adapter("a.onnx_adapter"), device="cuda")
        session.run_with_iobinding(io)            # adapter a
        slots.load(read_adapter("b.onnx_adapter"))
        session.run_with_iobinding(io)            # adapter b, same buffers
    """

    def __init__(self, session, binding, params: dict[str, np.ndarray], device: str = "cpu", device_id: int = 0):
        import onnxruntime as ort

        known = {i.name for i in session.get_overridable_initializers()}
        unknown = sorted(set(params) - known)
        if unknown:
            raise OnnxfuseError(f"adapter parameters {', '.join(unknown)} are not inputs of the model (it takes "
                                f"{', '.join(sorted(known)) or 'none'}); export it with --lora-as-inputs")
        self.values = {}
        self.kinds = {}  # name -> (shape, dtype) of the bound buffer, so a swap reads nothing back from the device
        for name, arr in params.items():
            value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr), device, device_id)
            binding.bind_ortvalue_input(name, value)
            self.values[name] = value
            self.kinds[name] = (tuple(arr.shape), np.dtype(arr.dtype))

    def load(self, params: dict[str, np.ndarray]) -> None:
        """Copy `params` into the bound buffers (checked first: the same names, shapes and dtypes)."""
        if set(params) != set(self.values):
            raise OnnxfuseError(f"the adapter has parameters {sorted(params)}, the bound one {sorted(self.values)}: "
                                "swap adapters of the same layers")
        for name, arr in params.items():
            shape, dtype = self.kinds[name]
            if tuple(arr.shape) != shape or np.dtype(arr.dtype) != dtype:
                raise OnnxfuseError(f"adapter parameter {name} is {arr.dtype}{list(arr.shape)}, the bound buffer "
                                    f"{dtype}{list(shape)}: swap adapters of the same rank and dtype")
        for name, arr in params.items():
            self.values[name].update_inplace(np.ascontiguousarray(arr))
