"""What a kernel-library build finds on this machine: onnxruntime's headers, nvcc, oneDNN, Triton, the C++ compiler.

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

CUDA kernels need nvcc (``CUDA_HOME``, ``CUDA_PATH``, ``/usr/local/cuda``, ``PATH``), the Triton kernels also the
triton package. The versions probed here go into each build's cache key (build.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

from .cache import build_dir

HEADERS_VERSION = "1.21"  # what the trixie .deb gives; the C API is append-only, so it loads into newer runtimes
REQUIRED_HEADERS = ("onnxruntime_cxx_api.h", "onnxruntime_lite_custom_op.h")
REMEMBERED_HEADERS = "ort-headers-from-env"  # the cache's copy of the last ORT_INCLUDE_DIR
DEFAULT_ARCHS = ("90",)
_NO_HEADERS_HINT = ("set ORT_INCLUDE_DIR to an onnxruntime release's include directory (the GitHub release tarball "
                    "onnxruntime-linux-x64-<version>.tgz has it under include/), or install libonnxruntime-dev")


class BuildError(RuntimeError):
    """The library could not be built; the message says which stage failed and ends with the tail of its log."""


# ------------------------------------------------------------------------------------------------ ORT headers
def has_headers(d: pathlib.Path) -> bool:
    """Whether `d` holds the onnxruntime headers the kernels include (REQUIRED_HEADERS)."""
    return all((d / h).is_file() for h in REQUIRED_HEADERS)


def headers_version(d: pathlib.Path) -> str:
    """The C API version of the headers in `d` ("api21"), from ORT_API_VERSION, or "unknown"."""
    text = (d / "onnxruntime_c_api.h").read_text(errors="replace") if (d / "onnxruntime_c_api.h").is_file() else ""
    m = re.search(r"#define\s+ORT_API_VERSION\s+(\d+)", text)
    return f"api{m.group(1)}" if m else "unknown"


def headers_digest(d: pathlib.Path) -> str:
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
        for cmd, cwd in ((["apt-get", *opts, "update"], None),
                         (["apt-get", *opts, "download", "libonnxruntime-dev"], d)):
            p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
            log.append(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}")
            if p.returncode != 0:
                return False
        debs = sorted(d.glob("libonnxruntime-dev_*.deb"))
        if not debs:
            return False
        p = subprocess.run(["dpkg", "-x", str(debs[0]), str(d / "root")], capture_output=True, text=True)
        src = d / "root/usr/include/onnxruntime"
        if p.returncode != 0 or not has_headers(src):
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
        if not has_headers(d):
            raise BuildError(f"ORT_INCLUDE_DIR={env} does not contain {' and '.join(REQUIRED_HEADERS)}; "
                             f"{_NO_HEADERS_HINT}")
        _remember_headers(d, log)
        return d, f"ORT_INCLUDE_DIR={d}"
    remembered = build_dir() / REMEMBERED_HEADERS
    if has_headers(remembered):  # a copy of the last ORT_INCLUDE_DIR: builds made with it stay found without it
        return remembered, f"copy of an earlier ORT_INCLUDE_DIR {remembered}"
    cached = build_dir() / f"ort-headers-{HEADERS_VERSION}"
    if has_headers(cached):
        return cached, f"cached copy {cached}"
    system = pathlib.Path("/usr/include/onnxruntime")
    if has_headers(system):
        return system, f"system {system}"
    if fetch:
        cached.parent.mkdir(parents=True, exist_ok=True)
        if _fetch_trixie_headers(cached, log) and has_headers(cached):
            return cached, f"Debian trixie libonnxruntime-dev {HEADERS_VERSION} fetched into {cached}"
    raise BuildError(f"onnxruntime C/C++ headers not found (ORT_INCLUDE_DIR unset, no {cached}, no {system}"
                     f"{', apt fetch of libonnxruntime-dev failed' if fetch else ''}); {_NO_HEADERS_HINT}")


def _remember_headers(d: pathlib.Path, log: list[str]) -> None:
    """Keep a copy of ORT_INCLUDE_DIR's headers in the cache (replacing an older copy): the cache key holds their
    digest, so a later shell without the variable finds the same headers, the same key and the built library."""
    dest = build_dir() / REMEMBERED_HEADERS
    if has_headers(dest) and headers_digest(dest) == headers_digest(d):
        return
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(tempfile.mkdtemp(prefix=".ort-headers-", dir=dest.parent))
        for h in d.glob("*.h"):
            shutil.copy2(h, staging / h.name)
        old = dest.with_name(dest.name + ".old")
        if dest.exists():
            os.replace(dest, old)
        os.replace(staging, dest)
        shutil.rmtree(old, ignore_errors=True)
        log.append(f"headers: ORT_INCLUDE_DIR={d} copied to {dest}")
    except OSError as e:  # a read-only cache: builds still work while the variable is set
        log.append(f"headers: could not copy ORT_INCLUDE_DIR into the cache ({e})")


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


CUTLASS_PACKAGE = "nvidia-cutlass"  # CUTLASS's Python package ships its C++ headers (cutlass_library/source)


def find_cutlass() -> tuple[pathlib.Path | None, str, str]:
    """CUTLASS's source folder (include/ and tools/util/include/ under it) for the sm_90a int4 GEMM: (found, its
    version, why not). ONNXFUSE_CUTLASS_DIR=<folder> must hold include/cutlass/cutlass.h (BuildError if not);
    ONNXFUSE_CUTLASS_DIR=off builds without it; else the nvidia-cutlass package (installed with --no-deps: only its
    headers are read)."""
    env = os.environ.get("ONNXFUSE_CUTLASS_DIR")
    if env is not None and env.strip().lower() in ("off", "0", "no", "none", ""):
        return None, "", "disabled by ONNXFUSE_CUTLASS_DIR=off"
    if env:
        root = pathlib.Path(env)
        if not (root / "include/cutlass/cutlass.h").is_file():
            raise BuildError(f"ONNXFUSE_CUTLASS_DIR={env} has no include/cutlass/cutlass.h; point it at a CUTLASS "
                             f"checkout, pip install --no-deps {CUTLASS_PACKAGE}, or set ONNXFUSE_CUTLASS_DIR=off")
        return root.resolve(), _cutlass_version(root), ""
    import importlib.metadata as md  # noqa: PLC0415
    try:
        dist = md.distribution(CUTLASS_PACKAGE)
    except md.PackageNotFoundError:
        return None, "", f"{CUTLASS_PACKAGE} is not installed (pip install --no-deps {CUTLASS_PACKAGE})"
    hit = [f for f in (dist.files or []) if str(f).replace("\\", "/").endswith("source/include/cutlass/cutlass.h")]
    if not hit:
        return None, "", f"{CUTLASS_PACKAGE} {dist.version} has no source/include/cutlass/cutlass.h"
    root = pathlib.Path(dist.locate_file(hit[0])).resolve().parents[2]
    return root, _cutlass_version(root) or dist.version, ""


def _cutlass_version(root: pathlib.Path) -> str:
    """CUTLASS's version from include/cutlass/version.h (major.minor.patch), or ""."""
    try:
        text = (root / "include/cutlass/version.h").read_text(errors="replace")
    except OSError:
        return ""
    parts = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else ""


_probe_cache: dict[tuple, str] = {}


def first_line(cmd: list[str]) -> str:
    """The first non-empty output line of `cmd` (a tool's --version), cached per process; "unavailable" if it
    cannot run."""
    if tuple(cmd) in _probe_cache:
        return _probe_cache[tuple(cmd)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    _probe_cache[tuple(cmd)] = out = lines[0].strip() if lines else "unknown"
    return out


def nvcc_version(nvcc: pathlib.Path) -> str:
    """nvcc's version ("V12.8.93"), cached per process."""
    key = ("nvcc-version", str(nvcc))
    if key not in _probe_cache:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
        m = re.search(r"release ([\d.]+), (V[\d.]+)", out)
        _probe_cache[key] = m.group(2) if m else "unknown"
    return _probe_cache[key]


def triton_version() -> str | None:
    """The importable triton package's version, or None."""
    try:
        import triton  # noqa: PLC0415 - optional, heavy

        return triton.__version__
    except Exception:  # noqa: BLE001 - any import failure means "no Triton"
        return None


def cxx() -> str:
    """The C++ compiler: $CXX, else g++ or c++ on PATH."""
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or "c++"


def available_backends() -> list[str]:
    """Backends this machine can build: cpu always; cuda with nvcc; triton with nvcc and the triton package."""
    out = ["cpu"]
    if find_nvcc() is not None:
        out.append("cuda")
        if triton_version() is not None:
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
