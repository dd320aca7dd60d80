"""onnxfuse: export PyTorch models to ONNX, fuse subgraphs into custom ops, run them with CPU/CUDA/Triton kernels.

    import onnxfuse
    from onnxfuse import zoo
    onnxfuse.export("llama", zoo.LlamaSpec.from_preset("tiny"), "llama.onnx")   # export.export
    onnxfuse.fuse("llama.onnx", "llama.fused.onnx")                             # fuse.fuse
    assert onnxfuse.verify("llama.fused.onnx").passed                           # verify.verify
    sess = onnxfuse.session("llama.fused.onnx")                                 # runtime.session

Importing onnxfuse is cheap: torch, onnx and onnxruntime load on first use. `onnxfuse.export`, `onnxfuse.fuse` and
`onnxfuse.verify` are the submodules of those names, which can be called as their main function (so
`from onnxfuse import fuse; fuse.fuse(...)` and `onnxfuse.fuse(...)` both work); `onnxfuse.session` is
`onnxfuse.runtime.session`; `onnxfuse.kernels` is the kernel library (build, path, cache).
"""
import importlib
import sys
import types

__version__ = "0.1.0"
__all__ = ["__version__", "export", "fuse", "kernels", "session", "verify"]

_CALLABLE = ("export", "fuse", "verify")  # submodules callable as their function of the same name
_ALIASES = {"session": ("runtime", "session")}


class _CallableModule(types.ModuleType):
    """A submodule that can be called as its main function (onnxfuse.fuse(...) is onnxfuse.fuse.fuse(...))."""

    def __call__(self, *args, **kwargs):
        return getattr(self, self.__name__.rpartition(".")[2])(*args, **kwargs)

    @property
    def __signature__(self):
        import inspect
        return inspect.signature(getattr(self, self.__name__.rpartition(".")[2]))


def _callable(module: types.ModuleType) -> types.ModuleType:
    if not isinstance(module, _CallableModule):
        module.__class__ = _CallableModule
    return module


class _Package(types.ModuleType):
    """The onnxfuse package: its export/fuse/verify attributes are the callable submodules, however they were
    imported (`import onnxfuse.fuse` sets the attribute through the setter below)."""

    def __getattr__(self, name):  # only for names not set yet: import lazily
        if name in _CALLABLE:
            return _callable(importlib.import_module(f"{__name__}.{name}"))
        if name in _ALIASES:
            module, attr = _ALIASES[name]
            return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        if name == "kernels":
            return importlib.import_module(f"{__name__}.kernels")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name in _CALLABLE and isinstance(value, types.ModuleType):
            value = _callable(value)
        super().__setattr__(name, value)

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(__all__))


sys.modules[__name__].__class__ = _Package
