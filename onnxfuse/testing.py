"""Test helpers for onnxfuse's custom ops, the one place for them (shaped like onnxscript's rewriter/testing.py).

  * `op_model`: a model of one onnxfuse node, with typed graph inputs or (cast=True) float32 graph inputs and
    output with Casts to and from the op's type T (numpy has no bfloat16); `run_op` runs one node on torch tensors.
  * `TOLERANCES`: the kernel-vs-reference bounds, one row per element type and one named entry per kind of check
    (the doctor's, the CPU kernel tests', the embedding kernels', the Triton interpreter's, fused-vs-unfused
    graphs); `assert_close` and
    `check_close` apply them with a message naming the error and the bound.

Model-level checks against PyTorch (a whole exported model, `onnxfuse verify`) have their own table,
`onnxfuse.verify.TOLERANCES`.

    from onnxfuse import schema, testing
    y = testing.run_op("SwiGLU", [x, w_gate, w_up], {"activation": "silu"})
    testing.assert_close(y, schema.reference("SwiGLU", [x, w_gate, w_up], {"activation": "silu"}), "float")
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from . import schema

ONNX_TYPE = {"float": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}

# Inputs of a fixed integer type (never cast to T), (op, input name) -> their ONNX type: each op's `int_inputs`, int64
# (Embedding's ids and the embedding-interaction ops' ids, bags and table layout), `int32_inputs` (CachedAttention's
# sequence lengths), and `byte_inputs`, uint8
# (Int4Linear's packed weights). INT_INPUTS is the set of their keys.
INPUT_TYPES = {**{(op, name): TensorProto.INT64 for op in schema.OPS for name in schema.op_def(op).int_inputs},
               **{(op, name): TensorProto.INT32 for op in schema.OPS for name in schema.op_def(op).int32_inputs},
               **{(op, name): TensorProto.UINT8 for op in schema.OPS for name in schema.op_def(op).byte_inputs}}
INT_INPUTS = set(INPUT_TYPES)

_ALIASES = {"float": "float", "fp32": "float", "float32": "float", "f32": "float",
            "float16": "float16", "fp16": "float16", "half": "float16", "f16": "float16",
            "bfloat16": "bfloat16", "bf16": "bfloat16"}


def dtype_name(dtype) -> str:
    """The schema name ("float", "float16", "bfloat16") of `dtype`: a schema name, an alias (fp32, fp16, bf16,
    float32), a numpy dtype or a torch dtype."""
    if isinstance(dtype, str) and dtype in _ALIASES:
        return _ALIASES[dtype]
    text = str(dtype).replace("torch.", "")
    if text in _ALIASES:
        return _ALIASES[text]
    try:
        return _ALIASES[np.dtype(dtype).name]
    except (TypeError, KeyError):
        raise ValueError(f"unknown element type {dtype!r}; use one of {', '.join(schema.TYPES)}") from None


def torch_type(dtype):
    """The torch dtype of a schema type name (or alias)."""
    import torch
    return {"float": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[dtype_name(dtype)]


# ------------------------------------------------------------------------------------------------ tolerances
@dataclass(frozen=True)
class Tolerance:
    """max|actual - expected| <= atol + rtol * max(floor, max|expected|); and, when rel_l2 is set,
    ||actual - expected|| / ||expected|| <= rel_l2 (not checked when ||expected|| < 1e-6). Outputs must be finite."""
    atol: float = 0.0
    rtol: float = 0.0
    floor: float = 0.0
    rel_l2: float | None = None

    def bound(self, scale: float) -> float:
        """The bound on max|actual - expected| for max|expected| = scale."""
        return self.atol + self.rtol * max(self.floor, scale)


# Per element type, one entry per kind of check:
#   doctor      — `onnxfuse doctor` (every backend, realistic shapes): atol + rtol * max|ref|, tight enough that a
#                 wrong index, a missing bias or a wrong activation fails (those give errors of order max|ref|);
#   kernel      — the CPU kernel tests: relative L2 error, and max error relative to max(1, max|ref|). fp16/bf16
#                 outputs are rounded by both sides, so one ulp of disagreement is expected (fp16 ulp is 2^-11
#                 relative, bf16 2^-8); a kernel that drops the bias, the LoRA branch or the scale is off by > 10%;
#   embedding   — the embedding-interaction CPU kernels, which round where the reference does (only the fp32 sums'
#                 order differs, one T ulp at most): max error relative to max|ref|;
#   interpreter — the embedding-interaction Triton kernel in the Triton interpreter: the same bounds relative to
#                 max(1, max|ref|);
#   graph       — a fused graph against the unfused one in onnxruntime (max error relative to max(1, max|ref|)).
TOLERANCES: dict[str, dict[str, Tolerance]] = {
    "float": {"doctor": Tolerance(atol=2e-4, rtol=2e-4),
              "kernel": Tolerance(rtol=1e-4, floor=1.0, rel_l2=1e-5),
              "embedding": Tolerance(rtol=1e-6, floor=1e-6),
              "interpreter": Tolerance(rtol=1e-6, floor=1.0),
              "graph": Tolerance(rtol=1e-4, floor=1.0)},
    "float16": {"doctor": Tolerance(atol=4e-3, rtol=4e-3),
                "kernel": Tolerance(rtol=1e-2, floor=1.0, rel_l2=2e-3),
                "embedding": Tolerance(rtol=1e-3, floor=1e-6),
                "interpreter": Tolerance(rtol=1e-3, floor=1.0),
                "graph": Tolerance(rtol=1e-2, floor=1.0)},
    "bfloat16": {"doctor": Tolerance(atol=3e-2, rtol=1.6e-2),
                 "kernel": Tolerance(rtol=3e-2, floor=1.0, rel_l2=1.5e-2),
                 "embedding": Tolerance(rtol=8e-3, floor=1e-6),
                 "interpreter": Tolerance(rtol=8e-3, floor=1.0)},
}
KINDS = ("doctor", "kernel", "embedding", "interpreter", "graph")


def tolerance(dtype, kind: str = "kernel") -> Tolerance:
    """TOLERANCES' entry for `dtype` (any spelling dtype_name takes) and `kind`; KeyError naming what exists."""
    row = TOLERANCES[dtype_name(dtype)]
    if kind not in row:
        raise KeyError(f"no {kind!r} tolerance for {dtype_name(dtype)}; it has {', '.join(row)}")
    return row[kind]


def _numpy(a) -> np.ndarray:
    if hasattr(a, "detach"):  # a torch tensor, bfloat16 included
        a = a.detach().float().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


@dataclass
class Closeness:
    """What check_close measured: `ok`, max|actual - expected| (`err`) and its `bound`, the relative L2 error
    (`rel_l2`, None when not checked) and, when not ok, `reason`."""
    ok: bool
    err: float
    bound: float
    rel_l2: float | None = None
    reason: str = ""


def check_close(actual, expected, dtype, kind: str = "kernel") -> Closeness:
    """Compare `actual` with `expected` (numpy arrays or torch tensors, any float type) under tolerance(dtype, kind)."""
    tol = tolerance(dtype, kind)
    a, e = _numpy(actual), _numpy(expected)
    if a.shape != e.shape:
        return Closeness(False, float("inf"), 0.0, reason=f"shape {list(a.shape)} != expected {list(e.shape)}")
    scale = float(np.abs(e).max(initial=0.0))
    bound = tol.bound(scale)
    if not np.isfinite(a).all():
        bad = int((~np.isfinite(a)).sum())
        return Closeness(False, float("inf"), bound, reason=f"{bad} of {a.size} values are not finite")
    err = float(np.abs(a - e).max(initial=0.0))
    rel = None
    if tol.rel_l2 is not None and e.size:
        norm = float(np.linalg.norm(e))
        rel = float(np.linalg.norm(a - e)) / max(norm, 1e-30)
        if rel > tol.rel_l2 and norm >= 1e-6:
            return Closeness(False, err, bound, rel, f"||actual-expected||/||expected|| = {rel:.3g} > {tol.rel_l2:g}")
    if err > bound:
        return Closeness(False, err, bound, rel, f"max |actual-expected| = {err:.3g} > {bound:.3g} "
                         f"(atol {tol.atol:g} + rtol {tol.rtol:g} * max({tol.floor:g}, max|expected| {scale:.3g}))")
    return Closeness(True, err, bound, rel)


def special_mismatch(actual: np.ndarray, expected: np.ndarray) -> str | None:
    """Why two same-shaped arrays disagree on NaN or +-Inf (NaN exactly where `expected` has NaN, +-Inf exactly where
    it has +-Inf, same sign), or None when they agree there."""
    nan_a, nan_e = np.isnan(actual), np.isnan(expected)
    if (nan_a != nan_e).any():
        lost, made = int((nan_e & ~nan_a).sum()), int((nan_a & ~nan_e).sum())
        return f"NaN where the reference has none: {made}; NaN of the reference lost: {lost} (of {actual.size})"
    inf_e = np.isinf(expected)
    bad = (np.isinf(actual) != inf_e) | (inf_e & (np.sign(actual) != np.sign(expected)))
    return f"{int(bad.sum())} of {actual.size} values differ in +-Inf" if bad.any() else None


def check_special(actual, expected, dtype, kind: str = "kernel") -> Closeness:
    """Compare outputs computed from inputs holding special values (NaN, +-Inf, -0, the type's max, subnormals) with
    IEEE semantics: NaN exactly where `expected` has NaN, +-Inf exactly where it has +-Inf (same sign), and the
    finite rest within tolerance(dtype, kind) of a bound scaled by the finite expected values."""
    tol = tolerance(dtype, kind)
    a, e = _numpy(actual).astype(np.float64), _numpy(expected).astype(np.float64)
    if a.shape != e.shape:
        return Closeness(False, float("inf"), 0.0, reason=f"shape {list(a.shape)} != expected {list(e.shape)}")
    finite_e = np.isfinite(e)
    bound = tol.bound(float(np.abs(e[finite_e]).max(initial=0.0)))
    mismatch = special_mismatch(a, e)
    if mismatch:
        return Closeness(False, float("inf"), bound, reason=mismatch)
    err = float(np.abs(a[finite_e] - e[finite_e]).max(initial=0.0))
    if err > bound:
        return Closeness(False, err, bound, reason=f"finite values: max |actual-expected| = {err:.3g} > {bound:.3g}")
    return Closeness(True, err, bound)


def with_special_rows(t, first: int = 0, type_max: bool = True):
    """A copy of float tensor `t` whose rows (of its last dimension; row i = the i-th vector) from `first` on hold
    special values in turn: all NaN; one NaN; one +Inf; one -Inf; all -0.0; one the type's max (left as it was with
    type_max=False, for comparisons whose overflow depends on where intermediates are rounded); all the smallest
    subnormal; the other rows as they were. Returns (tensor, number of rows changed)."""
    import torch
    x = t.clone()
    flat = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
    info = torch.finfo(x.dtype)
    width = flat.shape[1]
    rows = [("all", float("nan")), ("one", float("nan")), ("one", float("inf")), ("one", float("-inf")),
            ("all", -0.0), ("one", info.max), ("all", info.smallest_normal * 2.0 ** -3)]
    changed = 0
    for i, (where, value) in enumerate(rows):
        r = first + i
        if r >= flat.shape[0]:
            break
        if value == info.max and not type_max:
            pass
        elif where == "all":
            flat[r] = value
        else:
            flat[r, (3 * r + 1) % width] = value
        changed += 1
    return flat.reshape(x.shape), changed


def assert_close(actual, expected, dtype, what: str = "", *, kind: str = "kernel") -> None:
    """AssertionError unless `actual` is within tolerance(dtype, kind) of `expected`; the message starts with `what`
    and names the element type, the kind of check, the error and the bound."""
    c = check_close(actual, expected, dtype, kind)
    if not c.ok:
        where = f"{what}: " if what else ""
        raise AssertionError(f"{where}{c.reason} [{dtype_name(dtype)}, {kind} tolerance]")


# ------------------------------------------------------------------------------------------------ models
def input_names(op: str, n_inputs: int) -> list[str]:
    """The node's input names (MLPStack: X, W_1, bias_1, ... for (n_inputs - 1) // 2 layers)."""
    s = schema.OPS[op]
    return schema.stack_input_names((n_inputs - 1) // 2) if s.variadic else list(s.inputs)


def _initializer(name: str, t, dtype: str) -> onnx.TensorProto:
    import torch
    if not t.is_floating_point():  # packed weights, ids: their own type
        return onnx.numpy_helper.from_array(t.contiguous().numpy(), name)
    if dtype == "float":
        raw = t.contiguous().to(torch.float32).numpy().tobytes()
    else:
        raw = t.contiguous().to(torch_type(dtype)).view(torch.uint16).numpy().tobytes()
    return helper.make_tensor(name, ONNX_TYPE[dtype], list(t.shape), vals=raw, raw=True)


def op_model(op: str, dtype, inputs, attrs: dict | None = None, *, initializers: dict | None = None,
             cast: bool = False, out_shape=None, functions: bool = False) -> onnx.ModelProto:
    """A model of one onnxfuse `op` node of element type `dtype`.

    inputs: the graph inputs, {name: shape} in the node's order (a shape may hold None or names for symbolic
    dims), or a list of shapes named by input_names. initializers: {name: torch tensor} stored as initializers of
    type T (a name also in `inputs` is an overridable initializer); the node takes them in the op's input order
    (a variadic op's: the inputs, then the initializers not among them). The integer inputs (INT_INPUTS) keep their
    type (INPUT_TYPES: int64, int32, uint8). cast=True: float graph inputs and the outputs are float32, with Casts to
    and from T around the node (integer inputs pass through an Identity; initializers, stored in T, feed the node as
    they are). Every output of the op is a graph output (CachedAttention's present_key and present_value too).
    out_shape: Y's declared shape (None: unknown; the other outputs' are left unknown). functions=True adds the ops'
    ONNX function bodies, so the model runs without the kernel library."""
    dtype = dtype_name(dtype)
    attrs = dict(attrs or {})
    if not isinstance(inputs, dict):
        inputs = dict(zip(input_names(op, len(inputs)), inputs))
    inits = dict(initializers or {})
    s = schema.OPS[op]
    names = list(dict.fromkeys([*inputs, *inits]))
    if set(names) <= set(s.inputs):  # the schema's order (Int4SwiGLU's byte inputs sit between its initializers)
        names = [n for n in s.inputs if n in names]
    t = ONNX_TYPE[dtype]
    nodes, graph_inputs = [], []
    for name, shape in inputs.items():
        shape = None if shape is None else list(shape)
        if (op, name) in INT_INPUTS:
            graph_inputs.append(helper.make_tensor_value_info(name, INPUT_TYPES[(op, name)], shape))
            if cast:
                nodes.append(helper.make_node("Identity", [name], [name + "_t"]))
        elif cast:
            graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
            nodes.append(helper.make_node("Cast", [name], [name + "_t"], to=t))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, t, shape))
    # with cast=True the initializers are stored in T and feed the node directly; only graph inputs are cast
    node_inputs = [n + "_t" if n in inputs else n for n in names] if cast else names
    outs = list(s.outputs)  # Y, and the others of a multi-output op (CachedAttention's present_key/value)
    nodes.append(helper.make_node(op, node_inputs, [y + "_t" if cast else y for y in outs], domain=schema.DOMAIN,
                                  overload=schema.op_def(op).node_overload(attrs, names), **attrs))
    if cast:
        nodes += [helper.make_node("Cast", [y + "_t"], [y], to=TensorProto.FLOAT) for y in outs]
    graph_outputs = [helper.make_tensor_value_info(y, TensorProto.FLOAT if cast else t,
                                                   None if out_shape is None or i else list(out_shape))
                     for i, y in enumerate(outs)]
    graph = helper.make_graph(nodes, f"one_{op}", graph_inputs, graph_outputs,
                              initializer=[_initializer(n, v, dtype) for n, v in inits.items()])
    model = helper.make_model(graph, ir_version=schema.IR_VERSION,
                              opset_imports=[helper.make_opsetid("", schema.ONNX_OPSET),
                                             helper.make_opsetid(schema.DOMAIN, schema.DOMAIN_VERSION)])
    if functions:
        from . import functions as _functions
        _functions.add_functions(model)
    return model


def ortvalue(t, dtype=None):
    """An onnxruntime.OrtValue over a CPU torch tensor's memory (bfloat16 as its raw 16-bit patterns; integer
    tensors as they are)."""
    import onnxruntime as ort
    import torch
    if not t.is_floating_point():
        return ort.OrtValue.ortvalue_from_numpy(t.contiguous().numpy())
    if dtype_name(dtype or t.dtype) == "bfloat16":  # numpy has no bfloat16
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(t.contiguous().view(torch.uint16).numpy(),
                                                                TensorProto.BFLOAT16)
    return ort.OrtValue.ortvalue_from_numpy(t.contiguous().numpy())


def run_session(sess, op: str, feeds: dict, out_shape, out_shapes=None):
    """Run a one-node session on CPU torch tensors through IO binding; Y (of X's dtype) is written by onnxruntime
    into a tensor of `out_shape`. With `out_shapes` (every output's shape) all outputs are bound that way and returned
    as a list."""
    import torch
    x = next(t for t in feeds.values() if t.is_floating_point())
    shapes = list(out_shapes) if out_shapes is not None else [out_shape]
    outs = [torch.empty(tuple(shape), dtype=x.dtype) for shape in shapes]
    binding = sess.io_binding()
    for name, t in feeds.items():
        binding.bind_ortvalue_input(name, ortvalue(t))
    for name, y in zip(schema.OPS[op].outputs, outs):
        binding.bind_ortvalue_output(name, ortvalue(y))  # ORT writes into y's memory
    sess.run_with_iobinding(binding)
    return outs if out_shapes is not None else outs[0]


def run_op(op: str, inputs: list, attrs: dict | None = None, *, library: bool | str | os.PathLike | None = True,
           out_shape=None, constants: bool = False):
    """Run one onnxfuse node on the CPU EP on torch tensors (inputs in the node's order, X first) and return Y as a
    tensor of X's dtype. library: as runtime.session's (True: the cached build, or a path). out_shape: Y's shape
    (default: X's leading dims and the op's output width, ids.shape + [D] for Embedding). constants=True: every
    input but X is an initializer (the kernels' prepacked path: oneDNN where the library and the CPU have it).
    An op with several outputs (CachedAttention) returns them all, a list in the schema's order."""
    from . import runtime
    dtype = dtype_name(inputs[0].dtype)
    names = input_names(op, len(inputs))
    if constants:
        model = op_model(op, dtype, {names[0]: tuple(inputs[0].shape)}, attrs,
                         initializers=dict(zip(names[1:], inputs[1:])))
    else:
        model = op_model(op, dtype, [tuple(t.shape) for t in inputs], attrs)
    sess = runtime.session(model, "cpu", library=library)
    feeds = dict(zip(names[:1] if constants else names, inputs))
    if len(schema.OPS[op].outputs) > 1:
        shapes = {name: list(t.shape) for name, t in zip(names, inputs)}
        return run_session(sess, op, feeds, None, schema.op_def(op).all_out_shapes(shapes, dict(attrs or {})))
    return run_session(sess, op, feeds, out_shape or default_out_shape(op, inputs, attrs))


def default_out_shape(op: str, inputs: list, attrs: dict | None = None) -> tuple[int, ...]:
    """Y's shape on these input tensors (schema.op_def(op).out_shape; `attrs` names an embedding op's
    interaction)."""
    shapes = {name: list(t.shape) for name, t in zip(input_names(op, len(inputs)), inputs)}
    return tuple(schema.op_def(op).out_shape(shapes, dict(attrs or {})))
