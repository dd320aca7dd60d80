"""Build the onnxfuse custom-op library (``libonnxfuse_ops.so``) with CMake, and keep the cache of builds.

Where builds live: the user cache dir (``platformdirs.user_cache_dir("onnxfuse")/kernels``, e.g.
``~/.cache/onnxfuse/kernels``), or ``ONNXFUSE_BUILD_DIR``. In it:
  * ``<key>/`` one finished build: ``libonnxfuse_ops.so``, ``build_info.json``, ``build.log``. The key hashes
    everything that makes the library (sources, the generated ``onnxfuse_ops.h``, compiler, CMake, nvcc, Triton and
    header versions and contents, backends, archs, experiments), so a change of any of them builds anew;
  * ``stable/<configuration>`` one symlink per configuration (``cpu``, ``cpu-cuda-sm90``,
    ``cpu-cuda-triton-sm90``, ``...-experiments``) to the newest build of it, so that
    ``<cache>/stable/<configuration>/libonnxfuse_ops.so`` is a path scripts can keep (``onnxfuse build
    --print-path``): it always holds a library with those backends, archs and experiments, a later build of the
    same configuration (new sources, a new compiler) takes its place, and builds of other configurations (a CPU-only
    first-use build after a CPU test run, say) never move it;
  * ``failed/<key>.json`` a build that failed, with its error and log: the same inputs fail at once instead of
    rebuilding, until they change or ``build(force=True)`` (``onnxfuse build --force``);
  * ``logs/<key>.log`` the log of the latest attempt of each key; ``ort-headers-1.21/`` fetched headers;
    ``.build.lock`` serialises builds between processes.

Where the onnxruntime headers come from, in order (first hit wins, and `BuildResult.header_source` says which):
  1. ``ORT_INCLUDE_DIR`` — any onnxruntime release's ``include/`` (must hold onnxruntime_cxx_api.h and
     onnxruntime_lite_custom_op.h);
  2. a cached copy under the build dir (``<build dir>/ort-headers-1.21/``);
  3. the system: ``/usr/include/onnxruntime`` (Debian 13+, Ubuntu 25.04+, Arch);
  4. Debian trixie's ``libonnxruntime-dev`` .deb fetched with apt through a private sources dir (nothing installed,
     the system's apt setup untouched), unpacked into the cache of 2.

The CPU kernels run their constant-weight GEMMs through oneDNN's matmul primitive (post-ops fused, weights prepacked
once per session) when oneDNN is found, in order: ``ONNXFUSE_ONEDNN_ROOT`` (a prefix with ``include/oneapi/dnnl``
and ``lib/libdnnl.so.3``; ``off`` builds without it), else the PyPI packages ``onednn-cpu-gomp`` +
``onednn-devel-cpu-gomp`` (what ``pip install 'onnxfuse[cpu]'`` brings). The library finds ``libdnnl.so.3`` at run
time through an rpath to that folder. Without oneDNN the build falls back to the built-in micro-kernel and says so
on stderr and in the build info (``cpu_gemm``).

The library links no onnxruntime: it receives the API in ``RegisterCustomOps``. CUDA kernels are built when nvcc is
found (``CUDA_HOME``, ``/usr/local/cuda``, ``PATH``) unless ``backends`` leaves CUDA out. A build runs in stages
(headers, configure, cpu, cuda, triton, link), reported on stderr unless quiet, in a temporary directory renamed into
``<build dir>/<key>/`` so a reader never sees a half-written library.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time

KERNELS_DIR = pathlib.Path(__file__).resolve().parent
LIB_NAME = "libonnxfuse_ops.so"
HEADERS_VERSION = "1.21"  # what the trixie .deb gives; the C API is append-only, so it loads into newer runtimes
REQUIRED_HEADERS = ("onnxruntime_cxx_api.h", "onnxruntime_lite_custom_op.h")
DEFAULT_ARCHS = ("90",)
ALL_BACKENDS = ("cpu", "cuda", "triton")
STAGES = ("headers", "configure", "cpu", "cuda", "triton", "link")
# What the build reads from this folder. pyproject.toml's package-data must ship every one of these (a test checks).
SOURCE_GLOBS = ("*.cc", "*.h", "cpu/*.cc", "cpu/*.h", "common/*.h", "cuda/*.cc", "cuda/*.h", "cuda/*.cu",
                "cuda/*.cuh", "cuda/*.cmake", "CMakeLists.txt", "exports.map", "triton/*.py", "ops_header.py")
# Sources only the CUDA/Triton build compiles; a CPU-only build's key ignores them so edits there do not rebuild it.
_GPU_ONLY = ("cuda/", "triton/")
_NO_HEADERS_HINT = ("set ORT_INCLUDE_DIR to an onnxruntime release's include directory (the GitHub release tarball "
                    "onnxruntime-linux-x64-<version>.tgz has it under include/), or install libonnxruntime-dev")
_KEY_RE = re.compile(r"[0-9a-f]{16}")


class BuildError(RuntimeError):
    """The library could not be built; the message says which stage failed and ends with the tail of its log."""


@dataclasses.dataclass
class BuildResult:
    """A built (or reused) library: its `path` in the cache, backends, CUDA archs, where the ORT headers came from,
    the cache key, the build log text and its path, whether it was `cached`, experiments, and the seconds taken."""
    path: pathlib.Path
    backends: list[str]
    archs: list[str]
    header_source: str
    cache_key: str
    log: str
    cached: bool = False
    experiments: bool = False
    log_path: pathlib.Path | None = None
    seconds: float = 0.0


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


def stable_name(backends, archs=(), experiments: bool = False) -> str:
    """The name of a configuration's stable link: its backends, then its CUDA archs when it has CUDA kernels, then
    "experiments" when it has the A/B variants, e.g. "cpu", "cpu-cuda-triton-sm90", "cpu-cuda-triton-sm80-sm90"."""
    parts = [b for b in ALL_BACKENDS if b in backends]
    if "cuda" in parts:
        parts += [f"sm{a}" for a in archs]
    if experiments:
        parts.append("experiments")
    return "-".join(parts)


def stable_path(backends, archs=(), experiments: bool = False) -> pathlib.Path:
    """<build dir>/stable/<stable_name(...)>/libonnxfuse_ops.so: the path of the newest build of one configuration.
    Only a build of that same configuration re-points it, so a script can keep it (it may not exist yet)."""
    return build_dir() / "stable" / stable_name(backends, archs, experiments) / LIB_NAME


def link_stable(lib: pathlib.Path) -> pathlib.Path:
    """Point the stable link of `lib`'s configuration (read from its build_info.json) at `lib`'s build folder,
    atomically, and return the stable library path; `lib` itself when it is not a cache entry (ONNXFUSE_LIBRARY)."""
    root = build_dir()
    lib = pathlib.Path(lib).resolve()
    info = _read_info(lib.parent)
    if lib.parent.parent != root.resolve() or info is None:
        return lib
    link = stable_path(info.get("backends", ["cpu"]), info.get("archs", []), bool(info.get("experiments"))).parent
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


# ------------------------------------------------------------------------------------------------ ORT headers
def _has_headers(d: pathlib.Path) -> bool:
    return all((d / h).is_file() for h in REQUIRED_HEADERS)


def _headers_version(d: pathlib.Path) -> str:
    text = (d / "onnxruntime_c_api.h").read_text(errors="replace") if (d / "onnxruntime_c_api.h").is_file() else ""
    m = re.search(r"#define\s+ORT_API_VERSION\s+(\d+)", text)
    return f"api{m.group(1)}" if m else "unknown"


def _headers_digest(d: pathlib.Path) -> str:
    """Hash of the headers' contents: two copies of the same release share cached builds, an edited one does not."""
    h = hashlib.sha256()
    for p in sorted(d.glob("*.h")):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _fetch_trixie_headers(dest: pathlib.Path, log: list[str]) -> bool:
    """Download trixie's libonnxruntime-dev with apt using private lists/cache dirs and unpack its headers."""
    if not (shutil.which("apt-get") and shutil.which("dpkg")):
        log.append("headers: apt-get/dpkg not available, cannot fetch libonnxruntime-dev")
        return False
    keyring = "/usr/share/keyrings/debian-archive-keyring.gpg"
    if not os.path.exists(keyring):
        log.append(f"headers: {keyring} missing, cannot fetch libonnxruntime-dev")
        return False
    with tempfile.TemporaryDirectory(prefix="onnxfuse-apt-") as tmp:
        d = pathlib.Path(tmp)
        (d / "lists/partial").mkdir(parents=True)
        (d / "cache/archives/partial").mkdir(parents=True)
        (d / "trixie.sources").write_text(
            "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: trixie\nComponents: main\n"
            f"Signed-By: {keyring}\n")
        opts = ["-oDir::Etc::SourceList=/dev/null", f"-oDir::Etc::SourceParts={d}", f"-oDir::State::Lists={d}/lists",
                f"-oDir::Cache={d}/cache"]
        for cmd, cwd in ((["apt-get", *opts, "update"], None), (["apt-get", *opts, "download", "libonnxruntime-dev"], d)):
            p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
            log.append(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}")
            if p.returncode != 0:
                return False
        debs = sorted(d.glob("libonnxruntime-dev_*.deb"))
        if not debs:
            return False
        p = subprocess.run(["dpkg", "-x", str(debs[0]), str(d / "root")], capture_output=True, text=True)
        src = d / "root/usr/include/onnxruntime"
        if p.returncode != 0 or not _has_headers(src):
            log.append(f"headers: unpacking {debs[0].name} failed: {p.stderr}")
            return False
        staging = pathlib.Path(tempfile.mkdtemp(prefix=".ort-headers-", dir=dest.parent))
        shutil.copytree(src, staging, dirs_exist_ok=True)
        os.replace(staging, dest) if not dest.exists() else shutil.rmtree(staging)
        log.append(f"headers: fetched {debs[0].name} into {dest}")
    return True


def find_ort_headers(fetch: bool = True, log: list[str] | None = None) -> tuple[pathlib.Path, str]:
    """Return (include dir, human-readable source). Raises BuildError naming the fix when none is found."""
    log = log if log is not None else []
    env = os.environ.get("ORT_INCLUDE_DIR")
    if env:
        d = pathlib.Path(env)
        if not _has_headers(d):
            raise BuildError(f"ORT_INCLUDE_DIR={env} does not contain {' and '.join(REQUIRED_HEADERS)}; "
                             f"{_NO_HEADERS_HINT}")
        return d, f"ORT_INCLUDE_DIR={d}"
    cached = build_dir() / f"ort-headers-{HEADERS_VERSION}"
    if _has_headers(cached):
        return cached, f"cached copy {cached}"
    system = pathlib.Path("/usr/include/onnxruntime")
    if _has_headers(system):
        return system, f"system {system}"
    if fetch:
        cached.parent.mkdir(parents=True, exist_ok=True)
        if _fetch_trixie_headers(cached, log) and _has_headers(cached):
            return cached, f"Debian trixie libonnxruntime-dev {HEADERS_VERSION} fetched into {cached}"
    raise BuildError(f"onnxruntime C/C++ headers not found (ORT_INCLUDE_DIR unset, no {cached}, no {system}"
                     f"{', apt fetch of libonnxruntime-dev failed' if fetch else ''}); {_NO_HEADERS_HINT}")


# ------------------------------------------------------------------------------------------------ toolchain
def find_nvcc() -> pathlib.Path | None:
    """nvcc from CUDA_HOME, CUDA_PATH, /usr/local/cuda or PATH (in that order), or None."""
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (pathlib.Path(root) / "bin/nvcc").is_file():
            return pathlib.Path(root) / "bin/nvcc"
    found = shutil.which("nvcc")
    return pathlib.Path(found) if found else None


ONEDNN_PACKAGES = ("onednn-cpu-gomp", "onednn-devel-cpu-gomp")  # oneDNN 3.2, CPU only, GNU OpenMP runtime
_ONEDNN_HINT = "pip install 'onnxfuse[cpu]' (brings onednn-cpu-gomp and onednn-devel-cpu-gomp)"


@dataclasses.dataclass
class OneDnn:
    """A oneDNN the CPU backend links: its headers, the shared library (given an rpath), its version, and where it
    was found (the onednn-cpu-gomp package, ONNXFUSE_ONEDNN_ROOT)."""
    include_dir: pathlib.Path
    lib: pathlib.Path      # libdnnl.so.3
    version: str
    source: str


def _onednn_version(include_dir: pathlib.Path) -> str:
    text = (include_dir / "oneapi/dnnl/dnnl_version.h").read_text(errors="replace")
    parts = [re.search(rf"#define\s+DNNL_VERSION_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else "unknown"


def _onednn_at(include_dir: pathlib.Path, lib_dir: pathlib.Path, source: str) -> OneDnn | None:
    lib = lib_dir / "libdnnl.so.3"
    if not ((include_dir / "oneapi/dnnl/dnnl.hpp").is_file() and lib.is_file()):
        return None
    cfg = (include_dir / "oneapi/dnnl/dnnl_config.h").read_text(errors="replace")
    if not re.search(r"#define\s+DNNL_CPU_THREADING_RUNTIME\s+DNNL_RUNTIME_OMP", cfg):
        return None  # the kernels make oneDNN sequential per tile through the OpenMP API (cpu/onednn_gemm.cc)
    return OneDnn(include_dir.resolve(), lib.resolve(), _onednn_version(include_dir), source)


def find_onednn() -> tuple[OneDnn | None, str]:
    """oneDNN for the CPU GEMMs: (found, why not). ONNXFUSE_ONEDNN_ROOT=<prefix> must hold it (BuildError if not);
    ONNXFUSE_ONEDNN_ROOT=off builds without it; else the onednn-cpu-gomp / onednn-devel-cpu-gomp packages."""
    env = os.environ.get("ONNXFUSE_ONEDNN_ROOT")
    if env is not None and env.strip().lower() in ("off", "0", "no", "none", ""):
        return None, "disabled by ONNXFUSE_ONEDNN_ROOT=off"
    if env:
        root = pathlib.Path(env)
        found = _onednn_at(root / "include", root / "lib", f"ONNXFUSE_ONEDNN_ROOT={root}")
        if found is None:
            raise BuildError(f"ONNXFUSE_ONEDNN_ROOT={env} has no include/oneapi/dnnl/dnnl.hpp and lib/libdnnl.so.3 of "
                             f"an OpenMP build of oneDNN; {_ONEDNN_HINT}, or set ONNXFUSE_ONEDNN_ROOT=off")
        return found, ""
    import importlib.metadata as md  # noqa: PLC0415
    located = {}
    for name, suffix in zip(ONEDNN_PACKAGES, ("/libdnnl.so.3", "include/oneapi/dnnl/dnnl.hpp")):
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            return None, f"{name} is not installed; {_ONEDNN_HINT}"
        hit = [f for f in (dist.files or []) if ("/" + str(f).replace("\\", "/")).endswith(suffix)]
        if not hit:
            return None, f"{name} {dist.version} has no {suffix.lstrip('/')}; reinstall it ({_ONEDNN_HINT})"
        located[name] = pathlib.Path(dist.locate_file(hit[0])).resolve()
    lib_dir = located[ONEDNN_PACKAGES[0]].parent
    include_dir = located[ONEDNN_PACKAGES[1]].parents[2]
    found = _onednn_at(include_dir, lib_dir, f"packages {', '.join(ONEDNN_PACKAGES)}")
    if found is None:
        return None, f"{lib_dir} / {include_dir} do not hold an OpenMP build of oneDNN; {_ONEDNN_HINT}"
    return found, ""


_probe_cache: dict[tuple, str] = {}


def _first_line(cmd: list[str]) -> str:
    if tuple(cmd) in _probe_cache:
        return _probe_cache[tuple(cmd)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    _probe_cache[tuple(cmd)] = out = lines[0].strip() if lines else "unknown"
    return out


def _nvcc_version(nvcc: pathlib.Path) -> str:
    key = ("nvcc-version", str(nvcc))
    if key not in _probe_cache:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
        m = re.search(r"release ([\d.]+), (V[\d.]+)", out)
        _probe_cache[key] = m.group(2) if m else "unknown"
    return _probe_cache[key]


def _triton_version() -> str | None:
    try:
        import triton  # noqa: PLC0415 - optional, heavy

        return triton.__version__
    except Exception:  # noqa: BLE001 - any import failure means "no Triton"
        return None


def _cxx() -> str:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "c++"


def available_backends() -> list[str]:
    """Backends this machine can build: cpu always; cuda with nvcc; triton with nvcc and the triton package."""
    out = ["cpu"]
    if find_nvcc() is not None:
        out.append("cuda")
        if _triton_version() is not None:
            out.append("triton")
    return out


def onnxruntime_has_cuda() -> bool:
    """Whether the installed onnxruntime offers the CUDA execution provider (onnxruntime-gpu)."""
    try:
        import onnxruntime  # noqa: PLC0415
        return "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    except Exception:  # noqa: BLE001 - no onnxruntime: nothing can run the CUDA kernels either
        return False


def auto_backends(provider: str | None = None) -> list[str]:
    """What an automatic (first-use) build compiles: the CPU backend only where onnxruntime has no CUDA EP (the GPU
    kernels could never run there), else every backend this machine can build. `provider` = "cuda" asks for the
    GPU backends whatever onnxruntime says."""
    if provider == "cuda" or (provider is None and onnxruntime_has_cuda()):
        return available_backends()
    return ["cpu"]


def parse_archs(arch) -> list[str]:
    """CUDA archs from "80,90", "sm_90" or a list (default DEFAULT_ARCHS); BuildError on anything else."""
    if arch is None:
        return list(DEFAULT_ARCHS)
    items = arch.replace(";", ",").split(",") if isinstance(arch, str) else [str(a) for a in arch]
    archs = [a.strip().removeprefix("sm_").removeprefix("compute_") for a in items if str(a).strip()]
    for a in archs:
        if not re.fullmatch(r"\d{2,3}[af]?", a):
            raise BuildError(f"bad CUDA arch {a!r}: expected numbers like 80,90 (sm_80, sm_90)")
    return sorted(set(archs), key=archs.index)


def source_files(with_gpu: bool = True) -> list[pathlib.Path]:
    """The files the build reads (SOURCE_GLOBS), without the CUDA/Triton ones unless with_gpu."""
    files: set[pathlib.Path] = set()
    for pattern in SOURCE_GLOBS:
        files.update(p for p in KERNELS_DIR.glob(pattern) if p.is_file())
    if not with_gpu:
        files = {p for p in files if not str(p.relative_to(KERNELS_DIR)).startswith(_GPU_ONLY)}
    return sorted(files)


def ops_header_text() -> str:
    """The generated onnxfuse_ops.h (from schema.py and the Triton kernel table)."""
    from . import ops_header  # noqa: PLC0415 - imports onnxfuse.schema
    return ops_header.render()


def _cache_key(backends: list[str], archs: list[str], experiments: bool, versions: dict, ops_header: str) -> str:
    h = hashlib.sha256()
    for p in source_files(with_gpu="cuda" in backends):
        h.update(str(p.relative_to(KERNELS_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(ops_header.encode() + b"\0")
    h.update(json.dumps({"backends": backends, "archs": archs, "experiments": experiments, "versions": versions},
                        sort_keys=True).encode())
    return h.hexdigest()[:16]


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------------------------------------ plan
@dataclasses.dataclass
class Plan:
    """Everything a build of one configuration is decided by, and its cache key (no compiling yet)."""
    backends: list[str]
    archs: list[str]
    experiments: bool
    include_dir: pathlib.Path
    header_source: str
    versions: dict
    nvcc: pathlib.Path | None
    key: str
    ops_header: str
    notes: list[str]
    onednn: OneDnn | None = None
    cpu_gemm: str = "builtin"  # what the CPU kernels' constant-weight GEMMs run on (build info "cpu_gemm")

    @property
    def dir(self) -> pathlib.Path:
        """The cache folder of this build: <build dir>/<key>."""
        return build_dir() / self.key

    @property
    def lib(self) -> pathlib.Path:
        """The library this build makes: <build dir>/<key>/libonnxfuse_ops.so."""
        return self.dir / LIB_NAME

    @property
    def log_path(self) -> pathlib.Path:
        """The log of the latest attempt: <build dir>/logs/<key>.log."""
        return build_dir() / "logs" / f"{self.key}.log"

    @property
    def failure_path(self) -> pathlib.Path:
        """Where a failure of this build is remembered: <build dir>/failed/<key>.json."""
        return build_dir() / "failed" / f"{self.key}.json"


def plan(arch=None, backends=None, experiments: bool = False, fetch_headers: bool = True,
         header_log: list[str] | None = None) -> Plan:
    """Decide backends, archs and headers, probe the toolchain, and compute the cache key. Raises BuildError with
    the fix when something needed is missing (an unknown backend, nvcc for cuda, triton, headers, cmake)."""
    notes: list[str] = []
    requested = list(backends) if backends is not None else available_backends()
    unknown = [b for b in requested if b not in ALL_BACKENDS]
    if unknown:
        raise BuildError(f"unknown backend(s) {unknown}; choose from {list(ALL_BACKENDS)}")
    chosen = ["cpu"] + [b for b in ("cuda", "triton") if b in requested]
    if "triton" in chosen and "cuda" not in chosen:
        chosen.insert(1, "cuda")  # Triton kernels are launched through the CUDA EP glue
    nvcc = find_nvcc() if "cuda" in chosen else None
    if "cuda" in chosen and nvcc is None:
        if backends is not None:
            raise BuildError("backend 'cuda' requested but nvcc was not found (set CUDA_HOME or put nvcc on PATH)")
        chosen = ["cpu"]
        notes.append("nvcc not found: CPU backend only")
    triton_version = _triton_version() if "triton" in chosen else None
    if "triton" in chosen and triton_version is None:
        raise BuildError("backend 'triton' requested but the triton package cannot be imported "
                         "(pip install 'onnxfuse[build]')")
    if "cuda" in chosen and not (KERNELS_DIR / "cuda/cuda.cmake").is_file():
        if backends is not None:
            raise BuildError(f"backend 'cuda' requested but {KERNELS_DIR / 'cuda/cuda.cmake'} does not exist (the "
                             "CUDA kernels are not in this checkout); build with backends=['cpu']")
        chosen = ["cpu"]
        notes.append("cuda/cuda.cmake not in this checkout: CPU backend only")
    archs = parse_archs(arch) if "cuda" in chosen else []
    if experiments and "triton" not in chosen:
        raise BuildError("the experiments are Triton kernel variants, but this build has no triton backend "
                         f"({', '.join(chosen)}); build them with --backends cpu,cuda,triton (needs nvcc and triton)")
    experiments = bool(experiments)
    include_dir, header_source = find_ort_headers(fetch=fetch_headers, log=header_log)
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake not found on PATH (need CMake >= 3.18; pip install cmake or apt-get install cmake)")
    onednn, why_not = find_onednn()
    if onednn is None:
        notes.append(f"oneDNN not found ({why_not}): the CPU kernels use the built-in GEMM (slower)")
    versions = {
        "onednn": None if onednn is None else f"{onednn.version} {onednn.lib}",
        "ort_headers": _headers_version(include_dir),
        "ort_headers_sha": _headers_digest(include_dir),
        "cxx": _first_line([_cxx(), "--version"]),
        "cmake": _first_line([cmake, "--version"]),
        "nvcc": _nvcc_version(nvcc) if nvcc else None,
        "triton": triton_version,
        "machine": platform.machine(),
    }
    header = ops_header_text()
    key = _cache_key(chosen, archs, experiments, versions, header)
    cpu_gemm = f"onednn {onednn.version}" if onednn is not None else f"builtin ({why_not})"
    return Plan(chosen, archs, experiments, include_dir, header_source, versions, nvcc, key, header, notes, onednn,
                cpu_gemm)


# ------------------------------------------------------------------------------------------------ failures
def remembered_failure(p: Plan) -> dict | None:
    """The record of a failed build of exactly these inputs, if there is one."""
    try:
        return json.loads(p.failure_path.read_text())
    except (OSError, ValueError):
        return None


def _remember_failure(p: Plan, error: str, stage: str) -> None:
    p.failure_path.parent.mkdir(parents=True, exist_ok=True)
    record = {"key": p.key, "stage": stage, "error": error, "log": str(p.log_path), "backends": p.backends,
              "archs": p.archs, "experiments": p.experiments,
              "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    tmp = p.failure_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, p.failure_path)


def _raise_remembered(record: dict) -> None:
    raise BuildError(f"{record['error']}\n(remembered: these sources, compilers and options already failed to build "
                     f"at {record.get('time', '?')}, so no rebuild was tried; full log: {record.get('log')}; fix the "
                     "cause, then run 'onnxfuse build --force' to try again)")


# ------------------------------------------------------------------------------------------------ build
class _Progress:
    """Stage lines on stderr (`onnxfuse build [3/6] cpu: ...`), or nothing when quiet."""

    def __init__(self, quiet: bool, stages: list[str]):
        self.quiet, self.stages, self.t0 = quiet, stages, time.monotonic()

    def stage(self, name: str, detail: str = "") -> None:
        if not self.quiet:
            i = self.stages.index(name) + 1
            print(f"onnxfuse build [{i}/{len(self.stages)}] {name}{': ' + detail if detail else ''}",
                  file=sys.stderr, flush=True)

    def say(self, msg: str) -> None:
        if not self.quiet:
            print(f"onnxfuse build: {msg}", file=sys.stderr, flush=True)


def _stages_for(backends: list[str]) -> list[str]:
    return [s for s in STAGES if s not in ("cuda", "triton") or s in backends]


def build(arch=None, backends=None, force: bool = False, quiet: bool = False, experiments: bool = False,
          on_build_start=None) -> BuildResult:
    """Build (or reuse) the library for `backends` (default: all available) and CUDA `arch` (default 90).

    experiments=True also compiles the Triton A/B variants (a larger, opt-in library). A cached build of the same
    inputs is reused; a remembered failure of the same inputs is raised at once unless force=True. Stages are
    reported on stderr unless quiet. `on_build_start(plan)` is called when an actual compile begins (after the
    cache and failure checks), e.g. to say where the log is.
    """
    t0 = time.monotonic()
    header_log: list[str] = []
    p = plan(arch, backends, experiments, header_log=header_log)
    progress = _Progress(quiet, _stages_for(p.backends))
    root = build_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key: wait, then reuse it
        if p.lib.is_file() and not force:
            link_stable(p.lib)
            return _result(p, cached=True, seconds=time.monotonic() - t0)
        record = remembered_failure(p)
        if record is not None and not force:
            _raise_remembered(record)
        with contextlib.suppress(FileNotFoundError):
            p.failure_path.unlink()
        if on_build_start is not None:
            on_build_start(p)
        progress.stage("headers", p.header_source)
        for note in p.notes:
            progress.say(note)
        p.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(p.log_path, "w") as log:
            log.write("\n".join(header_log + [f"ORT headers: {p.header_source}", f"key: {p.key}",
                                              f"backends: {p.backends}", f"archs: {p.archs}",
                                              f"experiments: {p.experiments}", ""]) + "\n")
            log.flush()
            try:
                _compile(p, log, progress)
            except _StageFailed as e:
                log.flush()
                message = (f"{e.stage} stage failed (exit {e.code}); log: {p.log_path}; log tail:\n"
                           f"{_tail(p.log_path.read_text(errors='replace'))}")
                _remember_failure(p, message, e.stage)
                raise BuildError(message) from None
            except BuildError as e:
                _remember_failure(p, str(e), "link")
                raise
        link_stable(p.lib)
        seconds = time.monotonic() - t0
        progress.say(f"built {p.lib} in {seconds:.0f} s (backends {', '.join(p.backends)}; CPU GEMM {p.cpu_gemm}"
                     f"{'; archs ' + ','.join(p.archs) if p.archs else ''}{'; experiments' if p.experiments else ''})")
        return _result(p, cached=False, seconds=seconds)


class _StageFailed(Exception):
    def __init__(self, stage: str, code: int):
        super().__init__(stage)
        self.stage, self.code = stage, code


def _result(p: Plan, cached: bool, seconds: float) -> BuildResult:
    log = ""
    with contextlib.suppress(OSError):
        log = (p.dir / "build.log").read_text(errors="replace")
    return BuildResult(p.lib, p.backends, p.archs, p.header_source, p.key, log, cached=cached,
                       experiments=p.experiments, log_path=p.dir / "build.log", seconds=seconds)


def _compile(p: Plan, log, progress: _Progress) -> None:
    """Configure and build stage by stage into a temporary folder, then rename it into the cache."""
    root = build_dir()
    info = {"library": "onnxfuse_ops", "cache_key": p.key, "backends": p.backends, "archs": p.archs,
            "experiments": p.experiments, "header_source": p.header_source, "cpu_gemm": p.cpu_gemm, **p.versions}
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{p.key}-", dir=root))
    cmake = shutil.which("cmake")

    def run(stage: str, cmd: list[str]) -> None:
        log.write(f"\n== {stage}\n$ {' '.join(cmd)}\n")
        log.flush()
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        log.flush()
        if code != 0:
            raise _StageFailed(stage, code)

    try:
        gen = work / "generated"
        gen.mkdir()
        literal = json.dumps(json.dumps(info, sort_keys=True))  # a C string literal is a JSON string here
        (gen / "onnxfuse_build_info.h").write_text(
            "// Generated by onnxfuse/kernels/build.py; read back with onnxfuse.kernels.build_info().\n"
            f"#define ONNXFUSE_BUILD_INFO_JSON {literal}\n")
        (gen / "onnxfuse_ops.h").write_text(p.ops_header)
        progress.stage("configure", f"cmake, log {p.log_path}")
        cfg = [cmake, "-S", str(KERNELS_DIR), "-B", str(work / "cmake"), "-DCMAKE_BUILD_TYPE=Release",
               f"-DCMAKE_CXX_COMPILER={_cxx()}", f"-DORT_INCLUDE_DIR={p.include_dir}",
               f"-DONNXFUSE_GENERATED_DIR={gen}", f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={work / 'out'}",
               f"-DONNXFUSE_WITH_CUDA={'ON' if 'cuda' in p.backends else 'OFF'}",
               f"-DONNXFUSE_WITH_TRITON={'ON' if 'triton' in p.backends else 'OFF'}",
               f"-DONNXFUSE_EXPERIMENTS={'ON' if p.experiments else 'OFF'}",
               f"-DONNXFUSE_CUDA_ARCHS={';'.join(p.archs) or '90'}", f"-DONNXFUSE_PYTHON={sys.executable}"]
        if p.onednn is not None:
            cfg += [f"-DONNXFUSE_ONEDNN_INCLUDE_DIR={p.onednn.include_dir}", f"-DONNXFUSE_ONEDNN_LIBRARY={p.onednn.lib}"]
        if p.nvcc:
            cfg += [f"-DCMAKE_CUDA_COMPILER={p.nvcc}", f"-DCUDAToolkit_ROOT={p.nvcc.parent.parent}"]
        run("configure", cfg)
        jobs = str(max(1, min(os.cpu_count() or 2, 16)))
        targets = {"cpu": ("onnxfuse_cpu", "C++ kernels (g++)"), "cuda": ("onnxfuse_cuda", "CUDA kernels (nvcc)"),
                   "triton": ("onnxfuse_triton", "Triton AOT cubins"), "link": ("onnxfuse_ops", LIB_NAME)}
        for stage in progress.stages[2:]:
            target, what = targets[stage]
            progress.stage(stage, what)
            run(stage, [cmake, "--build", str(work / "cmake"), "--target", target, "-j", jobs])
        built = work / "out" / LIB_NAME
        if not built.is_file():
            raise BuildError(f"build finished but {built} is missing; log: {p.log_path}")
        manifest = work / "cmake" / "triton_generated" / "triton_kernels.json"
        artifacts = {"size_bytes": built.stat().st_size}
        if manifest.is_file():
            artifacts["triton_cubins"] = len(json.loads(manifest.read_text())["kernels"])
        staging = work / "final"
        staging.mkdir()
        shutil.copy2(built, staging / LIB_NAME)
        (staging / "build_info.json").write_text(json.dumps({**info, "artifacts": artifacts}, indent=2,
                                                            sort_keys=True) + "\n")
        log.flush()
        shutil.copy2(p.log_path, staging / "build.log")
        if p.dir.exists():
            shutil.rmtree(p.dir)  # force=True: replace; nobody else builds under the lock
        os.replace(staging, p.dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ cache
def _read_info(d: pathlib.Path) -> dict | None:
    try:
        return json.loads((d / "build_info.json").read_text())
    except (OSError, ValueError):
        return None


def _dir_size(d: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())


def cache_entries(check: bool = True) -> list[dict]:
    """Every build and remembered failure in the cache: key, backends, archs, experiments, size, age, status.

    status: "ok" (built from the current sources and toolchain: usable), "stale" (built from other inputs),
    "failed" (a remembered failure), "partial" (a folder without a library). With check=False the "ok"/"stale"
    check (which probes the toolchain) is skipped and finished builds say "built"."""
    root = build_dir()
    now = time.time()
    links: dict[str, list[str]] = {}
    for name, key in stable_links().items():
        links.setdefault(key, []).append(name)
    plans: dict[tuple, str | None] = {}
    out = []
    for d in sorted(root.iterdir()) if root.is_dir() else []:
        if not (d.is_dir() and not d.is_symlink() and _KEY_RE.fullmatch(d.name)):
            continue
        info = _read_info(d) or {}
        lib = d / LIB_NAME
        status = "partial" if not lib.is_file() else "built"
        if check and lib.is_file():
            status = "ok" if _current_key(info, plans) == d.name else "stale"
        out.append({"key": d.name, "status": status, "backends": info.get("backends", []),
                    "archs": info.get("archs", []), "experiments": bool(info.get("experiments")),
                    "size_bytes": _dir_size(d), "age_s": round(now - d.stat().st_mtime), "path": str(d),
                    "stable": links.get(d.name, []), "cubins": (info.get("artifacts") or {}).get("triton_cubins")})
    for f in sorted((root / "failed").glob("*.json")) if (root / "failed").is_dir() else []:
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        out.append({"key": rec.get("key", f.stem), "status": "failed", "backends": rec.get("backends", []),
                    "archs": rec.get("archs", []), "experiments": bool(rec.get("experiments")),
                    "size_bytes": f.stat().st_size, "age_s": round(now - f.stat().st_mtime), "path": str(f),
                    "stable": [], "stage": rec.get("stage"), "log": rec.get("log"), "cubins": None})
    return out


def _current_key(info: dict, plans: dict) -> str | None:
    """The key a build of `info`'s configuration would have now (None if it cannot be built here)."""
    cfg = (tuple(info.get("backends", [])), tuple(info.get("archs", [])), bool(info.get("experiments")))
    if cfg not in plans:
        try:
            plans[cfg] = plan(list(cfg[1]) or None, list(cfg[0]), cfg[2], fetch_headers=False).key
        except BuildError:
            plans[cfg] = None
    return plans[cfg]


def find_cached(need: set[str]) -> pathlib.Path | None:
    """A finished, current (same inputs) build whose backends cover `need`: the default one (no experiments)
    with the fewest extra backends first, then the newest."""
    found = [e for e in cache_entries(check=True) if e["status"] == "ok" and need <= set(e["backends"])]
    found.sort(key=lambda e: (e["experiments"], len(e["backends"]), e["age_s"]))
    return pathlib.Path(found[0]["path"]) / LIB_NAME if found else None


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
