"""Shared fixtures: tiny exports made once per session, and the GPU marker that skips cleanly without a GPU."""
from __future__ import annotations

import functools
import os
import pathlib
import warnings

import pytest
from hypothesis import HealthCheck, settings

warnings.filterwarnings("ignore")

# Hypothesis profiles shared by every property test: "quick" (CI, the default) and "nightly" (thousands of
# examples), chosen with ONNXFUSE_HYPOTHESIS_PROFILE=nightly. Tests whose examples are expensive lower the quick
# count only under the quick profile (see tests/test_properties.py).
HYPOTHESIS_PROFILE = os.environ.get("ONNXFUSE_HYPOTHESIS_PROFILE", "quick")
settings.register_profile("quick", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile(HYPOTHESIS_PROFILE)


def _gpu_available() -> bool:
    try:
        import onnxruntime as ort
        return "CUDAExecutionProvider" in ort.get_available_providers() and os.path.exists("/dev/nvidia0")
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU and onnxruntime-gpu (CUDAExecutionProvider)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("exports")


@pytest.fixture(scope="session")
def exported(export_dir):
    """exported(kind, exporter='dynamo', dtype='fp32', **spec overrides) -> path of a tiny exported model (cached)."""
    from onnxfuse import export, zoo

    @functools.lru_cache(maxsize=None)
    def make(kind: str, exporter: str = "dynamo", dtype: str = "fp32", **overrides):
        name = "-".join([kind, exporter, dtype] + [f"{k}{v}" for k, v in sorted(overrides.items())]) + ".onnx"
        path = export_dir / name
        if kind == "llama":
            spec = zoo.LlamaSpec.from_preset("tiny", **overrides)
        else:
            spec = zoo.DlrmSpec.from_preset("small", **overrides)
        export.export(kind, spec, path, exporter=exporter, dtype=dtype, force=True)
        return path

    return lambda kind, exporter="dynamo", dtype="fp32", **kw: make(kind, exporter, dtype, **kw)
