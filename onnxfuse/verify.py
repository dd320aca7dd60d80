"""Verify an ONNX model (fused or not) against the PyTorch module it came from.

The module is rebuilt from the model's recipe (or given by the caller), both get the same seeded inputs, and each
output is compared against the module run in fp32 on the same (possibly fp16/bf16-rounded) weights.

    from onnxfuse import verify
    res = verify.verify("models/llama-tiny.fused.onnx")
    res.passed, [(o.name, o.max_rel_err, o.tolerance) for o in res.outputs]

`onnxfuse.verify(...)` is the same function.
"""
from __future__ import annotations

import importlib.util
import pathlib
from dataclasses import asdict, dataclass

import numpy as np
import onnx
import torch

from . import adapters, export, onnxio, runtime, zoo
from .errors import OnnxfuseError
from .functions import nodes as _nodes
from .schema import DOMAIN

# Max |out - ref| / max|ref| allowed, by the model's dtype. fp32 on the CUDA EP gets TF32's bound (ORT uses TF32
# for fp32 GEMMs by default); the half types get bounds their 8/11-bit mantissas can meet after a decoder layer.
TOLERANCES = {("fp32", "cpu"): 1e-4, ("fp32", "cuda"): 5e-3, ("fp16", "cpu"): 1e-2, ("fp16", "cuda"): 1e-2,
              ("bf16", "cpu"): 4e-2, ("bf16", "cuda"): 4e-2}


@dataclass
class OutputCheck:
    """One model output against the PyTorch reference: `passed` when every value is finite and
    max_rel_err = max|out - ref| / max|ref| <= tolerance. A shape mismatch fails with infinite errors."""
    name: str
    shape: list[int]
    max_abs_err: float
    max_rel_err: float     # max |d| / max|ref|
    rel_l2_err: float      # ||d|| / ||ref||
    tolerance: float
    passed: bool


@dataclass
class VerifyResult:
    """The outcome of `verify`: the model path, execution provider ("cpu", "cuda"), dtype, number of onnxfuse nodes,
    whether the kernel library was registered, and one OutputCheck per output; `passed` when all of them pass."""
    model: str
    provider: str
    dtype: str
    fused_nodes: int
    library: bool
    outputs: list[OutputCheck]

    @property
    def passed(self) -> bool:
        """Whether every output is within its tolerance."""
        return all(o.passed for o in self.outputs)

    def to_dict(self) -> dict:
        """The result as plain JSON-ready data (what `onnxfuse verify --json` prints), with "passed"."""
        d = asdict(self)
        d["passed"] = self.passed
        return d


def load_factory(spec: str):
    """'path/to/file.py:factory' -> the factory's result: a module, or (module, inputs dict) (verify --module)."""
    if ":" not in spec:
        raise OnnxfuseError(f"--module {spec!r}: expected PATH.py:FACTORY (a function returning an nn.Module)")
    path, name = spec.rsplit(":", 1)
    p = pathlib.Path(path)
    if not p.is_file():
        raise OnnxfuseError(f"--module: {p} does not exist; give PATH.py:FACTORY")
    mod_spec = importlib.util.spec_from_file_location(p.stem, p)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    if not hasattr(mod, name):
        raise OnnxfuseError(f"--module: {p} has no function {name!r}")
    return getattr(mod, name)()


STAGES = ("torch reference", "onnxruntime session", "run")
_BF16_CPU = ("onnxruntime's CPU provider has no bf16 kernels for these models; verify bf16 models with --provider "
             "cuda, or export with --dtype fp16/fp32 for the CPU")


def verify(model_path: str | pathlib.Path, *, module: torch.nn.Module | None = None,
           inputs: dict | None = None, provider: str = "cpu", tolerance: float | None = None,
           library: bool | None = None, graph_optimization: bool = True, backend: str | None = None,
           progress=None) -> VerifyResult:
    """Run the ONNX model at `model_path` (fused or not) in onnxruntime and compare each output with the PyTorch
    module it came from.

    module/inputs: the PyTorch module and its inputs (name -> tensor, or a list of tensors, fed as the model inputs
    name_0 .. name_{n-1} or in order); by default both are rebuilt from the recipe
    `onnxfuse export` stored in the model. provider: "cpu" or "cuda". tolerance: max |out-ref|/max|ref| (default
    by dtype and provider, TOLERANCES). library: None registers the kernel library when the model has onnxfuse
    nodes (falling back to their function bodies with a warning), True requires it, False never loads it.
    graph_optimization=False turns onnxruntime's optimisations off; backend sets every onnxfuse node's kernel
    family (auto|cpu|cuda|triton) on an in-memory copy. progress(index, total, stage, detail), when given, is
    called as each stage starts (STAGES: torch reference, onnxruntime session, run).
    Raises OnnxfuseError on bad input; a mismatch is not an exception: see VerifyResult.passed.
    """
    def stage(i: int, detail: str) -> None:
        if progress is not None:
            progress(i + 1, len(STAGES), STAGES[i], detail)

    model = onnxio.load(model_path, load_external_data=False)
    recipe = export.read_recipe(model)
    dtype = recipe["dtype"] if recipe else None
    if module is None and recipe is None:
        raise OnnxfuseError(f"{model_path}: has no onnxfuse recipe (not written by 'onnxfuse export'); pass "
                            "--module PATH.py:FACTORY to give the PyTorch module")
    if inputs is None and recipe is None:
        raise OnnxfuseError("verify needs inputs for a module without a recipe: "
                            "return (module, inputs) from the factory")
    if dtype == "bf16" and provider == "cpu":
        raise OnnxfuseError(_BF16_CPU)
    stage(0, f"the recipe's {recipe['kind']} module in fp32" if module is None else
             f"{type(module).__name__} in fp32")
    if module is None:
        kind = recipe["kind"]
        spec = zoo.spec_from_dict(kind, recipe["spec"])
        module = zoo.build_module(kind, spec, recipe["seed"], recipe["dtype"])
        if inputs is None:
            inputs = zoo.make_inputs(kind, spec, recipe["seed"], recipe["dtype"])
    if inputs is None:
        kind = recipe["kind"]
        inputs = zoo.make_inputs(kind, zoo.spec_from_dict(kind, recipe["spec"]), recipe["seed"], recipe["dtype"])
    if dtype is None:
        floats = [t.dtype for t in module.parameters() if t.is_floating_point()]
        dtype = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(floats[0] if floats else torch.float32, "fp32")
    if dtype == "bf16" and provider == "cpu":
        raise OnnxfuseError(_BF16_CPU)

    # Reference: the same (rounded) weights, computed in fp32.
    ref_module = module.float()
    with torch.no_grad():
        ref = ref_module(*[_as_fp32(v) for v in inputs.values()])
    refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]

    source = str(model_path)
    if _has_bf16_io(model):
        source = _float_io(onnxio.load(model_path))  # numpy has no bf16: feed and read float32 through Casts
    stage(1, f"{provider} provider" + (f", backend {backend}" if backend else ""))
    sess = runtime.session(source, provider, library=library, graph_optimization=graph_optimization, backend=backend)
    stage(2, f"{len(sess.get_outputs())} output(s) against the reference")
    feeds = runtime.check_feeds(sess, _feeds_for(sess, inputs))
    if recipe and recipe.get("adapter"):  # exported --lora-as-inputs: the module's adapter, fed as its inputs
        feeds.update(adapters.read_adapter(pathlib.Path(model_path).with_name(recipe["adapter"])))
    outs = sess.run(None, feeds)
    names = [o.name for o in sess.get_outputs()]
    if len(outs) != len(refs):
        raise OnnxfuseError(f"the model has {len(outs)} outputs and the module {len(refs)}; check --module")
    tol = tolerance if tolerance is not None else TOLERANCES[(dtype, provider)]
    checks = []
    for name, out, r in zip(names, outs, refs):
        checks.append(compare(name, np.asarray(out, dtype=np.float64), r.double().numpy(), tol))
    fused = sum(1 for n in _nodes(model.graph) if n.domain == DOMAIN)
    return VerifyResult(str(model_path), provider, dtype, fused, runtime.has_onnxfuse_nodes(model) if library is None
                        else bool(library), checks)


def _as_fp32(value):
    """A module input in fp32 for the reference: a tensor, or a list/tuple of tensors (DLRM_Net's lS_o, lS_i)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_as_fp32(v) for v in value)
    return value.float() if value.is_floating_point() else value


def _feeds_for(sess, inputs: dict) -> dict[str, np.ndarray]:
    """The module's inputs as the session's feeds: a list/tuple input K of n tensors is the n model inputs K_0 ..
    K_{n-1} (a list argument is exported as one input per tensor, named as the export call chose). Where those
    names are not the model's, inputs that include lists are matched to the model's inputs in order, when there are
    as many; inputs without lists are matched by name only."""
    flat = []
    for key, value in inputs.items():
        items = [(f"{key}_{i}", v) for i, v in enumerate(value)] if isinstance(value, (list, tuple)) else [(key, value)]
        flat += [(name, (t.float() if t.dtype == torch.bfloat16 else t).numpy()) for name, t in items]
    names = [i.name for i in sess.get_inputs()]
    lists = any(isinstance(v, (list, tuple)) for v in inputs.values())
    if not lists or {n for n, _ in flat} == set(names) or len(flat) != len(names):
        return dict(flat)  # by name (check_feeds names any mismatch)
    return {name: arr for name, (_, arr) in zip(names, flat)}


def _has_bf16_io(model: onnx.ModelProto) -> bool:
    return any(v.type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
               for v in list(model.graph.input) + list(model.graph.output))


def _float_io(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every bf16 graph input and output seen as float32 through a Cast (for verification only)."""
    bf16, f32 = onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT
    g = model.graph
    pre, post = [], []
    for v in g.input:
        if v.type.tensor_type.elem_type == bf16:
            inner = v.name + "__onnxfuse_bf16"
            for node in g.node:
                node.input[:] = [inner if i == v.name else i for i in node.input]
            pre.append(onnx.helper.make_node("Cast", [v.name], [inner], to=bf16))
            v.type.tensor_type.elem_type = f32
    for v in g.output:
        if v.type.tensor_type.elem_type == bf16:
            inner = v.name + "__onnxfuse_bf16"
            for node in g.node:
                node.output[:] = [inner if o == v.name else o for o in node.output]
            post.append(onnx.helper.make_node("Cast", [inner], [v.name], to=f32))
            v.type.tensor_type.elem_type = f32
    nodes = pre + list(g.node) + post
    del g.node[:]
    g.node.extend(nodes)
    return model


def compare(name: str, out: np.ndarray, ref: np.ndarray, tol: float) -> OutputCheck:
    """Compare one output with its reference (see OutputCheck for the criterion)."""
    if out.shape != ref.shape:
        return OutputCheck(name, list(out.shape), float("inf"), float("inf"), float("inf"), tol, False)
    diff = np.abs(out - ref)
    scale = max(float(np.max(np.abs(ref))), 1e-30)
    max_abs = float(np.max(diff)) if diff.size else 0.0
    rel = max_abs / scale
    l2 = float(np.linalg.norm(diff) / max(np.linalg.norm(ref), 1e-30))
    ok = bool(np.all(np.isfinite(out))) and rel <= tol
    return OutputCheck(name, list(out.shape), max_abs, rel, l2, tol, ok)
