"""The cache of kernel-library builds: where builds live, the stable per-configuration links, listing and cleaning.

Where builds live: the user cache dir (``platformdirs.user_cache_dir("onnxfuse")/kernels``, e.g.
``~/.cache/onnxfuse/kernels``), or ``ONNXFUSE_BUILD_DIR``. In it:
  * ``<key>/`` one finished build: ``libonnxfuse_ops.so``, ``build_info.json``, ``build.log``. The key hashes
    everything that makes the library (sources, the generated ``onnxfuse_ops.h``, compiler, CMake, nvcc, Triton and
    header versions and contents, backends, archs), so a change of any of them builds anew (build.py);
  * ``stable/<configuration>`` one symlink per configuration (``cpu``, ``cpu-cuda-sm90``,
    ``cpu-cuda-triton-sm90``) to the newest build of it, so that
    ``<cache>/stable/<configuration>/libonnxfuse_ops.so`` is a path scripts can keep (``onnxfuse build
    --print-path``): it always holds a library with those backends and archs, a later build of the
    same configuration (new sources, a new compiler) takes its place, and builds of other configurations (a CPU-only
    first-use build after a CPU test run, say) never move it;
  * ``failed/<key>.json`` a build that failed, with its error and log: the same inputs fail at once instead of
    rebuilding, until they change or ``build(force=True)`` (``onnxfuse build --force``);
  * ``logs/<key>.log`` the log of the latest attempt of each key; ``ort-headers-1.21/`` fetched headers;
    ``.build.lock`` serialises builds between processes.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pathlib
import re
import shutil
import time

LIB_NAME = "libonnxfuse_ops.so"
ALL_BACKENDS = ("cpu", "cuda", "triton")  # in the order configuration names list them
_KEY_RE = re.compile(r"[0-9a-f]{16}")


def build_dir() -> pathlib.Path:
    """The build cache: ONNXFUSE_BUILD_DIR, else the user cache dir (never inside the installed package)."""
    env = os.environ.get("ONNXFUSE_BUILD_DIR")
    if env:
        return pathlib.Path(env)
    try:
        import platformdirs  # noqa: PLC0415
        root = pathlib.Path(platformdirs.user_cache_dir("onnxfuse"))
    except ImportError:  # a declared dependency; this only keeps a partial install working (same path on Linux)
        root = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "onnxfuse"
    return root / "kernels"


def stable_name(backends, archs=()) -> str:
    """The name of a configuration's stable link: its backends, then its CUDA archs when it has CUDA kernels, e.g.
    "cpu", "cpu-cuda-triton-sm90", "cpu-cuda-triton-sm80-sm90"."""
    parts = [b for b in ALL_BACKENDS if b in backends]
    if "cuda" in parts:
        parts += [f"sm{a}" for a in archs]
    return "-".join(parts)


def stable_path(backends, archs=()) -> pathlib.Path:
    """<build dir>/stable/<stable_name(...)>/libonnxfuse_ops.so: the path of the newest build of one configuration.
    Only a build of that same configuration re-points it, so a script can keep it (it may not exist yet)."""
    return build_dir() / "stable" / stable_name(backends, archs) / LIB_NAME


def link_stable(lib: pathlib.Path) -> pathlib.Path:
    """Point the stable link of `lib`'s configuration (read from its build_info.json) at `lib`'s build folder,
    atomically, and return the stable library path; `lib` itself when it is not a cache entry (ONNXFUSE_LIBRARY)."""
    root = build_dir()
    lib = pathlib.Path(lib).resolve()
    info = read_info(lib.parent)
    if lib.parent.parent != root.resolve() or info is None:
        return lib
    link = stable_path(info.get("backends", ["cpu"]), info.get("archs", [])).parent
    link.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.join("..", lib.parent.name)
    with contextlib.suppress(OSError):
        if os.readlink(link) == target:
            return link / LIB_NAME
    tmp = link.parent / f".{link.name}-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)
    return link / LIB_NAME


def stable_links() -> dict[str, str]:
    """{stable link name: key of the build it points at} for every stable link in the cache."""
    out = {}
    d = build_dir() / "stable"
    for link in sorted(d.iterdir()) if d.is_dir() else []:
        with contextlib.suppress(OSError):
            out[link.name] = pathlib.Path(os.readlink(link)).name
    return out


def read_info(d: pathlib.Path) -> dict | None:
    """The build_info.json of the build in folder `d`, or None."""
    try:
        return json.loads((d / "build_info.json").read_text())
    except (OSError, ValueError):
        return None


def _dir_size(d: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())


def entries(key_now=None) -> list[dict]:
    """Every build and remembered failure in the cache: key, backends, archs, size, age, status.

    status: "failed" (a remembered failure), "partial" (a folder without a library), else "built"; given
    `key_now(build_info)`, the key a build of that configuration would have now (build.py's plan; None where it
    cannot be built here), finished builds say "ok" (built from the current inputs: usable) or "stale"."""
    root = build_dir()
    now = time.time()
    links: dict[str, list[str]] = {}
    for name, key in stable_links().items():
        links.setdefault(key, []).append(name)
    out = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if not (d.is_dir() and not d.is_symlink() and _KEY_RE.fullmatch(d.name)):
            continue
        info = read_info(d) or {}
        lib = d / LIB_NAME
        status = "partial" if not lib.is_file() else "built"
        if key_now is not None and lib.is_file():
            status = "ok" if key_now(info) == d.name else "stale"
        out.append({"key": d.name, "status": status, "backends": info.get("backends", []),
                    "archs": info.get("archs", []), "size_bytes": _dir_size(d),
                    "age_s": round(now - d.stat().st_mtime), "path": str(d),
                    "stable": links.get(d.name, []), "cubins": (info.get("artifacts") or {}).get("triton_cubins")})
    for f in sorted((root / "failed").glob("*.json")) if (root / "failed").is_dir() else []:
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        out.append({"key": rec.get("key", f.stem), "status": "failed", "backends": rec.get("backends", []),
                    "archs": rec.get("archs", []), "size_bytes": f.stat().st_size,
                    "age_s": round(now - f.stat().st_mtime), "path": str(f),
                    "stable": [], "stage": rec.get("stage"), "log": rec.get("log"), "cubins": None})
    return out

def clean(include_headers: bool = False) -> list[pathlib.Path]:
    """Remove every cached build, failure record, log and stable link (and, with include_headers, the
    fetched onnxruntime headers). Returns what was removed."""
    root = build_dir()
    removed = []
    if not root.is_dir():
        return removed
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # not while another process builds
        for d in sorted(root.iterdir()):
            name = d.name
            if name == ".build.lock" or (name.startswith("ort-headers-") and not include_headers):
                continue
            if d.is_symlink() or d.is_file():
                d.unlink()
            else:
                shutil.rmtree(d)
            removed.append(d)
    return removed
