"""Gate activations read as expressions: what swiglu.py uses to recognise act(g) in any spelling.

`Expressions` reads the elementwise subgraph under a value (Mul, Div, Add, Sub, Neg, Reciprocal, Pow, unary ops,
com.microsoft activations) into a small expression tree: products and sums flattened, so every association and
operand order of the same formula reads the same. `classify(expr, g)` compares it with each SwiGLU activation's
formula in g (silu, quick_gelu, gelu, gelu_tanh, relu, sigmoid), constants checked to one unit in the last place
of their own element type, and returns (activation, spelling) or raises Miss; `describe` names an activation
SwiGLU does not compute, for `fuse --explain`.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
from onnxscript import ir

from ..schema import GELU_TANH_COEFF, QUICK_GELU_ALPHA

DEFAULT_DOMAINS = ("", "ai.onnx")
MS_DOMAIN = "com.microsoft"
# Elementwise ops an activation may be spelled with; the structure under them is read as an expression.
_UNARY = ("Tanh", "Erf", "Sigmoid", "Exp", "Relu", "Swish", "Gelu", "Softplus", "Softsign", "LeakyRelu", "Elu",
          "Selu", "Celu", "HardSigmoid", "HardSwish", "Mish", "Abs", "Sqrt", "Log", "Cast", "Clip", "Sin", "Cos",
          "ThresholdedRelu", "PRelu", "Sign", "Floor", "Ceil", "Round")
_MS_ACTIVATIONS = ("Gelu", "FastGelu", "QuickGelu", "BiasGelu")
_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
# At most this many nodes are read into one expression (a product or sum tree larger than any activation's is not
# a gated MLP; this bounds the work on graphs with long elementwise chains).
BUDGET = 200

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


class Expressions:
    """Reads the elementwise subgraph under a value as an expression, recording the nodes it went through."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.nodes: dict[int, ir.Node] = {}
        self._memo: dict[int, object] = {}
        self._budget = BUDGET

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
        if domain in DEFAULT_DOMAINS:
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
        if domain == MS_DOMAIN and op in _MS_ACTIVATIONS and ins and ins[0] is not None:
            self._take(node)
            return Fn(f"{MS_DOMAIN}.{op}", [self.build(v) if v is not None else None for v in ins], node)
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


def free_variables(expr, out: dict | None = None) -> dict:
    out = {} if out is None else out
    if isinstance(expr, Var):
        out[id(expr.value)] = expr.value
    elif isinstance(expr, Prod):
        for f, _ in expr.factors:
            free_variables(f, out)
    elif isinstance(expr, Sum):
        for t in expr.terms:
            free_variables(t, out)
    elif isinstance(expr, Power):
        free_variables(expr.base, out)
    elif isinstance(expr, Fn):
        for a in expr.args:
            if a is not None:
                free_variables(a, out)
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
        if op == f"{MS_DOMAIN}.QuickGelu" and not extra:
            return _alpha_family(_attr_float(node, "alpha", QUICK_GELU_ALPHA), _F32_TOL,
                                 "com.microsoft QuickGelu"), "com.microsoft QuickGelu"
        if op == f"{MS_DOMAIN}.Gelu" and not extra:
            return "gelu", "com.microsoft Gelu"
        if op == f"{MS_DOMAIN}.FastGelu" and not extra:
            return "gelu_tanh", "com.microsoft FastGelu"
        if op in (f"{MS_DOMAIN}.FastGelu", f"{MS_DOMAIN}.BiasGelu"):
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
        out.append(expr.op.replace(f"{MS_DOMAIN}.", "com.microsoft "))
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
        return f"{expr.op.replace(f'{MS_DOMAIN}.', 'com.microsoft ')} of the gate, which no SwiGLU activation is"
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
