"""Scale check: export and fuse Llama-2-7B-shaped decoders of N layers (fp16, external data) as subprocesses, and
measure wall time and peak RSS of each step, weight bytes and node counts.

    .venv/bin/python scripts/scale.py                  # N = 1, 8, 32
    .venv/bin/python scripts/scale.py --layers 1 8     # a subset

Writes benchmarks/results/scale-cpu-<date>.json and prints a table. Goals: fuse time grows linearly in node count,
and peak RSS stays under 1.5x the weights. Models go to models/scale/ (git-ignored) and are deleted after each N
unless --keep. Before each export the script estimates what the exporter needs (the module is built by
onnxfuse.zoo directly in fp16) and skips an N that cannot fit in this machine's memory instead of letting it OOM.

Why a script: it measures the CLI from outside (each `onnxfuse export` / `onnxfuse fuse` a subprocess under
/usr/bin/time for its peak RSS), which no onnxfuse command can do for itself.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PY = sys.executable
TIME = shutil.which("time") or "/usr/bin/time"


def llama2_7b_params(layers: int) -> int:
    h, i, v = 4096, 11008, 32000
    per_layer = 4 * h * h + 3 * h * i + 2 * h
    return v * h + layers * per_layer + h


def mem_available() -> int:
    for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def timed(cmd: list[str], log: pathlib.Path, timeout: float) -> dict:
    """Run cmd under /usr/bin/time -v: wall seconds, peak RSS (bytes), exit code."""
    t0 = time.perf_counter()
    with open(log, "w") as f:
        try:
            rc = subprocess.run([TIME, "-v", *cmd], stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                cwd=ROOT).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    wall = time.perf_counter() - t0
    text = log.read_text(errors="replace")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return {"seconds": round(wall, 2), "peak_rss_bytes": int(m.group(1)) * 1024 if m else None, "rc": rc,
            "killed": "Command terminated by signal" in text}


def node_count(path: pathlib.Path) -> int:
    import onnx
    return len(onnx.load(str(path), load_external_data=False).graph.node)


def file_bytes(path: pathlib.Path) -> int:
    data = path.with_name(path.name + ".data")
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def run_one(n: int, work: pathlib.Path, timeout: float, force_try: bool, keep: bool) -> dict:
    params = llama2_7b_params(n)
    row = {"layers": n, "params": params, "weight_bytes_expected": 2 * params}
    # zoo.build_llama builds the module directly in fp16 (2 bytes a parameter); the dynamo exporter traces with fake
    # tensors and writes the real ones out as external data, so the module itself is the export's floor.
    need = int(2.2 * params)
    avail = mem_available()
    row["export_memory_estimate_bytes"] = need
    if need > 0.9 * avail and not force_try:
        row["skipped"] = (f"export needs about {need / 2**30:.1f} GiB (the fp16 module and the exporter's working "
                          f"set); {avail / 2**30:.1f} GiB available")
        return row
    src = work / f"llama2-7b-{n}l-fp16.onnx"
    dst = work / f"llama2-7b-{n}l-fp16.fused.onnx"
    cli = [PY, "-m", "onnxfuse.cli"]
    row["export"] = timed(cli + ["export", "llama", "--preset", "llama2-7b", "--layers", str(n), "--dtype", "fp16",
                                 "--external-data", "-o", str(src), "--force", "-q"], work / f"export-{n}.log", timeout)
    if row["export"]["rc"] != 0:
        row["error"] = "export failed: " + (work / f"export-{n}.log").read_text(errors="replace")[-600:]
        return row
    row["weight_bytes"] = file_bytes(src)
    row["nodes_before"] = node_count(src)
    row["export"]["rss_over_weights"] = round(row["export"]["peak_rss_bytes"] / row["weight_bytes"], 2)
    row["fuse"] = timed(cli + ["fuse", str(src), "-o", str(dst), "--force", "-q", "--report",
                               str(work / f"report-{n}.json")], work / f"fuse-{n}.log", timeout)
    if row["fuse"]["rc"] != 0:
        row["error"] = "fuse failed: " + (work / f"fuse-{n}.log").read_text(errors="replace")[-600:]
        return row
    row["nodes_after"] = node_count(dst)
    row["fused_bytes"] = file_bytes(dst)
    report = json.loads((work / f"report-{n}.json").read_text())
    row["fuse"]["in_process_seconds"] = report["seconds"]
    row["fuse"]["matches"] = len(report["matches"])
    row["fuse"]["rss_over_weights"] = round(row["fuse"]["peak_rss_bytes"] / row["weight_bytes"], 2)
    row["fuse"]["seconds_per_1k_nodes"] = round(1000 * row["fuse"]["seconds"] / row["nodes_before"], 3)
    if not keep:
        for p in (src, dst):
            for f in (p, p.with_name(p.name + ".data")):
                f.unlink(missing_ok=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--work", default=str(ROOT / "models" / "scale"), help="where models are written (git-ignored)")
    ap.add_argument("--timeout", type=float, default=1500, help="seconds per step (default 25 min)")
    ap.add_argument("--try-anyway", action="store_true", help="run an N even if the memory estimate says no")
    ap.add_argument("--keep", action="store_true", help="keep the models")
    ap.add_argument("-o", "--output", help="results JSON (default benchmarks/results/scale-cpu-<date>.json)")
    args = ap.parse_args()
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.layers:
        print(f"N={n} ...", flush=True)
        rows.append(run_one(n, work, args.timeout, args.try_anyway, args.keep))
        print(json.dumps(rows[-1]), flush=True)
    done = [r for r in rows if "fuse" in r and r["fuse"]["rc"] == 0]
    goals = {}
    if len(done) >= 2:
        a, b = done[0], done[-1]
        ratio_nodes = b["nodes_before"] / a["nodes_before"]
        ratio_time = b["fuse"]["in_process_seconds"] / max(a["fuse"]["in_process_seconds"], 1e-9)
        goals["fuse_time_ratio_over_node_ratio"] = round(ratio_time / ratio_nodes, 2)
    goals["fuse_rss_under_1.5x_weights"] = all(r["fuse"]["rss_over_weights"] < 1.5 for r in done)
    goals["export_rss_under_1.5x_weights"] = all(r["export"]["rss_over_weights"] < 1.5 for r in done)
    import onnxruntime
    import torch
    result = {"date": datetime.date.today().isoformat(), "machine": {"cpus": os.cpu_count(),
              "mem_total_bytes": int(pathlib.Path("/proc/meminfo").read_text().split()[1]) * 1024,
              "platform": platform.platform()},
              "versions": {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__},
              "preset": "llama2-7b", "dtype": "fp16", "rows": rows, "goals": goals}
    out = (pathlib.Path(args.output) if args.output
           else ROOT / "benchmarks" / "results" / f"scale-cpu-{result['date']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    gib = 2**30
    print(f"\n{'N':>3} {'weights GiB':>11} {'nodes':>11} {'export s':>9} {'export RSS GiB':>14} {'fuse s':>7} "
          f"{'fuse RSS GiB':>12} {'fuse RSS/w':>10}")
    for r in rows:
        if "fuse" not in r:
            print(f"{r['layers']:>3} {r['weight_bytes_expected'] / gib:>11.2f}  "
                  f"skipped/failed: {r.get('skipped') or r.get('error', '')[:160]}")
            continue
        print(f"{r['layers']:>3} {r['weight_bytes'] / gib:>11.2f} {r['nodes_before']:>5}->{r['nodes_after']:<5} "
              f"{r['export']['seconds']:>9.1f} {r['export']['peak_rss_bytes'] / gib:>14.2f} "
              f"{r['fuse']['seconds']:>7.1f} "
              f"{r['fuse']['peak_rss_bytes'] / gib:>12.2f} {r['fuse']['rss_over_weights']:>10.2f}")
    print(f"goals: {json.dumps(goals)}\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
