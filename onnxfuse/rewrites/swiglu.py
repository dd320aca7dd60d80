"""swiglu: the gate and up projections of a Llama MLP with their SiLU-gate-mul -> `SwiGLU`.

    Y = silu(X @ W_gate) * (X @ W_up)        (then down_proj stays a plain MatMul/Gemm on Y)

Spellings matched: gate/up as MatMul on [K, N] weights or Gemm(transB=0|1); SiLU as Mul(g, Sigmoid(g)) (what
both exporters emit for torch's silu), the ONNX Swish op (opset 24, alpha 1), or decomposed as
g / (1 + Exp(-g)) and g * Reciprocal(1 + Exp(-g)); every commutation of Mul/Add.

Why this granularity (measured on an H200, fp16, Llama MLP h4096/i11008, 2048 tokens, torch): the three GEMMs alone
take 0.875 ms and the MLP with its activation 0.919 ms, while merging gate+up into one GEMM with a *separate*
silu*mul was slower (0.998 ms), as was Liger-Kernel's standalone silu*mul. So the win is hiding the activation in
the epilogue of the gate/up GEMM (one kernel computing both products and writing silu(g)*u once: the g and u
intermediates never reach memory), not a standalone elementwise op. The down projection is a plain GEMM that
onnxruntime already runs at cuBLAS speed; keeping it out keeps the op's output allocated by onnxruntime and its
scratch-free kernels safe under CUDA-graph capture. At decode sizes the same op reads W_gate and W_up once.
"""
from __future__ import annotations

from onnxscript.rewriter import MatchResult

from . import _base
from ._base import FusionRule, check_float_dtypes, dims, gemm_flops, rule_set, weight_kn

LINEARS = ("matmul", "gemm")
SILUS = ("sigmoid_mul", "swish", "div_exp", "reciprocal_exp")


class SwiGLU(FusionRule):
    op = "SwiGLU"
    pattern_name = "swiglu"

    def __init__(self, recorder, linear: str, silu: str):
        self.linear, self.silu = linear, silu
        super().__init__(recorder, f"{linear}_{silu}")

    def _lin(self, op, x, w, tag):
        if self.linear == "matmul":
            return op.MatMul(x, w, _outputs=[f"{tag}_lin"])
        return op.Gemm(x, w, _outputs=[f"{tag}_lin"])

    def _silu(self, op, g):
        if self.silu == "sigmoid_mul":
            return op.Mul(g, op.Sigmoid(g))
        if self.silu == "swish":
            return op.Swish(g, _outputs=["swish"])
        denom = op.Add(op.Exp(op.Neg(g)), 1.0)
        if self.silu == "div_exp":
            return op.Div(g, denom)
        return op.Mul(g, op.Reciprocal(denom))

    def pattern(self, op, x, w_gate, w_up):
        g = self._lin(op, x, w_gate, "gate")
        u = self._lin(op, x, w_up, "up")
        return op.Mul(self._silu(op, g), u)

    def check(self, context, x, w_gate, w_up, gate_lin, up_lin, swish=None, **_):
        self.remember(context)
        result = MatchResult()
        if not self.guard(context, result, x):
            return result
        if swish is not None and swish.producer().attributes.get_float("alpha", 1.0) != 1.0:
            return result.fail(f"{_base.node_label(swish.producer())} is a Swish with alpha != 1: not SiLU", swish)
        trans = []
        for lin in (gate_lin, up_lin):
            node = lin.producer()
            if node.op_type == "Gemm":
                a = node.attributes
                if a.get_int("transA", 0) or a.get_float("alpha", 1.0) != 1.0:
                    return result.fail(f"{_base.node_label(node)} is a Gemm with transA=1 or alpha != 1: not fused", lin)
                if len(node.inputs) > 2 and node.inputs[2] is not None:
                    return result.fail(f"{_base.node_label(node)} adds a bias ({node.inputs[2].name}): SwiGLU's projections "
                                       "have none", lin)
                trans.append(bool(a.get_int("transB", 0)))
            else:
                trans.append(False)
        if check_float_dtypes(result, X=x, W_gate=w_gate, W_up=w_up) is None and not result:
            return result
        wg = weight_kn(result, w_gate, "the gate weight", trans[0])
        wu = weight_kn(result, w_up, "the up weight", trans[1]) if wg is not None else None
        if wg is None or wu is None:
            return result
        if wg.shape != wu.shape:
            return result.fail(f"the gate weight {w_gate.name} {list(wg.shape)} and the up weight {w_up.name} "
                               f"{list(wu.shape)} differ in shape", w_up)
        xd = dims(x)
        if xd is not None and len(xd) < 2:
            return result.fail(f"X {x.name} has rank {len(xd)}, expected [..., K]", x)
        if xd is not None and isinstance(xd[-1], int) and xd[-1] != wg.shape[0]:
            return result.fail(f"X {x.name} ends in {xd[-1]}, the weights have K = {wg.shape[0]}", w_gate)
        if not self.guard_output(context, result, x, wg.shape[1]):
            return result
        self._wg, self._wu, self._trans = wg, wu, trans
        return result

    def rewrite(self, op, x, w_gate, w_up, **_):
        k, n = self._wg.shape
        rec, graph = self.recorder, self._graph
        wg = w_gate if not self._trans[0] else rec.derived(op, graph, w_gate, "_KxN", lambda: self._wg)
        wu = w_up if not self._trans[1] else rec.derived(op, graph, w_up, "_KxN", lambda: self._wu)
        flops = gemm_flops(x, k, n)
        shapes = {"X": dims(x), "W_gate": [k, n], "W_up": [k, n]}
        return self.emit(op, self.op, [x, wg, wu], {"backend": "auto"}, shapes, x.dtype or w_gate.dtype,
                         None if flops is None else 2 * flops)


def rules(recorder):
    return rule_set([(SwiGLU, (recorder, lin, s)) for lin in LINEARS for s in SILUS])
