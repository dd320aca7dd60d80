"""`onnxfuse info`: what this machine offers onnxfuse (versions, providers, GPU, headers, kernel library)."""
from __future__ import annotations

import importlib
import os
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
    """What `onnxfuse info --json` prints: versions, providers, GPUs, nvcc, kernel_status(); with check, the doctor's
    rows ("check"), their summary ("check_summary", see check_summary) and "check_passed"."""
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
    from . import host
    lib = data["kernels"].get("library", "")  # a path, or why there is none
    data["host"] = host.describe(lib if os.path.isfile(lib) else None)
    if check:
        from . import doctor
        rows = doctor.run_doctor()
        data["check"] = rows
        data["check_summary"] = check_summary(rows)
        data["check_passed"] = data["check_summary"]["passed"]  # skipped checks (no GPU here) are not failures
    return data


def doctor_command(args, console) -> int:
    """`onnxfuse doctor`: run the checks the flags choose (then the special-values ones with --special-values),
    print them (each row as it finishes with --verbose, else the table; JSON with --json), return the exit code."""
    import json

    from . import doctor
    verbose = args.verbose and not (args.quiet or args.json)
    chosen = {k: v for k, v in (("ops", args.ops), ("dtypes", args.dtypes), ("modes", args.modes)) if v}
    on_row = (lambda r: print(doctor.format_row(r), flush=True)) if verbose else None
    run = dict(providers=tuple(args.providers or ("cpu", "cuda")), backends=args.backends, lib_path=args.lib,
               on_row=on_row, **chosen)
    rows = doctor.run_doctor(**run)
    if args.special_values:
        rows += doctor.run_doctor(**run, special=True)
    summary = check_summary(rows)
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary, "passed": summary["passed"]}, indent=2))
    elif not args.quiet:  # with --verbose the rows were printed as they ran: the failures and counts are left
        print_check(console(), rows, title="onnxfuse doctor: every op x backend against PyTorch",
                    every=not verbose, notes=doctor.library_notes(args.lib))
    return 0 if summary["passed"] else 1


def check_summary(rows: list[dict]) -> dict:
    """Counts of the doctor's rows (passed, failed = FAIL or ERROR, skipped), the skip reasons with their counts,
    the failed rows in full, and `passed`: True when nothing failed (skips do not fail a check)."""
    failures = [r for r in rows if r.get("status") in ("FAIL", "ERROR")]
    reasons: dict[str, int] = {}
    for r in rows:
        if r.get("status") == "SKIP":
            reason = str(r.get("detail") or "skipped").removeprefix("skipped: ")
            reasons[reason] = reasons.get(reason, 0) + 1
    return {"checks": len(rows), "pass": sum(r.get("status") == "PASS" for r in rows), "fail": len(failures),
            "skip": sum(reasons.values()), "skip_reasons": reasons, "failures": failures, "passed": not failures}


def _shape(r: dict) -> str:
    return (f"M{r['M']} K{r['K']} N{r['N']}" + (f" r{r['r']}" if r.get("r") else "") +
            (f" {r['layers']}" if r.get("layers") else ""))


def print_check(con, rows: list[dict], title: str, every: bool = False, notes=()) -> None:
    """The doctor's rows as a table (every row that ran when `every`, else the failures only), one line per skip
    reason, the `notes` (lines about the library), and the counts."""
    from ._term import Table
    from .doctor import mode_label
    s = check_summary(rows)
    shown = [r for r in rows if r.get("status") != "SKIP"] if every else s["failures"]
    if shown:
        t = Table("status", "op", "EP", "backend", "dtype", "shape", "mode", "max err / tol", "detail",
                  title=title if every else f"{title}: failures", numeric=("max err / tol",))
        for r in shown:
            err = "" if r.get("max_err") is None else f"{r['max_err']:.2g} / {r['tol']:.2g}"
            style = {"PASS": "green", "FAIL": "red", "ERROR": "red"}.get(r["status"], "")
            t.add_row(f"[{style}]{r['status']}[/]", r["op"], r["provider"], r["backend"], r["dtype"], _shape(r),
                      mode_label(r), err, r.get("detail", ""))
        con.print(t)
    for reason, n in s["skip_reasons"].items():
        con.print(f"SKIP {n} checks: {reason}", soft_wrap=True)
    for line in notes:
        con.print(line, soft_wrap=True, markup=False)
    con.print(f"{s['pass']} passed, {s['fail']} failed, {s['skip']} skipped")


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


def print_info(data: dict, con=None) -> None:
    """The `onnxfuse info` report: versions, providers, GPU, nvcc and the kernel library; with --check, the
    summary of every op checked against PyTorch (counts, skip reasons, failed checks in full)."""
    from rich.table import Table

    from ._term import console
    con = con or console()
    t = Table(title=f"onnxfuse {data['onnxfuse']} (Python {data['python']})", show_header=False)
    t.add_column("what")
    t.add_column("value", overflow="fold")
    for k, v in data["versions"].items():
        t.add_row(k, v or "[dim]not installed[/]")
    t.add_row("onnxruntime providers", ", ".join(data["providers"]) or "-")
    if data.get("host"):
        from . import host
        t.add_row("CPU", host.summary(data["host"]))
    t.add_row("GPU", "; ".join(data["gpu"]) or "none")
    t.add_row("nvcc", data["nvcc"] or "not found (CPU-only kernel library)")
    k = data.get("kernels", {})
    for key, val in k.items():
        t.add_row(f"kernels: {key}", str(val))
    con.print(t)
    if "check" in data:
        print_check(con, data["check"], title="kernel check (each op against PyTorch)")
