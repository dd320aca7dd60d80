"""Build the onnxfuse custom-op library (``libonnxfuse_ops.so``) with CMake.

Where the onnxruntime headers come from, in order (first hit wins, and `BuildResult.header_source` says which):
  1. ``ORT_INCLUDE_DIR`` — any onnxruntime release's ``include/`` (must hold onnxruntime_cxx_api.h and
     onnxruntime_lite_custom_op.h);
  2. a cached copy under the build dir (``<build dir>/ort-headers-1.21/``);
  3. the system: ``/usr/include/onnxruntime`` (Debian 13+, Ubuntu 25.04+, Arch);
  4. Debian trixie's ``libonnxruntime-dev`` .deb fetched with apt through a private sources dir (nothing installed,
     the system's apt setup untouched), unpacked into the cache of 2.

The library links no onnxruntime: it receives the API in ``RegisterCustomOps``. CUDA kernels are built when nvcc is
found (``CUDA_HOME``, ``/usr/local/cuda``, ``PATH``) unless ``backends`` leaves CUDA out. Builds land in a temporary
directory and are renamed into ``<build dir>/<cache key>/`` so a reader never sees a half-written library.
"""
from __future__ import annotations

import argparse
import dataclasses
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

KERNELS_DIR = pathlib.Path(__file__).resolve().parent
LIB_NAME = "libonnxfuse_ops.so"
HEADERS_VERSION = "1.21"  # what the trixie .deb gives; the C API is append-only, so it loads into newer runtimes
REQUIRED_HEADERS = ("onnxruntime_cxx_api.h", "onnxruntime_lite_custom_op.h")
DEFAULT_ARCHS = ("90",)
ALL_BACKENDS = ("cpu", "cuda", "triton")
_SOURCE_GLOBS = ("**/*.cc", "**/*.h", "**/*.cu", "**/*.cmake", "CMakeLists.txt", "ort/exports.map", "triton/*.py")
_NO_HEADERS_HINT = ("set ORT_INCLUDE_DIR to an onnxruntime release's include directory (the GitHub release tarball "
                    "onnxruntime-linux-x64-<version>.tgz has it under include/), or install libonnxruntime-dev")


class BuildError(RuntimeError):
    """The library could not be built; the message ends with the tail of the compiler/CMake log."""


@dataclasses.dataclass
class BuildResult:
    path: pathlib.Path
    backends: list[str]
    archs: list[str]
    header_source: str
    cache_key: str
    log: str
    cached: bool = False


def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("ONNXFUSE_BUILD_DIR") or KERNELS_DIR / "_build")


# ------------------------------------------------------------------------------------------------ ORT headers
def _has_headers(d: pathlib.Path) -> bool:
    return all((d / h).is_file() for h in REQUIRED_HEADERS)


def _headers_version(d: pathlib.Path) -> str:
    text = (d / "onnxruntime_c_api.h").read_text(errors="replace") if (d / "onnxruntime_c_api.h").is_file() else ""
    m = re.search(r"#define\s+ORT_API_VERSION\s+(\d+)", text)
    return f"api{m.group(1)}" if m else "unknown"


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
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (pathlib.Path(root) / "bin/nvcc").is_file():
            return pathlib.Path(root) / "bin/nvcc"
    found = shutil.which("nvcc")
    return pathlib.Path(found) if found else None


def _first_line(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    return lines[0].strip() if lines else "unknown"


def _nvcc_version(nvcc: pathlib.Path) -> str:
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release ([\d.]+), (V[\d.]+)", out)
    return m.group(2) if m else "unknown"


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


def parse_archs(arch) -> list[str]:
    if arch is None:
        return list(DEFAULT_ARCHS)
    items = arch.replace(";", ",").split(",") if isinstance(arch, str) else [str(a) for a in arch]
    archs = [a.strip().removeprefix("sm_").removeprefix("compute_") for a in items if str(a).strip()]
    for a in archs:
        if not re.fullmatch(r"\d{2,3}[af]?", a):
            raise BuildError(f"bad CUDA arch {a!r}: expected numbers like 80,90 (sm_80, sm_90)")
    return sorted(set(archs), key=archs.index)


# Sources only the CUDA/Triton build compiles; a CPU-only build's key ignores them so edits there do not rebuild it.
_GPU_ONLY = ("cuda/", "triton/", "ort/ops_cuda.cc")


def _source_files(with_gpu: bool = True) -> list[pathlib.Path]:
    files: set[pathlib.Path] = set()
    for pattern in _SOURCE_GLOBS:
        files.update(p for p in KERNELS_DIR.glob(pattern) if p.is_file() and "_build" not in p.parts)
    if not with_gpu:
        files = {p for p in files if not str(p.relative_to(KERNELS_DIR)).startswith(_GPU_ONLY)}
    return sorted(files)


def _cache_key(backends: list[str], archs: list[str], versions: dict) -> str:
    h = hashlib.sha256()
    for p in _source_files(with_gpu="cuda" in backends):
        h.update(str(p.relative_to(KERNELS_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(json.dumps({"backends": backends, "archs": archs, "versions": versions}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------------------------------------ build
def build(arch=None, backends=None, force: bool = False, quiet: bool = False) -> BuildResult:
    """Build (or reuse) the library for `backends` (default: all available) and CUDA `arch` (default 90)."""
    log: list[str] = []

    def say(msg: str) -> None:
        log.append(msg)
        if not quiet:
            print(f"onnxfuse.kernels: {msg}", file=sys.stderr)

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
    triton_version = _triton_version() if "triton" in chosen else None
    if "triton" in chosen and triton_version is None:
        raise BuildError("backend 'triton' requested but the triton package cannot be imported")
    if "cuda" in chosen and backends is None and not (KERNELS_DIR / "cuda/cuda.cmake").is_file():
        say("cuda/cuda.cmake not in this checkout: CUDA kernels skipped")
        chosen = ["cpu"]
    if "cuda" in chosen and not (KERNELS_DIR / "cuda/cuda.cmake").is_file():
        raise BuildError(f"backend 'cuda' requested but {KERNELS_DIR / 'cuda/cuda.cmake'} does not exist (the CUDA "
                         "kernels are not in this checkout); build with backends=['cpu']")
    archs = parse_archs(arch) if "cuda" in chosen else []
    if chosen == ["cpu"]:
        say("building a CPU-only library" + ("" if backends is not None else " (nvcc not found)"))

    include_dir, header_source = find_ort_headers(log=log)
    say(f"ORT headers: {header_source}")
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake not found on PATH (need CMake >= 3.18)")
    versions = {
        "ort_headers": _headers_version(include_dir),
        "cxx": _first_line([_cxx(), "--version"]),
        "cmake": _first_line([cmake, "--version"]),
        "nvcc": _nvcc_version(nvcc) if nvcc else None,
        "triton": triton_version,
        "machine": platform.machine(),
    }
    key = _cache_key(chosen, archs, versions)
    root = build_dir()
    final_dir = root / key
    lib = final_dir / LIB_NAME
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key: wait, then reuse it
        if lib.is_file() and not force:
            return BuildResult(lib, chosen, archs, header_source, key, "\n".join(log), cached=True)
        info = {"library": "onnxfuse_ops", "cache_key": key, "backends": chosen, "archs": archs,
                "header_source": header_source, **versions}
        work = pathlib.Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
        try:
            gen = work / "generated"
            gen.mkdir()
            literal = json.dumps(json.dumps(info, sort_keys=True))  # a C string literal is a JSON string here
            (gen / "onnxfuse_build_info.h").write_text(
                "// Generated by onnxfuse/kernels/build.py; read back with onnxfuse.kernels.build_info().\n"
                f"#define ONNXFUSE_BUILD_INFO_JSON {literal}\n")
            cfg = [cmake, "-S", str(KERNELS_DIR), "-B", str(work / "cmake"), "-DCMAKE_BUILD_TYPE=Release",
                   f"-DCMAKE_CXX_COMPILER={_cxx()}", f"-DORT_INCLUDE_DIR={include_dir}",
                   f"-DONNXFUSE_GENERATED_DIR={gen}", f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={work / 'out'}",
                   f"-DONNXFUSE_WITH_CUDA={'ON' if 'cuda' in chosen else 'OFF'}",
                   f"-DONNXFUSE_WITH_TRITON={'ON' if 'triton' in chosen else 'OFF'}",
                   f"-DONNXFUSE_CUDA_ARCHS={';'.join(archs) or '90'}", f"-DONNXFUSE_PYTHON={sys.executable}"]
            if nvcc:
                cfg += [f"-DCMAKE_CUDA_COMPILER={nvcc}", f"-DCUDAToolkit_ROOT={nvcc.parent.parent}"]
            jobs = str(max(1, min(os.cpu_count() or 2, 16)))
            for cmd in (cfg, [cmake, "--build", str(work / "cmake"), "-j", jobs]):
                say("$ " + " ".join(cmd))
                p = subprocess.run(cmd, capture_output=True, text=True)
                log.append(p.stdout + p.stderr)
                if p.returncode != 0:
                    raise BuildError(f"{'configure' if cmd is cfg else 'build'} failed (exit {p.returncode}); "
                                     f"log tail:\n{_tail(p.stdout + p.stderr)}")
            built = work / "out" / LIB_NAME
            if not built.is_file():
                raise BuildError(f"build finished but {built} is missing; log tail:\n{_tail(chr(10).join(log))}")
            staging = work / "final"
            staging.mkdir()
            shutil.copy2(built, staging / LIB_NAME)
            (staging / "build_info.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
            (staging / "build.log").write_text("\n".join(log))
            if final_dir.exists():
                shutil.rmtree(final_dir)  # force=True: replace; nobody else builds under the lock
            os.replace(staging, final_dir)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        say(f"built {lib} (backends {chosen}{', archs ' + ','.join(archs) if archs else ''})")
        return BuildResult(lib, chosen, archs, header_source, key, "\n".join(log))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m onnxfuse.kernels.build", description=__doc__.splitlines()[0])
    ap.add_argument("--arch", help="CUDA archs, e.g. 80,90 (default 90)")
    ap.add_argument("--backends", help=f"comma list from {','.join(ALL_BACKENDS)} (default: all available)")
    ap.add_argument("--force", action="store_true", help="rebuild even when a cached library exists")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    try:
        r = build(arch=a.arch, backends=a.backends.split(",") if a.backends else None, force=a.force, quiet=a.quiet)
    except BuildError as e:
        print(f"onnxfuse.kernels.build: error: {e}", file=sys.stderr)
        return 1
    print(r.path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
