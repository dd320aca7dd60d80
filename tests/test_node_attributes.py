"""Kernel choice lives in the model, not the environment: `fuse --backend` writes the nodes' backend attribute,
`runtime.session(backend=, node_attributes=)` sets attributes on an in-memory copy, and fused models carry no
environment-variable names."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxfuse import cli, fuse, runtime, schema, zoo
from onnxfuse.errors import OnnxfuseError


def _onnxfuse_nodes(path) -> list[onnx.NodeProto]:
    return [n for n in onnx.load(str(path), load_external_data=False).graph.node if n.domain == schema.DOMAIN]


def _attr(node: onnx.NodeProto, name: str):
    a = next((a for a in node.attribute if a.name == name), None)
    return None if a is None else onnx.helper.get_attribute_value(a)


@pytest.fixture(scope="module")
def dlrm(exported):
    return exported("dlrm")


def _feeds(path):
    return {k: v.numpy() for k, v in zoo.make_inputs("dlrm", zoo.DlrmSpec.from_preset("small"), 0, "fp32").items()}


def test_fuse_backend_sets_every_node(dlrm, tmp_path):
    default = fuse.fuse(dlrm, tmp_path / "auto.onnx")
    res = fuse.fuse(dlrm, tmp_path / "triton.onnx", backend="triton")
    assert res.matches and len(res.matches) == len(default.matches)
    assert {_attr(n, "backend").decode() for n in _onnxfuse_nodes(tmp_path / "auto.onnx")} == {"auto"}
    nodes = _onnxfuse_nodes(tmp_path / "triton.onnx")
    assert nodes and {_attr(n, "backend").decode() for n in nodes} == {"triton"}
    # On the CPU EP every backend value runs the CPU kernels: same outputs as the auto model.
    feeds = _feeds(dlrm)
    a = runtime.session(str(tmp_path / "auto.onnx"), library=True).run(None, feeds)[0]
    b = runtime.session(str(tmp_path / "triton.onnx"), library=True).run(None, feeds)[0]
    np.testing.assert_array_equal(a, b)


def test_fuse_backend_from_the_cli(dlrm, tmp_path, capsys):
    assert cli.main(["fuse", str(dlrm), "-o", str(tmp_path / "f.onnx"), "--backend", "cuda", "-q"]) == 0
    assert {_attr(n, "backend").decode() for n in _onnxfuse_nodes(tmp_path / "f.onnx")} == {"cuda"}
    assert cli.main(["fuse", str(dlrm), "-o", str(tmp_path / "g.onnx"), "--backend", "gpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--backend" in err and "triton" in err
    assert not (tmp_path / "g.onnx").exists()
    with pytest.raises(OnnxfuseError, match="--backend must be one of auto, cpu, cuda, triton"):
        fuse.fuse(dlrm, tmp_path / "h.onnx", backend="gpu")


def test_session_backend_changes_a_copy_not_the_file(dlrm, tmp_path):
    fuse.fuse(dlrm, tmp_path / "f.onnx")
    before = (tmp_path / "f.onnx").read_bytes()
    sess = runtime.session(str(tmp_path / "f.onnx"), backend="cuda", library=True)
    sess.run(None, _feeds(dlrm))
    assert (tmp_path / "f.onnx").read_bytes() == before
    with pytest.raises(OnnxfuseError, match="--backend must be one of"):
        runtime.session(str(tmp_path / "f.onnx"), backend="gpu")


def test_session_node_attributes_reach_the_kernel(dlrm, tmp_path):
    """stack_mode is read by the library when the session creates the MLPStack kernels: a bad value fails there."""
    fuse.fuse(dlrm, tmp_path / "f.onnx")
    assert any(n.op_type == "MLPStack" for n in _onnxfuse_nodes(tmp_path / "f.onnx"))
    feeds = _feeds(dlrm)
    ref = runtime.session(str(tmp_path / "f.onnx"), library=True).run(None, feeds)[0]
    for mode in schema.STACK_MODES:
        out = runtime.session(str(tmp_path / "f.onnx"), library=True, node_attributes={"stack_mode": mode})
        out = out.run(None, feeds)[0]
        if mode == "layers":
            # The CPU kernel runs each layer over all rows instead of 64-row blocks through every layer: oneDNN may
            # pick another kernel for the other row count (it does on AVX2 hosts), which sums in another order.
            np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
        else:  # auto, fused and grid run the same CPU code (mlp_stack.cc): the same bits
            np.testing.assert_array_equal(out, ref)
    with pytest.raises(OnnxfuseError, match="stack_mode 'one'"):
        runtime.session(str(tmp_path / "f.onnx"), library=True, node_attributes={"stack_mode": "one"})
    with pytest.raises(OnnxfuseError, match="unknown onnxfuse node attribute 'stack'"):
        runtime.session(str(tmp_path / "f.onnx"), library=True, node_attributes={"stack": "fused"})


def test_set_node_attributes_only_touches_ops_that_take_them(dlrm, tmp_path):
    fuse.fuse(dlrm, tmp_path / "f.onnx")
    model = onnx.load(str(tmp_path / "f.onnx"))
    n = runtime.set_node_attributes(model, {"stack_mode": "layers", "scale": 0.5})
    stacks = [x for x in model.graph.node if x.op_type == "MLPStack"]
    assert n == len(stacks) > 0
    assert all(_attr(x, "stack_mode").decode() == "layers" and _attr(x, "scale") is None for x in stacks)


def test_session_backend_with_external_weights(dlrm, tmp_path):
    """A model whose weights are in '<model>.data' is copied in memory without its weights; onnxruntime reads them
    from the model's folder."""
    fuse.fuse(dlrm, tmp_path / "f.onnx", external_data=True)
    assert (tmp_path / "f.onnx.data").is_file()
    feeds = _feeds(dlrm)
    ref = runtime.session(str(tmp_path / "f.onnx"), library=True).run(None, feeds)[0]
    out = runtime.session(str(tmp_path / "f.onnx"), library=True, backend="cpu").run(None, feeds)[0]
    np.testing.assert_array_equal(out, ref)


def test_fused_models_name_no_environment_variables(dlrm, tmp_path):
    fuse.fuse(dlrm, tmp_path / "f.onnx")
    model = onnx.load(str(tmp_path / "f.onnx"), load_external_data=False)
    texts = [n.doc_string for n in model.graph.node] + [f.doc_string for f in model.functions]
    texts += [a.doc for s in schema.OPS.values() for a in s.attrs]
    assert any("backend attribute" in t for t in texts)
    assert not [t for t in texts if "ONNXFUSE_" in t]
