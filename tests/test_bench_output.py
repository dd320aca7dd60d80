"""`onnxfuse bench` output: skipped variants folded into one line per case, flags for noisy medians and rooflines
above 100 % (table and JSON), where results are written (never the current directory implicitly), and plots with
p10-p90 error bars and the fused/unfused speedup."""
from __future__ import annotations

import copy
import importlib.util
import json
import pathlib
import subprocess

import pytest

from onnxfuse import bench, cli

HAS_MPL = importlib.util.find_spec("matplotlib") is not None


def _timed(ms, p10=None, p90=None, roof=50.0):
    return {"median_ms": ms, "p10_ms": p10 or ms, "p90_ms": p90 or ms, "runs": 50, "tflops": 1.0, "gbs": 1.0,
            "roofline_pct": roof, "speedup_vs_unfused": None}


def _result(sizes=(2048,)) -> dict:
    cases = []
    for size in sizes:
        variants = {name: {"skipped": "no CUDA"} for name in bench.VARIANTS}
        variants["torch-compile"] = {"skipped": "off on the CPU by default (--compile to run it)"}
        variants.update({"ort-unfused": _timed(0.10 * size / 2048, 0.09, 0.15),  # p90/p10 1.67: noisy
                         "fused-cpu": _timed(0.05 * size / 2048, roof=130.0),    # above the roofline
                         "torch-eager": _timed(0.2 * size / 2048)})
        variants["fused-cpu"]["speedup_vs_unfused"] = 2.0
        cases.append({"case": "dlrm-bottom", "size": size, "size_name": "batch", "shape": {"batch": size},
                      "quick": True, "flops": 1, "bytes": 1, "variants": variants})
    run = {"device": "CPU test", "device_type": "cpu", "dtype": "fp32", "peak_tflops": 1.0, "bandwidth_gbs": 10.0,
           "versions": {}, "cases": cases, "ort_floor_ms": {"plain": 0.005}, "method": {"runs": 50}}
    return bench.reevaluate(run)


def test_skipped_variants_are_one_line_per_case():
    text = bench.format_table(_result())
    skipped = [ln for ln in text.splitlines() if ln.strip().startswith("skipped:")]
    assert len(skipped) == 1, text
    line = skipped[0]
    assert "torch-compile (off on the CPU by default (--compile to run it))" in line
    gpu = [v for v in bench.VARIANTS if v not in ("ort-unfused", "fused-cpu", "torch-eager", "torch-compile")]
    assert f"{', '.join(gpu)} (no CUDA)" in line  # grouped by reason, in table order
    assert not any(ln.strip().startswith(tuple(gpu)) for ln in text.splitlines())  # no row per skipped variant


def test_noisy_medians_and_roofline_over_100_are_flagged():
    r = _result()
    v = r["cases"][0]["variants"]
    assert v["ort-unfused"]["noisy"] is True and v["ort-unfused"]["spread"] == pytest.approx(0.15 / 0.09, abs=1e-3)
    assert v["fused-cpu"]["noisy"] is False and v["fused-cpu"]["roofline_over_100"] is True
    assert v["torch-eager"]["roofline_over_100"] is False and r["noisy_spread"] == bench.NOISY_SPREAD
    flags = r["cases"][0]["flags"]
    assert any(f.startswith("ort-unfused: noisy median") for f in flags)
    assert any(f.startswith("fused-cpu: roofline 130% > 100%") for f in flags)
    rows = {ln.split()[0]: ln for ln in bench.format_table(r).splitlines() if ln.startswith("  ") and ln.split()}
    assert rows["ort-unfused"].rstrip().endswith("noisy") and rows["fused-cpu"].rstrip().endswith(">100% roof")
    assert not rows["torch-eager"].rstrip().endswith(("noisy", "roof"))
    loose = bench.reevaluate(dict(copy.deepcopy(r), noisy_spread=2.0))  # a looser threshold: not noisy
    assert loose["cases"][0]["variants"]["ort-unfused"]["noisy"] is False


def test_from_json_reports_flags_in_json(tmp_path, capsys):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_result()))
    assert cli.main(["bench", "--from-json", str(path), "--json", "--no-plot", "--noisy-spread", "1.5"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["noisy_spread"] == 1.5 and data["cases"][0]["variants"]["ort-unfused"]["noisy"] is True


def test_results_never_go_to_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    here = bench.results_dir()
    # the checkout's
    assert here == pathlib.Path(bench.__file__).resolve().parents[2] / "benchmarks" / "results" / "local"
    assert subprocess.run(["git", "check-ignore", "-q", str(here / "x.json")], cwd=here.parents[2]).returncode == 0
    # installed from a wheel (no checkout around the package): the user data dir
    monkeypatch.setattr(bench.report, "__file__", str(tmp_path / "site-packages" / "onnxfuse" / "bench" / "report.py"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert bench.results_dir() == tmp_path / "data" / "onnxfuse" / "bench-results"
    out = bench.default_output(_result())
    assert out.parent == tmp_path / "data" / "onnxfuse" / "bench-results" and tmp_path not in [out.parent]
    assert bench.default_output(_result(), tmp_path / "mine").parent == tmp_path / "mine"


def test_run_writes_into_results_dir(tmp_path, monkeypatch, capsys):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    results = tmp_path / "results"
    assert cli.main(["bench", "dlrm-bottom", "--device", "cpu", "--runs", "2", "--warmup", "0", "--cache-dir",
                     str(tmp_path / "cache"), "--variants", "ort-unfused,fused-cpu-all", "--no-plot",
                     "--results-dir", str(results)]) == 2  # the folder must exist: one line, nothing run
    assert "--results-dir" in capsys.readouterr().err
    results.mkdir()
    assert cli.main(["bench", "dlrm-bottom", "--device", "cpu", "--runs", "2", "--warmup", "0", "--cache-dir",
                     str(tmp_path / "cache"), "--variants", "ort-unfused,fused-cpu-all", "--no-plot", "-q",
                     "--results-dir", str(results)]) == 0
    written = list(results.glob("*.json"))
    assert len(written) == 1 and list(work.iterdir()) == []
    data = json.loads(written[0].read_text())
    assert "flags" in data["cases"][0] and "spread" in data["cases"][0]["variants"]["fused-cpu-all"]


@pytest.mark.skipif(not HAS_MPL, reason="needs matplotlib")
@pytest.mark.parametrize("sizes", [(2048,), (128, 2048)], ids=["one size", "sweep"])
def test_plot_has_error_bars_and_the_speedup(sizes, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt
    from matplotlib.container import BarContainer, ErrorbarContainer
    figs = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    r = _result(sizes)
    assert bench.plot(r, tmp_path / "p.png").stat().st_size > 1000
    axes = figs[0].axes
    if len(sizes) == 1:
        bars = [c for c in axes[0].containers if isinstance(c, BarContainer)]
        assert bars and bars[0].errorbar is not None  # p10-p90
        assert any("2.00x vs unfused" in t.get_text() for t in axes[0].texts)
    else:
        assert any(isinstance(c, ErrorbarContainer) for c in axes[0].containers)
        twin = [a for a in axes if a.get_ylabel() == "unfused / fused (x)"]
        assert twin and len(twin[0].lines[0].get_xdata()) == len(sizes)
