"""`onnxfuse bench` on the CPU (tiny sizes, few runs): the JSON schema, the variants that must run and those that
must be skipped, the plot, goal evaluation on synthetic numbers, exit codes, and bad input."""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import re

import pytest

from onnxfuse import bench
from onnxfuse.errors import OnnxfuseError

HAS_MPL = importlib.util.find_spec("matplotlib") is not None
RUN_KEYS = {"device", "versions", "peak_tflops", "bandwidth_gbs", "dtype", "cases"}
CASE_KEYS = {"case", "shape", "flops", "bytes", "variants", "ratios", "goals"}
TIMED_KEYS = {"median_ms", "p10_ms", "p90_ms", "runs", "tflops", "gbs", "roofline_pct"}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("bench-cache")


@pytest.fixture(scope="module")
def cpu_result(cache_dir):
    opts = bench.Options(device="cpu", runs=5, warmup=1, cache_dir=cache_dir, quiet=True)
    return bench.run(["dlrm-bottom", "lora-linear"], opts)


def test_api_schema_and_variants(cpu_result):
    r = cpu_result
    assert RUN_KEYS <= set(r)
    assert r["device_type"] == "cpu" and r["dtype"] == "fp32" and r["quick"] is True
    assert r["peak_tflops"] > 0 and r["bandwidth_gbs"] > 0
    # the ORT floor (an Identity through the same harness) is below every ORT variant it bounds
    floor = r["ort_floor_ms"]["plain"]
    assert 0 < floor < min(c["variants"]["ort-unfused"]["median_ms"] for c in r["cases"])
    assert "onnxruntime floor" in bench.format_table(r)
    assert r["versions"]["onnxruntime"] and r["versions"]["torch"]
    assert r["method"]["rotate_inputs"] is False
    assert [c["case"] for c in r["cases"]] == ["dlrm-bottom", "lora-linear"]
    json.dumps(r)  # serialisable as is
    for c in r["cases"]:
        assert CASE_KEYS <= set(c)
        assert c["flops"] > 0 and c["bytes"] > 0
        assert list(c["variants"]) == list(bench.VARIANTS)
        # fused-cpu-all fuses every pattern on every host; fused-cpu is this host's table (test_llama_cases_...)
        for name in ("ort-unfused", "ort-optimized", "fused-cpu-all", "torch-eager"):
            v = c["variants"][name]
            assert TIMED_KEYS <= set(v), (c["case"], name, v)
            assert v["median_ms"] > 0 and v["runs"] == 5 and v["p10_ms"] <= v["median_ms"] <= v["p90_ms"]
            assert 0 < v["roofline_pct"]
        # both ORT variants computed the module's function (checked against torch eager on poisoned outputs)
        for name in ("ort-unfused", "ort-optimized", "fused-cpu-all"):
            assert c["variants"][name]["rel_err"] < 1e-4
            # the time above onnxruntime's floor, per ORT variant
            assert c["variants"][name]["above_floor_ms"] == pytest.approx(c["variants"][name]["median_ms"] - floor,
                                                                          abs=1e-4)
        assert c["ratios"]["best_ort_optimized"] == "ort-optimized"
        # the reason names the host: no GPU, or a GPU host's CPU run
        import torch
        why = "CPU run (--device cpu)" if torch.cuda.is_available() else "no CUDA"
        for name in bench.GPU_ONLY:
            assert c["variants"][name] == {"skipped": why}
        assert "skipped" in c["variants"]["torch-compile"]
        # fused-cpu (what a user gets) is timed where this host's table fuses the case, else skipped with the
        # reason; the ratios compare it, so they are absent (None) where it was left to onnxruntime
        cpu = c["variants"]["fused-cpu"]
        if "median_ms" in cpu:
            assert c["ratios"]["best_fused"] == "fused-cpu" and c["ratios"]["fused_vs_unfused"] > 0
            assert c["ratios"]["fused_vs_ort_optimized"] > 0
        else:
            assert "left to onnxruntime" in cpu["skipped"], cpu
            assert c["ratios"]["best_fused"] is None and c["ratios"]["fused_vs_unfused"] is None
        assert c["ratios"]["best_unfused"] == "ort-unfused"
        # goals are GPU fp16 targets: on the CPU they are reported, not applied
        assert c["goals"] and all(g["status"] == "n/a" for g in c["goals"])
    assert r["cases"][0]["models"]["fused_ops"] == {"MLPStack": 1}
    assert r["cases"][1]["models"]["fused_ops"] == {"LoRALinearRelu": 1}


def test_flops_and_bytes(cpu_result):
    c = cpu_result["cases"][0]
    b = c["size"]
    sizes = [13, 512, 256, 64, 16]
    assert c["flops"] == sum(2 * b * i * o for i, o in zip(sizes[:-1], sizes[1:]))
    params = sum(i * o + o for i, o in zip(sizes[:-1], sizes[1:]))
    assert c["bytes"] == 4 * (params + b * 13 + b * 16)


def _register_parser():
    p = argparse.ArgumentParser(prog="onnxfuse")
    sub = p.add_subparsers(dest="command")
    bench.register(sub, argparse.ArgumentParser)
    return p


def test_register_runs_and_writes(cache_dir, tmp_path, capsys):
    out = tmp_path / "r.json"
    args = _register_parser().parse_args(
        ["bench", "dlrm-bottom", "--device", "cpu", "--runs", "3", "--warmup", "1", "--cache-dir", str(cache_dir),
         "-o", str(out), "--variants", "ort-unfused,fused-cpu-all", "--check-goals"])
    assert args.func(args) == 0  # goals do not apply on the CPU: nothing missed
    printed = capsys.readouterr().out
    assert "dlrm-bottom" in printed and "fused-cpu-all" in printed
    data = json.loads(out.read_text())
    v = data["cases"][0]["variants"]
    assert v["torch-eager"]["skipped"].startswith("not selected")
    assert v["ort-unfused"]["median_ms"] > 0 and v["fused-cpu-all"]["median_ms"] > 0
    png = out.with_suffix(".png")
    assert png.exists() == HAS_MPL
    if HAS_MPL:
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_upstream_per_table_case_fuses_whole_and_matches_torch(cache_dir, tmp_path):
    """bench dlrm-upstream-tables (DLRM_Net with per-table lists, exported at opset 11): the fused model is the two
    stacks and one bag op, and its output is torch eager's."""
    out = tmp_path / "r.json"
    args = _register_parser().parse_args(
        ["bench", "dlrm-upstream-tables", "--device", "cpu", "--sizes", "16", "--runs", "2", "--warmup", "0",
         "--cache-dir", str(cache_dir), "-o", str(out), "--variants", "torch-eager,fused-cpu-all", "--no-plot"])
    assert args.func(args) == 0
    case = json.loads(out.read_text())["cases"][0]
    assert case["models"]["fused_ops"] == {"MLPStack": 2, "EmbeddingBagInteraction": 1}, case["models"]
    v = case["variants"]["fused-cpu-all"]
    assert v["median_ms"] > 0 and v["rel_err"] < 1e-5, v


def test_json_flag_prints_results(cache_dir, tmp_path, capsys):
    args = _register_parser().parse_args(
        ["bench", "dlrm-bottom", "--device", "cpu", "--runs", "2", "--warmup", "0", "--cache-dir", str(cache_dir),
         "-o", str(tmp_path / "r.json"), "--variants", "ort-unfused", "--json", "--no-plot"])
    assert args.func(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["cases"][0]["variants"]["ort-unfused"]["runs"] == 2
    assert not (tmp_path / "r.png").exists()


def _synthetic(unfused: float, fused: float, compiled: float) -> dict:
    def timed(ms):
        return {"median_ms": ms, "p10_ms": ms, "p90_ms": ms, "runs": 50, "tflops": 1.0, "gbs": 1.0,
                "roofline_pct": 50.0}
    variants = {name: {"skipped": "not selected"} for name in bench.VARIANTS}
    variants.update({"ort-unfused": timed(unfused), "ort-unfused+graph": timed(unfused * 0.98),
                     "fused-cuda": timed(fused * 1.1), "fused-triton": timed(fused), "torch-compile": timed(compiled),
                     "torch-eager": timed(compiled * 1.2)})
    case = {"case": "dlrm-bottom", "size": 2048, "size_name": "batch", "shape": {"batch": 2048}, "quick": False,
            "flops": 1, "bytes": 1, "variants": variants}
    run = {"device": "NVIDIA H200", "device_type": "cuda", "dtype": "fp16", "peak_tflops": 700.0,
           "bandwidth_gbs": 4000.0, "versions": {}, "cases": [case], "ort_floor_ms": {"plain": 0.005, "graph": 0.004}}
    return bench.reevaluate(run)


def test_goal_logic_on_synthetic_numbers():
    ok = _synthetic(unfused=0.10, fused=0.02, compiled=0.05)
    c = ok["cases"][0]
    assert c["ratios"]["best_unfused"] == "ort-unfused+graph" and c["ratios"]["best_fused"] == "fused-triton"
    assert c["ratios"]["fused_vs_unfused"] == pytest.approx(0.098 / 0.02, rel=1e-3)
    assert c["ratios"]["fused_vs_compile"] == pytest.approx(2.5)
    # above onnxruntime's floor (graph floor for the graph variant, plain for the plain one)
    assert c["ratios"]["unfused_over_fused_above_floor"] == pytest.approx((0.098 - 0.004) / (0.02 - 0.005), rel=1e-3)
    status = {g["metric"]: g["status"] for g in c["goals"]}
    assert status == {"unfused_over_fused_above_floor": "pass", "fused_vs_compile": "pass"}
    assert bench.goals_failed(ok) == []

    miss = _synthetic(unfused=0.10, fused=0.05, compiled=0.04)  # 2.1x < 3x above the floor, slower than compile
    status = {g["metric"]: g["status"] for g in miss["cases"][0]["goals"]}
    assert status == {"unfused_over_fused_above_floor": "miss", "fused_vs_compile": "miss"}
    assert len(bench.goals_failed(miss)) == 2

    unmeasured = copy.deepcopy(ok)
    unmeasured["cases"][0]["variants"]["torch-compile"] = {"skipped": "failed: RuntimeError: x", "error": "x"}
    bench.reevaluate(unmeasured)
    status = {g["metric"]: g["status"] for g in unmeasured["cases"][0]["goals"]}
    assert status["fused_vs_compile"] == "unmeasured" and len(bench.goals_failed(unmeasured)) == 1

    other = copy.deepcopy(miss)
    other["cases"][0]["size"] = 64  # not the goal's size: only the every-case compile goal applies
    bench.reevaluate(other)
    assert [g["metric"] for g in other["cases"][0]["goals"]] == ["fused_vs_compile"]

    for field, value in (("device_type", "cpu"), ("dtype", "fp32")):
        na = copy.deepcopy(miss)
        na[field] = value
        bench.reevaluate(na)
        assert all(g["status"] == "n/a" for g in na["cases"][0]["goals"]) and bench.goals_failed(na) == []


def test_check_goals_exit_code_from_json(tmp_path, capsys):
    path = tmp_path / "miss.json"
    path.write_text(json.dumps(_synthetic(unfused=0.10, fused=0.05, compiled=0.04)))
    parser = _register_parser()
    args = parser.parse_args(["bench", "--from-json", str(path), "--check-goals", "--no-plot"])
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert "goal" in err and "dlrm-bottom" in err
    args = parser.parse_args(["bench", "--from-json", str(path), "--no-plot", "-q"])
    assert args.func(args) == 0  # without --check-goals a miss is reported, not an error
    from onnxfuse import cli  # `onnxfuse bench ARGS` is cli.main(["bench", *ARGS])
    assert cli.main(["bench", "--from-json", str(path), "--check-goals", "--no-plot", "-q"]) == 1
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(_synthetic(unfused=0.10, fused=0.02, compiled=0.05)))
    assert cli.main(["bench", "--from-json", str(ok), "--check-goals", "--no-plot", "-q"]) == 0
    if HAS_MPL:
        assert cli.main(["bench", "plot", str(ok), "-o", str(tmp_path / "ok.png")]) == 0
        assert (tmp_path / "ok.png").stat().st_size > 1000


def test_table_mentions_every_variant(cpu_result):
    """Every variant of every case has its own row (its median, to the printed digits) or sits on the case's
    "skipped:" line with its reason. (Names are prefixes of one another, ort-unfused of ort-unfused+graph: the row
    is matched whole, not by substring.)"""
    text = bench.format_table(cpu_result)
    blocks = text.split("\n\n")[1:]  # the run's header, then one block per case, then the goals
    assert "goals:" in blocks[-1]
    for case, block in zip(cpu_result["cases"], blocks):
        assert block.startswith(case["case"] + " "), block
        assert set(case["variants"]) == set(bench.VARIANTS), sorted(set(bench.VARIANTS) ^ set(case["variants"]))
        lines = block.splitlines()
        skipped = next((ln for ln in lines if ln.startswith("  skipped: ")), "")
        for name, v in case["variants"].items():
            if "median_ms" in v:
                row = f"  {name:20} {v['median_ms']:10.4f} "
                assert any(ln.startswith(row) for ln in lines), (case["case"], name, block)
            else:
                assert re.search(rf"(: |; |, ){re.escape(name)}(, [^(]*)? \({re.escape(v['skipped'])}\)", skipped), \
                    (case["case"], name, skipped)
    ran = [n for c in cpu_result["cases"] for n, v in c["variants"].items() if "median_ms" in v]
    assert {"ort-unfused", "fused-cpu-all"} <= set(ran), ran  # the CPU variants ran, so rows were checked


def test_bad_input():
    with pytest.raises(OnnxfuseError, match="unknown case 'nope'"):
        bench.run(["nope"], bench.Options(device="cpu"))
    with pytest.raises(OnnxfuseError, match="--variants"):
        bench.run(["dlrm-bottom"], bench.Options(device="cpu", variants=["warp-drive"]))
    with pytest.raises(OnnxfuseError):
        bench.load_json("/nonexistent/results.json")
    from onnxfuse import cli
    assert cli.main(["bench", "nope", "--device", "cpu"]) == 2
    assert cli.main(["bench", "--runs", "0"]) == 2  # argparse: must be positive


def test_cli_main(cache_dir, tmp_path):
    from onnxfuse import cli
    out = tmp_path / "r.json"
    rc = cli.main(["bench", "dlrm-bottom", "--device", "cpu", "--runs", "2", "--warmup", "0", "--cache-dir",
                   str(cache_dir), "-o", str(out), "--variants", "ort-unfused,fused-cpu-all", "--no-plot", "-q"])
    assert rc == 0 and json.loads(out.read_text())["cases"][0]["variants"]["fused-cpu-all"]["median_ms"] > 0
    assert cli.main(["bench", "nope", "--device", "cpu", "-q"]) == 2


def test_llama_cases_export_through_onnxfuse_export(tmp_path):
    """The Llama cases go through onnxfuse.export (the DLRM/LoRA ones through a plain torch export): cover that path."""
    from onnxfuse import bench
    res = bench.run(["seed-mlp"], bench.Options(device="cpu", quick=True, runs=3, warmup=1, cache_dir=tmp_path))
    case = res["cases"][0]
    assert case["models"]["fused_ops"] == {"SwiGLU": 1}
    assert case["variants"]["fused-cpu-all"]["median_ms"] > 0 and case["variants"]["ort-unfused"]["median_ms"] > 0
    # fused-cpu is what `fuse --provider cpu` gives this host: SwiGLU where its family's table keeps it, else a skip
    # that names the table's reason
    from onnxfuse import cpu_policy, host
    family = host.kernel_family()
    assert case["models"]["cpu_family"] == family and res["host"]["kernel_family"] == family
    if "swiglu" in cpu_policy.cpu_left_to_ort(family):  # the host's table (a 16-thread avx512 one leaves nothing)
        assert "left to onnxruntime" in case["variants"]["fused-cpu"]["skipped"]
        assert f"swiglu: on {family} hosts" in case["variants"]["fused-cpu"]["skipped"]
    else:
        assert case["models"]["fused_cpu_ops"] == {"SwiGLU": 1} and case["variants"]["fused-cpu"]["median_ms"] > 0


def test_host_description_tells_cpus_of_one_model_name_apart(monkeypatch, tmp_path):
    """A result names the CPU's vendor, family, model and stepping besides its model name (a virtual machine's
    "AMD EPYC" may be a Zen 1 or a Zen 3), and the one-line summary carries family and model."""
    from onnxfuse import host
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 1\n"
                       "model name\t: AMD EPYC\nstepping\t: 2\nflags\t\t: fpu avx avx2 fma f16c\n\nprocessor\t: 1\n")
    monkeypatch.setattr(host, "CPUINFO", cpuinfo)
    desc = host.describe()
    assert desc["cpu_id"] == {"vendor": "AuthenticAMD", "family": 23, "model": 1, "stepping": 2}
    assert desc["vector_isa"] == "avx2" and desc["cpu_model"] == "AMD EPYC"
    assert host.summary(desc).startswith("AMD EPYC (") and "family 23 model 1" in host.summary(desc)
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu\n")  # a CPU without these fields: None, no family text
    desc = host.describe()
    assert desc["cpu_id"]["family"] is None and "family" not in host.summary(desc)


def test_bench_cache_keys_change_with_the_rules(tmp_path, monkeypatch):
    """A cached fused model is reused only while the code that wrote it is unchanged: the key carries a fingerprint
    of the export / stage-1 / rule sources (a DLRM fused before the embedding rule existed was timed as current)."""
    from onnxfuse.bench import cases
    (tmp_path / "rewrites").mkdir()
    (tmp_path / "fuse.py").write_text("x = 1\n")
    (tmp_path / "rewrites" / "rule.py").write_text("y = 1\n")
    first = cases.pipeline_fingerprint(tmp_path)
    cases._FINGERPRINTS.clear()
    assert cases.pipeline_fingerprint(tmp_path) == first
    cases._FINGERPRINTS.clear()
    (tmp_path / "rewrites" / "rule.py").write_text("y = 2\n")
    assert cases.pipeline_fingerprint(tmp_path) != first
    cases._FINGERPRINTS.clear()
    (tmp_path / "doctor.py").write_text("z = 1\n")  # the doctor writes no model
    second = cases.pipeline_fingerprint(tmp_path)
    cases._FINGERPRINTS.clear()
    (tmp_path / "doctor.py").write_text("z = 2\n")
    assert cases.pipeline_fingerprint(tmp_path) == second
    cases._FINGERPRINTS.clear()
    keys = set()
    for fp in ("a", "b"):
        monkeypatch.setattr(cases, "pipeline_fingerprint", lambda root=None, fp=fp: fp)
        keys.add(cases.CASES["dlrm"].make(16, "fp32", 0, True, 1).key)
    assert len(keys) == 2 and all(k.startswith("dlrm-16-fp32-s0-") for k in keys)


def test_bench_table_prints_the_readme_table(tmp_path, capsys):
    """`onnxfuse bench table R.json ...`: one markdown row per case and size, each side at its best variant."""
    from onnxfuse import cli
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_synthetic(unfused=0.10, fused=0.02, compiled=0.05)))
    assert cli.main(["bench", "table", str(path), str(path)]) == 0
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| dlrm-bottom")]
    assert len(rows) == 2
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    # eager 0.06, compile 0.05, unfused best of plain/graph 0.098, no ORT-optimized, fused best 0.02 (triton)
    assert cells[:7] == ["dlrm-bottom", "2048 batch", "0.060", "0.050", "0.098", "-", "0.020"]
    assert cells[7:10] == ["4.9×", "-", "2.5×"]
    assert cli.main(["bench", "table", str(tmp_path / "absent.json")]) == 2
    assert "no such results file" in capsys.readouterr().err


def test_bench_backends_prints_each_backend_with_its_roofline(tmp_path, capsys):
    """`onnxfuse bench backends R.json ...`: per case, every fused backend that ran at its faster of plain / graph,
    with % of the roofline (and over the GPU kernel time where profiled); backends that never ran get no column."""
    from onnxfuse import cli
    run = _synthetic(unfused=0.10, fused=0.02, compiled=0.05)
    v = run["cases"][0]["variants"]
    v["fused-triton+graph"] = dict(v["fused-triton"], median_ms=0.016, roofline_pct=62.5, gpu_kernel_us=10.0)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(run))
    assert cli.main(["bench", "backends", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| case | size | triton: ms") and "cuda: ms" in out[0] and "auto" not in out[0]
    cells = [c.strip() for c in out[2].strip("|").split("|")]
    # triton: the graph run (0.016, 62.5 % of the roofline; 100 % over its 10 us of kernels); cuda: plain 0.022
    assert cells == ["dlrm-bottom", "2048 batch", "0.016 g (62 %, 100 %)", "0.022 (50 %)"]
    assert cli.main(["bench", "backends"]) == 2
    assert "bench backends takes results JSONs" in capsys.readouterr().err


def test_kernel_roofline_takes_the_gpu_kernel_time_in_place_of_the_median():
    from onnxfuse.bench import ratios
    assert ratios.kernel_roofline({"roofline_pct": 60.0, "median_ms": 0.15, "gpu_kernel_us": 100.0}) == 90.0
    assert ratios.kernel_roofline({"roofline_pct": 60.0, "median_ms": 0.15}) is None  # not profiled


def _genai_row(folder, batch, prompt, graph, prefill, decode, vs):
    return {"folder": folder, "batch": batch, "prompt_tokens": prompt, "cuda_graph": graph, "prefill_ms": prefill,
            "decode_ms_per_token": decode, "prefill_limit_ms": 2.3 * prompt / 128, "decode_limit_ms": 3.25,
            "prefill_speedup_vs_first": vs, "decode_speedup_vs_first": vs}


@pytest.mark.skipif(not HAS_MPL, reason="matplotlib is not installed")
def test_bench_plot_genai_results(tmp_path, capsys):
    """`bench plot` draws a `bench genai` results file (rows, no 'cases'): its PNG, a group of bars a setting; one
    without rows, or a JSON of neither kind, is a one-line error."""
    from onnxfuse import cli
    settings = ((1, 128, False, 6.4, 5.3), (1, 2048, True, 49.7, 5.31), (8, 128, False, 24.4, 5.6))
    rows = [_genai_row(f, b, p, g, pre * k, dec * k, 1 / k)
            for f, k in (("/root/gen", 1.0), ("/root/gen-fused", 0.86)) for b, p, g, pre, dec in settings]
    path = tmp_path / "genai.json"
    path.write_text(json.dumps({"kind": "genai", "device": "test", "date": "2026-11-30", "rows": rows}))
    assert cli.main(["bench", "plot", str(path), "-o", str(tmp_path / "genai.png")]) == 0
    assert (tmp_path / "genai.png").stat().st_size > 5000
    assert "wrote" in capsys.readouterr().out
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"kind": "genai", "rows": []}))
    assert cli.main(["bench", "plot", str(empty)]) == 2
    assert "without rows: nothing to plot" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": rows}))  # not kind genai, no cases
    assert cli.main(["bench", "plot", str(other)]) == 2
    assert "not an onnxfuse bench results file" in capsys.readouterr().err
    assert not (tmp_path / "empty.png").exists() and not (tmp_path / "other.png").exists()
