"""swiglu: the gate and up projections of a gated MLP with act(gate) * up -> `SwiGLU` (attribute `activation`).

    Y = act(X @ W_gate) * (X @ W_up)        (then down_proj stays a plain MatMul/Gemm on Y)
    act: silu (Llama, Mistral, Qwen2/3, Phi-3), gelu_tanh (Gemma, Gemma2: GeGLU), gelu (erf), quick_gelu, relu
         (ReGLU), sigmoid (GLU)

Spellings matched, as both exporters and onnxruntime's stage-1 fusions write them (fp32, fp16, bf16):
  * projections: MatMul on [K, N] weights or Gemm(transB=0|1) without bias, one per gate and up; or Phi-3's merged
    spelling, one GEMM on a [K, 2N] weight whose output is cut into gate | up by Split (num_outputs=2 or split
    [N, N]) or by two Slices on the last axis (`chunk(2)`). The merged weight is cut into two [K, N] halves at fuse
    time, so the kernels are the separate-projection kernels;
  * activations, each as a formula in any association and commutation of its Mul/Add nodes (Div by a constant is
    Mul by its inverse, Neg is Mul by -1, g*g*g is Pow(g, 3)):
      silu        g*sigmoid(g), g/(1+exp(-g)), g*reciprocal(1+exp(-g)), Swish (opset 24, alpha 1), QuickGelu(alpha=1)
      quick_gelu  the same with 1.702*g inside, Swish(alpha=1.702), com.microsoft QuickGelu
      gelu        0.5*g*(1+erf(g/sqrt(2))), Gelu (opset 20, approximate="none"), com.microsoft Gelu
      gelu_tanh   0.5*g*(1+tanh(sqrt(2/pi)*(g+0.044715*g^3))) and its expanded forms (transformers' gelu_new,
                  gelu_fast), Gelu(approximate="tanh"), com.microsoft FastGelu without bias
      relu, sigmoid  Relu(g), Sigmoid(g)
    Every constant must be the activation's constant rounded to the constant's own element type, within one unit in
    the last place (an fp16 graph stores 0.044715 as 0.04471): 0.0447 or x/1.5 in an fp32 graph are refused.

Why a graph pass and not pattern rules: the formulas above come in dozens of associations and operand orders (the
tanh form alone has seven commutative nodes, 2^7 orders per association), so they are matched by flattening the
product and sum trees into a small expression and comparing it with each activation's formula; the pass keeps the
rules' contract: the shared guard (`_base.guard_nodes`: constants are true constants, no broadcast raises the rank,
the model's opset holds the function body), the output check, no intermediate with another use, a report entry
and a Netron annotation per match, and, for `fuse --explain`, a reason for every gated MLP it did not fuse
(including which activation it saw when that activation is not one SwiGLU computes).

Why this granularity (measured on an H200, fp16, Llama MLP h4096/i11008, 2048 tokens, torch): the three GEMMs alone
take 0.875 ms and the MLP with its activation 0.919 ms, while merging gate+up into one GEMM with a *separate*
silu*mul was slower (0.998 ms), as was Liger-Kernel's standalone silu*mul. So the win is hiding the activation in
the epilogue of the gate/up GEMM (one kernel computing both products and writing act(g)*u once: the g and u
intermediates never reach memory), not a standalone elementwise op. The down projection is a plain GEMM that
onnxruntime already runs at cuBLAS speed; keeping it out keeps the op's output allocated by onnxruntime and its
scratch-free kernels safe under CUDA-graph capture. At decode sizes the same op reads W_gate and W_up once.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from onnxscript import ir
from onnxscript.rewriter import MatchResult

from .. import functions
from ..schema import DOMAIN, GATE_ACTIVATIONS, GELU_TANH_COEFF, QUICK_GELU_ALPHA, swiglu_overload
from . import _base, _explain

PATTERN = "swiglu"
OP = "SwiGLU"
_DEFAULT = ("", "ai.onnx")
_MS = "com.microsoft"
LINEARS = ("MatMul", "Gemm")
SELECTS = ("Split", "Slice")
# Elementwise ops an activation may be spelled with; the structure under them is read as an expression.
_UNARY = ("Tanh", "Erf", "Sigmoid", "Exp", "Relu", "Swish", "Gelu", "Softplus", "Softsign", "LeakyRelu", "Elu",
          "Selu", "Celu", "HardSigmoid", "HardSwish", "Mish", "Abs", "Sqrt", "Log", "Cast", "Clip", "Sin", "Cos",
          "ThresholdedRelu", "PRelu", "Sign", "Floor", "Ceil", "Round")
_MS_ACTIVATIONS = ("Gelu", "FastGelu", "QuickGelu", "BiasGelu")
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
# Activations whose function body needs typed constants (CastLike: opset 15).
_CASTLIKE_OPSET = 15
# At most this many nodes are read into one expression (a product or sum tree larger than any activation's is not
# a gated MLP; this bounds the work on graphs with long elementwise chains).
_BUDGET = 200


# ------------------------------------------------------------------------------------------------ expressions

@dataclasses.dataclass(eq=False)
class Var:
    """A value the expression does not look into: a projection's output, a graph input, another op's output."""
    value: ir.Value


@dataclasses.dataclass(eq=False)
class Const:
    """A scalar constant; `tol`: one unit in the last place of its element type, relative (0 for exact ones)."""
    value: float
    tol: float


@dataclasses.dataclass(eq=False)
class Prod:
    factors: list  # [(expr, exponent +1 | -1)], none of them a Prod


@dataclasses.dataclass(eq=False)
class Sum:
    terms: list  # [expr], none of them a Sum


@dataclasses.dataclass(eq=False)
class Power:
    base: object
    exponent: float


@dataclasses.dataclass(eq=False)
class Fn:
    """An elementwise op applied to args: "Tanh", "com.microsoft.FastGelu", ..."""
    op: str
    args: list
    node: ir.Node


class _Expressions:
    """Reads the elementwise subgraph under a value as an expression, recording the nodes it went through."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.nodes: dict[int, ir.Node] = {}
        self._memo: dict[int, object] = {}
        self._budget = _BUDGET

    def build(self, value: ir.Value):
        key = id(value)
        if key not in self._memo:
            self._memo[key] = self._build(value)
        return self._memo[key]

    def _build(self, value: ir.Value):
        c = _scalar(value)
        if c is not None:
            return c
        node = value.producer()
        if node is None or node.graph is not self.graph or len(node.outputs) != 1 or self._budget <= 0:
            return Var(value)
        op, domain = node.op_type, node.domain
        ins = node.inputs
        if domain in _DEFAULT:
            if op in ("Mul", "Div", "Add", "Sub") and len(ins) == 2 and None not in ins:
                self._take(node)
                a, b = self.build(ins[0]), self.build(ins[1])
                if op == "Mul":
                    return _prod([(a, 1), (b, 1)])
                if op == "Div":
                    return _prod([(a, 1), (b, -1)])
                if op == "Add":
                    return _sum([a, b])
                return _sum([a, _prod([(b, 1), (Const(-1.0, 0.0), 1)])])
            if op in ("Neg", "Reciprocal") and ins and ins[0] is not None:
                self._take(node)
                a = self.build(ins[0])
                return _prod([(a, 1), (Const(-1.0, 0.0), 1)]) if op == "Neg" else _prod([(a, -1)])
            if op == "Pow" and len(ins) == 2 and ins[0] is not None and _scalar(ins[1]) is not None:
                self._take(node)
                return Power(self.build(ins[0]), _scalar(ins[1]).value)
            if op in _UNARY and ins and ins[0] is not None:
                self._take(node)
                return Fn(op, [self.build(v) if v is not None else None for v in ins], node)
            return Var(value)
        if domain == _MS and op in _MS_ACTIVATIONS and ins and ins[0] is not None:
            self._take(node)
            return Fn(f"{_MS}.{op}", [self.build(v) if v is not None else None for v in ins], node)
        return Var(value)

    def _take(self, node: ir.Node) -> None:
        self.nodes[id(node)] = node
        self._budget -= 1


def _prod(factors):
    flat = []
    for f, e in factors:
        if isinstance(f, Prod):
            flat += [(g, ge * e) for g, ge in f.factors]
        else:
            flat.append((f, e))
    return Prod(flat)


def _sum(terms):
    flat = []
    for t in terms:
        flat += t.terms if isinstance(t, Sum) else [t]
    return Sum(flat)


def _scalar(value: ir.Value | None) -> Const | None:
    """A one-element constant (an initializer or Constant node; whether it may be overridden is the guard's call)."""
    if value is None or value.const_value is None:
        return None
    try:
        arr = value.const_value.numpy()
    except Exception:  # noqa: BLE001 - an unreadable tensor is not a constant we can use
        return None
    if arr.size != 1 or arr.dtype.kind != "f":
        if arr.size == 1 and arr.dtype.kind in "iu":
            return Const(float(arr.reshape(())), 0.0)
        return None
    v = float(arr.reshape(()))
    tol = float(np.spacing(np.abs(arr.reshape(()))) / abs(v)) if v != 0 and math.isfinite(v) else 0.0
    return Const(v, tol)


def _variables(expr, out: dict | None = None) -> dict:
    out = {} if out is None else out
    if isinstance(expr, Var):
        out[id(expr.value)] = expr.value
    elif isinstance(expr, Prod):
        for f, _ in expr.factors:
            _variables(f, out)
    elif isinstance(expr, Sum):
        for t in expr.terms:
            _variables(t, out)
    elif isinstance(expr, Power):
        _variables(expr.base, out)
    elif isinstance(expr, Fn):
        for a in expr.args:
            if a is not None:
                _variables(a, out)
    return out


@dataclasses.dataclass
class Mono:
    """coef * g^power * prod(rest), rest = [(expr, exponent)] of sums and functions."""
    coef: float = 1.0
    tol: float = 0.0
    power: float = 0
    rest: list = dataclasses.field(default_factory=list)


def _mono(expr, g: ir.Value) -> Mono:
    if isinstance(expr, Var):
        return Mono(power=1) if expr.value is g else Mono(rest=[(expr, 1)])
    if isinstance(expr, Const):
        return Mono(coef=expr.value, tol=expr.tol)
    if isinstance(expr, Prod):
        m = Mono()
        for f, e in expr.factors:
            fm = _mono(f, g)
            if e < 0 and fm.coef == 0:
                return Mono(rest=[(expr, 1)])
            m.coef *= fm.coef ** e
            m.tol += fm.tol
            m.power += fm.power * e
            m.rest += [(r, re * e) for r, re in fm.rest]
        return m
    if isinstance(expr, Power):
        bm = _mono(expr.base, g)
        k = expr.exponent
        if not bm.rest and float(k).is_integer() and (bm.coef != 0 or k > 0):
            return Mono(coef=bm.coef ** k, tol=bm.tol * abs(k), power=bm.power * k)
        return Mono(rest=[(expr, 1)])
    return Mono(rest=[(expr, 1)])


def _polynomial(expr, g: ir.Value) -> dict | None:
    """{power of g: (coef, tol)} when `expr` is a polynomial in g with constant coefficients, else None."""
    m = _mono(expr, g)
    if not m.rest:
        return {m.power: (m.coef, m.tol)}
    if len(m.rest) == 1 and m.rest[0][1] == 1 and isinstance(m.rest[0][0], Sum):
        out: dict = {}
        for t in m.rest[0][0].terms:
            p = _polynomial(t, g)
            if p is None:
                return None
            for power, (c, tol) in p.items():
                key = power + m.power
                c0, t0 = out.get(key, (0.0, 0.0))
                out[key] = (c0 + c * m.coef, max(t0, tol + m.tol))
        return {k: v for k, v in out.items() if v[0] != 0}
    return None


def _close(got: float, want: float, tol: float) -> bool:
    """`got` is `want` as an element type with relative unit `tol` stores it (within one unit, plus float64's own
    rounding of a product of constants)."""
    return abs(got - want) <= (tol + 1e-12) * abs(want)


class Miss(Exception):
    """The gate's activation is not one SwiGLU computes; the message says what it is."""


def _fmt(v: float) -> str:
    return f"{v:.7g}"


def _check_coef(got: tuple, want: float, what: str, form: str) -> None:
    if not _close(got[0], want, got[1]):
        raise Miss(f"{form} with {what} = {_fmt(got[0])} where it is {_fmt(want)}")


def _alpha_family(alpha: float, tol: float, form: str) -> str:
    """g * sigmoid(alpha * g): silu for alpha 1, quick_gelu for 1.702."""
    if _close(alpha, 1.0, tol):
        return "silu"
    if _close(alpha, QUICK_GELU_ALPHA, tol):
        return "quick_gelu"
    raise Miss(f"x * sigmoid(a * x) ({form}) with a = {_fmt(alpha)}: silu has a = 1, quick_gelu a = "
               f"{QUICK_GELU_ALPHA}")


def _attr_float(node: ir.Node, name: str, default: float) -> float:
    return node.attributes.get_float(name, default) if name in node.attributes else default


_F32_TOL = float(np.spacing(np.float32(1.0)))


def classify(expr, g: ir.Value) -> tuple[str, str]:
    """(activation, spelling) when `expr` is act(g) for one of SwiGLU's activations; raises Miss otherwise."""
    if isinstance(expr, Fn) and len(expr.args) >= 1 and isinstance(expr.args[0], Var) and expr.args[0].value is g:
        op, node, extra = expr.op, expr.node, [a for a in expr.args[1:] if a is not None]
        if op == "Relu" and not extra:
            return "relu", "Relu"
        if op == "Sigmoid" and not extra:
            return "sigmoid", "Sigmoid"
        if op == "Gelu" and not extra:
            approx = node.attributes.get_string("approximate", "none") if "approximate" in node.attributes else "none"
            if approx in ("none", "tanh"):
                return ("gelu" if approx == "none" else "gelu_tanh"), f"Gelu(approximate={approx})"
        if op == "Swish" and not extra:
            return _alpha_family(_attr_float(node, "alpha", 1.0), _F32_TOL, "Swish"), "Swish"
        if op == f"{_MS}.QuickGelu" and not extra:
            return _alpha_family(_attr_float(node, "alpha", QUICK_GELU_ALPHA), _F32_TOL,
                                 "com.microsoft QuickGelu"), "com.microsoft QuickGelu"
        if op == f"{_MS}.Gelu" and not extra:
            return "gelu", "com.microsoft Gelu"
        if op == f"{_MS}.FastGelu" and not extra:
            return "gelu_tanh", "com.microsoft FastGelu"
        if op in (f"{_MS}.FastGelu", f"{_MS}.BiasGelu"):
            raise Miss(f"{op.split('.')[-1]} with a bias input (the gate would need a bias, which SwiGLU has not)")
    m = _mono(expr, g)
    if m.power == 1 and len(m.rest) == 1:
        (inner, e), = m.rest
        # g * sigmoid(a * g)
        if e == 1 and isinstance(inner, Fn) and inner.op == "Sigmoid":
            arg = _polynomial(inner.args[0], g)
            if arg is not None and set(arg) == {1}:
                _check_coef((m.coef, m.tol), 1.0, "the factor in front", "x * sigmoid(a * x)")
                return _alpha_family(arg[1][0], arg[1][1], "Sigmoid and Mul"), "Sigmoid, Mul"
        # g / (1 + exp(-a * g))
        if e == -1 and isinstance(inner, Sum) and len(inner.terms) == 2:
            consts = [t for t in inner.terms if isinstance(t, Const)]
            exps = [t for t in inner.terms if isinstance(t, Fn) and t.op == "Exp"]
            if len(consts) == 1 and len(exps) == 1:
                arg = _polynomial(exps[0].args[0], g)
                if arg is not None and set(arg) == {1}:
                    _check_coef((consts[0].value, consts[0].tol), 1.0, "the 1 in 1 + exp(-a x)", "x / (1 + exp(-a x))")
                    _check_coef((m.coef, m.tol), 1.0, "the factor in front", "x / (1 + exp(-a x))")
                    return _alpha_family(-arg[1][0], arg[1][1], "x / (1 + exp(-a x))"), "x / (1 + Exp(-x))"
        # 0.5 * g * (1 + erf(g / sqrt(2)))  and  0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3)))
        if e == 1 and isinstance(inner, Sum) and len(inner.terms) == 2:
            parts = [_mono(t, g) for t in inner.terms]
            consts = [p for p in parts if not p.rest and p.power == 0]
            fns = [p for p in parts if p.power == 0 and len(p.rest) == 1 and p.rest[0][1] == 1
                   and isinstance(p.rest[0][0], Fn) and p.rest[0][0].op in ("Erf", "Tanh")]
            if len(consts) == 1 and len(fns) == 1:
                fn = fns[0].rest[0][0]
                form = "gelu (erf form)" if fn.op == "Erf" else "gelu (tanh approximation)"
                _check_coef((m.coef * consts[0].coef, m.tol + consts[0].tol), 0.5, "the factor 0.5 * 1", form)
                _check_coef((m.coef * fns[0].coef, m.tol + fns[0].tol), 0.5, f"the factor 0.5 before {fn.op}", form)
                arg = _polynomial(fn.args[0], g)
                if fn.op == "Erf":
                    if arg is None or set(arg) != {1}:
                        raise Miss(f"{form} whose erf argument is not a multiple of x")
                    _check_coef(arg[1], _SQRT1_2, "the erf argument's factor (1/sqrt(2))", form)
                    return "gelu", "0.5 x (1 + Erf(x / sqrt 2))"
                if arg is None or set(arg) != {1, 3}:
                    raise Miss(f"{form} whose tanh argument is not sqrt(2/pi) * (x + 0.044715 x^3)")
                _check_coef(arg[1], _SQRT_2_OVER_PI, "the tanh argument's factor of x (sqrt(2/pi))", form)
                _check_coef(arg[3], _SQRT_2_OVER_PI * GELU_TANH_COEFF,
                            f"the factor of x^3 (sqrt(2/pi) * {GELU_TANH_COEFF})", form)
                return "gelu_tanh", "0.5 x (1 + Tanh(sqrt(2/pi) (x + 0.044715 x^3)))"
    raise Miss(describe(expr, g))


def _ops_in(expr, out: list) -> list:
    if isinstance(expr, Prod):
        if any(e < 0 for _, e in expr.factors):
            out.append("Div")
        if sum(1 for _, e in expr.factors) > 1:
            out.append("Mul")
        for f, _ in expr.factors:
            _ops_in(f, out)
    elif isinstance(expr, Sum):
        out.append("Add")
        for t in expr.terms:
            _ops_in(t, out)
    elif isinstance(expr, Power):
        out.append("Pow")
        _ops_in(expr.base, out)
    elif isinstance(expr, Fn):
        out.append(expr.op.replace(f"{_MS}.", "com.microsoft "))
        for a in expr.args:
            if a is not None:
                _ops_in(a, out)
    return out


def describe(expr, g: ir.Value) -> str:
    """A name for an activation SwiGLU does not compute, from its structure (for --explain)."""
    if isinstance(expr, Var):
        return "none (gate * up: a bilinear layer)"
    ops = list(dict.fromkeys(_ops_in(expr, [])))
    spelled = "/".join(ops)
    if isinstance(expr, Fn) and len(expr.args) >= 1 and isinstance(expr.args[0], Var):
        return f"{expr.op.replace(f'{_MS}.', 'com.microsoft ')} of the gate, which no SwiGLU activation is"
    names = set(ops)
    if "Cast" in names:
        return (f"computed through Casts (spelled {spelled}); SwiGLU matches an activation spelled in the model's "
                "own precision")
    if {"Softplus", "Tanh"} <= names:
        return f"mish-like (spelled {spelled})"
    if "Relu" in names and ("Pow" in names or "Mul" in names):
        return f"a relu product such as relu^2 (spelled {spelled})"
    if "Erf" in names:
        return f"an erf form that is not gelu's 0.5 x (1 + erf(x / sqrt 2)) (spelled {spelled})"
    if "Tanh" in names:
        return f"a tanh form that is not gelu_tanh's (spelled {spelled})"
    if "Sigmoid" in names or "Exp" in names:
        return f"a sigmoid form that is neither silu nor quick_gelu (spelled {spelled})"
    return f"spelled {spelled or 'as nothing'}"


# ------------------------------------------------------------------------------------------------ projections

@dataclasses.dataclass
class Projection:
    """Where one operand of the gating product comes from: a GEMM of X, or a column range of one (`select`: a Split
    output or a Slice)."""
    value: ir.Value
    gemm: ir.Node
    select: ir.Node | None = None

    @property
    def x(self) -> ir.Value:
        return self.gemm.inputs[0]


def _gemm(node: ir.Node | None) -> bool:
    return node is not None and node.domain in _DEFAULT and node.op_type in LINEARS and len(node.inputs) >= 2 \
        and node.inputs[0] is not None and node.inputs[1] is not None


def projection(value: ir.Value, graph: ir.Graph) -> Projection | None:
    """`value` as a projection of some X made in `graph` (a value of an outer scope is not one: the match could not
    replace its nodes)."""
    node = value.producer()
    if node is None or node.graph is not graph:
        return None
    if _gemm(node):
        return Projection(value, node)
    if node.domain in _DEFAULT and node.op_type in SELECTS and node.inputs and node.inputs[0] is not None:
        gemm = node.inputs[0].producer()
        if _gemm(gemm) and gemm.graph is graph:
            return Projection(value, gemm, node)
    return None


def _product_leaves(value: ir.Value, graph: ir.Graph, out: list, budget: list) -> list:
    """The values a product tree (Mul, Div, Neg, Reciprocal) multiplies, without looking further: a cheap test
    before reading a Mul's whole expression."""
    node = value.producer()
    if budget[0] > 0 and node is not None and node.graph is graph and node.domain in _DEFAULT and \
            node.op_type in ("Mul", "Div", "Neg", "Reciprocal") and None not in node.inputs:
        budget[0] -= 1
        for v in node.inputs:
            _product_leaves(v, graph, out, budget)
    else:
        out.append(value)
    return out


def _int_list(value: ir.Value | None) -> list[int] | None:
    if value is None or value.const_value is None:
        return None
    arr = value.const_value.numpy()
    return [int(v) for v in arr.reshape(-1)] if arr.dtype.kind in "iu" else None


def _columns(p: Projection, total: int, rank: int | None, result: MatchResult) -> tuple[int, int] | None:
    """The [start, stop) column range of the GEMM's output that `p.select` takes, or None with a reason."""
    node, label = p.select, _base.node_label(p.select)

    def last_axis(axis: int) -> bool:
        return axis == -1 or (rank is not None and axis == rank - 1)

    if node.op_type == "Split":
        axis = node.attributes.get_int("axis", 0) if "axis" in node.attributes else 0
        if not last_axis(axis):
            result.fail(f"{label} splits axis {axis}, not the last axis of {p.gemm.outputs[0].name}", p.value)
            return None
        outs = len(node.outputs)
        sizes = None
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            sizes = _int_list(node.inputs[1])
            if sizes is None:
                result.fail(f"{label}'s split sizes {node.inputs[1].name} are not a constant", p.value)
                return None
        elif "split" in node.attributes:
            sizes = list(node.attributes.get_ints("split"))
        elif "num_outputs" in node.attributes:
            n = node.attributes.get_int("num_outputs")
            chunk = -(-total // n)
            sizes = [min(chunk, max(total - i * chunk, 0)) for i in range(n)]
        elif total % outs == 0:
            sizes = [total // outs] * outs
        if sizes is None or len(sizes) != outs or sum(sizes) != total:
            result.fail(f"{label} does not cut {p.gemm.outputs[0].name} ({total} columns) into its outputs' sizes",
                        p.value)
            return None
        i = next(k for k, v in enumerate(node.outputs) if v is p.value)
        start = sum(sizes[:i])
        return start, start + sizes[i]
    starts, ends = _int_list(node.inputs[1]) if len(node.inputs) > 1 else None, \
        _int_list(node.inputs[2]) if len(node.inputs) > 2 else None
    # absent axes mean [0, 1, ...] (ONNX), so one unlabelled range slices axis 0
    axes = _int_list(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else [0]
    steps = _int_list(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
    if starts is None or ends is None or axes is None or steps is None:
        result.fail(f"{label}'s starts/ends/axes/steps are not all constants (fold them first, e.g. with fuse's "
                    "stage 1, which is on by default)", p.value)
        return None
    if not (len(starts) == len(ends) == len(axes) == len(steps) == 1) or not last_axis(axes[0]):
        result.fail(f"{label} does not slice the last axis of {p.gemm.outputs[0].name} alone", p.value)
        return None
    if steps[0] != 1:
        result.fail(f"{label} slices with step {steps[0]}, not 1", p.value)
        return None

    def clamp(i: int) -> int:
        return min(max(i + total if i < 0 else i, 0), total)

    return clamp(starts[0]), clamp(ends[0])


# ------------------------------------------------------------------------------------------------ the pass

@dataclasses.dataclass
class Candidate:
    mul: ir.Node
    nodes: list[ir.Node]
    gate: Projection
    up: Projection
    activation: str = ""
    spelling: str = ""
    wg: np.ndarray | None = None
    wu: np.ndarray | None = None
    trans: tuple = (False, False)
    gate_cols: tuple | None = None
    up_cols: tuple | None = None


@dataclasses.dataclass
class _Shim:
    """The `op.initializer` the rules get from the pattern rewriter, for this graph pass."""
    graph: ir.Graph

    def initializer(self, tensor, name: str) -> ir.Value:
        value = ir.Value(name=name, shape=ir.Shape(tensor.shape), type=ir.TensorType(tensor.dtype),
                         const_value=tensor)
        self.graph.register_initializer(value)
        return value


class SwiGLUPass:
    """Finds gated MLPs and replaces each with one SwiGLU node; quacks like a rule set (`apply_to_model`)."""

    op = OP

    def __init__(self, recorder: _base.Recorder):
        self.recorder = recorder
        # Why gated MLPs were not fused, from the last real pass (for --explain): a later rule may take part of a
        # refused candidate (linear_act fuses a ReLU gate's Linear+Relu), and the explain re-run over the fused
        # model would no longer see it as a gated MLP.
        self.refusals: list[dict] = []

    # -------------------------------------------------------------------------------------------- entry points

    def apply_to_model(self, model: ir.Model, tracer=None) -> int:
        """Fuse every gated MLP of the main graph and its If/Loop/Scan bodies. With a tracer (`fuse --explain`'s
        re-run over the fused model) nothing changes: each gated MLP left records why it did not fuse."""
        from onnxscript.optimizer import basic_constant_propagation

        count = 0
        if tracer is None:
            self.refusals = []
        for graph in _base.graphs(model.graph):
            basic_constant_propagation(graph)  # Constant nodes' values (what the pattern rewriter does first)
            # Outermost products first (consumers come after producers): the gating Mul before the Mul inside its
            # activation, so a match takes the whole product; then the matches are replaced in graph order.
            nodes = list(graph)
            claimed: set[int] = set()
            matches = []
            for mul in reversed(nodes):
                if id(mul) in claimed or not _is_mul(mul):
                    continue
                found = self.analyze(model, graph, mul)
                if found is None:
                    continue
                cand, result = found
                if tracer is not None:
                    if not result:
                        tracer.records.append(self._record(cand, result, None))
                elif not result:
                    anchor = next((n for n in cand.nodes if n.op_type in LINEARS), cand.mul)
                    self.refusals.append({"rule": self._record(cand, result, None)["rule"],
                                          "node": _base.node_label(anchor), "op_type": anchor.op_type,
                                          "reason": result.reason})
                elif not any(id(n) in claimed for n in cand.nodes):
                    claimed.update(id(n) for n in cand.nodes)
                    matches.append(cand)
            for cand in reversed(matches):
                self._replace(graph, cand)
                count += 1
        return count

    def trace_function(self, model: ir.Model, function: ir.Function, tracer) -> None:
        """What would have fused inside a model-local function, which onnxfuse does not rewrite (for --explain)."""
        from onnxscript.optimizer import basic_constant_propagation

        basic_constant_propagation(function)
        name = f"{function.domain}.{function.name}"
        for mul in reversed(list(function)):
            if _is_mul(mul):
                found = self.analyze(model, function.graph, mul)
                if found is not None:
                    tracer.records.append(self._record(found[0], found[1], name))

    def _record(self, cand: Candidate, result: MatchResult, function: str | None) -> dict:
        ok = bool(result)
        return {"rule": f"{PATTERN}/{cand.activation or 'gated'}", "root": cand.mul, "nodes": list(cand.nodes),
                "status": "SUCCESS" if ok else "CONDITION_FAILED", "reason": "" if ok else result.reason,
                "function": function}

    # -------------------------------------------------------------------------------------------- matching

    def analyze(self, model: ir.Model, graph: ir.Graph, mul: ir.Node) -> tuple[Candidate, MatchResult] | None:
        """None when `mul` is not the gating product of a gated MLP (no projection of X times a function of another
        projection of the same X); else the candidate and whether it fuses (a failed MatchResult says why)."""
        leaves = _product_leaves(mul.outputs[0], graph, [], [_BUDGET])
        if not any(projection(v, graph) is not None for v in leaves):
            return None
        ex = _Expressions(graph)
        root = ex.build(mul.outputs[0])
        if not isinstance(root, Prod):
            return None
        best = None
        for i, (factor, e) in enumerate(root.factors):
            if e != 1 or not isinstance(factor, Var):
                continue
            up = projection(factor.value, graph)
            if up is None:
                continue
            rest = root.factors[:i] + root.factors[i + 1:]
            act = rest[0][0] if len(rest) == 1 and rest[0][1] == 1 else Prod(rest)
            variables = list(_variables(act).values())
            if len(variables) != 1:
                continue
            gate = projection(variables[0], graph)
            # g * sigmoid(g) alone is silu(g), not a gated MLP with W_up = W_gate (that would run the GEMM twice)
            if gate is None or gate.x is not up.x or gate.value is up.value:
                continue
            nodes = self._nodes(graph, mul, ex, gate, up)
            cand = Candidate(mul, nodes, gate, up)
            result, stage = self._check(model, cand, act)
            if result:
                return cand, result
            if best is None or stage > best[2]:
                best = (cand, result, stage)
        return None if best is None else best[:2]

    @staticmethod
    def _nodes(graph: ir.Graph, mul: ir.Node, ex: _Expressions, gate: Projection, up: Projection) -> list[ir.Node]:
        """The nodes a match replaces, in graph order: the product and activation, the projections."""
        chosen = {id(mul): mul, **ex.nodes}
        for p in (gate, up):
            chosen[id(p.gemm)] = p.gemm
            if p.select is not None:
                chosen[id(p.select)] = p.select
        order = {id(n): i for i, n in enumerate(graph)}
        return sorted(chosen.values(), key=lambda n: order.get(id(n), -1))

    def _check(self, model: ir.Model, cand: Candidate, act) -> tuple[MatchResult, int]:
        """Whether the candidate fuses, and how far it got (for picking the most telling refusal)."""
        result = MatchResult()
        gate, up, mul = cand.gate, cand.up, cand.mul
        try:
            cand.activation, cand.spelling = classify(act, gate.value)
        except Miss as miss:
            return result.fail(f"the gate {gate.value.name} and up {up.value.name} projections of {gate.x.name} "
                               f"meet in {_base.node_label(mul)}, but the gate's activation is {miss}: SwiGLU "
                               f"computes {', '.join(GATE_ACTIVATIONS)}", gate.value), 1
        if not self._projections(cand, result):
            return result, 2
        if not self._uses(cand, result):
            return result, 3
        x = gate.x
        min_opset = _CASTLIKE_OPSET if cand.activation in functions.GATE_ACTIVATIONS_WITH_CONSTANTS else None
        if not _base.guard_nodes(cand.nodes, model, result, x, OP, min_opset):
            return result, 4
        if not self._weights(cand, result):
            return result, 5
        k, n = cand.wg.shape
        xd = _base.dims(x)
        if xd is not None and len(xd) < 2:
            return result.fail(f"X {x.name} has rank {len(xd)}, expected [..., K]", x), 6
        if xd is not None and isinstance(xd[-1], int) and xd[-1] != k:
            return result.fail(f"X {x.name} ends in {xd[-1]}, the weights have K = {k}", x), 6
        if not _base.guard_output_value(mul.outputs[0], result, x, n):
            return result, 6
        return result, 7

    def _projections(self, cand: Candidate, result: MatchResult) -> bool:
        gate, up = cand.gate, cand.up
        for p in {id(gate.gemm): gate, id(up.gemm): up}.values():
            node = p.gemm
            if node.op_type == "Gemm":
                a = node.attributes
                if a.get_int("transA", 0) or a.get_float("alpha", 1.0) != 1.0:
                    result.fail(f"{_base.node_label(node)} is a Gemm with transA=1 or alpha != 1: not fused",
                                node.outputs[0])
                    return False
                if len(node.inputs) > 2 and node.inputs[2] is not None:
                    result.fail(f"{_base.node_label(node)} adds a bias ({node.inputs[2].name}): SwiGLU's projections "
                                "have none", node.outputs[0])
                    return False
        if (gate.select is None) != (up.select is None):
            p = gate if gate.select is not None else up
            result.fail(f"only one of gate and up ({p.value.name}) is a column range of a projection "
                        f"({_base.node_label(p.gemm)}); the other has its own", p.value)
            return False
        if gate.select is None:
            return True
        if gate.gemm is not up.gemm:
            result.fail(f"gate {gate.value.name} and up {up.value.name} are column ranges of two different "
                        f"projections ({_base.node_label(gate.gemm)}, {_base.node_label(up.gemm)})", up.value)
            return False
        merged = gate.gemm.outputs[0]
        od = _base.dims(merged)
        w = gate.gemm.inputs[1]
        total = od[-1] if od and isinstance(od[-1], int) else None
        if total is None and w.const_value is not None and len(w.const_value.shape) == 2:
            trans = gate.gemm.op_type == "Gemm" and gate.gemm.attributes.get_int("transB", 0)
            total = int(w.const_value.shape[0 if trans else 1])
        if total is None:
            result.fail(f"the width of {merged.name} is unknown", merged)
            return False
        rank = len(od) if od is not None else None
        g_cols = _columns(gate, total, rank, result)
        u_cols = _columns(up, total, rank, result) if g_cols is not None else None
        if g_cols is None or u_cols is None:
            return False
        half = total // 2
        if total % 2 or sorted([g_cols, u_cols]) != [(0, half), (half, total)]:
            result.fail(f"gate {gate.value.name} takes columns [{g_cols[0]}, {g_cols[1]}) and up {up.value.name} "
                        f"[{u_cols[0]}, {u_cols[1]}) of {merged.name} ({total} columns): not its two halves", up.value)
            return False
        cand.gate_cols, cand.up_cols = g_cols, u_cols
        return True

    @staticmethod
    def _uses(cand: Candidate, result: MatchResult) -> bool:
        inside = {id(n) for n in cand.nodes}
        for node in cand.nodes:
            if node is cand.mul:
                continue
            for v in node.outputs:
                if v is not None and (v.is_graph_output() or any(id(u.node) not in inside for u in v.uses())):
                    result.fail(_explain._other_uses(cand.nodes, cand.mul), v)
                    return False
        return True

    @staticmethod
    def _weights(cand: Candidate, result: MatchResult) -> bool:
        gate, up = cand.gate, cand.up
        if _base.check_float_dtypes(result, X=gate.x, W_gate=gate.gemm.inputs[1], W_up=up.gemm.inputs[1]) is None \
                and not result:
            return False

        def trans(p: Projection) -> bool:
            return p.gemm.op_type == "Gemm" and bool(p.gemm.attributes.get_int("transB", 0))

        cand.trans = (trans(gate), trans(up))
        if gate.select is not None:
            w = _base.weight_kn(result, gate.gemm.inputs[1], "the merged gate/up weight", cand.trans[0])
            if w is None:
                return False
            cand.wg = np.ascontiguousarray(w[:, cand.gate_cols[0]:cand.gate_cols[1]])
            cand.wu = np.ascontiguousarray(w[:, cand.up_cols[0]:cand.up_cols[1]])
            return True
        cand.wg = _base.weight_kn(result, gate.gemm.inputs[1], "the gate weight", cand.trans[0])
        cand.wu = _base.weight_kn(result, up.gemm.inputs[1], "the up weight", cand.trans[1]) \
            if cand.wg is not None else None
        if cand.wg is None or cand.wu is None:
            return False
        if cand.wg.shape != cand.wu.shape:
            result.fail(f"the gate weight {gate.gemm.inputs[1].name} {list(cand.wg.shape)} and the up weight "
                        f"{up.gemm.inputs[1].name} {list(cand.wu.shape)} differ in shape", up.gemm.inputs[1])
            return False
        return True

    # -------------------------------------------------------------------------------------------- rewriting

    def _replace(self, graph: ir.Graph, cand: Candidate) -> None:
        gate, up, rec = cand.gate, cand.up, self.recorder
        shim = _Shim(graph)
        x = gate.x
        k, n = cand.wg.shape
        if gate.select is not None:
            w = gate.gemm.inputs[1]
            wg = rec.derived(shim, graph, w, f"_gate{cand.gate_cols[0]}_KxN", lambda: cand.wg)
            wu = rec.derived(shim, graph, w, f"_up{cand.up_cols[0]}_KxN", lambda: cand.wu)
        else:
            wg = gate.gemm.inputs[1] if not cand.trans[0] else rec.derived(shim, graph, gate.gemm.inputs[1], "_KxN",
                                                                           lambda: cand.wg)
            wu = up.gemm.inputs[1] if not cand.trans[1] else rec.derived(shim, graph, up.gemm.inputs[1], "_KxN",
                                                                         lambda: cand.wu)
        act = cand.activation
        node = ir.Node(DOMAIN, OP, [x, wg, wu],
                       [ir.AttrString("activation", act), ir.AttrString("backend", "auto")],
                       overload=swiglu_overload(act), num_outputs=1)
        old_out = cand.mul.outputs[0]
        node.outputs[0].dtype = old_out.dtype
        node.outputs[0].shape = old_out.shape
        merged = gate.select is not None
        if merged:  # the merged projection's module is a child of the MLP (gate_up_proj): name the MLP
            module = _base.module_path([gate.gemm]).rsplit(".", 1)
            module = module[0] if len(module) == 2 else "root"
        else:
            module = _base.module_path([gate.gemm, up.gemm])
        flops = _base.gemm_flops(x, k, n)
        shapes = {"X": _base.dims(x), "W_gate": [k, n], "W_up": [k, n]}
        linear = ("merged " + "/".join(dict.fromkeys(n.op_type for n in (gate.select, up.select)))) if merged \
            else "/".join(dict.fromkeys(p.gemm.op_type for p in (gate, up)))
        extra = [f"activation: {act}", f"  spelled: {cand.spelling}"[:64]]
        if merged:
            extra += [f"merged weight {gate.gemm.inputs[1].name}"[:64],
                      f"  cut at fuse time: gate cols [{cand.gate_cols[0]},{cand.gate_cols[1]})",
                      f"  up cols [{cand.up_cols[0]},{cand.up_cols[1]})"]
        rule = f"{PATTERN}/{act}" + (" (merged gate_up)" if merged else "")
        _base.annotate(node, rec, PATTERN, rule, OP, module, [(m.name or "?", m.op_type) for m in cand.nodes],
                       shapes, x.dtype or gate.gemm.inputs[1].dtype, None if flops is None else 2 * flops,
                       extra_doc=tuple(extra), detail=act)
        node.metadata_props["onnxfuse.activation"] = act
        node.metadata_props["onnxfuse.projections"] = linear
        ir.convenience.replace_nodes_and_values(graph, cand.mul, cand.nodes, [node], [old_out], [node.outputs[0]])


def _is_mul(node: ir.Node) -> bool:
    return node.op_type == "Mul" and node.domain in _DEFAULT and len(node.inputs) == 2 and None not in node.inputs \
        and len(node.outputs) == 1


def rules(recorder):
    return SwiGLUPass(recorder)
