"""The installed package as a library and a command line people can depend on (issue 14): stage progress on stderr
(never with -q or --json), info --check and -q, view without netron, one list syntax, errors that point at the
command's help, tables that never cut numbers, `import onnxfuse` (lazy, callable submodules, no torch), and
runtime.session with the user's SessionOptions."""
from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import onnxfuse
from onnxfuse import cli, kernels, runtime

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fused_tiny(tmp_path_factory, exported):
    """(unfused, fused) paths of the tiny 1-layer Llama."""
    from onnxfuse import fuse
    src = exported("llama", num_hidden_layers=1)
    out = tmp_path_factory.mktemp("ux") / "llama.fused.onnx"
    fuse.fuse(src, out, force=True)
    return src, out


def _stage_lines(err: str, command: str) -> list[str]:
    return re.findall(rf"^onnxfuse {command} \[(\d)/(\d)\] ([a-z ]+)(?::|$)", err, flags=re.M)


# ------------------------------------------------------------------------------------------------ progress
def test_export_stages_on_stderr_and_the_data_file(tmp_path, capfd):
    out = tmp_path / "m.onnx"
    assert cli.main(["export", "llama", "--preset", "tiny", "-o", str(out), "--external-data"]) == 0
    cap = capfd.readouterr()
    assert [s[2] for s in _stage_lines(cap.err, "export")] == ["module", "export", "write", "external data"]
    assert {s[1] for s in _stage_lines(cap.err, "export")} == {"4"}
    assert re.search(r"external data: \S*m\.onnx\.data \(", cap.err), cap.err
    assert f"wrote {out} and its weights {out}.data (" in cap.out and (tmp_path / "m.onnx.data").is_file()
    assert "onnxfuse export" not in cap.out  # progress never on stdout

    out2 = tmp_path / "q.onnx"
    assert cli.main(["export", "llama", "--preset", "tiny", "-o", str(out2), "-q"]) == 0
    cap = capfd.readouterr()
    assert cap.out == "" and cap.err == "" and out2.is_file()

    out3 = tmp_path / "j.onnx"
    assert cli.main(["export", "llama", "--preset", "tiny", "-o", str(out3), "--json"]) == 0
    cap = capfd.readouterr()
    data = json.loads(cap.out)
    assert cap.err == "" and data["path"] == str(out3) and data["data_path"] is None


def test_export_without_external_data_says_so(tmp_path, capfd):
    assert cli.main(["export", "llama", "--preset", "tiny", "-o", str(tmp_path / "m.onnx")]) == 0
    err = capfd.readouterr().err
    assert re.search(r"\[4/4\] external data: none: .* stay inside the \.onnx", err), err
    assert not (tmp_path / "m.onnx.data").exists()


def test_verify_stages_quiet_and_json(fused_tiny, capfd):
    _, fused = fused_tiny
    assert cli.main(["verify", str(fused)]) == 0
    cap = capfd.readouterr()
    assert [s[2] for s in _stage_lines(cap.err, "verify")] == ["torch reference", "onnxruntime session", "run"]
    assert "PASS" in cap.out and "onnxfuse verify [" not in cap.out
    assert cli.main(["verify", str(fused), "-q"]) == 0
    cap = capfd.readouterr()
    assert cap.out == "" and cap.err == ""
    assert cli.main(["verify", str(fused), "--json"]) == 0
    cap = capfd.readouterr()
    assert cap.err == "" and json.loads(cap.out)["passed"] is True


def test_first_use_build_inside_verify_is_one_line(fused_tiny, monkeypatch, capfd):
    """No cached library: verify builds one and says so once, naming the backends and the log; -q says nothing.
    (The build itself is stood in for by the real library, as tests/kernels/test_kernel_build.py builds for real.)"""
    _, fused = fused_tiny
    monkeypatch.delenv("ONNXFUSE_LIBRARY", raising=False)
    real = kernels.library_path(provider="cpu")
    calls = []

    def fake_build(backends, quiet, on_build_start):
        plan = argparse.Namespace(backends=backends, log_path=pathlib.Path("/cache/logs/k.log"))
        on_build_start(plan)
        calls.append(backends)
        return argparse.Namespace(path=real)

    monkeypatch.setattr(kernels, "find_cached", lambda need: None)
    monkeypatch.setattr(kernels, "build", fake_build)
    for quiet in (False, True):
        kernels._resolved.clear()
        assert cli.main(["verify", str(fused)] + (["-q"] if quiet else [])) == 0
        err = capfd.readouterr().err
        notices = [ln for ln in err.splitlines() if "building the kernel library" in ln]
        if quiet:
            assert err == ""
        else:
            assert len(notices) == 1 and "(cpu) for first use" in notices[0] and "log: /cache/logs/k.log" in notices[0]
    assert calls == [["cpu"], ["cpu"]]
    kernels._resolved.clear()


# ------------------------------------------------------------------------------------------------ info, view
def _rows(statuses):
    base = dict(op="SwiGLU", provider="cpu", backend="cpu", dtype="fp32", M=16, K=64, N=176, r=0, layers=None,
                mode="plain", max_err=1e-7, tol=1e-4, seconds=0.1, detail="")
    rows = []
    for s in statuses:
        r = dict(base, status=s)
        if s == "SKIP":
            r.update(provider="cuda", backend="triton", max_err=None, tol=None, detail="skipped: no CUDA EP here")
        if s == "FAIL":
            r.update(max_err=0.5, detail="the one failure in full")
        rows.append(r)
    return rows


def test_info_check_skips_pass_and_failures_are_shown(monkeypatch, capsys):
    from onnxfuse import doctor
    monkeypatch.setattr(doctor, "run_doctor", lambda: _rows(["PASS"] * 3 + ["SKIP"] * 500))
    assert cli.main(["info", "--check"]) == 0  # skipped checks are not failures
    out = capsys.readouterr().out
    assert "3 passed, 0 failed, 500 skipped" in out and "SKIP 500 checks: no CUDA EP here" in out
    assert len(out.splitlines()) < 40  # a summary, not a row per check
    assert cli.main(["info", "--check", "-q"]) == 0 and capsys.readouterr().out == ""
    assert cli.main(["info", "--check", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["check_passed"] is True and data["check_summary"]["skip"] == 500

    monkeypatch.setattr(doctor, "run_doctor", lambda: _rows(["PASS"] * 3 + ["FAIL"] + ["SKIP"] * 5))
    assert cli.main(["info", "--check"]) == 1
    out = capsys.readouterr().out
    assert "the one failure in full" in out and "3 passed, 1 failed, 5 skipped" in out
    assert out.count("PASS") == 0  # passing checks are counted, not listed
    assert cli.main(["info", "--check", "-q"]) == 1 and capsys.readouterr().out == ""


def test_info_quiet_prints_nothing(capsys):
    assert cli.main(["info", "-q"]) == 0
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err == ""


def test_view_without_netron_is_one_line(fused_tiny, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "netron", None)  # import netron raises ImportError
    for argv in (["view", str(fused_tiny[1]), "--no-browser"], ["view", "--screenshot", "x.png", str(fused_tiny[1])]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "pip install 'onnxfuse[view]'" in err, err


# ------------------------------------------------------------------------------------------------ parser
def _all_parsers(parser, path=("onnxfuse",)):
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _all_parsers(sub, path + (name,))


def test_every_list_flag_takes_commas():
    """One list syntax: no option takes space-separated values (nargs + or *); the list options parse commas."""
    for name, p in _all_parsers(cli.build_parser()):
        for a in p._actions:
            if a.option_strings and a.nargs in ("+", "*"):
                pytest.fail(f"{name} {a.option_strings[0]} takes space-separated values; use commas")
    parse = cli.build_parser().parse_args
    a = parse(["export", "llama", "--lora-rank", "4", "--lora-targets", "gate_proj,up_proj"])
    assert a.lora_targets == ["gate_proj", "up_proj"]
    a = parse(["export", "dlrm", "--bottom-mlp", "512,256,64,16", "--top-mlp", "512-256-1"])  # dashes still read
    assert a.bottom_mlp == (512, 256, 64, 16) and a.top_mlp == (512, 256, 1)
    assert parse(["build", "--backends", "cpu,cuda", "--arch", "80,90"]).backends == ["cpu", "cuda"]
    assert parse(["fuse", "m.onnx", "--patterns", "swiglu,linear_act"]).patterns == ["swiglu", "linear_act"]
    a = parse(["bench", "--sizes", "16,128", "--variants", "ort-unfused,fused-cpu"])
    assert a.sizes == [16, 128] and a.variants == ["ort-unfused", "fused-cpu"]


@pytest.mark.parametrize("argv,help_of", [
    (["fuse", "m.onnx", "--bogus"], "onnxfuse fuse"),
    (["export", "llama", "--bogus"], "onnxfuse export llama"),
    (["build", "--backends", "fortran"], "onnxfuse build"),
    (["verify"], "onnxfuse verify"),
    (["bench", "--sizes", "0"], "onnxfuse bench"),
    (["--bogus"], "onnxfuse"),
])
def test_errors_point_at_the_commands_help(argv, help_of, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith(f"(see '{help_of} --help')"), err


# ------------------------------------------------------------------------------------------------ tables
def test_numbers_are_never_cut_in_80_columns():
    from rich.console import Console

    from onnxfuse._term import Table
    t = Table("output", "shape", "max abs err", "max rel err", "rel L2 err", "tolerance", "result",
              numeric=("shape", "max abs err", "max rel err", "rel L2 err", "tolerance"))
    numbers = ["1.369e-06", "2.270e-07", "1.468e-07"]
    t.add_row("a_rather_long_output_name_that_must_give_way", "2x1024x1024", *numbers, "1e-04", "PASS")
    for width in (80, 72):
        buf = io.StringIO()
        Console(file=buf, width=width, highlight=False).print(t)
        text = buf.getvalue()
        assert "…" not in text and all(n in text for n in numbers + ["2x1024x1024"]), text
        assert max(len(ln) for ln in text.splitlines()) <= width


def test_verify_table_in_an_80_column_terminal(fused_tiny, monkeypatch, capfd):
    monkeypatch.setenv("COLUMNS", "80")
    assert cli.main(["verify", str(fused_tiny[1]), "--json"]) == 0
    res = json.loads(capfd.readouterr().out)
    assert cli.main(["verify", str(fused_tiny[1])]) == 0
    out = capfd.readouterr().out
    o = res["outputs"][0]
    for v in (o["max_abs_err"], o["max_rel_err"], o["rel_l2_err"]):
        assert f"{v:.3e}" in out, out
    assert "…" not in out and max(len(ln) for ln in out.splitlines()) <= 80


# ------------------------------------------------------------------------------------------------ the API
def test_import_is_lazy_and_fast():
    code = ("import sys, time; t = time.perf_counter(); import onnxfuse; dt = time.perf_counter() - t; "
            "heavy = sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'transformers') if m in sys.modules); "
            "print(dt, heavy, callable(onnxfuse.fuse), sorted(onnxfuse.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split(maxsplit=1)
    assert float(out[0]) < 0.5 and out[1].startswith("[] True"), out


def test_top_level_names():
    import inspect

    from onnxfuse import export, fuse, verify  # the submodules, as before
    assert onnxfuse.export is export and onnxfuse.fuse is fuse and onnxfuse.verify is verify
    assert callable(onnxfuse.export) and callable(onnxfuse.fuse) and callable(onnxfuse.verify)
    assert fuse.fuse.__module__ == "onnxfuse.fuse" and hasattr(fuse, "FuseResult")
    assert onnxfuse.session is runtime.session
    assert "tolerance" in inspect.signature(onnxfuse.verify).parameters
    assert onnxfuse.kernels is kernels


def test_top_level_calls(fused_tiny, tmp_path):
    src, _ = fused_tiny
    res = onnxfuse.fuse(src, tmp_path / "f.onnx")
    assert res.changed and (tmp_path / "f.onnx").is_file()
    assert onnxfuse.verify(tmp_path / "f.onnx").passed
    sess = onnxfuse.session(tmp_path / "f.onnx")
    assert [o.name for o in sess.get_outputs()] == ["last_hidden_state"]


def test_session_takes_the_users_options(fused_tiny, tmp_path):
    """runtime.session(sess_options=): the user's settings are kept (here profiling, one thread), onnxfuse adds its
    library once, even when the same options serve two sessions."""
    import onnxruntime as ort
    _, fused = fused_tiny
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    s1 = runtime.session(fused, sess_options=so)
    s2 = runtime.session(fused, sess_options=so)
    assert kernels.registered_library(so) and so.intra_op_num_threads == 1
    feeds = runtime.random_feeds(s1)
    feeds = {k: (v % 256 if v.dtype == np.int64 else v) for k, v in feeds.items()}
    np.testing.assert_array_equal(s1.run(None, feeds)[0], s2.run(None, feeds)[0])
    prof = pathlib.Path(s1.end_profiling())
    assert prof.is_file() and prof.name.startswith("prof") and "SwiGLU" in prof.read_text()


def test_public_api_has_docstrings():
    """Every public function, class, method and property of the modules users call has a docstring."""
    missing = public_without_docstrings()
    assert missing == [], missing


API_MODULES = ("onnxfuse", "onnxfuse.export", "onnxfuse.fuse", "onnxfuse.verify", "onnxfuse.runtime",
               "onnxfuse.kernels", "onnxfuse.kernels.build", "onnxfuse.kernels.cache", "onnxfuse.kernels.toolchain")


def public_without_docstrings(modules=API_MODULES) -> list[str]:
    import importlib
    import inspect
    out = []
    for name in modules:
        mod = importlib.import_module(name)
        names = getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")]
        for attr in names:
            obj = getattr(mod, attr, None)
            if inspect.ismodule(obj) or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if getattr(obj, "__module__", name) != name and name != "onnxfuse.kernels":
                continue  # imported from elsewhere: counted where it is defined
            if not (obj.__doc__ or "").strip() or (inspect.isclass(obj) and obj.__doc__.startswith(obj.__name__ + "(")):
                out.append(f"{name}.{attr}")  # (a dataclass without one gets its signature as __doc__)
            if inspect.isclass(obj):
                for m, member in vars(obj).items():
                    if m.startswith("_"):
                        continue
                    fn = member.fget if isinstance(member, property) else member
                    if (inspect.isfunction(fn) or isinstance(member, property)) and not (fn.__doc__ or "").strip():
                        out.append(f"{name}.{attr}.{m}")
    return sorted(set(out))


def test_quiet_and_json_on_the_model_commands(fused_tiny, tmp_path, capfd):
    """-q prints nothing at all; --json prints one JSON document on stdout and nothing on stderr."""
    src, fused = fused_tiny
    runs = {
        "fuse": (["fuse", str(src), "-o", str(tmp_path / "q.onnx")],
                 ["fuse", str(src), "-o", str(tmp_path / "j.onnx")]),
        "run": (["run", str(fused)], ["run", str(fused)]),
        "cache": (["cache"], ["cache"]),
        "build": (["build", "--print-path"], ["build", "--print-path"]),
    }
    for name, (quiet, as_json) in runs.items():
        assert cli.main(quiet + ["-q"]) == 0, name
        cap = capfd.readouterr()
        assert cap.err == "" and (cap.out == "" or name == "build"), (name, cap)  # --print-path prints the path
        assert cli.main(as_json + ["--json"]) == 0, name
        cap = capfd.readouterr()
        assert cap.err == "", (name, cap.err)
        json.loads(cap.out)
