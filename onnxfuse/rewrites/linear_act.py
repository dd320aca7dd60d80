"""linear_act: a Linear layer and its activation -> `LinearRelu` / `LinearSigmoid`.

    Y = act(X @ W + bias)        act in {relu, sigmoid}

Spellings matched (as the dynamo and TorchScript exporters emit them, fp32/fp16/bf16, 2-D and N-D X):
    act(Gemm(X, W, C))               Gemm with the bias as input C, transB 0 or 1 (DLRM MLP layers)
    act(Add(Gemm(X, W), b))          Gemm without C, bias added after
    act(Add(MatMul(X, W), b))        MatMul on [K, N] weights (3-D activations, TorchScript), either Add order
    act(MatMul(X, W)), act(Gemm(X, W))   no bias: the op gets a zero bias

Why this granularity: a GEMM's bias and activation are elementwise epilogues; done in the GEMM's registers they
cost nothing, while unfused they are a full extra read and write of the output (the DLRM lecture's fused add+relu,
which torch.compile also emits). Refused: non-constant weights or bias, a bias that broadcasts along any axis but
the last or that raises the output's rank, initializers that are also graph inputs (defaults a caller may
override), Gemm with transA or alpha/beta != 1, rank-1 X, mixed element types, intermediates used elsewhere.
"""
from __future__ import annotations

import numpy as np
from onnxscript import ir
from onnxscript.rewriter import MatchResult

from ..ops.linear_act import LINEAR_RELU, LINEAR_SIGMOID
from . import _base
from ._base import FusionRule, bias_n, check_float_dtypes, dims, gemm_flops, rule_set, weight_kn

ACTIVATIONS = {"relu": ("Relu", LINEAR_RELU.name), "sigmoid": ("Sigmoid", LINEAR_SIGMOID.name)}
SPELLINGS = ("gemm_c", "gemm_add", "matmul_add", "matmul", "gemm")


class LinearAct(FusionRule):
    pattern_name = "linear_act"

    def __init__(self, recorder, spelling: str, activation: str):
        self.spelling = spelling
        self.act_op, self.op = ACTIVATIONS[activation]
        self.pattern_name = f"linear_{activation}"
        super().__init__(recorder, spelling)

    def pattern(self, op, x, w, b):
        if self.spelling == "gemm_c":
            z = op.Gemm(x, w, b, _outputs=["lin"])
        elif self.spelling == "gemm_add":
            z = op.Add(op.Gemm(x, w, _outputs=["lin"]), b)
        elif self.spelling == "matmul_add":
            z = op.Add(op.MatMul(x, w, _outputs=["lin"]), b)
        elif self.spelling == "matmul":
            z = op.MatMul(x, w, _outputs=["lin"])
        else:
            z = op.Gemm(x, w, _outputs=["lin"])
        return getattr(op, self.act_op)(z)

    def _gemm_trans(self, result: MatchResult, lin: ir.Value) -> bool | None:
        node = lin.producer()
        if node.op_type != "Gemm":
            return False
        a = node.attributes
        if a.get_int("transA", 0):
            result.fail(f"{_base.node_label(node)} is a Gemm with transA=1 (X transposed): not fused", lin)
            return None
        if a.get_float("alpha", 1.0) != 1.0 or a.get_float("beta", 1.0) != 1.0:
            result.fail(f"{_base.node_label(node)} is a Gemm with alpha {a.get_float('alpha', 1.0)} and beta "
                        f"{a.get_float('beta', 1.0)}: only alpha = beta = 1 is fused", lin)
            return None
        return bool(a.get_int("transB", 0))

    def check(self, context, x, w, lin, b=None, **_):
        self.remember(context)
        result = MatchResult()
        if not self.guard(context, result, x):
            return result
        trans = self._gemm_trans(result, lin)
        if trans is None:
            return result
        xd = dims(x)
        if xd is not None and len(xd) < 2:
            return result.fail(f"X {x.name} has rank {len(xd)}: a rank-1 MatMul is a vector product, "
                               "not a Linear layer", x)
        if check_float_dtypes(result, X=x, W=w, bias=b) is None and not result:
            return result
        wkn = weight_kn(result, w, "the weight", trans)
        if wkn is None:
            return result
        if xd is not None and isinstance(xd[-1], int) and xd[-1] != wkn.shape[0]:
            return result.fail(f"X {x.name} ends in {xd[-1]}, the weight {w.name} has K = {wkn.shape[0]}", w)
        if b is not None and bias_n(result, b, wkn.shape[1], None) is None:
            return result
        if not self.guard_output(context, result, x, wkn.shape[1]):
            return result
        self._w, self._trans = wkn, trans
        return result

    def rewrite(self, op, x, w, lin, b=None, **_):
        wkn, rec, graph = self._w, self.recorder, self._graph
        k, n = wkn.shape
        w_new = w if not self._trans else rec.derived(op, graph, w, "_KxN", lambda: wkn)
        if b is None:
            b_new = rec.derived(op, graph, w, "_zero_bias", lambda: np.zeros(n, dtype=wkn.dtype))
        elif list(b.shape or []) == [n]:
            b_new = b
        else:
            b_new = rec.derived(op, graph, b, "_N", lambda: bias_n(MatchResult(), b, n, None))
        dtype = x.dtype or w.dtype
        shapes = {"X": dims(x), "W": [k, n], "bias": [n]}
        return self.emit(op, self.op, [x, w_new, b_new], {"backend": "auto"}, shapes, dtype, gemm_flops(x, k, n))


def rules(recorder):
    return rule_set([(LinearAct, (recorder, s, a)) for a in ACTIVATIONS for s in SPELLINGS])
