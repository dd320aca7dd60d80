"""The host's CPU as the CPU kernels see it: its model, its vector ISA family, and what the kernel library runs on it.

The CPU kernels choose their code at run time (kernels/cpu/gemm.cc: an AVX-512, AVX2+FMA+F16C or baseline x86-64
micro-kernel; oneDNN: its own dispatch, bf16/fp16 matmuls only where the CPU has them), so the same build computes
differently, and at a different speed, on different hosts. `describe()` names the host and, with a library, what it
runs there (`kernels.host_info`); bench results, `doctor` and CI print it, and tests take their expectations from it.
"""
from __future__ import annotations

import os
import pathlib
import platform

# The built-in GEMM's micro-kernel families (gemm.cc SelectIsa), highest first, with the CPU flags each needs.
FAMILIES = (("avx512", ("avx512f", "avx512vl", "avx512bw", "avx512dq", "avx2", "fma", "f16c")),
            ("avx2", ("avx2", "fma", "f16c")),
            ("generic", ()))
# The environment variables that force a lower family (ours, and oneDNN's two spellings of its cap).
FORCING_VARIABLES = ("ONNXFUSE_CPU_ISA", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
# Flags worth naming in a result: the ones that change which kernel runs.
_NOTABLE = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni",
            "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_bf16", "amx_tile", "amx_fp16")


CPUINFO = pathlib.Path("/proc/cpuinfo")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        text = CPUINFO.read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def physical_cores() -> int:
    """The physical cores this process may run on (distinct core ids of its CPUs; their count where the topology
    is unreadable)."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores = set()
    for c in cpus:
        topo = pathlib.Path(f"/sys/devices/system/cpu/cpu{c}/topology")
        try:
            cores.add((topo.joinpath("physical_package_id").read_text().strip(),
                       topo.joinpath("core_id").read_text().strip()))
        except OSError:
            return len(cpus)
    return max(1, len(cores))


def cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_id() -> dict:
    """Vendor, family, model and stepping (/proc/cpuinfo): what tells CPUs of one model name apart, e.g. a virtual
    machine's "AMD EPYC" that is a Zen 1 (family 23, model 1: 128-bit FMA units) or a Zen 3 (family 25)."""
    info = _cpuinfo()
    out: dict = {"vendor": info.get("vendor_id", "")}
    for key, name in (("cpu family", "family"), ("model", "model"), ("stepping", "stepping")):
        try:
            out[name] = int(info[key])
        except (KeyError, ValueError):
            out[name] = None
    return out


def cpu_flags() -> set[str]:
    return set(_cpuinfo().get("flags", "").split())


def vector_isa(flags: set[str] | None = None) -> str:
    """The highest micro-kernel family this CPU supports ("avx512", "avx2", "generic"), as gemm.cc decides it."""
    flags = cpu_flags() if flags is None else flags
    return next(name for name, need in FAMILIES if all(f in flags for f in need))


def kernel_family() -> str:
    """The family the CPU kernels run on this host: vector_isa(), or a lower one that ONNXFUSE_CPU_ISA forces (as
    gemm.cc decides it: a family the CPU lacks is not taken)."""
    order = [name for name, _ in FAMILIES]
    natural = vector_isa()
    forced = os.environ.get("ONNXFUSE_CPU_ISA", "")
    return forced if forced in order and order.index(forced) > order.index(natural) else natural


def describe(lib: str | os.PathLike | None = None) -> dict:
    """The host: CPU model, threads, vector ISA family and notable flags, any forcing variables set, and (with a
    built library) what its CPU kernels run here: the built-in GEMM's family and oneDNN's ISA and matmul per type."""
    flags = cpu_flags()
    out = {"cpu_model": cpu_model(), "cpu_id": cpu_id(), "threads": os.cpu_count(), "vector_isa": vector_isa(flags),
           "kernel_family": kernel_family(),
           "flags": sorted(f for f in _NOTABLE if f in flags),
           "forced": {v: os.environ[v] for v in FORCING_VARIABLES if os.environ.get(v)}}
    if lib is not None:
        from . import kernels
        try:
            out["kernels"] = kernels.host_info(lib)
        except Exception as e:  # an old library without onnxfuse_host_info, or one that does not load
            out["kernels"] = {"error": str(e).splitlines()[0] if str(e) else type(e).__name__}
    return out


def family(desc: dict) -> str:
    """The host family a CPU result belongs to: the family the kernels ran (forced or not), e.g. "avx2"."""
    return (desc.get("kernels") or {}).get("gemm_isa") or desc.get("kernel_family") or desc["vector_isa"]


def summary(desc: dict) -> str:
    """One line: 'AMD EPYC (2 threads, family 23 model 1), vector ISA avx2 (no AVX-512); built-in GEMM avx2; oneDNN
    avx2: float gemm:jit:f32, ...'."""
    isa = desc["vector_isa"]
    ident = desc.get("cpu_id") or {}
    fam = f", family {ident['family']} model {ident['model']}" if ident.get("family") is not None else ""
    text = f"{desc['cpu_model']} ({desc['threads']} threads{fam}), vector ISA {isa}"
    if isa != "avx512":
        text += " (no AVX-512)"
    if desc.get("forced"):
        text += ", forced " + " ".join(f"{k}={v}" for k, v in desc["forced"].items())
    k = desc.get("kernels")
    if k and "error" not in k:
        text += f"; built-in GEMM {k['gemm_isa']}"
        dnnl = k.get("onednn")
        if dnnl:
            text += f"; oneDNN {dnnl['isa']}: " + ", ".join(f"{t} {impl or 'none'}"
                                                            for t, impl in dnnl["matmul"].items())
        else:
            text += "; no oneDNN"
    elif k:
        text += f"; kernels: {k['error']}"
    return text
