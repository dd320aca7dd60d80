"""What `onnxfuse bench` writes and prints.

annotate flags what a reader should not trust (noisy medians, rooflines above 100 %); results_dir and
default_output say where the results JSON goes without -o (never the current directory), write_json and load_json
write and re-read it (--from-json), reevaluate recomputes ratios, goals and flags; format_table is the plain-text
table and plot the PNG (median ms per variant and size, p10-p90 bars, the fused/unfused speedup).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import pathlib
import re

from .. import onnxio
from ..errors import OnnxfuseError
from .goals import cross_case_ratios, evaluate_goals
from .ratios import compute_ratios, kernel_roofline
from .variants import VARIANTS

DEFAULT_RESULTS = pathlib.Path("benchmarks/results")  # in the checkout (results_dir)
# A median whose p90/p10 spread is above this is flagged noisy in the table and the JSON.
NOISY_SPREAD = 1.25


def results_dir() -> pathlib.Path:
    """Where results go without -o: benchmarks/results/local/ of the onnxfuse checkout this package runs from (an
    editable install; git-ignored, so a run in the checkout never makes tracked-looking files: a result set is
    committed by moving it into a folder of its own beside it), else the user data dir (e.g.
    ~/.local/share/onnxfuse/bench-results); never the current directory."""
    checkout = pathlib.Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / DEFAULT_RESULTS).is_dir():
        return checkout / DEFAULT_RESULTS / "local"
    try:
        import platformdirs
        return pathlib.Path(platformdirs.user_data_dir("onnxfuse")) / "bench-results"
    except ImportError:  # a declared dependency; the same path on Linux
        return pathlib.Path.home() / ".local" / "share" / "onnxfuse" / "bench-results"


def slug(text: str) -> str:
    """A file-name part: lower case, runs of other characters as one dash, at most 40 characters."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40] or "device"


def annotate(result: dict, noisy_spread: float = NOISY_SPREAD) -> dict:
    """Flag what a reader should not trust, per timed variant and per case (`flags`): a noisy median (p90/p10 above
    `noisy_spread`: `spread`, `noisy`), and a roofline above 100 % (`roofline_over_100`: the peak or bandwidth
    measured in the same run was itself noisy or low, so the percentage is not meaningful)."""
    result["noisy_spread"] = noisy_spread
    for c in result.get("cases", []):
        flags = []
        for name, v in c.get("variants", {}).items():
            if "median_ms" not in v:
                continue
            p10, p90 = v.get("p10_ms"), v.get("p90_ms")
            if isinstance(p10, (int, float)) and isinstance(p90, (int, float)) and p10 > 0:
                v["spread"] = round(p90 / p10, 3)
                v["noisy"] = v["spread"] > noisy_spread
                if v["noisy"]:
                    flags.append(f"{name}: noisy median (p90/p10 {v['spread']:.2f} > {noisy_spread})")
            roof = v.get("roofline_pct")
            v["roofline_over_100"] = isinstance(roof, (int, float)) and roof > 100
            if v["roofline_over_100"]:
                flags.append(f"{name}: roofline {roof:.0f}% > 100% (the same-run peak/bandwidth was noisy)")
        c["flags"] = flags
    return result


def default_output(result: dict, out_dir: pathlib.Path | None = None) -> pathlib.Path:
    """A new results path in `out_dir` (default results_dir()): <date>-<device>-<target>.json, -2, -3, ... if taken."""
    out_dir = pathlib.Path(out_dir) if out_dir is not None else results_dir()
    date = result.get("date", _dt.datetime.now().isoformat())[:10]
    base = f"{date}-{slug(result.get('device', 'device'))}-{slug(result.get('target', 'all'))}"
    p = out_dir / f"{base}.json"
    n = 2
    while p.exists():
        p = out_dir / f"{base}-{n}.json"
        n += 1
    return p


def write_json(result: dict, path: pathlib.Path) -> pathlib.Path:
    """Write the results JSON atomically (a temporary file renamed into place), creating the folder."""
    path = pathlib.Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    onnxio.write_atomic(path, json.dumps(result, indent=1, default=json_default))
    return path


def json_default(o):
    """json.dumps' default for the results: paths as strings, NaN as null."""
    if isinstance(o, pathlib.Path):
        return str(o)
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


def load_json(path) -> dict:
    """A results JSON written by onnxfuse bench (--from-json); one-line errors for anything else."""
    p = pathlib.Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise OnnxfuseError(f"{p}: no such results file; give a JSON written by 'onnxfuse bench'") from None
    except (OSError, ValueError) as e:
        raise OnnxfuseError(f"{p}: not a readable results JSON ({type(e).__name__}); give a file written by "
                            "'onnxfuse bench'") from None
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise OnnxfuseError(f"{p}: not an onnxfuse bench results file (no 'cases' list)")
    return data


def reevaluate(result: dict) -> dict:
    """Recompute ratios, goals and flags (e.g. after editing goals.json, or for a synthetic results file)."""
    for c in result["cases"]:
        c["ratios"] = compute_ratios(c.get("variants", {}), result.get("ort_floor_ms"))
        c["goals"] = evaluate_goals(c, result)
    cross_case_ratios(result)
    return annotate(result, result.get("noisy_spread", NOISY_SPREAD))


def _fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def format_table(result: dict) -> str:
    """Plain-text tables (one per case, then the goals): readable in CI logs and with or without rich."""
    lines = [f"onnxfuse bench on {result['device']} ({result['dtype']}; peak {result['peak_tflops']} TFLOP/s, "
             f"copy {result['bandwidth_gbs']} GB/s; {result.get('method', {}).get('runs', '?')} runs, median)"]
    if result.get("host"):
        from .. import host
        lines.append(f"host: {host.summary(result['host'])}")
    floor = result.get("ort_floor_ms") or {}
    if floor:
        lines.append("onnxruntime floor (Identity on 4 floats, same harness): " +
                     ", ".join(f"{k} {_fmt(v, '.4f') if isinstance(v, float) else v} ms" for k, v in floor.items()))
    for c in result["cases"]:
        shape = ", ".join(f"{k} {v}" for k, v in c.get("shape", {}).items())
        lines.append("")
        lines.append(f"{c['case']} [{shape}]  {_fmt(c.get('flops') and c['flops'] / 1e9, '.2f')} GFLOP, "
                     f"{_fmt(c.get('bytes') and c['bytes'] / 1e6, '.1f')} MB; fused ops: "
                     f"{', '.join(f'{k} {v}' for k, v in (c.get('models', {}).get('fused_ops') or {}).items()) or '-'}")
        lines.append(f"  {'variant':20} {'median ms':>10} {'p10':>9} {'p90':>9} {'TFLOP/s':>8} {'GB/s':>8} "
                     f"{'%roof':>6} {'x unfused':>9} {'rel err':>8}  flags")
        skipped: dict[str, list[str]] = {}
        for name, v in c["variants"].items():
            if "median_ms" in v:
                marks = ", ".join(m for m, on in (("noisy", v.get("noisy")), (">100% roof", v.get("roofline_over_100")))
                                  if on)
                lines.append(f"  {name:20} {v['median_ms']:10.4f} {v['p10_ms']:9.4f} {v['p90_ms']:9.4f} "
                             f"{_fmt(v.get('tflops'), '8.2f')} {_fmt(v.get('gbs'), '8.1f')} "
                             f"{_fmt(v.get('roofline_pct'), '6.1f')} {_fmt(v.get('speedup_vs_unfused'), '9.3f')} "
                             f"{_fmt(v.get('rel_err'), '8.1e')}  {marks}".rstrip())
            else:
                skipped.setdefault(v.get("skipped", "?"), []).append(name)
        if skipped:  # one line per case, variants grouped by reason
            lines.append("  skipped: " + "; ".join(f"{', '.join(names)} ({reason})"
                                                   for reason, names in skipped.items()))
        for flag in c.get("flags", []):
            lines.append(f"  flag: {flag}")
        r = c.get("ratios", {})
        lines.append("  ratios: " + ", ".join(f"{k} {v}" for k, v in r.items() if v is not None))
    goals = [g for c in result["cases"] for g in c.get("goals", [])]
    if goals:
        lines.append("")
        lines.append("goals:")
        for g in goals:
            val = "-" if g.get("value") is None else f"{g['value']:.3f}"
            extra = f" ({g['reason']})" if g.get("reason") else ""
            lines.append(f"  {g['status'].upper():10} {g['case']}/{g.get('size')}: {g['metric']} {val} "
                         f">= {g['threshold']}{extra}  [{g['goal']}]")
    return "\n".join(lines)


def _best(variants: dict, prefix: str):
    timed = [(v["median_ms"], k) for k, v in variants.items() if k.startswith(prefix) and "median_ms" in v]
    return min(timed) if timed else (None, None)


def markdown_table(results: list[dict]) -> str:
    """The README's results table from one or more results files (`onnxfuse bench table R.json ...`): a row per
    case and size with torch eager, torch.compile, ORT unfused and ORT-optimized (each the faster of plain and CUDA
    graph), onnxfuse (the fastest fused variant), the three ratios, and the GPU kernel time per run (unfused ->
    fused) where --profile recorded it. Times in ms."""
    head = ("| case | size | torch eager | torch.compile | ORT unfused | ORT-optimized | onnxfuse | vs unfused "
            "| vs ORT-optimized | vs compile | GPU kernel us/run, unfused → fused |")
    lines = [head, "|" + "---|" * head.count(" |")]
    for result in results:
        for c in result["cases"]:
            v = c.get("variants", {})
            eager = v.get("torch-eager", {}).get("median_ms")
            compiled = v.get("torch-compile", {}).get("median_ms")
            unfused, u_name = _best(v, "ort-unfused")
            optimized, _ = _best(v, "ort-optimized")
            fused, f_name = _best(v, "fused-")

            def ratio(base):
                return "-" if base is None or not fused else f"{base / fused:.3g}×"
            kernel = "-"
            if u_name and f_name and v[u_name].get("gpu_kernel_us") and v[f_name].get("gpu_kernel_us"):
                kernel = " → ".join(f"{us:.0f}" if us >= 100 else f"{us:.3g}"
                                    for us in (v[u_name]["gpu_kernel_us"], v[f_name]["gpu_kernel_us"]))
            size = f"{c.get('size')} {'tok' if c.get('size_name') == 'tokens' else c.get('size_name', '')}".strip()
            lines.append(f"| {c['case']} | {size} | {_fmt(eager)} | {_fmt(compiled)} | {_fmt(unfused)} "
                         f"| {_fmt(optimized)} | {_fmt(fused)} | {ratio(unfused)} | {ratio(optimized)} "
                         f"| {ratio(compiled)} | {kernel} |")
    return "\n".join(lines)


BACKENDS = ("triton", "cuda", "auto", "cpu")


def markdown_backends_table(results: list[dict]) -> str:
    """The README's per-backend table (`onnxfuse bench backends R.json ...`): a row per case and size with each fused
    backend's median ms (the faster of plain and CUDA graph; "g" marks the graph run) and % of the roofline at it,
    and the % of the roofline over the GPU kernel time where --profile recorded it; backends not run are left out."""
    seen = [b for b in BACKENDS if any(f"fused-{b}" in c.get("variants", {}) and
                                       "median_ms" in c["variants"][f"fused-{b}"]
                                       for r in results for c in r["cases"])]
    head = "| case | size | " + " | ".join(f"{b}: ms (% roof, % roof of kernel time)" for b in seen) + " |"
    lines = [head, "|" + "---|" * (2 + len(seen))]
    for result in results:
        for c in result["cases"]:
            v = c.get("variants", {})
            cells = []
            for b in seen:
                ms, name = _best(v, f"fused-{b}")
                if name is None:
                    cells.append("-")
                    continue
                roof, kern = v[name].get("roofline_pct"), kernel_roofline(v[name])
                pcts = ", ".join(f"{x:.0f} %" for x in (roof, kern) if isinstance(x, (int, float)))
                cells.append(f"{_fmt(ms)}{' g' if name.endswith('+graph') else ''}" + (f" ({pcts})" if pcts else ""))
            size = f"{c.get('size')} {'tok' if c.get('size_name') == 'tokens' else c.get('size_name', '')}".strip()
            lines.append(f"| {c['case']} | {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only), or None where matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(plt, fig, path) -> pathlib.Path:
    """fig laid out and written to path as a PNG (its folder made), then closed."""
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(result: dict, path) -> pathlib.Path | None:
    """A perf-report style PNG: median ms vs size per variant, one panel per case. None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    by_case: dict[str, list[dict]] = {}
    for c in result["cases"]:
        by_case.setdefault(c["case"], []).append(c)
    n = len(by_case)
    if not n:
        return None
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    colors = {name: plt.get_cmap("tab20")(i % 20) for i, name in enumerate(VARIANTS)}
    for ax, (case, entries) in zip(axes.flat, by_case.items()):
        entries = sorted(entries, key=lambda e: e.get("size") or 0)
        xs = [e.get("size") or 0 for e in entries]
        names = [v for v in VARIANTS if any("median_ms" in e["variants"].get(v, {}) for e in entries)]
        if len(set(xs)) > 1:  # perf-report style: median ms vs size, one line per variant, p10-p90 error bars
            for name in names:
                pts = [(x, e["variants"][name]) for x, e in zip(xs, entries)
                       if "median_ms" in e["variants"].get(name, {})]
                style = "--" if name.startswith("torch") else ("-." if name.startswith("ort") else "-")
                med = [v["median_ms"] for _, v in pts]
                err = [[max(v["median_ms"] - v.get("p10_ms", v["median_ms"]), 0) for _, v in pts],
                       [max(v.get("p90_ms", v["median_ms"]) - v["median_ms"], 0) for _, v in pts]]
                ax.errorbar([x for x, _ in pts], med, yerr=err, fmt=style, marker="o", capsize=2, label=name,
                            color=colors[name])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(sorted(set(xs)))
            ax.set_xticklabels([str(x) for x in sorted(set(xs))])
            ax.set_xlabel(entries[0].get("size_name", "size"))
            ax.set_ylabel("median ms (p10-p90 bars)")
            ratio = [(x, e.get("ratios", {}).get("fused_vs_unfused")) for x, e in zip(xs, entries)]
            ratio = [(x, r) for x, r in ratio if r]
            if ratio:  # best fused vs best unfused on a second axis
                ax2 = ax.twinx()
                ax2.plot([x for x, _ in ratio], [r for _, r in ratio], ":", marker="s", color="black",
                         label="fused/unfused speedup")
                ax2.axhline(1.0, color="gray", linewidth=0.6)
                ax2.set_ylabel("unfused / fused (x)")
                ax2.legend(fontsize=7, loc="lower right")
            ax.legend(fontsize=7)
        else:  # one size: a bar per variant, p10-p90 error bars, fused bars labelled with their speedup
            vs = [entries[0]["variants"][name] for name in names]
            ms = [v["median_ms"] for v in vs]
            err = [[max(v["median_ms"] - v.get("p10_ms", v["median_ms"]), 0) for v in vs],
                   [max(v.get("p90_ms", v["median_ms"]) - v["median_ms"], 0) for v in vs]]
            ax.barh(names, ms, xerr=err, capsize=2, color=[colors[n_] for n_ in names])
            ax.invert_yaxis()
            if ms and max(ms) / min(ms) > 30:
                ax.set_xscale("log")
            for i, (name, v) in enumerate(zip(names, vs)):
                sp = v.get("speedup_vs_unfused") if name.startswith("fused") else None
                label = f" {v['median_ms']:.3g}" + (f" ({sp:.2f}x vs unfused)" if sp else "") + \
                    (" noisy" if v.get("noisy") else "")
                ax.text(v.get("p90_ms", v["median_ms"]), i, label, va="center", fontsize=7)
            ax.set_xlabel(f"median ms, p10-p90 bars ({entries[0].get('size_name', 'size')} {xs[0]})")
            ax.tick_params(axis="y", labelsize=7)
        ax.set_title(f"{case} ({result.get('dtype')})")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"onnxfuse bench: {result.get('device')}", fontsize=10)
    return save_figure(plt, fig, path)


def _setting(r: dict) -> str:
    return f"batch {r.get('batch', 1)}, prompt {r['prompt_tokens']}" + (", graph" if r["cuda_graph"] else "")


def plot_genai(result: dict, path) -> pathlib.Path | None:
    """The PNG of a `bench genai` run: prefill ms and decode ms/token, a group of bars per setting (batch, prompt,
    CUDA graph) with a bar per folder (its time against the first folder's above it) and the setting's limit as a
    black line across the group. None without matplotlib."""
    plt = pyplot()
    if plt is None:
        return None
    rows = result.get("rows") or []
    settings = list(dict.fromkeys(_setting(r) for r in rows))
    folders = list(dict.fromkeys(r["folder"] for r in rows))
    if not settings:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(settings) * 2), 4.6), squeeze=False)
    colors = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(folders)}
    width = 0.8 / len(folders)
    panels = (("prefill_ms", "prefill_limit_ms", "prefill_speedup_vs_first", "prefill, ms"),
              ("decode_ms_per_token", "decode_limit_ms", "decode_speedup_vs_first", "decode, ms a token"))
    for ax, (key, limit_key, vs_key, title) in zip(axes.flat, panels):
        for j, f in enumerate(folders):
            xs, ys, labels = [], [], []
            for i, s in enumerate(settings):
                r = next((r for r in rows if r["folder"] == f and _setting(r) == s), None)
                if r is None:
                    continue
                xs.append(i - 0.4 + (j + 0.5) * width)
                ys.append(r[key])
                vs = r.get(vs_key)
                labels.append(f"{r[key]:.3g}" + (f"\n{vs:.2f}x" if vs and j else ""))
            ax.bar(xs, ys, width=width * 0.95, color=colors[f], label=pathlib.Path(f).name or f)
            for x, y, text in zip(xs, ys, labels):
                ax.text(x, y, text, ha="center", va="bottom", fontsize=6)
        for i, s in enumerate(settings):
            limits = [r[limit_key] for r in rows if _setting(r) == s and r.get(limit_key)]
            if limits:
                ax.hlines(limits[0], i - 0.45, i + 0.45, colors="black", linewidth=1.5,
                          label="limit" if i == 0 else None)
        ax.set_xticks(range(len(settings)))
        ax.set_xticklabels(settings, fontsize=7, rotation=20, ha="right")
        values = [r[key] for r in rows if r.get(key)]
        if values and max(values) / min(values) > 20:
            ax.set_yscale("log")
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"onnxfuse bench genai: {result.get('device')}, {result.get('date')} (limits: prefill FLOPs at the "
                 f"run's GEMM peak, decode bytes at its memory rate)", fontsize=9)
    return save_figure(plt, fig, path)
