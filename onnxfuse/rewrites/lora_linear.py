"""lora_linear: a LoRA-adapted linear, base GEMM and rank-r branch -> `LoRALinear` / `LoRALinearRelu`.

    Y = [relu](X @ W + bias + scale * ((X @ A) @ B))

Spellings matched: peft's unmerged adapter (base_layer MatMul [+ bias Add], lora_A and lora_B MatMuls, the
scaling Mul, or no Mul where the scaling is 1 and an optimizer folded it away, dropout gone in eval, and under the
TorchScript exporter the Cast back to the input dtype), and the plain-PyTorch LoRA of onnxfuse's DLRM (Gemm with
bias, x @ Aᵀ @ Bᵀ, scaling, + ReLU). Base as MatMul, MatMul+Add, Gemm(X, W[, C]) with transB 0|1; the branch as two
MatMuls or, as the dynamo exporter writes peft's lora_A / lora_B Linears on a 2-D X, two Gemms (transB 0|1, constant
A and B: transposed once at fuse time); every commutation of Add/Mul.

Why one op: unfused, the rank-r branch costs two skinny GEMMs, a scaling pass and an add pass over the full
[M, N] output, each launch and each pass paid in memory traffic; fused, X @ A is a thin [M, r] product and the
scaled (X @ A) @ B is accumulated into the base GEMM's tile before the epilogue, so the branch adds about r/K to
the base GEMM's work and nothing to its memory traffic.

Adapters as inputs: A and B may be graph inputs (with or without a default initializer) instead of constants. They
stay op inputs under their own names, never baked, so one fused model serves any adapter of the same shapes (fed
per run, or bound once with IOBinding and overwritten to swap). Their shapes must be static 2-D ([K, r], [r, N]).
Refused: a non-constant W or scale, A/B computed in the graph, an adapter input read by a Gemm with transB=1 (its
transpose cannot be baked), a Gemm branch with C, transA or alpha/beta != 1, a non-scalar scale,
shapes that do not chain ([K,N], [K,r], [r,N]), a bias not along the last axis, a scale or bias that raises the
output's rank, initializers that are also graph inputs, a Cast to another dtype, models below opset 15 (the
function body needs CastLike).
"""
from __future__ import annotations

import numpy as np
from onnxscript.rewriter import MatchResult

from ..ops.lora_linear import LORA_LINEAR, LORA_LINEAR_RELU
from . import _base
from ._base import FusionRule, bias_n, check_float_dtypes, const, dims, gemm_flops, rule_set, weight_kn

BASES = ("matmul", "matmul_add", "gemm_c", "gemm")
BRANCHES = ("matmul", "gemm")  # (X @ A) @ B as MatMuls, or as Gemm(Gemm(X, A), B) (a 2-D X's Linears)
TAILS = ("cast_relu", "relu", "cast", "none")  # longest first: see rules()


class LoRALinear(FusionRule):
    pattern_name = "lora_linear"

    def __init__(self, recorder, base: str, tail: str, scaled: bool = True, branch: str = "matmul"):
        self.base, self.tail, self.scaled, self.branch = base, tail, scaled, branch
        relu = tail.endswith("relu")
        self.op = (LORA_LINEAR_RELU if relu else LORA_LINEAR).name
        self.pattern_name = "lora_linear_relu" if relu else "lora_linear"
        super().__init__(recorder, f"{base}_{tail}" + ("" if scaled else "_unscaled") +
                         ("" if branch == "matmul" else "_gemm_branch"))

    def pattern(self, op, x, w, b, a, bm, s):
        if self.base == "matmul":
            base = op.MatMul(x, w, _outputs=["lin"])
        elif self.base == "matmul_add":
            base = op.Add(op.MatMul(x, w, _outputs=["lin"]), b)
        elif self.base == "gemm_c":
            base = op.Gemm(x, w, b, _outputs=["lin"])
        else:
            base = op.Gemm(x, w, _outputs=["lin"])
        if self.branch == "gemm":
            branch = op.Gemm(op.Gemm(x, a, _outputs=["xa"]), bm, _outputs=["xab"])
        else:
            branch = op.MatMul(op.MatMul(x, a), bm)
        if self.scaled:  # a scaling of 1 (alpha == r) is folded away by optimizers: the branch is then bare
            branch = op.Mul(branch, s)
        y = op.Add(base, branch)
        if self.tail.startswith("cast"):
            y = op.Cast(y, _outputs=["cast"])
        if self.tail.endswith("relu"):
            y = op.Relu(y)
        return y

    def check(self, context, x, w, a, bm, lin, s=None, b=None, cast=None, xa=None, xab=None, **_):
        self.remember(context)
        result = MatchResult()
        # adapter weights fed at run time stay op inputs: the guard lets them through, _adapter_shape checks them
        if not self.guard(context, result, x, runtime=tuple(v for v in (a, bm) if v.is_graph_input())):
            return result
        trans = False
        node = lin.producer()
        if node.op_type == "Gemm":
            attrs = node.attributes
            if (attrs.get_int("transA", 0) or attrs.get_float("alpha", 1.0) != 1.0
                    or attrs.get_float("beta", 1.0) != 1.0):
                return result.fail(f"{_base.node_label(node)} is a Gemm with transA=1 or alpha/beta != 1: not "
                                   "fused", lin)
            trans = bool(attrs.get_int("transB", 0))
        dtype = check_float_dtypes(result, X=x, W=w, A=a, B=bm, bias=b)
        if not result:
            return result
        if cast is not None:
            to = cast.producer().attributes.get_int("to", 0)
            if dtype is not None and to != dtype.value:
                return result.fail(f"{_base.node_label(cast.producer())} casts the LoRA sum to another type "
                                   f"(to={to})", cast)
        scale = const(s) if s is not None else np.ones(1, np.float32)
        if scale is None or scale.size != 1:
            return result.fail(f"the LoRA scaling {s.name} is not a constant of one element", s)
        wkn = weight_kn(result, w, "the base weight", trans)
        ta = tb = False
        if self.branch == "gemm":
            flags = _branch_gemm_flags(result, xa, xab)
            if flags is None:
                return result
            ta, tb = flags
        sa = _adapter_shape(result, a, "lora_A", ta) if wkn is not None else None
        sb = _adapter_shape(result, bm, "lora_B", tb) if sa is not None else None
        if wkn is None or sa is None or sb is None:
            return result
        k, n = wkn.shape
        if sa[0] != k or sb[1] != n or sa[1] != sb[0]:
            return result.fail(f"shapes do not chain: W {w.name} {list(wkn.shape)}, A {a.name} {sa}, "
                               f"B {bm.name} {sb} "
                               "(expected [K,N], [K,r], [r,N])", a)
        xd = dims(x)
        if xd is not None and (len(xd) < 2 or (isinstance(xd[-1], int) and xd[-1] != k)):
            return result.fail(f"X {x.name} {xd} does not end in K = {k}", x)
        if b is not None and bias_n(result, b, n, None) is None:
            return result
        if not self.guard_output(context, result, x, n):
            return result
        self._w, self._trans, self._scale, self._r = wkn, trans, float(scale.reshape(-1)[0]), sa[1]
        self._ab_trans = (ta, tb)
        return result

    def rewrite(self, op, x, w, a, bm, lin, b=None, **_):
        k, n = self._w.shape
        rec, graph = self.recorder, self._graph
        w_new = w if not self._trans else rec.derived(op, graph, w, "_KxN", lambda: self._w)
        if b is None:
            b_new = rec.derived(op, graph, w, "_zero_bias", lambda: np.zeros(n, dtype=self._w.dtype))
        elif list(b.shape or []) == [n]:
            b_new = b
        else:
            b_new = rec.derived(op, graph, b, "_N", lambda: bias_n(MatchResult(), b, n, None))
        ta, tb = self._ab_trans  # a Gemm branch's transB=1 adapters, stored [K, r] / [r, N] once
        a = rec.derived(op, graph, a, "_KxR", lambda: weight_kn(MatchResult(), a, "lora_A", True)) if ta else a
        bm = rec.derived(op, graph, bm, "_RxN", lambda: weight_kn(MatchResult(), bm, "lora_B", True)) if tb else bm
        r = self._r
        base = gemm_flops(x, k, n)
        flops = None if base is None else base + base // n * r + base // k * r  # + 2MKr + 2MrN
        shapes = {"X": dims(x), "W": [k, n], "A": [k, r], "B": [r, n], "bias": [n]}
        return self.emit(op, self.op, [x, w_new, a, bm, b_new], {"scale": self._scale, "backend": "auto"}, shapes,
                         x.dtype or w.dtype, flops)


def _adapter_shape(result: MatchResult, v, name: str, trans: bool = False) -> list[int] | None:
    """The static [rows, cols] (after a Gemm's transB when `trans`) of a LoRA weight that is a constant or a graph
    input (an adapter fed at run time, kept as an op input), or None with a reason."""
    if v.is_graph_input():
        d = dims(v)
        if trans:
            result.fail(f"{name} {v.name} is a graph input read by a Gemm with transB=1: an adapter input must be in "
                        "the MatMul layout ([K, r], [r, N]; export with a 3-D X, or transpose it in the model)", v)
            return None
        if d is None or len(d) != 2 or not all(isinstance(x, int) for x in d):
            result.fail(f"{name} {v.name} is a graph input of shape {d}: an adapter input needs a static 2-D shape", v)
            return None
        return d
    arr = weight_kn(result, v, name, trans)
    return None if arr is None else list(arr.shape)


def _branch_gemm_flags(result: MatchResult, xa, xab) -> tuple[bool, bool] | None:
    """The transB flags of a Gemm-spelled branch (Gemm(Gemm(X, A), B): no C, transA 0, alpha and beta 1), or None
    with a reason."""
    flags = []
    for v in (xa, xab):
        node = v.producer()
        attrs = node.attributes
        if (len(node.inputs) > 2 or attrs.get_int("transA", 0) or attrs.get_float("alpha", 1.0) != 1.0
                or attrs.get_float("beta", 1.0) != 1.0):
            result.fail(f"{_base.node_label(node)} in the LoRA branch has a C input, transA=1 or alpha/beta != 1: not "
                        "fused", v)
            return None
        flags.append(bool(attrs.get_int("transB", 0)))
    return flags[0], flags[1]


def rules(recorder):
    # Longest tails first, one pass each: the rewriter visits nodes in order, and at the LoRA sum the bare variant
    # would otherwise fire before the Cast/Relu after it is considered.
    return [rule_set([(LoRALinear, (recorder, base, tail, scaled, branch)) for scaled in (True, False)
                      for base in BASES for branch in BRANCHES])
            for tail in TAILS]
