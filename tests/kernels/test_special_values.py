"""IEEE semantics of the fused ops on the CPU: NaN in an input reaches every output it feeds, +-Inf behaves as in
PyTorch (relu(-Inf) = 0, sigmoid(+-Inf) = 1 / 0), fp16 overflow gives Inf. The doctor's special-values mode runs every
op x dtype on rows of NaN, +-Inf, -0, the type's max and subnormals, with the weighted ops' weights as graph inputs
(the built-in GEMM) and as initializers (oneDNN's post-ops where the library and the CPU have them); the case that
started it (MatMul + Add + Relu on a NaN row, fused into LinearRelu, gave 0) runs through `fuse` end to end.
GPU rows of the same mode run in tests/test_gpu.py."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from onnxfuse import fuse, kernels, runtime, schema, testing
from onnxfuse import doctor


def test_doctor_special_values_on_the_cpu():
    rows = doctor.run_doctor(providers=("cpu",), special=True)
    bad = [doctor.format_row(r) for r in rows if r["status"] != "PASS"]
    assert not bad, "\n".join(bad)
    ran = {(r["op"], r["weights"]) for r in rows}
    assert {op for op, _ in ran} == set(schema.OPS)
    assert {(op, "constants") for op in doctor.WEIGHTED_OPS} <= ran  # the prepacked (oneDNN) path ran too
    assert all(r["values"] == "special" for r in rows)


def test_special_rows_hold_every_kind_of_value():
    x, changed = testing.with_special_rows(torch.zeros(9, 5, dtype=torch.float16))
    assert changed == 7
    assert torch.isnan(x[0]).all() and torch.isnan(x[1]).sum() == 1
    assert x[2].max() == float("inf") and x[3].min() == float("-inf")
    assert torch.signbit(x[4]).all() and (x[4] == 0).all()
    assert x[5].max() == torch.finfo(torch.float16).max
    assert (x[6] > 0).all() and (x[6] < torch.finfo(torch.float16).smallest_normal).all()  # subnormal
    assert (x[7:] == 0).all()


@pytest.mark.parametrize("bad,why", [
    (lambda y: np.where(np.isnan(y), 0.0, y), "NaN of the reference lost"),
    (lambda y: np.where(np.isinf(y), 65504.0, y), "differ in +-Inf"),
    (lambda y: np.where(np.isfinite(y), y + 1.0, y), "finite values"),
])
def test_check_special_fails_a_kernel_that_drops_special_values(bad, why):
    ref = np.array([[np.nan, 1.0, -np.inf], [0.5, np.inf, 2.0]], dtype=np.float32)
    assert testing.check_special(ref.copy(), ref, "float").ok
    c = testing.check_special(bad(ref.copy()), ref, "float")
    assert not c.ok and why in c.reason, c.reason


def _linear_relu_model(path, k=8, n=12):  # n >= 8: not the narrow dot-product path
    g = torch.Generator().manual_seed(0)
    w = helper.make_tensor("W", TensorProto.FLOAT, [k, n], (torch.randn(k, n, generator=g) / k ** 0.5).flatten())
    b = helper.make_tensor("b", TensorProto.FLOAT, [n], torch.randn(n, generator=g).flatten() * 0.1)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
         helper.make_node("Relu", ["u"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])], initializer=[w, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))


@pytest.mark.parametrize("rows", [5, 300])  # one oneDNN call; several row tiles on onnxruntime's pool
def test_fused_linear_relu_keeps_a_nan_row(tmp_path, rows):
    """The reported case: a row of NaN through MatMul + Add + Relu is NaN in onnxruntime unfused and in PyTorch; the
    fused LinearRelu (weights are initializers: the prepacked oneDNN path where the library has oneDNN) must agree."""
    _linear_relu_model(tmp_path / "m.onnx")
    res = fuse.fuse(tmp_path / "m.onnx", tmp_path / "f.onnx", ort=False, patterns=["linear_act"])
    assert [m.op for m in res.matches] == ["LinearRelu"]
    x, _ = testing.with_special_rows(torch.randn(rows, 8, generator=torch.Generator().manual_seed(1)))
    feeds = {"x": x.numpy()}
    unfused = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    fused = runtime.session(str(tmp_path / "f.onnx"), library=True).run(None, feeds)[0]
    assert np.isnan(unfused[0]).all() and np.isnan(fused[0]).all(), fused[0]
    c = testing.check_special(fused, unfused, "float")
    assert c.ok, c.reason


def test_onednn_relu_keeps_nan_in_every_type():
    """LinearRelu with constant weights in fp32/fp16/bf16: NaN rows stay NaN and -Inf rows give 0 whichever GEMM the
    host takes for the type (kernels.host_info says which)."""
    lib = kernels.library_path()
    for dtype in schema.TYPES:
        t = testing.torch_type(dtype)
        g = torch.Generator().manual_seed(2)
        x, _ = testing.with_special_rows(torch.randn(40, 130, generator=g).to(t))
        w = (torch.randn(130, 200, generator=g) / 130 ** 0.5).to(t)
        b = torch.randn(200, generator=g).to(t)
        out = testing.run_op("LinearRelu", [x, w, b], library=lib, constants=True)
        ref = schema.reference("LinearRelu", [x, w, b])
        c = testing.check_special(out, ref, dtype)
        assert c.ok, f"{dtype} ({kernels.host_info(lib)['onednn']}): {c.reason}"
