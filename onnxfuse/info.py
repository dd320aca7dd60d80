"""`onnxfuse info`: what this machine offers onnxfuse (versions, providers, GPU, headers, kernel library)."""
from __future__ import annotations

import importlib
import platform
import shutil
import subprocess

from . import __version__


def _version(module: str) -> str | None:
    try:
        return getattr(importlib.import_module(module), "__version__", "?")
    except Exception:
        return None


def collect(check: bool = False) -> dict:
    data: dict = {"onnxfuse": __version__, "python": platform.python_version(), "platform": platform.platform()}
    data["versions"] = {m: _version(m) for m in ("torch", "onnx", "onnxruntime", "onnxscript", "onnx_ir",
                                                   "transformers", "peft", "triton", "netron")}
    try:
        import onnxruntime as ort
        data["providers"] = ort.get_available_providers()
    except Exception:
        data["providers"] = []
    data["gpu"] = _gpus()
    data["nvcc"] = shutil.which("nvcc") or (shutil.which("/usr/local/cuda/bin/nvcc") and "/usr/local/cuda/bin/nvcc")
    data["kernels"] = kernel_status()
    if check:
        from .kernels import doctor
        rows = doctor.run_doctor()
        data["check"] = rows
        data["check_passed"] = all(r.get("status") in ("PASS", "skipped") or str(r.get("status", "")).startswith("skipped")
                                   for r in rows)
    return data


def kernel_status() -> dict:
    """Headers, buildable backends and the newest cached library, without compiling or downloading anything."""
    from . import kernels
    import importlib
    kb = importlib.import_module("onnxfuse.kernels.build")  # the package re-exports a function named build
    out: dict = {"buildable backends": ", ".join(kernels.available_backends()), "cache": str(kernels.build_dir())}
    try:
        _, source = kb.find_ort_headers(fetch=False)
        out["ORT headers"] = source
    except Exception as e:
        out["ORT headers"] = f"not found locally ({str(e).splitlines()[0]}); 'onnxfuse build' fetches them"
    try:
        lib = kernels.library_path(build_if_missing=False)
        info = kernels.build_info(lib)
        out["library"] = str(lib)
        out["library backends"] = ", ".join(info.get("backends", []))
        out["library archs"] = ", ".join(info.get("archs", [])) or "-"
    except Exception as e:
        out["library"] = f"not built ({str(e).splitlines()[0]}); run 'onnxfuse build'"
    return out


def _gpus() -> list[str]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return [line.strip() for line in out.stdout.splitlines() if line.strip()]
    except Exception:
        return []


def print_info(data: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    con = Console(highlight=False)
    t = Table(title=f"onnxfuse {data['onnxfuse']} (Python {data['python']})", show_header=False)
    t.add_column("what")
    t.add_column("value")
    for k, v in data["versions"].items():
        t.add_row(k, v or "[dim]not installed[/]")
    t.add_row("onnxruntime providers", ", ".join(data["providers"]) or "-")
    t.add_row("GPU", "; ".join(data["gpu"]) or "none")
    t.add_row("nvcc", data["nvcc"] or "not found (CPU-only kernel library)")
    k = data.get("kernels", {})
    for key, val in k.items():
        t.add_row(f"kernels: {key}", str(val))
    con.print(t)
    if "check" in data:
        c = Table(title="kernel check (each op against PyTorch)")
        cols = sorted({key for row in data["check"] for key in row})
        for col in cols:
            c.add_column(col)
        for row in data["check"]:
            c.add_row(*[str(row.get(col, "")) for col in cols])
        con.print(c)
