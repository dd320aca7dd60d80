"""Build the onnxfuse custom-op library (``libonnxfuse_ops.so``) with CMake into the cache of builds.

A build is decided first (`plan`: backends, CUDA archs, headers, the toolchain's versions and the cache key), then
reused when the cache (cache.py) holds that key, refused at once when the same inputs already failed (until they
change or force=True), and otherwise compiled. What the build finds on this machine (onnxruntime headers, nvcc,
oneDNN, Triton) is toolchain.py's; this module re-exports those names.

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
import importlib.util
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from . import cache
from .cache import ALL_BACKENDS, LIB_NAME, build_dir, link_stable
from .toolchain import (BuildError, OneDnn, available_backends, cxx, find_cutlass, find_nvcc, find_onednn,
                        find_ort_headers, first_line, headers_digest, headers_version, nvcc_version, parse_archs,
                        triton_version)
# Re-exported: where callers (kernels/__init__.py, tests) have always found them.
from .cache import clean, stable_links, stable_name, stable_path  # noqa: F401, E402
from .toolchain import auto_backends, onnxruntime_has_cuda  # noqa: F401, E402

KERNELS_DIR = pathlib.Path(__file__).resolve().parent
STAGES = ("headers", "configure", "cpu", "cuda", "triton", "link")


TRITON_DIR = pathlib.Path(__file__).resolve().parent / "triton"


def aot_module():
    """triton/aot.py (a build script, not a package module), loaded once."""
    name = "_onnxfuse_aot"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TRITON_DIR / "aot.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]
# What the build reads from this folder. pyproject.toml's package-data must ship every one of these (a test checks).
SOURCE_GLOBS = ("*.cc", "*.h", "cpu/*.cc", "cpu/*.h", "common/*.h", "cuda/*.cc", "cuda/*.h", "cuda/*.cu",
                "cuda/cutlass/*.cu", "cuda/sm90a/*.cu", "cuda/triton/*.cc", "cuda/triton/*.h", "cuda/*.cmake",
                "CMakeLists.txt", "exports.map", "triton/*.py", "triton/*.json", "ops_header.py")
# Sources only the CUDA/Triton build compiles; a CPU-only build's key ignores them so edits there do not rebuild it.
_GPU_ONLY = ("cuda/", "triton/")


@dataclasses.dataclass
class BuildResult:
    """A built (or reused) library: its `path` in the cache, backends, CUDA archs, where the ORT headers came from,
    the cache key, the build log text and its path, whether it was `cached`, and the seconds taken."""
    path: pathlib.Path
    backends: list[str]
    archs: list[str]
    header_source: str
    cache_key: str
    log: str
    cached: bool = False
    log_path: pathlib.Path | None = None
    seconds: float = 0.0


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


def _cache_key(backends: list[str], archs: list[str], versions: dict, ops_header: str) -> str:
    h = hashlib.sha256()
    for p in source_files(with_gpu="cuda" in backends):
        h.update(str(p.relative_to(KERNELS_DIR)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(ops_header.encode() + b"\0")
    h.update(json.dumps({"backends": backends, "archs": archs, "versions": versions}, sort_keys=True).encode())
    return h.hexdigest()[:16]


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


# ------------------------------------------------------------------------------------------------ plan
@dataclasses.dataclass
class Plan:
    """Everything a build of one configuration is decided by, and its cache key (no compiling yet)."""
    backends: list[str]
    archs: list[str]
    include_dir: pathlib.Path
    header_source: str
    versions: dict
    nvcc: pathlib.Path | None
    key: str
    ops_header: str
    notes: list[str]
    onednn: OneDnn | None = None
    cpu_gemm: str = "builtin"  # what the CPU kernels' constant-weight GEMMs run on (build info "cpu_gemm")
    cutlass: pathlib.Path | None = None  # CUTLASS's source folder: the sm_90a int4 GEMM is built (cuda/cuda.cmake)

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


def plan(arch=None, backends=None, fetch_headers: bool = True, header_log: list[str] | None = None) -> Plan:
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
    triton = triton_version() if "triton" in chosen else None
    if "triton" in chosen and triton is None:
        raise BuildError("backend 'triton' requested but the triton package cannot be imported "
                         "(pip install 'onnxfuse[build]')")
    if "cuda" in chosen and not (KERNELS_DIR / "cuda/cuda.cmake").is_file():
        if backends is not None:
            raise BuildError(f"backend 'cuda' requested but {KERNELS_DIR / 'cuda/cuda.cmake'} does not exist (the "
                             "CUDA kernels are not in this checkout); build with backends=['cpu']")
        chosen = ["cpu"]
        notes.append("cuda/cuda.cmake not in this checkout: CPU backend only")
    archs = parse_archs(arch) if "cuda" in chosen else []
    include_dir, header_source = find_ort_headers(fetch=fetch_headers, log=header_log)
    cmake = shutil.which("cmake")
    if cmake is None:
        raise BuildError("cmake not found on PATH (need CMake >= 3.18; pip install cmake or apt-get install cmake)")
    onednn, why_not = find_onednn()
    if onednn is None:
        notes.append(f"oneDNN not found ({why_not}): the CPU kernels use the built-in GEMM (slower)")
    cutlass = None
    if "cuda" in chosen:
        cutlass, cutlass_version, why_not = find_cutlass()
        if cutlass is None:
            notes.append(f"CUTLASS not found ({why_not}): Int4Linear/Int4SwiGLU past 16 rows dequantize, then cuBLAS")
        elif "90" not in archs:
            notes.append("no sm_90 among the archs: CUTLASS's sm_90a int4 GEMM is not built")
            cutlass = None
    versions = {
        "onednn": None if onednn is None else f"{onednn.version} {onednn.lib}",
        "cutlass": None if cutlass is None else f"{cutlass_version} {cutlass}",
        "ort_headers": headers_version(include_dir),
        "ort_headers_sha": headers_digest(include_dir),
        "cxx": first_line([cxx(), "--version"]),
        "cmake": first_line([cmake, "--version"]),
        "nvcc": nvcc_version(nvcc) if nvcc else None,
        "triton": triton,
        "machine": platform.machine(),
    }
    header = ops_header_text()
    key = _cache_key(chosen, archs, versions, header)
    cpu_gemm = f"onednn {onednn.version}" if onednn is not None else f"builtin ({why_not})"
    return Plan(chosen, archs, include_dir, header_source, versions, nvcc, key, header, notes, onednn, cpu_gemm,
                cutlass)


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
              "archs": p.archs,
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


def build(arch=None, backends=None, force: bool = False, quiet: bool = False, on_build_start=None) -> BuildResult:
    """Build (or reuse) the library for `backends` (default: all available) and CUDA `arch` (default 90).

    A cached build of the same inputs is reused; a remembered failure of the same inputs is raised at once unless
    force=True. Stages are reported on stderr unless quiet. `on_build_start(plan)` is called when an actual compile
    begins (after the cache and failure checks), e.g. to say where the log is.
    """
    t0 = time.monotonic()
    header_log: list[str] = []
    p = plan(arch, backends, header_log=header_log)
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
                                              f"backends: {p.backends}", f"archs: {p.archs}", ""]) + "\n")
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
                     f"{'; archs ' + ','.join(p.archs) if p.archs else ''})")
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
                       log_path=p.dir / "build.log", seconds=seconds)


def _compile(p: Plan, log, progress: _Progress) -> None:
    """Configure and build stage by stage into a temporary folder, then rename it into the cache."""
    root = build_dir()
    info = {"library": "onnxfuse_ops", "cache_key": p.key, "backends": p.backends, "archs": p.archs,
            "header_source": p.header_source, "cpu_gemm": p.cpu_gemm, **p.versions}
    if "triton" in p.backends:  # triton/tuned.json's tiles, which the AOT step applies over the kernel files' CONFIGS
        info["triton_tuned"] = {a: k for a, k in aot_module().default_overrides().items() if a in p.archs}
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
               f"-DCMAKE_CXX_COMPILER={cxx()}", f"-DORT_INCLUDE_DIR={p.include_dir}",
               f"-DONNXFUSE_GENERATED_DIR={gen}", f"-DCMAKE_LIBRARY_OUTPUT_DIRECTORY={work / 'out'}",
               f"-DONNXFUSE_WITH_CUDA={'ON' if 'cuda' in p.backends else 'OFF'}",
               f"-DONNXFUSE_WITH_TRITON={'ON' if 'triton' in p.backends else 'OFF'}",
               f"-DONNXFUSE_CUDA_ARCHS={';'.join(p.archs) or '90'}", f"-DONNXFUSE_PYTHON={sys.executable}"]
        if p.onednn is not None:
            cfg += [f"-DONNXFUSE_ONEDNN_INCLUDE_DIR={p.onednn.include_dir}",
                    f"-DONNXFUSE_ONEDNN_LIBRARY={p.onednn.lib}"]
        if p.nvcc:
            cfg += [f"-DCMAKE_CUDA_COMPILER={p.nvcc}", f"-DCUDAToolkit_ROOT={p.nvcc.parent.parent}"]
        if p.cutlass is not None:
            cfg.append(f"-DONNXFUSE_CUTLASS_DIR={p.cutlass}")
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
def cache_entries(check: bool = True) -> list[dict]:
    """Every build and remembered failure in the cache: key, backends, archs, size, age, status.

    status: "ok" (built from the current sources and toolchain: usable), "stale" (built from other inputs),
    "failed" (a remembered failure), "partial" (a folder without a library). With check=False the "ok"/"stale"
    check (which probes the toolchain) is skipped and finished builds say "built"."""
    plans: dict[tuple, str | None] = {}
    return cache.entries((lambda info: _current_key(info, plans)) if check else None)


def _current_key(info: dict, plans: dict) -> str | None:
    """The key a build of `info`'s configuration would have now (None if it cannot be built here)."""
    cfg = (tuple(info.get("backends", [])), tuple(info.get("archs", [])))
    if cfg not in plans:
        try:
            plans[cfg] = plan(list(cfg[1]) or None, list(cfg[0]), fetch_headers=False).key
        except BuildError:
            plans[cfg] = None
    return plans[cfg]


def find_cached(need: set[str]) -> pathlib.Path | None:
    """A finished, current (same inputs) build whose backends cover `need`: the one with the fewest extra backends
    first, then the newest."""
    found = [e for e in cache_entries(check=True) if e["status"] == "ok" and need <= set(e["backends"])]
    found.sort(key=lambda e: (len(e["backends"]), e["age_s"]))
    return pathlib.Path(found[0]["path"]) / LIB_NAME if found else None
