"""The onnxfuse kernel library: a custom-op shared library for onnxruntime, built on first use.

    import onnxruntime as ort
    from onnxfuse import kernels
    so = kernels.session_options()             # SessionOptions with libonnxfuse_ops.so registered
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])

`library_path()` builds the library when no cached build exists (see `build.py` for where the ORT headers and
nvcc come from); `build()` builds explicitly; `build_info()` reads the versions recorded inside a built library.
Environment: ONNXFUSE_LIBRARY (a prebuilt library to use instead of building), ONNXFUSE_BUILD_DIR (cache dir), ORT_INCLUDE_DIR (headers), ONNXFUSE_BACKENDS (comma list used by
library_path(), e.g. "cpu"), ONNXFUSE_BACKEND (run-time kernel family override), ONNXFUSE_CPU_THREADS.
"""
from __future__ import annotations

import ctypes
import json
import os
import pathlib

from .build import BuildError, BuildResult, available_backends, build, build_dir

__all__ = ["BuildError", "BuildResult", "available_backends", "build", "build_dir", "build_info", "library_path",
           "session_options"]

_resolved: dict[tuple, pathlib.Path] = {}


def _default_backends() -> list[str] | None:
    env = os.environ.get("ONNXFUSE_BACKENDS", "").strip()
    return [b.strip() for b in env.split(",") if b.strip()] if env else None


def library_path(build_if_missing: bool = True) -> pathlib.Path:
    """Path of the library for the default backends (ONNXFUSE_BACKENDS or all available), building it if needed."""
    prebuilt = os.environ.get("ONNXFUSE_LIBRARY")
    if prebuilt:  # a library built elsewhere (e.g. on a CPU machine for a GPU one): use it as is
        if not pathlib.Path(prebuilt).is_file():
            raise BuildError(f"ONNXFUSE_LIBRARY={prebuilt} does not exist; unset it or point it at libonnxfuse_ops.so")
        return pathlib.Path(prebuilt)
    backends = _default_backends()
    key = (str(build_dir()), tuple(backends or ()))
    if key in _resolved and _resolved[key].is_file():
        return _resolved[key]
    if not build_if_missing:
        # Newest cached build, without compiling (and without probing compilers).
        libs = sorted(build_dir().glob("*/libonnxfuse_ops.so"), key=lambda p: p.stat().st_mtime, reverse=True)
        if not libs:
            raise BuildError("no built onnxfuse library in "
                             f"{build_dir()}; run `python -m onnxfuse.kernels.build` or call library_path()")
        return libs[0]
    result = build(backends=backends, quiet=True)
    _resolved[key] = result.path
    return result.path


def build_info(path: str | os.PathLike | None = None) -> dict:
    """The JSON the library recorded at build time (versions, backends, archs, header source, cache key)."""
    lib = ctypes.CDLL(str(path or library_path()))
    fn = lib.onnxfuse_build_info
    fn.restype = ctypes.c_char_p
    return json.loads(fn().decode())


def session_options(so=None, path: str | os.PathLike | None = None):
    """Return `so` (or a new onnxruntime.SessionOptions) with the onnxfuse library registered."""
    import onnxruntime as ort

    so = so if so is not None else ort.SessionOptions()
    so.register_custom_ops_library(str(path or library_path()))
    return so
