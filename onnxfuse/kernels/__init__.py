"""The onnxfuse kernel library: a custom-op shared library for onnxruntime, built on first use.

    import onnxruntime as ort
    from onnxfuse import kernels
    so = kernels.session_options()             # SessionOptions with libonnxfuse_ops.so registered
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])

`library_path()` returns a cached library that covers what the session needs (a CPU session takes any current
build; a CUDA session one with the CUDA and, where buildable, Triton kernels), building one when there is none:
only the CPU backend where onnxruntime has no CUDA EP, every buildable backend otherwise (`build.py` builds,
`cache.py` keeps the builds, `toolchain.py` finds the ORT headers, nvcc and oneDNN). `build()` builds explicitly;
`build_info()` reads what a built library recorded.

Environment: ONNXFUSE_LIBRARY (a prebuilt library to use instead of the cache), ONNXFUSE_BUILD_DIR (cache dir),
ORT_INCLUDE_DIR (headers), ONNXFUSE_BACKENDS (comma list an automatic build compiles, e.g. "cpu"); read once by
the CPU kernels: ONNXFUSE_CPU_THREADS, ONNXFUSE_CPU_ISA; read once by the GPU launchers: ONNXFUSE_PDL ("0": no
programmatic dependent launches: the Triton LoRA kernels', cuda/triton/runtime.h, and the CUDA int4 kernels',
cuda/gemm.h). Kernel choice is not in the environment: it is each node's
`backend` attribute (onnxfuse fuse --backend, onnxfuse.runtime.session(backend=)).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pathlib
import sys

from .build import BuildResult, build, cache_entries, find_cached
from .cache import ALL_BACKENDS, LIB_NAME, build_dir, clean, link_stable, stable_links, stable_name, stable_path
from .toolchain import BuildError, auto_backends, available_backends

__all__ = ["BuildError", "BuildResult", "announcements", "auto_backends", "available_backends", "build", "build_dir",
           "build_info", "cache_entries", "clean", "find_cached", "host_info", "library_path", "link_stable",
           "needed_backends", "register", "registered_library", "session_options", "stable_links", "stable_name",
           "stable_path"]

_resolved: dict[tuple, pathlib.Path] = {}
_announce = [True]


@contextlib.contextmanager
def announcements(enabled: bool):
    """Whether a first-use build says so on stderr (one line with the log path); the CLI turns it off for -q/--json."""
    saved = _announce[0]
    _announce[0] = enabled
    try:
        yield
    finally:
        _announce[0] = saved


def _env_backends() -> list[str] | None:
    env = os.environ.get("ONNXFUSE_BACKENDS", "").strip()
    return [b.strip() for b in env.split(",") if b.strip()] if env else None


def needed_backends(provider: str | None = None) -> set[str]:
    """Backends a library must have for sessions on `provider` ("cpu", "cuda"; None: what this onnxruntime runs)."""
    gpu = provider == "cuda" or (provider is None and auto_backends() != ["cpu"])
    need = set(available_backends()) if gpu else {"cpu"}  # without nvcc a CUDA session runs the CPU kernels
    return need | set(_env_backends() or ())


def library_path(build_if_missing: bool = True, provider: str | None = None) -> pathlib.Path:
    """Path of a library for sessions on `provider`: ONNXFUSE_LIBRARY, else a current cached build that covers
    the needed backends, else a new build (ONNXFUSE_BACKENDS, or auto_backends()). A build that failed with the
    same inputs raises its remembered error at once (`onnxfuse build --force` retries)."""
    prebuilt = os.environ.get("ONNXFUSE_LIBRARY")
    if prebuilt:  # a library built elsewhere (e.g. on a CPU machine for a GPU one): use it as is
        if not pathlib.Path(prebuilt).is_file():
            raise BuildError(f"ONNXFUSE_LIBRARY={prebuilt} does not exist; unset it or point it at libonnxfuse_ops.so")
        return pathlib.Path(prebuilt)
    need = needed_backends(provider)
    key = (str(build_dir()), tuple(sorted(need)))
    if key in _resolved and _resolved[key].is_file():
        return _resolved[key]
    if not build_if_missing:
        # Newest cached build with the needed backends, without compiling (and without probing compilers).
        entries = [e for e in cache_entries(check=False) if e["status"] == "built" and need <= set(e["backends"])]
        if not entries:
            raise BuildError(f"no built onnxfuse library with backends {sorted(need)} in {build_dir()}; run "
                             "'onnxfuse build' or call library_path()")
        return pathlib.Path(min(entries, key=lambda e: e["age_s"])["path"]) / LIB_NAME
    found = find_cached(need)
    if found is not None:
        link_stable(found)
        _resolved[key] = found
        return found
    # What to build: ONNXFUSE_BACKENDS, else what this onnxruntime can run (a CPU session on a GPU machine gets the
    # full library too, so that its CUDA sessions need no second build).
    auto = auto_backends("cuda" if provider == "cuda" else None)
    backends = sorted(set(_env_backends() or auto) | need, key=ALL_BACKENDS.index)

    def say(p) -> None:
        if _announce[0]:
            print(f"onnxfuse: building the kernel library ({', '.join(p.backends)}) for first use, "
                  f"about {'2 minutes' if 'cuda' in p.backends else '20 s'}; log: {p.log_path}", file=sys.stderr,
                  flush=True)

    result = build(backends=backends, quiet=True, on_build_start=say)
    _resolved[key] = result.path
    return result.path


def host_info(path: str | os.PathLike | None = None) -> dict:
    """What the library's CPU kernels run on this host (probed once per process, after ONNXFUSE_CPU_ISA and oneDNN's
    ISA cap): {"gemm_isa": built-in GEMM family, "onednn": None or {"isa", "matmul": {type: implementation or None}}}.
    A type whose matmul is None keeps the built-in GEMM for its prepacked weights."""
    lib = ctypes.CDLL(str(path or library_path()))
    try:
        fn = lib.onnxfuse_host_info
    except AttributeError:
        raise BuildError(f"{path or library_path()} predates onnxfuse_host_info; "
                         "rebuild it ('onnxfuse build')") from None
    fn.restype = ctypes.c_char_p
    return json.loads(fn().decode())


def build_info(path: str | os.PathLike | None = None) -> dict:
    """The JSON the library recorded at build time (versions, backends, archs, header source, key)."""
    lib = ctypes.CDLL(str(path or library_path()))
    fn = lib.onnxfuse_build_info
    fn.restype = ctypes.c_char_p
    return json.loads(fn().decode())


# A session config entry that marks SessionOptions with the library registered (a user's options reused for several
# sessions): onnxruntime refuses a second registration on one options object ("Domain already set in registry") and
# ignores config keys it does not know.
_LIBRARY_ENTRY = "onnxfuse.custom_ops_library"


def registered_library(so) -> str | None:
    """The library path `session_options` registered on `so`, or None."""
    try:
        return so.get_session_config_entry(_LIBRARY_ENTRY)
    except Exception:  # onnxruntime raises when the key is absent
        return None


def register(so, lib: str | os.PathLike) -> None:
    """so.register_custom_ops_library(lib), with a load failure turned into a BuildError naming the fix: a library
    built with oneDNN needs libdnnl.so.3 (and libgomp) where it runs, a copied library the runtime it was linked to."""
    try:
        so.register_custom_ops_library(str(lib))
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        missing = msg.split("error:")[-1].split(":")[0].strip() if "cannot open shared object" in msg else ""
        if not pathlib.Path(lib).is_file():
            fix = "no such file; point ONNXFUSE_LIBRARY at a built libonnxfuse_ops.so or run onnxfuse build"
        elif missing.startswith(("libdnnl", "libgomp")):
            fix = ("it was built with oneDNN: pip install 'onnxfuse[cpu]' here (or put the folder of libdnnl.so.3 on "
                   "LD_LIBRARY_PATH), or rebuild it with ONNXFUSE_ONEDNN_ROOT=off onnxfuse build --force")
        elif missing:
            fix = f"{missing} is not on this machine's library path; rebuild here with onnxfuse build --force"
        else:
            fix = "rebuild it here with onnxfuse build --force, or run onnxfuse doctor"
        raise BuildError(f"onnxruntime could not load the onnxfuse library {lib}: {msg[-300:]}; {fix}") from None


def session_options(so=None, path: str | os.PathLike | None = None, provider: str | None = None):
    """Return `so` (or a new onnxruntime.SessionOptions) with the onnxfuse library registered: `path`, else
    library_path(provider=provider). Registering twice on the same options object is a no-op."""
    import onnxruntime as ort

    so = so if so is not None else ort.SessionOptions()
    if registered_library(so) is None:
        lib = str(path or library_path(provider=provider))
        register(so, lib)
        so.add_session_config_entry(_LIBRARY_ENTRY, lib)
    return so
