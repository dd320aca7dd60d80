"""The kernel library's build: the generated onnxfuse_ops.h against schema.py, the C++ sources free of copied
literals, packaging, the build cache in the user cache dir (failure memory, reuse, list/clean, the stable path),
progress and quiet output, the CPU-only automatic build, and one full CPU+CUDA+Triton build where nvcc is present.

Builds here go to temporary cache dirs (ONNXFUSE_BUILD_DIR) and take the onnxruntime headers from the default
cache (ORT_INCLUDE_DIR), so nothing is downloaded twice and the user's cache is not touched.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import zipfile

import pytest

from onnxfuse import cli, kernels, schema
from onnxfuse.kernels import ops_header

kbuild = importlib.import_module("onnxfuse.kernels.build")
ROOT = pathlib.Path(__file__).resolve().parents[2]
KERNELS = ROOT / "onnxfuse" / "kernels"


@pytest.fixture(scope="module")
def ort_headers() -> pathlib.Path:
    """The onnxruntime headers the default build uses (fetched once into the default cache if needed)."""
    include, _ = kbuild.find_ort_headers()
    return include


@pytest.fixture
def cache(tmp_path, monkeypatch, ort_headers) -> pathlib.Path:
    """An empty build cache of its own, headers from the default one."""
    monkeypatch.setenv("ONNXFUSE_BUILD_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(ort_headers))
    monkeypatch.delenv("ONNXFUSE_LIBRARY", raising=False)
    monkeypatch.delenv("ONNXFUSE_BACKENDS", raising=False)
    kernels._resolved.clear()
    yield tmp_path / "cache"
    kernels._resolved.clear()


# ------------------------------------------------------------------------------------------------ generated header
_C_PROGRAM = r"""
#include <stdio.h>
#include "onnxfuse_ops.h"
int main(void) {
  printf("{\"domain\": \"%s\", \"version\": %d, \"max_stack_layers\": %d, \"max_lora_rank\": %d,", ONNXFUSE_DOMAIN,
         ONNXFUSE_DOMAIN_VERSION, ONNXFUSE_MAX_STACK_LAYERS, ONNXFUSE_MAX_LORA_RANK);
  printf("\"dtypes\": [%d, %d, %d], \"acts\": {\"relu\": %d, \"sigmoid\": %d},", ONNXFUSE_FP32, ONNXFUSE_FP16,
         ONNXFUSE_BF16, ONNXFUSE_ACT_RELU, ONNXFUSE_ACT_SIGMOID);
  printf("\"stack_modes\": [%d, %d, %d, %d],", ONNXFUSE_STACK_AUTO, ONNXFUSE_STACK_FUSED, ONNXFUSE_STACK_LAYERS,
         ONNXFUSE_STACK_GRID);
  printf("\"interactions\": [%d, %d], \"hashes\": [%d, %d],", ONNXFUSE_INTERACTION_DOT, ONNXFUSE_INTERACTION_CAT,
         ONNXFUSE_HASH_NONE, ONNXFUSE_HASH_MOD);
  @KERNELS@
  printf("\"size_classes\": %d, \"max_m\": [%d, %d]}\n", ONNXFUSE_TRITON_NUM_SIZE_CLASSES, ONNXFUSE_TRITON_SMALL_MAX_M,
         ONNXFUSE_TRITON_MEDIUM_MAX_M);
  return 0;
}
"""


def _cpp_program() -> str:
    """A C++ program printing, as JSON, what the header's C++ part says about every op (struct per op)."""
    ops = []
    for op in schema.OPS.values():
        s = f"onnxfuse::schema::{op.name}"
        if op.variadic:
            idx = " << \",\" << ".join(f"{s}::{ops_header._camel(n.removesuffix('_i'))}(1)" for n in op.inputs[1:])
            inputs = f"\"[\" << {s}::kX << \",\" << {idx} << \"]\""
        else:
            inputs = ("\"[\" << " + " << \",\" << ".join(f"{s}::k{ops_header._camel(n)}" for n in op.inputs)
                      + " << \"]\"")
        attrs = f"[] {{ std::string a = \"[\"; for (int i = 0; i < {s}::kNumAttributes; ++i) " \
                f"a += std::string(i ? \",\" : \"\") + \"\\\"\" + {s}::kAttributes[i] + \"\\\"\"; " \
                f"return a + \"]\"; }}()"
        ops.append(f"  std::cout << \"\\\"\" << {s}::kName << \"\\\": {{\\\"inputs\\\": \" << {inputs} << "
                   f"\", \\\"attrs\\\": \" << {attrs} << \"}}\" << \",\";")
    defaults = []
    for a in {a.name: a for o in schema.OPS.values() for a in o.attrs}.values():
        c = ops_header._camel(a.name)
        value = f"\"\\\"\" << onnxfuse::schema::attr::k{c}Default << \"\\\"\"" if a.kind == "string" else \
            f"onnxfuse::schema::attr::k{c}Default"
        defaults.append(f"  std::cout << \"\\\"\" << onnxfuse::schema::attr::k{c} << \"\\\": \" << {value} << \",\";")
    names = lambda arr, n: (f"[] {{ std::string a = \"[\"; for (int i = 0; i < {n}; ++i) a += std::string(i ? \",\" : "
                            f"\"\") + \"\\\"\" + {arr}[i] + \"\\\"\"; return a + \"]\"; }}()")
    return "\n".join([
        "#include <iostream>", "#include <string>", '#include "onnxfuse_ops.h"', "int main() {",
        "  std::cout << \"{\\\"domain\\\": \\\"\" << onnxfuse::schema::kDomain << \"\\\", \\\"version\\\": \" << "
        "onnxfuse::schema::kDomainVersion << \", \\\"ops\\\": {\";",
        *ops,
        "  std::cout << \"\\\"_\\\": 0}, \\\"defaults\\\": {\";",
        *defaults,
        "  std::cout << \"\\\"_\\\": 0}, \\\"backends\\\": \" << "
        + names("onnxfuse::schema::kBackendNames", "onnxfuse::schema::kNumBackends") + ";",
        "  std::cout << \", \\\"activations\\\": \" << "
        + names("onnxfuse::schema::kActivationNames", "onnxfuse::schema::kNumActivations") + ";",
        "  std::cout << \", \\\"stack_modes\\\": \" << "
        + names("onnxfuse::schema::kStackModeNames", "onnxfuse::schema::kNumStackModes") + ";",
        "  std::cout << \", \\\"interactions\\\": \" << "
        + names("onnxfuse::schema::kInteractionNames", "onnxfuse::schema::kNumInteractions") + ";",
        "  std::cout << \", \\\"hashes\\\": \" << "
        + names("onnxfuse::schema::kHashNames", "onnxfuse::schema::kNumHashes") + ";",
        "  std::cout << \", \\\"size_max_m\\\": [\" << onnxfuse::triton::kSizeClassMaxM[0] << \",\" << "
        "onnxfuse::triton::kSizeClassMaxM[1] << \"], \\\"r_pads\\\": [\" << onnxfuse::triton::kRPads[0] << \",\" << "
        "onnxfuse::triton::kRPads[1] << \",\" << onnxfuse::triton::kRPads[2] << \"], \\\"mlp_stack_kernel\\\": \" << "
        "onnxfuse::triton::kMlpStack << \"}\" << std::endl;",
        "  return 0;", "}", ""])


def _c_program(table) -> str:
    """_C_PROGRAM with the Triton kernel ids printed from the header's macros, one per table.KERNEL_IDS entry."""
    keys = list(table.KERNEL_IDS)
    fmt = ", ".join(f'\\"{k}\\": %d' for k in keys)
    macros = ", ".join(f"ONNXFUSE_TRITON_{ops_header._upper(k)}" for k in keys)
    return _C_PROGRAM.replace("@KERNELS@", f'printf("\\"kernels\\": {{{fmt}}},", {macros});')


def _compile_and_run(tmp_path, source: str, compiler: list[str], name: str) -> dict:
    src = tmp_path / name
    src.write_text(source)
    exe = tmp_path / (name + ".bin")
    p = subprocess.run([*compiler, f"-I{tmp_path}", str(src), "-o", str(exe)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None, reason="needs gcc and g++")
def test_generated_header_matches_schema_in_c_and_cpp(tmp_path):
    ops_header.write(tmp_path)
    table = ops_header.triton_table()
    c = _compile_and_run(tmp_path, _c_program(table), ["gcc", "-std=c11", "-Wall", "-Werror", "-x", "c"], "c_part.c")
    assert c == {
        "domain": schema.DOMAIN, "version": schema.DOMAIN_VERSION, "max_stack_layers": schema.MAX_STACK_LAYERS,
        "max_lora_rank": table.MAX_LORA_RANK, "dtypes": [schema.TYPES.index(t) for t in schema.TYPES],
        "acts": schema.ACTIVATIONS, "stack_modes": list(range(len(schema.STACK_MODES))),
        "interactions": list(range(len(schema.INTERACTIONS))), "hashes": list(range(len(schema.HASHES))),
        "kernels": table.KERNEL_IDS, "size_classes": len(table.SIZE_CLASSES),
        "max_m": list(table.SIZE_CLASS_MAX_M)}
    cpp = _compile_and_run(tmp_path, _cpp_program(), ["g++", "-std=c++17", "-Wall", "-Werror"], "cpp_part.cc")
    assert cpp["domain"] == schema.DOMAIN and cpp["version"] == schema.DOMAIN_VERSION
    cpp["ops"].pop("_")
    assert list(cpp["ops"]) == list(schema.OPS)
    for name, op in schema.OPS.items():
        got = cpp["ops"][name]
        # MLPStack: X, then layer 1's (0-based) W and bias sit at 1 + 2 * 1 + 0 and + 1.
        want = [0, 3, 4] if op.variadic else list(range(len(op.inputs)))
        assert got == {"inputs": want, "attrs": list(op.attr_names)}, name
    cpp["defaults"].pop("_")
    want_defaults = {a.name: a.default for o in schema.OPS.values() for a in o.attrs}
    assert cpp["defaults"] == want_defaults
    assert cpp["backends"] == list(schema.BACKENDS)
    assert cpp["activations"] == ["", *schema.ACTIVATIONS]
    assert cpp["stack_modes"] == list(schema.STACK_MODES)
    assert cpp["interactions"] == list(schema.INTERACTIONS) and cpp["hashes"] == list(schema.HASHES)
    assert cpp["size_max_m"] == list(table.SIZE_CLASS_MAX_M) and cpp["r_pads"] == list(table.R_PADS)
    assert cpp["mlp_stack_kernel"] == table.KERNEL_IDS["mlp_stack"]


@pytest.mark.skipif(kbuild.find_nvcc() is None, reason="needs nvcc")
def test_generated_header_compiles_with_nvcc(tmp_path):
    """The .cu kernels include it through cuda/launch.h: it must stay free of onnxruntime and host-only code."""
    ops_header.write(tmp_path)
    src = tmp_path / "t.cu"
    src.write_text('#include "cuda/launch.h"\n'
                   '__global__ void k(int* p) { p[0] = ONNXFUSE_MAX_STACK_LAYERS + ONNXFUSE_ACT_SIGMOID; }\n'
                   'int host() { return onnxfuse::schema::MLPStack::W(1) + onnxfuse::triton::kRPads[0]; }\n')
    p = subprocess.run([str(kbuild.find_nvcc()), "-std=c++17", f"-I{tmp_path}", f"-I{KERNELS}", "-c", str(src), "-o",
                        str(tmp_path / "t.o")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def _string_literals(path: pathlib.Path) -> list[str]:
    text = path.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return re.findall(r'"((?:[^"\\\n]|\\.)*)"', text)


def test_cpp_sources_take_the_domain_from_the_generated_header():
    """No op name, domain, attribute name, backend, activation or stack-mode name is spelled as a string literal in
    the C++/CUDA sources: they come from onnxfuse_ops.h. The library reads no environment but the two CPU knobs, the
    GPU launchers' PDL switch and the int4 ops' CUTLASS switch, and prints nothing."""
    forbidden = {schema.DOMAIN, *schema.OPS, *schema.BACKENDS, *schema.STACK_ACTIVATIONS, *schema.STACK_MODES,
                 *schema.INTERACTIONS, *schema.HASHES,
                 *(a.name for o in schema.OPS.values() for a in o.attrs)}
    sources = [p for p in kbuild.source_files() if p.suffix in (".cc", ".h", ".cu", ".cuh")]
    assert any(p.name == "ops_cuda.cc" for p in sources) and any(p.parent.name == "common" for p in sources)
    found = {(str(p.relative_to(KERNELS)), lit) for p in sources for lit in _string_literals(p) if lit in forbidden}
    assert not found, sorted(found)
    env_reads = {(str(p.relative_to(KERNELS)), m) for p in sources
                 for m in re.findall(r'getenv\("([^"]*)"\)', p.read_text())}
    # the CPU kernels' two knobs, the GPU launchers' switches for programmatic dependent launches (read once for
    # the CUDA kernels and the Triton runtime) and for launching them so into a CUDA graph capture, the int4 ops'
    # switches for CUTLASS's sm_90 GEMM and for the rows path (Int4MmaGemm), CachedAttention's for its clustered decode
    # kernel and LinearSkipRMSNorm's for the norm in its GEMV's epilogue (each read once; for A/B runs: no switch
    # picks a backend)
    assert env_reads == {("cpu/gemm.cc", "ONNXFUSE_CPU_THREADS"), ("cpu/gemm.cc", "ONNXFUSE_CPU_ISA"),
                         ("cuda/gemm.cu", "ONNXFUSE_PDL"), ("cuda/gemm.cu", "ONNXFUSE_PDL_GRAPH"),
                         ("cuda/cutlass/int4_mixed_gemm.cu", "ONNXFUSE_INT4_CUTLASS"),
                         ("cuda/int4_linear.cu", "ONNXFUSE_INT4_ROWS"),
                         ("cuda/cached_attention.cu", "ONNXFUSE_DECODE_CLUSTERS"),
                         ("cuda/linear.cu", "ONNXFUSE_LINEAR_NORM_EPILOGUE")}, env_reads
    printing = [str(p.relative_to(KERNELS)) for p in sources
                if re.search(r"\b(f?printf|puts|std::cout|std::cerr|std::clog)\b",
                             re.sub(r"//[^\n]*", "", p.read_text()))]
    assert not printing, printing


def test_python_mirrors_read_the_schema():
    """functions.py and the scripts take the domain version from schema.py instead of a literal 1."""
    offenders = []
    for p in [ROOT / "onnxfuse" / "functions.py", ROOT / "onnxfuse" / "fuse.py",
              *sorted((ROOT / "scripts").glob("*.py"))]:
        for m in re.finditer(r"(make_opsetid\([^)]*DOMAIN[^)]*,\s*1\)|setdefault\(DOMAIN,\s*1\))", p.read_text()):
            offenders.append((p.name, m.group(0)))
    assert not offenders, offenders


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="needs setuptools to build a wheel")
def test_wheel_ships_every_file_the_build_reads(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "models", "benchmarks", "build",
                                                             "*.egg-info", "__pycache__", "*.onnx", "*.data", ".*"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (wheel,) = (tmp_path / "dist").glob("onnxfuse-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    needed = {f"onnxfuse/kernels/{f.relative_to(KERNELS)}" for f in kbuild.source_files()}
    assert any(n.endswith(".cu") for n in needed) and any(n.startswith("onnxfuse/kernels/triton/") for n in needed)
    assert needed <= shipped, sorted(needed - shipped)


# ------------------------------------------------------------------------------------------------ cache and failures
def _broken_headers(tmp_path, good: pathlib.Path, marker: str) -> pathlib.Path:
    bad = tmp_path / "broken-include"
    if bad.exists():
        shutil.rmtree(bad)
    shutil.copytree(good, bad)
    lite = bad / "onnxruntime_lite_custom_op.h"
    lite.write_text(lite.read_text() + f'\n#error "{marker}"\n')
    return bad


def test_cache_lives_in_the_user_cache_dir(monkeypatch):
    monkeypatch.delenv("ONNXFUSE_BUILD_DIR", raising=False)
    platformdirs = pytest.importorskip("platformdirs")  # a declared dependency; a bare environment may lack it
    assert kbuild.build_dir() == pathlib.Path(platformdirs.user_cache_dir("onnxfuse")) / "kernels"
    assert not kbuild.build_dir().is_relative_to(ROOT / "onnxfuse")
    monkeypatch.setenv("ONNXFUSE_BUILD_DIR", "/tmp/somewhere")
    assert kbuild.build_dir() == pathlib.Path("/tmp/somewhere")


def test_a_failed_build_is_remembered_until_inputs_change_or_force(cache, tmp_path, ort_headers, monkeypatch, capsys):
    """A broken header fails the cpu stage; the next library_path() raises the same error at once (no compiler
    run), naming the log; `onnxfuse build --force` retries; other inputs (another header edit) build anew."""
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(_broken_headers(tmp_path, ort_headers, "broken header one")))
    assert cli.main(["build", "--backends", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "cpu stage failed" in err and "broken header one" in err, err
    stages = re.findall(r"onnxfuse build \[\d/4\] (\w+)", err)
    assert stages == ["headers", "configure", "cpu"], err
    (record,) = [e for e in kernels.cache_entries() if e["status"] == "failed"]
    assert record["stage"] == "cpu" and pathlib.Path(record["log"]).is_file()
    assert "broken header one" in pathlib.Path(record["log"]).read_text()

    t0 = time.monotonic()
    with pytest.raises(kernels.BuildError) as info:
        kernels.library_path(provider="cpu")
    assert time.monotonic() - t0 < 10  # remembered: no configure, no compile
    msg = str(info.value)
    assert "broken header one" in msg and "remembered" in msg and record["log"] in msg and "--force" in msg

    assert cli.main(["build", "--backends", "cpu", "--force"]) == 2  # really retried: the stages run again
    err = capsys.readouterr().err
    assert "cpu stage failed" in err and "remembered" not in err and "[3/4] cpu" in err
    assert cli.main(["build", "--backends", "cpu", "--force", "-q"]) == 2  # -q: the error only, no stages
    err = capsys.readouterr().err
    assert err.startswith("onnxfuse: error: kernel library build failed: cpu stage failed") and "[3/4]" not in err

    monkeypatch.setenv("ORT_INCLUDE_DIR", str(_broken_headers(tmp_path, ort_headers, "broken header two")))
    with pytest.raises(kernels.BuildError, match="broken header two") as info:
        kernels.build(backends=["cpu"], quiet=True)
    assert "remembered" not in str(info.value)  # new inputs, new key: built (and failed) for real


def test_bad_ort_include_dir_is_one_clear_line(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(tmp_path))
    assert cli.main(["build", "--backends", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ORT_INCLUDE_DIR=" in err and "set ORT_INCLUDE_DIR" in err, err


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory, ort_headers):
    """A cache holding the automatic (first-use) build of a CPU session, made once for this module: (cache, library,
    what the build printed on stderr). Where onnxruntime has no CUDA EP, CPU-only is library_path()'s own choice."""
    cache = tmp_path_factory.mktemp("built") / "cache"
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err):
        mp.setenv("ONNXFUSE_BUILD_DIR", str(cache))
        mp.setenv("ORT_INCLUDE_DIR", str(ort_headers))
        mp.delenv("ONNXFUSE_LIBRARY", raising=False)
        mp.delenv("ONNXFUSE_BACKENDS", raising=False)
        if kbuild.onnxruntime_has_cuda():  # keep it a CPU build there too (the next test then skips)
            mp.setenv("ONNXFUSE_BACKENDS", "cpu")
        kernels._resolved.clear()
        lib = kernels.library_path(provider="cpu")
        kernels._resolved.clear()
    return cache, lib, err.getvalue()


@pytest.fixture
def cpu_cache(built_cache, monkeypatch, ort_headers):
    """The module's built cache, as this test's ONNXFUSE_BUILD_DIR."""
    cache, lib, err = built_cache
    monkeypatch.setenv("ONNXFUSE_BUILD_DIR", str(cache))
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(ort_headers))
    monkeypatch.delenv("ONNXFUSE_LIBRARY", raising=False)
    monkeypatch.delenv("ONNXFUSE_BACKENDS", raising=False)
    kernels._resolved.clear()
    yield cache, lib, err
    kernels._resolved.clear()


def test_automatic_build_is_cpu_only_without_a_cuda_ep(cpu_cache):
    """On a CPU-only onnxruntime the first-use build compiles the CPU backend only, even with nvcc present, and
    says so in one line with the log path."""
    from onnxfuse.kernels.build import onnxruntime_has_cuda
    if onnxruntime_has_cuda():
        pytest.skip("this onnxruntime has the CUDA EP")
    cache, lib, err = cpu_cache
    assert kernels.build_info(lib)["backends"] == ["cpu"]
    assert lib.parent.parent == cache
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "building the kernel library (cpu)" in lines[0], err
    log = re.search(r"log: (\S+)", lines[0]).group(1)
    assert pathlib.Path(log).is_file() and "== link" in pathlib.Path(log).read_text()


def test_cached_build_covering_the_session_is_reused(cpu_cache, capfd):
    """A CPU session takes a library built with --backends cpu; no rebuild, no message."""
    cache, lib, _ = cpu_cache
    kernels._resolved.clear()
    t0 = time.monotonic()
    assert kernels.library_path(provider="cpu") == lib
    assert time.monotonic() - t0 < 20
    assert capfd.readouterr().err == ""
    assert kbuild.find_cached({"cpu"}) == lib
    assert kbuild.find_cached({"cpu", "cuda"}) is None  # a CUDA session needs the CUDA kernels


def test_build_uses_the_same_cached_library(cpu_cache, capfd):
    cache, lib, _ = cpu_cache
    assert cli.main(["build", "--backends", "cpu", "--json"]) == 0
    out = capfd.readouterr()
    data = json.loads(out.out)
    assert data["cached"] is True and pathlib.Path(data["path"]) == lib
    assert out.err == ""  # --json: no progress, no notice


def test_print_path_is_stable(cpu_cache, capfd):
    cache, lib, _ = cpu_cache
    assert cli.main(["build", "--print-path"]) == 0
    first = capfd.readouterr()
    assert first.err == "" and len(first.out.splitlines()) == 1
    stable = pathlib.Path(first.out.strip())
    assert stable == cache / "stable" / "cpu" / "libonnxfuse_ops.so" and stable.resolve() == lib.resolve()
    assert kernels.build_info(stable)["cache_key"] == lib.parent.name
    assert cli.main(["build", "--print-path", "-q"]) == 0
    assert capfd.readouterr().out.strip() == str(stable)
    assert cli.main(["build", "--backends", "cpu", "--print-path"]) == 0  # explicit: the same configuration
    assert capfd.readouterr().out.strip() == str(stable)
    assert cli.main(["build", "--print-path", "--json"]) == 0
    data = json.loads(capfd.readouterr().out)
    assert data == {"path": str(stable), "library": str(lib.resolve())}


def _fake_build(cache: pathlib.Path, lib: pathlib.Path, key: str, backends: list[str],
                archs: list[str]) -> pathlib.Path:
    """A cache entry of another configuration (the CPU library's file with a build_info saying otherwise): enough
    for the stable links, which read the configuration from build_info.json."""
    d = cache / key
    d.mkdir()
    shutil.copy2(lib, d / lib.name)
    info = json.loads((lib.parent / "build_info.json").read_text())
    (d / "build_info.json").write_text(json.dumps({**info, "backends": backends, "archs": archs, "cache_key": key}))
    return d / lib.name


def test_stable_path_is_not_moved_by_other_configurations(cpu_cache, tmp_path, monkeypatch, capfd):
    """The issue's case: a script keeps the path of a CPU+CUDA+Triton library; a CPU-only session afterwards (a CPU
    test run) must not re-point it at a CPU-only build. Each configuration has its own link; only a newer build of
    the same configuration moves it."""
    shutil.copytree(cpu_cache[0], tmp_path / "cache", symlinks=True)
    cache = tmp_path / "cache"
    monkeypatch.setenv("ONNXFUSE_BUILD_DIR", str(cache))
    cpu_lib = cache / cpu_cache[1].parent.name / cpu_cache[1].name
    full = _fake_build(cache, cpu_lib, "00000000000000aa", ["cpu", "cuda", "triton"], ["90"])
    kept = kbuild.link_stable(full)
    assert kept == cache / "stable" / "cpu-cuda-triton-sm90" / "libonnxfuse_ops.so"
    assert kept == kbuild.stable_path(["cpu", "cuda", "triton"], ["90"])
    kernels._resolved.clear()
    assert kernels.library_path(provider="cpu") == cpu_lib  # a CPU session: the CPU-only build...
    assert cli.main(["build", "--print-path"]) == 0
    assert capfd.readouterr().out.strip() == str(cache / "stable" / "cpu" / "libonnxfuse_ops.so")
    assert kept.resolve() == full.resolve()  # ...and the kept path still names the full library
    assert json.loads((kept.parent / "build_info.json").read_text())["backends"] == ["cpu", "cuda", "triton"]
    newer = _fake_build(cache, cpu_lib, "00000000000000bb", ["cpu", "cuda", "triton"], ["90"])
    assert kbuild.link_stable(newer) == kept and kept.resolve() == newer.resolve()  # same configuration: moves
    other_arch = _fake_build(cache, cpu_lib, "00000000000000cc", ["cpu", "cuda", "triton"], ["80", "90"])
    assert kbuild.link_stable(other_arch).parent.name == "cpu-cuda-triton-sm80-sm90"
    assert kept.resolve() == newer.resolve()
    assert kbuild.stable_links() == {"cpu": cpu_lib.parent.name, "cpu-cuda-triton-sm80-sm90": "00000000000000cc",
                                     "cpu-cuda-triton-sm90": "00000000000000bb"}


def test_quiet_build_prints_nothing(cpu_cache, capfd):
    assert cli.main(["build", "--backends", "cpu", "-q"]) == 0
    out = capfd.readouterr()
    assert out.out == "" and out.err == ""


def test_cache_list_and_clean(cpu_cache, tmp_path, ort_headers, monkeypatch, capfd):
    shutil.copytree(cpu_cache[0], tmp_path / "cache", symlinks=True)  # a copy of its own: this test empties it
    cache = tmp_path / "cache"
    lib = cache / cpu_cache[1].parent.name / cpu_cache[1].name
    monkeypatch.setenv("ONNXFUSE_BUILD_DIR", str(cache))
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(_broken_headers(tmp_path, ort_headers, "for the listing")))
    with pytest.raises(kernels.BuildError):
        kernels.build(backends=["cpu"], quiet=True)
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(ort_headers))
    assert cli.main(["cache", "--json"]) == 0
    data = json.loads(capfd.readouterr().out)
    assert data["cache"] == str(cache)
    by_status = {e["status"]: e for e in data["entries"]}
    assert set(by_status) == {"ok", "failed"}, data
    ok = by_status["ok"]
    assert ok["key"] == lib.parent.name and ok["backends"] == ["cpu"] and ok["stable"] == ["cpu"]
    assert ok["size_bytes"] >= lib.stat().st_size and ok["age_s"] >= 0
    assert by_status["failed"]["stage"] == "cpu"
    assert cli.main(["cache"]) == 0
    table = capfd.readouterr().out
    assert lib.parent.name in table and "ok (stable: cpu)" in table and "failed at cpu" in table

    (cache / "ort-headers-1.21").mkdir()  # a fetched-headers copy survives a plain clean
    assert cli.main(["cache", "clean"]) == 0
    assert "removed" in capfd.readouterr().out
    assert not lib.exists() and not (cache / "stable").exists() and not (cache / "failed").exists()
    assert (cache / "ort-headers-1.21").is_dir()
    assert cli.main(["cache", "--json"]) == 0 and json.loads(capfd.readouterr().out)["entries"] == []
    assert cli.main(["cache", "clean", "--all", "-q"]) == 0
    assert capfd.readouterr().out == "" and not (cache / "ort-headers-1.21").exists()


def aot_specialisations(archs):
    """triton/aot.py's specialisations (the module runs as a script: imported by path)."""
    sys.path.insert(0, str(KERNELS / "triton"))
    try:
        aot = importlib.import_module("aot")
    finally:
        sys.path.pop(0)
    return aot.specialisations(archs)


def test_aot_specialisations():
    """The cubin set of an sm_90 build, with its persistent TMA builds."""
    default = list(aot_specialisations(["90"]))
    # linear_act, linear, swiglu, mlp_stack, rotary_embedding, embedding, mlp_stack_grid, cached_attention and the
    # three flash_attention kernels 18 each; int4_linear and int4_swiglu 36 each (with and without zero points);
    # lora_xa, lora_main, lora_swiglu, lora_gate, multi_lora_xa, multi_lora_main and multi_lora_swiglu 54 each (x 3 rank
    # paddings); embedding_interaction 24 (3 dtypes x 8 (NP, DP) tiles); then the persistent TMA builds: linear_act's
    # and lora_main's (x 3 rank paddings) aligned fp16/bf16 large class, 8
    assert len(default) == 680
    zp = [s for s in default if s["kernel"].startswith("int4")]
    assert sorted({s["r_pad"] for s in zp}) == [0, 1] and len(zp) == 72
    tma = [s for s in default if s["tma"]]
    assert {(s["kernel"], s["dtype"], s["size"], s["aligned"]) for s in tma} == {
        (k, d, "large", 1) for k in ("linear_act", "lora_main") for d in ("fp16", "bf16")} and len(tma) == 8
    # each beside the cp.async build of the same key and config, and none for sm_80
    plain = {(s["kernel"], s["dtype"], s["size"], s["aligned"], s["r_pad"], s["config"]) for s in default
             if not s["tma"]}
    assert all((s["kernel"], s["dtype"], s["size"], 1, s["r_pad"], s["config"]) in plain for s in tma)
    assert not any(s["tma"] for s in aot_specialisations(["80"]))


def test_aot_pdl_dependents():
    """The table's pdl flag (the launcher may start the kernel as a programmatic dependent) is set exactly on the
    sm_90 builds of table.PDL_DEPENDENTS, which are compiled with the wait before they read phase 1's partials; phase
    1 (it only signals) and every sm_80 build (no griddepcontrol there) stay plain launches."""
    pytest.importorskip("triton")
    aot = kbuild.aot_module()
    assert aot.TABLE.PDL_DEPENDENTS == ("lora_main", "lora_swiglu", "multi_lora_swiglu", "multi_lora_main")
    assert aot.TABLE.LORA_PDL_MAX_M == 16
    want = {("lora_swiglu", "90"): 1, ("lora_main", "90"): 1, ("lora_xa", "90"): 0, ("lora_swiglu", "80"): 0,
            ("multi_lora_swiglu", "90"): 1, ("multi_lora_xa", "90"): 0, ("multi_lora_main", "90"): 1,
            ("multi_lora_swiglu", "80"): 0}
    got = {}
    for spec in aot.specialisations(["90", "80"]):
        key = (spec["kernel"], spec["arch"])
        if key in want and key not in got and spec["dtype"] == "fp16" and spec["size"] == "small" \
                and spec["aligned"] and spec["r_pad"] == 16:
            got[key] = aot.compile_one(spec)["pdl"]
    assert got == want


# ------------------------------------------------------------------------------------------------ GPU backends compile
@pytest.mark.skipif(kbuild.find_nvcc() is None or kbuild.triton_version() is None, reason="needs nvcc and triton")
def test_cuda_and_triton_backends_compile(cache, capfd):
    """CI has no GPU but has nvcc and Triton: prove the CUDA and Triton backends build (66 s on the 2-core CPU
    machine with a warm Triton cache), with every stage reported, the whole cubin set, only
    the two exported symbols and no link to cuBLAS or the CUDA driver. The sessions of the other tests use the
    CPU-only automatic build."""
    assert cli.main(["build", "--backends", "cpu,cuda,triton"]) == 0
    err = capfd.readouterr().err
    assert re.findall(r"onnxfuse build \[\d/6\] (\w+)", err) == list(kbuild.STAGES), err
    lib = kbuild.stable_path(["cpu", "cuda", "triton"], ["90"]).resolve()
    info = json.loads((lib.parent / "build_info.json").read_text())
    assert info["backends"] == ["cpu", "cuda", "triton"]
    assert info["artifacts"]["triton_cubins"] == len(list(aot_specialisations(["90"])))
    found, version, why = kbuild.find_cutlass()
    if found is not None:  # CUTLASS's sm_90a int4 GEMM built: its folder and version in the build info
        assert info["cutlass"] == f"{version} {found}", info
        assert "CUTLASS kernels for sm_90a" in (lib.parent / "build.log").read_text()
    else:
        assert info["cutlass"] is None, (info, why)
    assert kernels.build_info(lib)["cache_key"] == lib.parent.name
    if shutil.which("nm"):
        out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
        assert sorted(ln.split()[-1] for ln in out.splitlines() if ln.strip()) == [
            "RegisterCustomOps", "onnxfuse_build_info", "onnxfuse_host_info"]
    if shutil.which("readelf"):  # cuBLASLt is dlopen'ed at run time, the driver API never linked
        needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
        assert "NEEDED" in needed and not re.search(r"NEEDED.*(libcublas|libcuda\.so|libcudart\.so)", needed), needed


def test_find_cutlass_by_env(tmp_path, monkeypatch):
    """ONNXFUSE_CUTLASS_DIR: off builds without CUTLASS (with the reason); a folder without CUTLASS's headers is one
    BuildError naming the fix; a folder with them is taken with the version its version.h says."""
    from onnxfuse.kernels.toolchain import BuildError, find_cutlass
    monkeypatch.setenv("ONNXFUSE_CUTLASS_DIR", "off")
    assert find_cutlass() == (None, "", "disabled by ONNXFUSE_CUTLASS_DIR=off")
    monkeypatch.setenv("ONNXFUSE_CUTLASS_DIR", str(tmp_path))
    with pytest.raises(BuildError, match="has no include/cutlass/cutlass.h.*ONNXFUSE_CUTLASS_DIR=off"):
        find_cutlass()
    inc = tmp_path / "include" / "cutlass"
    inc.mkdir(parents=True)
    (inc / "cutlass.h").write_text("")
    (inc / "version.h").write_text("#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0\n")
    assert find_cutlass() == (tmp_path.resolve(), "4.2.0", "")


def test_a_copied_library_without_its_onednn_names_the_fix(tmp_path):
    """A library built with oneDNN and copied where libdnnl.so.3 is not found fails to register with one line that
    names the fix, not onnxruntime's bare dlopen error."""
    ort = pytest.importorskip("onnxruntime")
    from onnxfuse import kernels
    lib = kernels.library_path(provider="cpu")
    if not kernels.build_info(lib).get("cpu_gemm", "").startswith("onednn "):  # "builtin (why not oneDNN)"
        pytest.skip("this library was built without oneDNN")
    data = pathlib.Path(lib).read_bytes()
    runpath = [p for p in
               subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout.splitlines()
               if "RUNPATH" in p or "RPATH" in p]
    if not runpath:
        pytest.skip("no RUNPATH to redirect")
    old = runpath[0].split("[", 1)[1].rstrip("]").split(":")[0].encode()
    copied = tmp_path / "libonnxfuse_ops.so"
    copied.write_bytes(data.replace(old, b"/" + b"x" * (len(old) - 1)))
    # a fresh process: this one may have libdnnl.so.3 loaded already (build_info opened the library)
    code = ("import sys, onnxruntime as ort\nfrom onnxfuse import kernels\n"
            "try:\n    kernels.register(ort.SessionOptions(), sys.argv[1])\n"
            "except kernels.BuildError as e:\n    print(e)\n    sys.exit(3)\n")
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    p = subprocess.run([sys.executable, "-c", code, str(copied)], capture_output=True, text=True, env=env)
    assert p.returncode == 3, p.stdout + p.stderr
    assert re.search(r"libdnnl\.so\.3.*ONNXFUSE_ONEDNN_ROOT=off", p.stdout) and len(p.stdout.splitlines()) == 1
    with pytest.raises(kernels.BuildError, match="no such file"):
        kernels.register(ort.SessionOptions(), tmp_path / "absent.so")
