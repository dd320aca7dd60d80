"""runtime.session is the one session factory (bench's OrtRun, doctor, stage 1, soundness): what it hands
onnxruntime for the CUDA EP is pinned here on the CPU machine, where no CUDA session can be created, by recording
the InferenceSession call (the GPU tests run the real thing)."""
from __future__ import annotations

import types

import onnx
import pytest
from onnx import TensorProto, helper

from onnxfuse import kernels, runtime, schema


def _model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", schema.ONNX_OPSET)],
                             ir_version=schema.IR_VERSION)


@pytest.fixture
def recorded(monkeypatch):
    """runtime.ort() as onnxruntime with a CUDA EP listed and InferenceSession recording its arguments."""
    import onnxruntime as real
    calls = []

    def inference_session(src, so, providers):
        entries = {k: so.get_session_config_entry(k) for k in ("session.disable_cpu_ep_fallback",)
                   if _has_entry(so, k)}
        calls.append({"providers": providers, "entries": entries, "library": kernels.registered_library(so),
                      "level": so.graph_optimization_level})
        return "session"

    fake = types.SimpleNamespace(**{n: getattr(real, n) for n in ("SessionOptions", "GraphOptimizationLevel",
                                                                  "__version__")})
    fake.get_available_providers = lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    fake.InferenceSession = inference_session
    monkeypatch.setattr(runtime, "ort", lambda: fake)
    return calls


def _has_entry(so, key) -> bool:
    try:
        so.get_session_config_entry(key)
        return True
    except Exception:
        return False


def test_bench_style_cuda_session_keeps_the_cpu_ep_and_the_graph_option(recorded):
    """OrtRun: CUDA EP with its options (+ enable_cuda_graph), the CPU EP after it, the given library registered."""
    lib = kernels.library_path(provider="cpu")
    assert runtime.session(_model(), "cuda", library=lib, cuda_graph=True,
                           provider_options={"use_tf32": "0"}) == "session"
    call = recorded[-1]
    assert call["providers"] == [("CUDAExecutionProvider", {"use_tf32": "0", "enable_cuda_graph": "1"}),
                                 "CPUExecutionProvider"]
    assert call["library"] == str(lib) and call["entries"] == {}


def test_doctor_style_cuda_session_has_no_cpu_fallback(recorded):
    """doctor: only the CUDA EP and session.disable_cpu_ep_fallback, so a node that cannot run on the GPU fails."""
    lib = kernels.library_path(provider="cpu")
    runtime.session(_model(), "cuda", library=lib, provider_options={"has_user_compute_stream": "1"},
                    cpu_fallback=False)
    call = recorded[-1]
    assert call["providers"] == [("CUDAExecutionProvider", {"has_user_compute_stream": "1"})]
    assert call["entries"] == {"session.disable_cpu_ep_fallback": "1"}


def test_unfused_session_registers_no_library_and_cpu_ignores_fallback(recorded):
    runtime.session(_model(), "cuda", graph_optimization=False)
    call = recorded[-1]
    assert call["library"] is None and call["providers"][-1] == "CPUExecutionProvider"
    import onnxruntime as real
    assert call["level"] == real.GraphOptimizationLevel.ORT_DISABLE_ALL
    runtime.session(_model(), "cpu", cpu_fallback=False)
    assert recorded[-1]["providers"] == ["CPUExecutionProvider"] and recorded[-1]["entries"] == {}
