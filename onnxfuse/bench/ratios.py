"""The numbers derived from a case's medians: the per-variant speedup over unfused ORT and time above onnxruntime's
floor (add_variant_speedups), and the case's ratios (compute_ratios: speedups, baseline median / fused median, that
the goals and the table read).
"""
from __future__ import annotations

from .variants import FUSED_GPU, ORT_OPTIMIZED, UNFUSED


def median(variants: dict, name: str) -> float | None:
    """A variant's median in ms, or None where it did not run."""
    v = variants.get(name) or {}
    m = v.get("median_ms")
    return float(m) if isinstance(m, (int, float)) and m > 0 else None


def best(variants: dict, names) -> tuple[str | None, float | None]:
    """The fastest of `names` that ran, and its median: (name, ms), or (None, None)."""
    got = [(n, median(variants, n)) for n in names]
    got = [(n, m) for n, m in got if m is not None]
    return min(got, key=lambda nm: nm[1]) if got else (None, None)


def floor_for(name: str, floor: dict | None) -> float | None:
    """The onnxruntime floor measured for a variant's CUDA-graph setting (None if not measured)."""
    if not floor:
        return None
    v = floor.get("graph" if name.endswith("+graph") else "plain")
    return float(v) if isinstance(v, (int, float)) else None


def compute_ratios(variants: dict, floor: dict | None = None) -> dict:
    """Speedups (baseline median / fused median) from a case's variants; None where a side is missing. `floor` is
    the run's ort_floor_ms (plain / graph): with it, times above the floor are compared too."""
    fused_names = FUSED_GPU + ("fused-cpu",)
    best_f_name, best_f = best(variants, fused_names)
    best_u_name, best_u = best(variants, UNFUSED)
    best_o_name, best_o = best(variants, ORT_OPTIMIZED)
    nog_name, nog = best(variants, ("fused-triton", "fused-cuda", "fused-auto", "fused-cpu"))
    g_name, g = best(variants, ("fused-triton+graph", "fused-cuda+graph", "fused-auto+graph"))

    def ratio(a, b):
        return None if a is None or b is None else round(a / b, 4)

    def above(name, t):
        f = floor_for(name or "", floor)
        return None if t is None or f is None else max(t - f, 1e-6)

    kernel_us = (variants.get(best_f_name) or {}).get("gpu_kernel_us") if best_f_name else None
    out = {
        "best_fused": best_f_name, "best_unfused": best_u_name, "best_ort_optimized": best_o_name,
        "fused_vs_unfused": ratio(best_u, best_f),
        "fused_vs_ort_optimized": ratio(best_o, best_f),
        "ort_optimized_vs_unfused": ratio(best_u, best_o),
        "unfused_over_fused_above_floor": ratio(above(best_u_name, best_u), above(best_f_name, best_f)),
        "kernel_us_goal": None if not kernel_us else round(30.0 / kernel_us, 4),
        "fused_vs_unfused_nograph": ratio(median(variants, "ort-unfused"), nog),
        "fused_vs_unfused_graph": ratio(median(variants, "ort-unfused+graph"), g),
        "fused_vs_compile": ratio(median(variants, "torch-compile"), best_f),
        "fused_vs_eager": ratio(median(variants, "torch-eager"), best_f),
        "unfused_vs_eager": ratio(median(variants, "torch-eager"), best_u),
        # > 1: the fused op costs more than the bare GEMMs (the activation is not free); about 1: it is free.
        "fused_over_gemms": ratio(best_f, median(variants, "torch-gemms")),
        "gemms_over_fused": ratio(median(variants, "torch-gemms"), best_f),  # goal form of the line above
        "roofline_pct": (variants.get(best_f_name) or {}).get("roofline_pct") if best_f_name else None,
        # the same roofline over the fused variant's summed GPU kernel time (--profile) instead of its median: what
        # the kernels reach without onnxruntime's per-run floor and the gaps between launches
        "kernel_roofline_pct": kernel_roofline(variants.get(best_f_name) or {}) if best_f_name else None,
        "eager_over_gemms": ratio(median(variants, "torch-eager"), median(variants, "torch-gemms")),
    }
    return out


def kernel_roofline(v: dict) -> float | None:
    """roofline_pct with the variant's GPU kernel time (gpu_kernel_us, from --profile) in place of its median."""
    pct, med, us = v.get("roofline_pct"), v.get("median_ms"), v.get("gpu_kernel_us")
    return None if not (pct and med and us) else round(pct * med * 1e3 / us, 2)


def add_variant_speedups(variants: dict, floor: dict | None = None) -> None:
    """Add to every timed variant (in place) its speedup over unfused ORT with the same CUDA-graph setting
    (speedup_vs_unfused; None where that did not run) and, for the ORT variants, its time above onnxruntime's floor
    (above_floor_ms; `floor` is the run's ort_floor_ms)."""
    for name, v in variants.items():
        if "median_ms" in v:
            base = median(variants, "ort-unfused+graph" if name.endswith("+graph") else "ort-unfused")
            v["speedup_vs_unfused"] = None if base is None else round(base / v["median_ms"], 4)
            f = floor_for(name, floor) if name.startswith(("ort", "fused")) else None
            if f is not None:
                v["above_floor_ms"] = round(v["median_ms"] - f, 5)
