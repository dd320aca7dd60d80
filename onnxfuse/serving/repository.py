"""Triton model repositories for a fused model: its signature read from the ONNX file, and `config.pbtxt`.

Two layouts:

* `serve` (`python_repository`): Triton's Python backend runs `triton_model.py`, which opens the model in
  onnxruntime with the kernel library registered (`onnxfuse.runtime.session`), one session per instance; what
  `onnxfuse serve` starts with the server PyTriton ships (that server has no onnxruntime backend).
* `triton-repo` (`onnxruntime_repository`): a production Triton's onnxruntime backend loads `1/model.onnx` itself
  and registers the library that `model_operations { op_library_filename }` names (an absolute path in the server's
  file system: the backend hands it to onnxruntime's RegisterCustomOpsLibrary as it is).

Dynamic batching needs every input and output to carry the batch on axis 0 under one symbolic name (what
`onnxfuse export --dynamic` and the DLRM exporters write for the dense features and ids); a model whose inputs do not
(the bag form's indices [F, N], a static export) is served one request per run, max_batch_size 0, and the reason is
returned with the signature.
"""
from __future__ import annotations

import dataclasses
import pathlib
import shutil

import onnx

from ..errors import OnnxfuseError

# ONNX element type -> Triton's model-config data type (the types onnxruntime's backend and numpy both carry).
TRITON_TYPES = {
    onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.FLOAT16: "TYPE_FP16", onnx.TensorProto.DOUBLE: "TYPE_FP64",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16", onnx.TensorProto.INT64: "TYPE_INT64", onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.INT16: "TYPE_INT16", onnx.TensorProto.INT8: "TYPE_INT8", onnx.TensorProto.UINT8: "TYPE_UINT8",
    onnx.TensorProto.BOOL: "TYPE_BOOL",
}
MODEL_FILE = "model.onnx"
LIBRARY_FILE = "libonnxfuse_ops.so"


@dataclasses.dataclass
class TensorSpec:
    name: str
    data_type: str          # TYPE_FP32, ...
    dims: list              # ints, or a str for a symbolic dim
    elem_type: int          # onnx.TensorProto element type


@dataclasses.dataclass
class Signature:
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batch_dim: str | None   # the symbolic name every input and output has on axis 0 (None: no dynamic batching)
    why_not_batched: str = ""

    @property
    def batched(self) -> bool:
        return self.batch_dim is not None


def _tensor(v: onnx.ValueInfoProto, role: str) -> TensorSpec:
    t = v.type.tensor_type
    if not v.type.HasField("tensor_type") or t.elem_type not in TRITON_TYPES:
        raise OnnxfuseError(f"the model's {role} {v.name!r} is not a tensor of a type Triton carries "
                            f"({', '.join(onnx.TensorProto.DataType.Name(k).lower() for k in TRITON_TYPES)})")
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    return TensorSpec(v.name, TRITON_TYPES[t.elem_type], dims, t.elem_type)


def signature(model: onnx.ModelProto) -> Signature:
    """The model's inputs (graph inputs that are not initializers) and outputs, and whether it batches on axis 0."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [_tensor(v, "input") for v in model.graph.input if v.name not in inits]
    outputs = [_tensor(v, "output") for v in model.graph.output]
    if not inputs or not outputs:
        raise OnnxfuseError("the model has no inputs or no outputs to serve")
    first = [t.dims[0] if t.dims else None for t in inputs]
    why = ""
    if not any(isinstance(d, str) for d in first):
        why = (f"the inputs have fixed first dims ({', '.join(f'{t.name} {t.dims}' for t in inputs)}): export with "
               "dynamic batch (onnxfuse export --dynamic) to batch requests")
    elif len(set(first)) != 1:
        names = ", ".join(f"{t.name} {t.dims}" for t in inputs)
        why = f"the inputs do not share one batch axis 0 ({names}): each request runs alone"
    elif any(not t.dims or not isinstance(t.dims[0], str) for t in outputs):
        bad = next(t for t in outputs if not t.dims or not isinstance(t.dims[0], str))
        why = f"output {bad.name!r} has no symbolic batch axis 0 ({bad.dims})"
    return Signature(inputs, outputs, None if why else first[0], why)


def _dims_txt(t: TensorSpec, batched: bool) -> str:
    dims = t.dims[1:] if batched else t.dims
    return "[ " + ", ".join(str(d) if isinstance(d, int) else "-1" for d in dims) + " ]"


def _io_txt(kind: str, tensors: list[TensorSpec], batched: bool) -> list[str]:
    lines = [f"{kind} ["]
    for i, t in enumerate(tensors):
        lines += ["  {", f'    name: "{t.name}"', f"    data_type: {t.data_type}",
                  f"    dims: {_dims_txt(t, batched)}", "  }" + ("," if i < len(tensors) - 1 else "")]
    return lines + ["]"]


def _parameters(params: dict[str, str]) -> list[str]:
    return [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]


def config_text(name: str, sig: Signature, *, backend: str, max_batch: int, delay_us: int, instances: int,
                provider: str, params: dict[str, str] | None = None, library: str | None = None,
                cuda_graph: bool = False) -> str:
    """config.pbtxt (Triton's ModelConfig in protobuf text): the backend (python or onnxruntime), the batch size
    and dynamic batcher (when the signature batches), inputs and outputs, the instance group, and for onnxruntime
    the library in model_operations and the CUDA provider's options."""
    batched = sig.batched and max_batch > 0
    lines = [f'name: "{name}"']
    lines += (['backend: "python"'] if backend == "python" else
              ['platform: "onnxruntime_onnx"', 'backend: "onnxruntime"'])
    lines.append(f"max_batch_size: {max_batch if batched else 0}")
    lines += _io_txt("input", sig.inputs, batched) + _io_txt("output", sig.outputs, batched)
    if batched:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}")
    kind = "KIND_GPU" if provider == "cuda" else "KIND_CPU"
    lines.append(f"instance_group [ {{ count: {instances} kind: {kind} }} ]")
    if library is not None:
        lines.append(f'model_operations {{ op_library_filename: "{library}" }}')
    if backend == "onnxruntime" and provider == "cuda":
        accel = ['optimization { execution_accelerators { gpu_execution_accelerator : [ {', '  name : "cuda"']
        if cuda_graph:  # onnxruntime's CUDA EP option; a graph replays one shape only
            accel.append('  parameters { key: "enable_cuda_graph" value: "1" }')
        lines += accel + ["} ] } }"]
    lines += _parameters(params or {})
    return "\n".join(lines) + "\n"


def _check_name(name: str) -> str:
    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise OnnxfuseError(f"--name {name!r}: a Triton model name of letters, digits, '-', '_' and '.'")
    return name


def _copy_model(model_path: pathlib.Path, version_dir: pathlib.Path) -> None:
    """The model (and its external-data file, under the name the model records) into version_dir/model.onnx."""
    from .. import onnxio
    version_dir.mkdir(parents=True, exist_ok=True)
    proto = onnxio.load(str(model_path), load_external_data=True)
    onnxio.save(proto, version_dir / MODEL_FILE)  # external data past protobuf's limit, as model.onnx.data


def write_repository(model_path, out_dir, *, name: str, backend: str, max_batch: int = 64, delay_us: int = 100,
                     instances: int = 1, provider: str = "cpu", library_path=None, mount: str | None = None,
                     cuda_graph: bool = False, threads: int = 0, force: bool = False) -> pathlib.Path:
    """Write a model repository `out_dir/<name>/{config.pbtxt, 1/model.onnx, ...}`; returns the model's folder.

    backend "python": the repository `onnxfuse serve` runs (1/model.py is onnxfuse's runner, the library path a
    parameter); "onnxruntime": for a production Triton (the library copied beside the model, with the oneDNN it
    links when there is one, and named in model_operations under `mount`, the path the repository will have in the
    server, the repository's own absolute path by default). Nothing is left behind when it fails."""
    from .. import onnxio
    model_path = pathlib.Path(model_path)
    if model_path.is_dir():
        model_path = model_path / MODEL_FILE
    if not model_path.is_file():
        raise OnnxfuseError(f"{model_path}: no such model file; pass a .onnx file or a folder holding {MODEL_FILE}")
    if max_batch < 0 or delay_us < 0 or instances < 1:
        raise OnnxfuseError("--max-batch and --max-queue-delay-us must be >= 0 and --instances >= 1")
    if provider not in ("cpu", "cuda"):
        raise OnnxfuseError(f"--provider must be cpu or cuda (got {provider!r})")
    name = _check_name(name)
    out_dir = pathlib.Path(out_dir)
    model_dir = out_dir / name
    if model_dir.exists() and not force:
        raise OnnxfuseError(f"{model_dir} exists; pass --force to overwrite it or choose another -o")
    sig = signature(onnxio.load(str(model_path), load_external_data=False))
    tmp = out_dir / f".{name}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _copy_model(model_path, tmp / "1")
        library = None
        params: dict[str, str] = {}
        if backend == "python":
            shutil.copy(pathlib.Path(__file__).with_name("triton_model.py"), tmp / "1" / "model.py")
            params = {"onnxfuse_provider": provider, "onnxfuse_model": MODEL_FILE, "onnxfuse_threads": str(threads)}
            if library_path is not None:
                params["onnxfuse_library"] = str(pathlib.Path(library_path).resolve())
        elif backend == "onnxruntime":
            library = _copy_library(library_path, tmp, mount or str(out_dir.resolve()), name, provider)
            params = {"intra_op_thread_count": str(threads)} if threads else {}
        else:
            raise OnnxfuseError(f"backend must be python or onnxruntime (got {backend!r})")
        (tmp / "config.pbtxt").write_text(config_text(
            name, sig, backend=backend, max_batch=max_batch, delay_us=delay_us, instances=instances,
            provider=provider, params=params, library=library, cuda_graph=cuda_graph))
        if model_dir.exists():
            shutil.rmtree(model_dir)
        tmp.rename(model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model_dir


def _copy_library(library_path, model_dir: pathlib.Path, mount: str, name: str, provider: str) -> str:
    """The kernel library (the cached build unless given) and the oneDNN it links into the model folder; returns
    the path model_operations names (in the server's file system)."""
    from .. import kernels
    lib = pathlib.Path(library_path if library_path is not None else kernels.library_path(provider=provider))
    if not lib.is_file():
        raise OnnxfuseError(f"{lib}: no kernel library there; run 'onnxfuse build' or pass --lib")
    shutil.copy(lib, model_dir / LIBRARY_FILE)
    for dep in _linked_onednn(lib):
        shutil.copy(dep, model_dir / dep.name)
    return f"{mount.rstrip('/')}/{name}/{LIBRARY_FILE}"


def _linked_onednn(lib: pathlib.Path) -> list[pathlib.Path]:
    """libdnnl.so.* the library resolves to on this machine (ldd), to travel beside it (the library's runpath has
    $ORIGIN)."""
    import subprocess
    try:
        out = subprocess.run(["ldd", str(lib)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[0].strip().startswith("libdnnl") and parts[1].split():
            path = pathlib.Path(parts[1].split()[0])
            if path.is_file():
                found.append(path)
    return found
