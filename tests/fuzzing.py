"""What the differential fuzzers share: how many graphs each runs per profile, and the one comparison of a fused
model with its original in onnxruntime (IEEE placement of NaN/+-Inf, then the finite values within tolerance).

Quick profile (CI, fixed seed): a few hundred graphs in all, under 3 minutes on 2 cores. Nightly
(ONNXFUSE_HYPOTHESIS_PROFILE=nightly): NIGHTLY graphs per fuzzer, 10,000 in all.
"""
from __future__ import annotations

import os
import pathlib
import tempfile

import numpy as np
import onnx
from hypothesis import settings

from onnxfuse import fuse, runtime, testing

QUICK = os.environ.get("ONNXFUSE_HYPOTHESIS_PROFILE", "quick") == "quick"
# graphs per fuzzer: (quick, nightly); the nightly column sums to 10,000
COUNTS = {"gemm": (150, 6000), "rotary": (80, 1600), "embedding": (50, 1000), "interaction": (60, 1200),
          "bags": (8, 200)}


def fuzz_settings(name: str):
    """hypothesis settings for fuzzer `name` under the active profile."""
    quick, nightly = COUNTS[name]
    return settings(max_examples=quick if QUICK else nightly)


def compare_fused(model: onnx.ModelProto, feeds: list[dict], tol: float, function_bodies: bool = False) -> list:
    """Fuse `model` (defaults: every rule, CUDA-or-CPU-agnostic), then run the original (plain onnxruntime) and the
    fused model (the kernel library; with function_bodies, also its ONNX function fallbacks) on every feed: same
    shapes and types, NaN and +-Inf exactly where the original has them, finite values within tol of the largest.
    Returns the fuse result's matches (empty when nothing fused)."""
    onnx.checker.check_model(model, full_check=True)  # the generators make valid models
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = pathlib.Path(tmp) / "m.onnx", pathlib.Path(tmp) / "f.onnx"
        onnx.save(model, str(src))
        res = fuse.fuse(src, dst)  # the soundness gate raises if the output is unloadable or changes a signature
        if not dst.exists():
            return []
        ref_sess = runtime.session(str(src), "cpu", library=False)
        sessions = [runtime.session(str(dst), "cpu", library=True)]
        if function_bodies:
            sessions.append(runtime.session(str(dst), "cpu", library=False))
        for f in feeds:
            ref = ref_sess.run(None, f)
            for sess in sessions:
                for r, o, info in zip(ref, sess.run(None, f), ref_sess.get_outputs()):
                    assert r.shape == o.shape and r.dtype == o.dtype, (info.name, r.shape, o.shape)
                    if not np.issubdtype(r.dtype, np.floating):
                        assert np.array_equal(r, o), info.name
                        continue
                    r64, o64 = r.astype(np.float64), o.astype(np.float64)
                    mismatch = testing.special_mismatch(o64, r64)
                    assert mismatch is None, (info.name, mismatch)
                    fin = np.isfinite(r64)
                    scale = max(1.0, float(np.max(np.abs(r64[fin]), initial=0.0)))
                    err = float(np.max(np.abs(o64[fin] - r64[fin]), initial=0.0))
                    assert err <= tol * scale, (info.name, err)
        return list(res.matches)
