"""onnxruntime sessions for onnxfuse models: provider choice, the kernel library registered when a model has
onnxfuse nodes, and input checking that fails with a message instead of an onnxruntime stack trace."""
from __future__ import annotations

import copy
import os
import pathlib
import re
import warnings

import numpy as np
import onnx

from .errors import OnnxfuseError
from .onnxio import MAX_IR_VERSION as _MAX_IR_VERSION
from .schema import BACKENDS, DOMAIN, ONNX_OPSET, OPS


class LibraryUnavailableWarning(UserWarning):
    """A fused model runs through its ONNX function bodies because the kernel library could not be loaded."""

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_ORT_TO_NUMPY = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_, "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
}


def ort():
    """The onnxruntime module, or OnnxfuseError naming the extra to install."""
    try:
        import onnxruntime
    except ImportError:
        raise OnnxfuseError("onnxruntime is not installed; pip install 'onnxfuse[cpu]' "
                            "(or 'onnxfuse[gpu]' on a GPU machine)")
    return onnxruntime


def has_onnxfuse_nodes(model: onnx.ModelProto) -> bool:
    """Whether any node of the model, in If/Loop/Scan bodies and model-local functions too, is an onnxfuse op."""
    from .functions import nodes
    return (any(n.domain == DOMAIN for n in nodes(model.graph))
            or any(n.domain == DOMAIN for f in model.functions for n in f.node))


def set_node_attributes(model: onnx.ModelProto, attributes: dict) -> int:
    """Set `attributes` on the onnxfuse nodes of `model` (in place) that take them: `backend` on every node, an op
    attribute (e.g. MLPStack's stack_mode) on the ops that have it.
    Returns the number of nodes changed; a bad name or value is an OnnxfuseError naming the choices."""
    from onnx import helper
    for name, value in attributes.items():
        known = {a.name: a for s in OPS.values() for a in s.attrs}
        if name not in known:
            raise OnnxfuseError(f"unknown onnxfuse node attribute {name!r}; choose from {', '.join(sorted(known))}")
        if name == "backend" and value not in BACKENDS:
            raise OnnxfuseError(f"--backend must be one of {', '.join(BACKENDS)} (got {value!r})")
    changed = 0
    for node in model.graph.node:
        if node.domain != DOMAIN:
            continue
        takes = {a.name for a in OPS[node.op_type].attrs} if node.op_type in OPS else {"backend"}
        todo = {k: v for k, v in attributes.items() if k in takes}
        if not todo:
            continue
        keep = [a for a in node.attribute if a.name not in todo]
        del node.attribute[:]
        node.attribute.extend(keep + [helper.make_attribute(k, v) for k, v in todo.items()])
        changed += 1
    return changed


def with_node_attributes(model: onnx.ModelProto | str | os.PathLike, attributes: dict, so) -> bytes:
    """The serialized model with `attributes` set on its onnxfuse nodes (set_node_attributes), for
    onnxruntime.InferenceSession with SessionOptions `so`: a model file is loaded without its external weights and
    `so` is told their folder, so big models are not pulled into memory. The file itself is not changed."""
    if isinstance(model, onnx.ModelProto):
        proto = copy.deepcopy(model)
    else:
        from . import onnxio
        proto = onnxio.load(model, load_external_data=False)
        so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                    str(pathlib.Path(model).resolve().parent))
    set_node_attributes(proto, attributes)
    return proto.SerializeToString()


def session(model: onnx.ModelProto | str | os.PathLike, provider: str = "cpu", *,
            library: bool | str | os.PathLike | None = None,
            graph_optimization: bool = True, cuda_graph: bool = False, provider_options: dict | None = None,
            backend: str | None = None, node_attributes: dict | None = None, sess_options=None,
            cpu_fallback: bool = True):
    """An onnxruntime.InferenceSession for `model` (a path or a ModelProto) on `provider` ("cpu" or "cuda"), with
    the onnxfuse kernel library registered when the model needs it and one-line errors instead of onnxruntime's.

    library: None registers the library when the model has onnxfuse nodes; if it cannot be built or loaded, the
    nodes run through their model-local ONNX function bodies and a LibraryUnavailableWarning says how to fix it.
    True requires it (OnnxfuseError otherwise), False never loads it. A path registers that library file instead of
    the cached build (e.g. a libonnxfuse_ops.so built elsewhere: `onnxfuse bench --lib`), required as with True.
    backend (auto|cpu|cuda|triton), when given, is set on every onnxfuse node of an in-memory copy of the model
    (the file is not touched); node_attributes sets other node attributes the same way (e.g. {"stack_mode":
    "fused"}, see set_node_attributes).
    graph_optimization=False turns onnxruntime's graph optimisations off; cuda_graph=True captures a CUDA graph
    (provider "cuda"); provider_options go to the execution provider.
    sess_options: your own onnxruntime.SessionOptions (threads, profiling, config entries, ...). onnxfuse adds to it
    in place what the model needs: the kernel library (registered once per SessionOptions object), the external
    weights folder for an in-memory copy, and graph_optimization=False's level; it keeps your log level. Without
    it, onnxfuse makes one with log_severity_level 3 (errors only).
    cpu_fallback=False (provider "cuda"): no CPU EP, and session.disable_cpu_ep_fallback set, so a node onnxruntime
    cannot place on the GPU fails session creation instead of silently running on the CPU (`onnxfuse doctor`).
    """
    rt = ort()
    if provider not in PROVIDERS:
        raise OnnxfuseError(f"--provider must be one of {', '.join(PROVIDERS)} (got {provider!r})")
    attributes = dict(node_attributes or {})
    if backend is not None:
        attributes["backend"] = backend
    ep = PROVIDERS[provider]
    if provider == "cuda":
        if hasattr(rt, "preload_dlls"):
            try:
                rt.preload_dlls()
            except Exception:
                pass
        if ep not in rt.get_available_providers():
            where = os.path.dirname(getattr(rt, "__file__", "") or "") or "?"
            raise OnnxfuseError(f"the CUDA execution provider is not available in this onnxruntime ({rt.__version__} "
                                f"at {where}); install onnxruntime-gpu (pip install 'onnxfuse[gpu]') on a machine "
                                "with an NVIDIA GPU")
    proto = model if isinstance(model, onnx.ModelProto) else None
    path = None if proto is not None else str(model)
    if proto is None:
        from . import onnxio
        proto = onnxio.load(path, load_external_data=False)
    so = sess_options if sess_options is not None else rt.SessionOptions()
    source = None
    if attributes:  # an in-memory copy with the attributes set; the file stays as it is
        source = with_node_attributes(path if path is not None else proto, attributes, so)
    if not graph_optimization:
        so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_DISABLE_ALL
    if sess_options is None:
        so.log_severity_level = 3
    lib_path = None
    if library is not None and not isinstance(library, bool):
        lib_path, library = os.fspath(library), True
    explicit = library is not None
    if library is None:
        library = has_onnxfuse_nodes(proto)
    if library:
        _register_library(so, proto, lib_path, provider, explicit)
    opts = dict(provider_options or {})
    if cuda_graph:
        opts["enable_cuda_graph"] = "1"
    providers = [(ep, opts)] if provider == "cuda" else [ep]
    if provider == "cuda" and cpu_fallback:
        providers.append("CPUExecutionProvider")
    elif provider == "cuda":
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if proto.ir_version > _MAX_IR_VERSION:
        raise OnnxfuseError(f"the model has IR version {proto.ir_version}, newer than onnxruntime "
                            f"{rt.__version__} loads (<= {_MAX_IR_VERSION}); re-export it with 'onnxfuse export' "
                            "(or re-save it with onnx.save after setting model.ir_version = 10)")
    src = source if source is not None else path if path is not None else proto.SerializeToString()
    try:
        return rt.InferenceSession(src, so, providers=providers)
    except Exception as e:
        raise _load_error(e, provider, proto, rt.__version__) from None


def _register_library(so, proto: onnx.ModelProto, lib_path, provider: str, explicit: bool) -> None:
    """The kernel library into `so`; where it cannot be had and the model carries function bodies and did not ask
    for the library explicitly, a LibraryUnavailableWarning instead (the nodes then run as their bodies)."""
    from . import kernels
    try:
        kernels.session_options(so, path=lib_path, provider=provider)
    except (OnnxfuseError, kernels.BuildError, OSError) as e:
        reason = str(e).splitlines()[0]
        if lib_path is not None:  # the message names the library and the fix
            raise OnnxfuseError(reason) from None
        if explicit or not _has_functions(proto):
            raise OnnxfuseError(f"the onnxfuse kernel library is unavailable ({reason}); run 'onnxfuse build' "
                                "and see 'onnxfuse info'") from None
        # Without the library the fused nodes still run: onnxruntime inlines their ONNX function bodies.
        warnings.warn(f"onnxfuse kernel library unavailable ({reason}); onnxfuse nodes run as their ONNX "
                      "function bodies (slower). Run 'onnxfuse build' to get the kernels.",
                      LibraryUnavailableWarning, stacklevel=3)


def _load_error(e: Exception, provider: str, proto: onnx.ModelProto, version: str) -> OnnxfuseError:
    """onnxruntime's session-creation error as one line naming the fix."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    missing = re.search(r"Could not find an implementation for (\w+\(\d+\))", msg)
    if missing and provider == "cpu" and _has_bf16(proto):
        return OnnxfuseError(f"onnxruntime's CPU provider has no bfloat16 kernel for {missing.group(1)}; run bf16 "
                             "models with --provider cuda, or export with --dtype fp16/fp32 for the CPU")
    opset = re.search(r"[Oo]pset (\d+)", msg)
    if opset and ("under development" in msg or "support" in msg.lower()):
        return OnnxfuseError(f"onnxruntime {version} cannot load this model: opset {opset.group(1)} is newer "
                             f"than it supports; re-export it with 'onnxfuse export' (opset {ONNX_OPSET})")
    if "onnxfuse" in msg and "not a registered function/op" in msg.replace("is not a registered", "not a registered"):
        return OnnxfuseError(f"onnxruntime cannot run this fused model's onnxfuse ops: {msg[:300]}; register the "
                             "kernel library (onnxfuse.kernels.library_path(), or 'onnxfuse run', which does it)")
    if "Unsupported model IR version" in msg or "opset" in msg.lower() and "support" in msg.lower():
        return OnnxfuseError(f"onnxruntime {version} cannot load this model: {msg[:300]}; re-export it with "
                             "'onnxfuse export' (IR version <= 13, opset <= 23)")
    return OnnxfuseError(f"onnxruntime could not load the model: {msg[:400]}")


def _has_bf16(model: onnx.ModelProto) -> bool:
    bf16 = onnx.TensorProto.BFLOAT16
    return (any(t.data_type == bf16 for t in model.graph.initializer)
            or any(v.type.tensor_type.elem_type == bf16 for v in [*model.graph.input, *model.graph.output]))


def _has_functions(model: onnx.ModelProto) -> bool:
    return any(f.domain == DOMAIN for f in model.functions)


def check_feeds(sess, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Check names, ranks, static dims and dtypes against the session's inputs; one-line errors naming the fix."""
    expected = {i.name: i for i in sess.get_inputs()}
    missing = [n for n in expected if n not in feeds]
    extra = [n for n in feeds if n not in expected]
    if missing or extra:
        raise OnnxfuseError(f"inputs do not match the model: missing {missing or 'none'}, "
                            f"unexpected {extra or 'none'}; "
                            f"the model takes {', '.join(f'{n}{_shape_str(i.shape)}' for n, i in expected.items())}")
    out = {}
    for name, arg in expected.items():
        value = np.asarray(feeds[name])
        want = _ORT_TO_NUMPY.get(arg.type)
        if want is not None and value.dtype != want:
            raise OnnxfuseError(f"input {name!r} has dtype {value.dtype}, the model wants {np.dtype(want).name}; "
                                f"convert it (e.g. arr.astype(np.{np.dtype(want).name}))")
        if len(value.shape) != len(arg.shape):
            raise OnnxfuseError(f"input {name!r} has shape {list(value.shape)}, "
                                f"the model wants {_shape_str(arg.shape)}; give an array of that rank")
        for got, dim in zip(value.shape, arg.shape):
            if isinstance(dim, int) and dim != got:
                raise OnnxfuseError(f"input {name!r} has shape {list(value.shape)}, the model wants "
                                    f"{_shape_str(arg.shape)}; re-export with --batch/--seq or --dynamic")
        out[name] = value
    return out


def _shape_str(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def random_feeds(sess, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for a model without a recipe (symbolic dims become 1)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for arg in sess.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in arg.shape]
        dt = _ORT_TO_NUMPY.get(arg.type, np.float32)
        if np.issubdtype(dt, np.integer):
            feeds[arg.name] = rng.integers(0, 100, size=shape).astype(dt)
        else:
            feeds[arg.name] = rng.standard_normal(shape).astype(dt)
    return feeds


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Inputs from an .npz written with numpy.savez(name=array, ...) (run --inputs); one-line errors."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise OnnxfuseError(f"{p}: no such inputs file; give an .npz written with numpy.savez(name=array, ...)")
    try:
        with np.load(p) as data:
            return {k: data[k] for k in data.files}
    except Exception as e:
        raise OnnxfuseError(f"{p}: not a readable .npz ({type(e).__name__}); "
                            "write it with numpy.savez(name=array, ...)") from None
