"""`onnxfuse tune` and the tuned table the build applies (onnxfuse/tune.py, triton/tuned.json, aot.py's
default_overrides): candidates, the table's format and merge, the build picking it up, the doctor covering every
tuned config, and clear errors. The sweep itself runs on the GPU (marker gpu)."""
from __future__ import annotations

import json

import pytest

from onnxfuse import cli
from onnxfuse import doctor, tune

aot = tune._aot()


@pytest.mark.parametrize("kernel", tune.KERNELS)
@pytest.mark.parametrize("size", tune.SIZES)
def test_candidates_start_with_the_built_in_config_and_fit_in_shared_memory(kernel, size):
    default = tuple(aot.configs_for("90")[kernel]["h"][size])
    cands = tune.candidates(kernel, size, default)
    assert cands[0] == default and len(cands) == len(set(cands)) >= 8
    assert all(len(c) == 6 and all(isinstance(v, int) and v > 0 for v in c) for c in cands)
    assert all(tune.shared_bytes(kernel, c) <= tune.SHARED_LIMIT for c in cands[1:])
    if size == "small":
        assert all(c[0] == 16 for c in cands)  # the decode class is one 16-row tile


def test_the_committed_table_is_valid_and_the_build_applies_it():
    table = tune.load_table()
    tuned = {a: k for a, k in table.items() if a != "meta"}
    over = aot.default_overrides()
    assert over == tuned
    for arch, kernels in tuned.items():
        cfgs = aot.configs_for(arch, over)
        for kernel, groups in kernels.items():
            for group, classes in groups.items():
                for size, cfg in classes.items():
                    assert cfgs[kernel][group][size] == cfg


def test_configs_file_overrides_the_tuned_table(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"90": {"swiglu": {"h": {"large": [64, 64, 32, 4, 4, 2]}}}, "meta": {"x": 1}}))
    over = aot.default_overrides(f)
    assert aot.configs_for("90", over)["swiglu"]["h"]["large"] == [64, 64, 32, 4, 4, 2]
    assert aot.configs_for("90", over)["swiglu"]["h"]["small"] == aot.configs_for("90", aot.default_overrides())[
        "swiglu"]["h"]["small"]


def test_merge_keeps_other_entries_and_meta_per_arch():
    base = {"90": {"swiglu": {"h": {"small": [16, 64, 128, 1, 4, 4]}}}, "meta": {"arch": "90", "results": {}}}
    new = {"80": {"swiglu": {"h": {"large": [128, 128, 32, 8, 8, 3]}}},
           "90": {"linear_act": {"h": {"medium": [64, 128, 64, 8, 4, 4]}}}, "meta": {"arch": "80", "date": "d"}}
    out = tune.merge_tables(base, new)
    assert out["90"]["swiglu"]["h"]["small"] == [16, 64, 128, 1, 4, 4]
    assert out["90"]["linear_act"]["h"]["medium"] == [64, 128, 64, 8, 4, 4]
    assert out["80"]["swiglu"]["h"]["large"] == [128, 128, 32, 8, 8, 3]
    assert set(out["meta"]) == {"90", "80"}


@pytest.mark.parametrize("bad, what", [
    ({"sm90": {}}, "not a number"),
    ({"90": {"gemm": {"h": {"small": [1] * 6}}}}, "unknown kernel"),
    ({"90": {"swiglu": {"x": {"small": [1] * 6}}}}, "dtype group"),
    ({"90": {"swiglu": {"h": {"tiny": [1] * 6}}}}, "unknown size class"),
    ({"90": {"swiglu": {"h": {"small": [16, 64, 128, 1, 4]}}}}, "six positive ints"),
])
def test_a_bad_table_is_refused_naming_the_entry(bad, what):
    with pytest.raises(ValueError, match=what):
        tune.validate(bad, "t.json")


def test_save_writes_whole_tables_only(tmp_path):
    out = tmp_path / "t.json"
    table = {"90": {"swiglu": {"h": {"small": [16, 64, 128, 1, 4, 4]}}}, "meta": {"arch": "90"}}
    assert "merge it into" in tune.save(table, out)
    assert json.loads(out.read_text()) == table
    with pytest.raises(ValueError):
        tune.save({"90": {"swiglu": {"h": {"small": [0, 0]}}}}, tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists() and list(tmp_path.glob("*.tmp")) == []


def test_the_package_table_holds_configs_and_the_timings_go_to_a_record(tmp_path, monkeypatch):
    package = tmp_path / "tuned.json"
    package.write_text(json.dumps({"90": {"swiglu": {"h": {"small": [16, 64, 128, 1, 4, 4]}}}}))
    monkeypatch.setattr(tune, "TUNED_FILE", package)
    table = {"90": {"linear_act": {"h": {"large": [128, 128, 32, 8, 8, 3]}}},
             "meta": {"arch": "90", "date": "2026-11-25", "results": {"linear_act": {}}}}
    msg = tune.save(table, package, records_dir=tmp_path / "records")
    written = json.loads(package.read_text())
    assert "meta" not in written and written["90"]["swiglu"]["h"]["small"] == [16, 64, 128, 1, 4, 4]
    assert written["90"]["linear_act"]["h"]["large"] == [128, 128, 32, 8, 8, 3]
    record = tmp_path / "records" / "tune-sm90-2026-11-25.json"
    assert json.loads(record.read_text())["results"] == {"linear_act": {}} and str(record) in msg
    # the package's own table holds no measurements either
    assert "meta" not in json.loads(tune.TRITON_DIR.joinpath("tuned.json").read_text())


def test_the_doctor_runs_every_tuned_config():
    assert tune.doctor_coverage(doctor.DEFAULT_SHAPES) == []
    # and the check can fail: without the large-M shapes, the large configs are not exercised
    shapes = {op: [s for s in v if not (isinstance(s[0], int) and s[0] > 256)]
              for op, v in doctor.DEFAULT_SHAPES.items()}
    assert {"linear_act/large", "swiglu/large", "lora_main/large"} <= set(tune.doctor_coverage(shapes))
    # the persistent TMA builds need K >= TMA_MIN_K as well: the large shapes with short K do not count
    short_k = {op: [s for s in v if not (isinstance(s[1], int) and s[1] >= 1024)]
               for op, v in doctor.DEFAULT_SHAPES.items()}
    assert set(tune.doctor_coverage(short_k)) == {"linear_act/large/tma", "lora_main/large/tma"}


def test_the_doctor_reaches_both_gate_passes_of_the_cublas_path():
    """From triton/table.py LORA_SWIGLU_CUBLAS's rows and K, LoRASwiGLU and LoRAGatedMLP run the CUDA gate pass where
    it takes the shape (cuda/swiglu.cu: 16-byte rows, N a multiple of 64, every rank a multiple of 8 to 16) and
    Triton's lora_gate elsewhere: the doctor's rows must reach both passes in both ops."""
    from onnxfuse.kernels.build import aot_module
    min_m, min_k = aot_module().TABLE.LORA_SWIGLU_CUBLAS

    def cuda_pass(shape):
        m, k, n, *ranks = [v for v in shape if isinstance(v, int)]
        return k % 16 == 0 and n % 64 == 0 and all(r % 8 == 0 and r <= 16 for r in ranks)

    for op in ("LoRASwiGLU", "LoRAGatedMLP"):
        on_cublas = [s for s in doctor.DEFAULT_SHAPES[op] if s[0] >= min_m and s[1] >= min_k]
        assert any(map(cuda_pass, on_cublas)) and not all(map(cuda_pass, on_cublas)), (op, on_cublas)


def test_tune_cli_needs_an_output_and_a_gpu(tmp_path, capsys, monkeypatch):
    assert cli.main(["tune"]) == 2
    assert "-o FILE.json, or --into-package" in capsys.readouterr().err
    assert cli.main(["tune", "-o", str(tmp_path / "no" / "t.json")]) == 2
    assert "no folder" in capsys.readouterr().err
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["tune", "-o", str(tmp_path / "t.json")]) != 0
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "t.json").exists()


@pytest.mark.gpu
def test_tune_sweeps_checks_and_picks_on_the_gpu(tmp_path):
    table = tune.run_tune(kernels=("linear_act",), sizes=("small",), jobs=4, rep_ms=20)
    arch = table["meta"]["arch"]
    res = table["meta"]["results"]["linear_act"]["small"]
    ran = [r for r in res["candidates"] if r["ms"] is not None]
    assert len(ran) >= 4 and all(r["rel_err"] <= 2e-2 for r in ran)
    assert table[arch]["linear_act"]["h"]["small"] == res["picked"]
    assert res["picked_ms"] <= res["built_in_ms"]
    tune.save(table, tmp_path / "t.json")
    assert aot.configs_for(arch, aot.default_overrides(tmp_path / "t.json"))["linear_act"]["h"]["small"] == \
        res["picked"]
