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


ADAPTER_INDEX = "adapter_index"  # the multi-adapter model's input: one adapter per batch row, -1 for none


def scales_name(a_input: str) -> str:
    """The scales input of the layer whose A input is `a_input` (`<layer>.lora_A` -> `<layer>.lora_scales`)."""
    return (a_input[:-len(".lora_A")] if a_input.endswith(".lora_A") else a_input) + ".lora_scales"


def to_multi_adapter(model: onnx.ModelProto, n: int) -> int:
    """Make `model` (exported with --lora-as-inputs: each LoRA layer's A and B graph inputs) serve a batch that mixes
    up to `n` adapters, in place: fuse its LoRA layers (the lora_linear and swiglu rules: a gated MLP's gate and up
    with their adapters become one LoRASwiGLU, with down's adapter too one LoRAGatedMLP), then turn each LoRALinear /
    LoRASwiGLU / LoRAGatedMLP whose adapters are graph inputs into a MultiLoRALinear / MultiLoRASwiGLU /
    MultiLoRAGatedMLP over stacks of n adapters: the same input names with a leading
    [n] axis (zero defaults), `<layer>.lora_scales` [n] (default: the exported scale), and one `adapter_index` [batch]
    input (int64, no default: -1 for a row without an adapter) that every layer shares. A projection of a gated MLP
    without an adapter keeps a zero one, stacked as a constant. Returns the number of nodes converted; raises
    OnnxfuseError when there is none. `stack_adapters` builds the stacked inputs from adapter files."""
    from onnxscript import ir

    from . import functions, fuse
    from .ops.lora_linear import LORA_LINEAR, MULTI_LORA_LINEAR
    from .ops.swiglu import LORA_GATED_MLP, LORA_SWIGLU, MULTI_LORA_GATED_MLP, MULTI_LORA_SWIGLU
    from .schema import DOMAIN

    if n < 1:
        raise OnnxfuseError(f"--adapters must be >= 1 (got {n})")
    irm = ir.serde.deserialize_model(model)
    fuse.fuse_model(irm, ["lora_linear", "swiglu"])
    fused = ir.serde.serialize_model(irm)
    graph = fused.graph
    inputs = {i.name: i for i in graph.input}
    # op -> (its multi-adapter op, [(A, B, scale attribute)] by input position)
    plans = {LORA_LINEAR.name: (MULTI_LORA_LINEAR.name, [(2, 3, "scale")]),
             LORA_SWIGLU.name: (MULTI_LORA_SWIGLU.name, [(3, 4, "scale_gate"), (5, 6, "scale_up")]),
             LORA_GATED_MLP.name: (MULTI_LORA_GATED_MLP.name,
                                   [(3, 4, "scale_gate"), (5, 6, "scale_up"), (8, 9, "scale_down")])}
    nodes = [nd for nd in graph.node if nd.domain == DOMAIN and nd.op_type in plans
             and any(nd.input[a] in inputs for a, _, _ in plans[nd.op_type][1])]
    if not nodes:
        raise OnnxfuseError("--adapters: no LoRA layer with its adapter as inputs fused (export with --lora-rank R)")
    graph.input.append(onnx.helper.make_tensor_value_info(ADAPTER_INDEX, onnx.TensorProto.INT64,
                                                          [_batch_dim(graph, nodes[0].input[0])]))
    for nd in nodes:
        op, pairs = plans[nd.op_type]
        attrs = {at.name: at for at in nd.attribute}
        scales = [_stack_pair(graph, inputs, nd.input[a], nd.input[b], attrs[s].f if s in attrs else 1.0, n)
                  for a, b, s in pairs]
        node_inputs = [*nd.input, *scales, ADAPTER_INDEX]
        keep = [at for name, at in attrs.items() if name not in {s for _, _, s in pairs}]
        nd.op_type = op  # the overload (the activation, or empty) stays
        del nd.input[:]
        nd.input.extend(node_inputs)
        del nd.attribute[:]
        nd.attribute.extend(keep)
    others = [f for f in fused.functions if f.domain != DOMAIN]  # the exporter's own functions stay
    del fused.functions[:]
    fused.functions.extend(others)
    functions.add_functions(fused)  # the onnxfuse ops' bodies, for the ops now in the graph
    model.CopyFrom(fused)
    return len(nodes)


def _stack_pair(graph: onnx.GraphProto, inputs: dict, a_name: str, b_name: str, scale: float, n: int) -> str:
    """Stack a LoRA layer's A and B n deep: graph inputs become [n, ...] inputs with zero defaults, constants (a gated
    MLP's zero adapter) [n, ...] constants; returns its scales' name, an [n] input defaulting to `scale`."""
    inits = {i.name: i for i in graph.initializer}
    s_name = scales_name(a_name)
    if s_name in inits:  # a constant zero adapter another node shares: stacked already
        return s_name
    for name in (a_name, b_name):
        init = inits[name]
        arr = _array(init)
        stacked = np.zeros([n, *arr.shape], arr.dtype) if name in inputs else np.broadcast_to(arr, (n, *arr.shape))
        new = numpy_helper.from_array(np.ascontiguousarray(stacked), name)
        new.data_type = init.data_type
        init.CopyFrom(new)
        if name in inputs:
            inputs[name].CopyFrom(onnx.helper.make_tensor_value_info(name, init.data_type, [n, *arr.shape]))
    elem = inits[a_name].data_type
    graph.initializer.append(numpy_helper.from_array(np.full([n], scale, onnx.helper.tensor_dtype_to_np_dtype(elem)),
                                                     s_name))
    if a_name in inputs:
        graph.input.append(onnx.helper.make_tensor_value_info(s_name, elem, [n]))
    return s_name


def _batch_dim(graph: onnx.GraphProto, x_name: str):
    """X's first dimension (a symbol or a size) as the graph declares it, following X back to a graph input of the
    same leading axis where it is an intermediate; "batch" where nothing says."""
    for vi in list(graph.input) + list(graph.value_info):
        if vi.name == x_name and vi.type.tensor_type.shape.dim:
            d = vi.type.tensor_type.shape.dim[0]
            return d.dim_param or (d.dim_value if d.HasField("dim_value") else "batch")
    first = next((i for i in graph.input if i.type.tensor_type.shape.dim), None)
    if first is not None:
        d = first.type.tensor_type.shape.dim[0]
        return d.dim_param or (d.dim_value if d.HasField("dim_value") else "batch")
    return "batch"


def stack_adapters(adapters: list[dict[str, np.ndarray]], scales: list[float],
                   n: int | None = None) -> dict[str, np.ndarray]:
    """The inputs of a multi-adapter model (`to_multi_adapter`) that hold `adapters` (each the parameters of one
    adapter file, `read_adapter`) in slots 0, 1, ...: each A and B input stacked, zeros in the slots past them up to
    `n`, and `<layer>.lora_scales` with each adapter's scale (`scales`: peft's lora_alpha / r, or alpha / sqrt(r)
    with rslora; the exported one is the default of the model's scales inputs), 0 in an empty slot. Every adapter
    must have the same layers, shapes and dtypes (fp32 or fp16)."""
    if not adapters:
        raise OnnxfuseError("stack_adapters: no adapters given")
    if len(scales) != len(adapters):
        raise OnnxfuseError(f"stack_adapters: {len(scales)} scales for {len(adapters)} adapters (one each)")
    n = len(adapters) if n is None else n
    if len(adapters) > n:
        raise OnnxfuseError(f"stack_adapters: {len(adapters)} adapters for {n} slots")
    names = sorted(adapters[0])
    for i, p in enumerate(adapters[1:], 1):
        if sorted(p) != names or any(p[k].shape != adapters[0][k].shape or p[k].dtype != adapters[0][k].dtype
                                     for k in names):
            raise OnnxfuseError(f"stack_adapters: adapter {i} has other layers, shapes or dtypes than adapter 0")
    out = {}
    for k in names:
        first = adapters[0][k]
        stacked = np.zeros((n, *first.shape), first.dtype)
        for i, p in enumerate(adapters):
            stacked[i] = p[k]
        out[k] = stacked
        if k.endswith(".lora_A"):
            if first.dtype not in (np.float32, np.float16):
                raise OnnxfuseError(f"stack_adapters: {k} is {first.dtype}; adapters are fp32 or fp16")
            out[scales_name(k)] = np.array(list(scales) + [0.0] * (n - len(adapters)), first.dtype)
    return out


_SLOT_ALIGN = 256  # bytes between the starts of two inputs in the slots' buffer


class AdapterSlots:
    """A session's adapter inputs bound once to an IOBinding, as views into one buffer on the session's device (the
    slots); swapping adapters rewrites that buffer, so the bound inputs, and a CUDA graph onnxruntime captured over
    them (`enable_cuda_graph`), stay valid across a swap. onnxruntime's own LoraAdapter does not apply to runs with a
    binding; this is the IOBinding form of it.

        io = session.io_binding(); io.bind_ortvalue_input("x", x_value); io.bind_ortvalue_output("y", y_value)
        slots = AdapterSlots(session, io, read_adapter("a.onnx_adapter"), device="cuda")
        session.run_with_iobinding(io)            # adapter a
        slots.load(read_adapter("b.onnx_adapter"))  # one host-to-device copy of the whole adapter
        session.run_with_iobinding(io)            # adapter b, same buffers
        slots.preload("c", read_adapter("c.onnx_adapter"))  # kept on the device in the slots' layout
        slots.activate("c")                       # one device-to-device copy: what a server does per switch

    Every adapter must have the bound one's names, shapes and dtypes (checked).
    """

    def __init__(self, session, binding, params: dict[str, np.ndarray], device: str = "cpu", device_id: int = 0):
        import onnxruntime as ort

        known = {i.name for i in session.get_overridable_initializers()}
        unknown = sorted(set(params) - known)
        if unknown:
            raise OnnxfuseError(f"adapter parameters {', '.join(unknown)} are not inputs of the model (it takes "
                                f"{', '.join(sorted(known)) or 'none'}); export it with --lora-as-inputs")
        if device not in ("cpu", "cuda"):
            raise OnnxfuseError(f"AdapterSlots: device must be cpu or cuda (got {device!r})")
        self.device, self.device_id = device, int(device_id)
        self.kinds = {}    # name -> (shape, dtype) of the bound view, so a swap reads nothing back from the device
        self.offsets = {}  # name -> byte offset of its view in the slots
        size = 0
        for name in sorted(params):
            arr = params[name]
            self.kinds[name] = (tuple(arr.shape), np.dtype(arr.dtype))
            self.offsets[name] = size
            size += -(-arr.nbytes // _SLOT_ALIGN) * _SLOT_ALIGN
        self.nbytes = size
        self.slots = ort.OrtValue.ortvalue_from_shape_and_type([max(size, 1)], np.uint8, device, self.device_id)
        self.resident: dict[str, object] = {}  # preloaded adapters, flat buffers on the device
        base = self.slots.data_ptr()
        for name, (shape, dtype) in self.kinds.items():
            binding.bind_input(name, device, self.device_id, dtype, list(shape), base + self.offsets[name])
        self.load(params)

    def _pack(self, params: dict[str, np.ndarray]) -> np.ndarray:
        """`params` in the slots' layout, one host buffer (checked first: the bound names, shapes and dtypes)."""
        if set(params) != set(self.kinds):
            raise OnnxfuseError(f"the adapter has parameters {sorted(params)}, the bound one {sorted(self.kinds)}: "
                                "swap adapters of the same layers")
        flat = np.zeros(max(self.nbytes, 1), np.uint8)
        for name, arr in params.items():
            shape, dtype = self.kinds[name]
            if tuple(arr.shape) != shape or np.dtype(arr.dtype) != dtype:
                raise OnnxfuseError(f"adapter parameter {name} is {arr.dtype}{list(arr.shape)}, the bound buffer "
                                    f"{dtype}{list(shape)}: swap adapters of the same rank and dtype")
            raw = np.ascontiguousarray(arr).view(np.uint8).reshape(-1)
            flat[self.offsets[name]:self.offsets[name] + raw.size] = raw
        return flat

    def load(self, params: dict[str, np.ndarray]) -> None:
        """Copy `params` into the slots: one host-to-device copy (a memcpy on the CPU)."""
        self.slots.update_inplace(self._pack(params))

    def preload(self, name: str, params: dict[str, np.ndarray]) -> None:
        """Keep adapter `name` on the slots' device in their layout, for `activate` (its memory: `nbytes`)."""
        import onnxruntime as ort
        self.resident[name] = ort.OrtValue.ortvalue_from_numpy(self._pack(params), self.device, self.device_id)

    def activate(self, name: str) -> None:
        """Make the preloaded adapter `name` the bound one: one device-to-device copy of `nbytes` into the slots,
        finished when this returns (the next run, on onnxruntime's own stream, reads it)."""
        if name not in self.resident:
            raise OnnxfuseError(f"adapter {name!r} was not preloaded (preloaded: {', '.join(self.resident) or 'none'})")
        src = self.resident[name]
        if self.device == "cpu":
            import ctypes
            ctypes.memmove(self.slots.data_ptr(), src.data_ptr(), self.nbytes)
        else:
            cuda_copy(self.slots.data_ptr(), src.data_ptr(), self.nbytes, self.device_id)


def cuda_copy(dst: int, src: int, nbytes: int, device_id: int = 0) -> None:
    """A device-to-device copy through the CUDA runtime onnxruntime's CUDA EP loaded in this process, then a device
    synchronize (onnxruntime runs on a stream of its own)."""
    rt = _cudart()
    for call, args in (("cudaSetDevice", (device_id,)), ("cudaMemcpy", (dst, src, nbytes, 3)),  # DeviceToDevice
                       ("cudaDeviceSynchronize", ())):
        err = getattr(rt, call)(*args)
        if err:
            raise OnnxfuseError(f"{call} failed with CUDA error {err}")


_CUDART = None


def _cudart():
    """libcudart as this process loaded it (the one onnxruntime's CUDA EP uses), else the loader's."""
    global _CUDART
    if _CUDART is None:
        import ctypes
        path = None
        try:
            with open("/proc/self/maps") as maps:
                path = next((line.split()[-1] for line in maps if "libcudart.so" in line.split()[-1]), None)
        except OSError:
            pass
        try:
            lib = ctypes.CDLL(path or "libcudart.so")
        except OSError as e:
            raise OnnxfuseError(f"AdapterSlots.activate on cuda needs the CUDA runtime (libcudart): {e}") from None
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        _CUDART = lib
    return _CUDART
