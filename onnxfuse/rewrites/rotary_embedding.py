"""rotary_embedding: rotary position embedding in the rotate-half convention -> `RotaryEmbedding`.

    Y = X * cos + rotate_half(X) * sin,    rotate_half(X) = concat(-X[..., D/2:], X[..., :D/2])

What both exporters emit for Llama / Mistral / Qwen2 (`apply_rotary_pos_emb`), per q and per k:
    Add(Mul(X, cos), Mul(Concat(Neg(Slice(X, D/2, end)), Slice(X, 0, D/2), axis=-1), sin))
with every commutation of Add/Mul. onnxruntime's own rotary fusion (stage 1 of `fuse`) takes this only where it can
also turn cos/sin into a cache; for decoders that compute them from position ids it gives the function back, and the
subgraph runs as six kernels per tensor (on a Llama-2-7B layer at 2048 tokens, about 0.22 ms of a 1.8 ms layer on
an H100). Fused, it is one pass: read X, cos, sin, write Y.

Variant with the head transposes: HF computes rotary in [B, H, S, D] between a Transpose of q/k and the Transpose
back. onnxruntime's transpose optimizer cancels those around plain elementwise ops but cannot see through a custom
op, so the rule takes them too: RotaryEmbedding runs in the untransposed layout on cos/sin transposed once (small
[B, 1, S, D] tensors, shared by q and k), and no Transpose kernel is left.

Refused: any other split point or order (interleaved rotary, partial rotary), a Slice with steps or on another axis,
a Concat on another axis, cos/sin whose shape does not broadcast to X's (or changes it), an odd or unknown D, element
types that differ, X of rank above 4.
"""
from __future__ import annotations

from onnxscript import ir
from onnxscript.rewriter import MatchResult

from ..ops.rotary_embedding import ROTARY_EMBEDDING
from ._base import FusionRule, check_float_dtypes, const, dims, rule_set

MAX_RANK = 4  # what the kernels index (leading dims padded to 3)


class RotaryEmbedding(FusionRule):
    op = ROTARY_EMBEDDING.name
    pattern_name = "rotary_embedding"
    naming_ops = ("Add",)

    def __init__(self, recorder, transposed: bool):
        self.transposed = transposed
        super().__init__(recorder, "transposed" if transposed else "plain")

    def pattern(self, op, x, cos, sin, s0, e0, a0, st0, s1, e1, a1, st1):
        t = op.Transpose(x, _outputs=["t_in"]) if self.transposed else x
        first = op.Slice(t, s0, e0, a0, st0, _outputs=["first"])
        second = op.Slice(t, s1, e1, a1, st1, _outputs=["second"])
        rot = op.Concat(op.Neg(second), first, _outputs=["rot"])
        y = op.Add(op.Mul(t, cos), op.Mul(rot, sin))
        return op.Transpose(y, _outputs=["t_out"]) if self.transposed else y

    def check(self, context, x, cos, sin, s0, e0, a0, st0, s1, e1, a1, st1, rot, first, t_in=None, t_out=None, **_):
        self.remember(context)
        result = MatchResult()
        if not self.guard(context, result, x, runtime=(cos, sin)):
            return result
        if check_float_dtypes(result, X=x, cos=cos, sin=sin) is None and not result:
            return result
        t = t_in if self.transposed else x
        td = dims(t)
        if td is None or not 2 <= len(td) <= MAX_RANK:
            return result.fail(f"{t.name} has rank {'unknown' if td is None else len(td)}: the kernels take rank 2 to "
                               f"{MAX_RANK}", t)
        rank, d = len(td), td[-1]
        if not isinstance(d, int) or d % 2 or d == 0:
            return result.fail(f"{t.name}'s last dim {d} is not a known even size", t)
        half = d // 2
        if self.transposed:
            perm_in = list(t_in.producer().attributes.get_ints("perm", []) or [])
            perm_out = list(t_out.producer().attributes.get_ints("perm", []) or [])
            if len(perm_in) != rank or len(perm_out) != rank or perm_in[-1] != rank - 1 or \
                    [perm_in[p] for p in perm_out] != list(range(rank)):
                return result.fail(f"the Transposes {perm_in} and {perm_out} around the rotary are not inverse of each "
                                   "other with the last axis in place", t_out)
            self._perm = perm_in
        # The halves: Slice(t, 0, D/2) and Slice(t, D/2, >= D), on the last axis, step 1.
        consts = {name: const(v) for name, v in (("s0", s0), ("e0", e0), ("a0", a0), ("st0", st0), ("s1", s1),
                                                  ("e1", e1), ("a1", a1), ("st1", st1))}
        if any(c is None or c.size != 1 for c in consts.values()):
            return result.fail("the Slices' starts/ends/axes/steps are not one-element constants", first)
        v = {k: int(c.reshape(-1)[0]) for k, c in consts.items()}
        axes_ok = all(a in (-1, rank - 1) for a in (v["a0"], v["a1"]))
        if not axes_ok or v["st0"] != 1 or v["st1"] != 1 or v["s0"] != 0 or v["e0"] != half or v["s1"] != half or \
                v["e1"] < d:
            return result.fail(f"the Slices take {v['s0']}:{v['e0']} and {v['s1']}:{v['e1']} (steps {v['st0']}, "
                               f"{v['st1']}) on axes {v['a0']}, {v['a1']}: rotate_half needs 0:{half} and {half}:end "
                               f"on the last axis (interleaved or partial rotary is not fused)", first)
        axis = rot.producer().attributes.get_int("axis", 0)
        if axis not in (-1, rank - 1):
            return result.fail(f"the Concat of the halves is on axis {axis}, not the last", rot)
        for name, c in (("cos", cos), ("sin", sin)):
            cd = dims(c)
            # Each leading dim of cos/sin is 1 or X's. A symbolic one is accepted where X's dim is a known size above 1:
            # at run time it is then 1, X's dim, or an error in the original Mul as in the kernel (which checks it);
            # where X's dim is 1 a larger cos dim would grow the original's output, so that is refused.
            if cd is None or len(cd) > rank or cd[-1] != d or \
                    any(not (cb == 1 or cb == tb or (isinstance(cb, str) and isinstance(tb, int) and tb > 1))
                        for cb, tb in zip(cd[:-1], td[len(td) - len(cd):-1])):
                return result.fail(f"{name} {c.name} of shape {cd} does not broadcast to {t.name} {td} along the "
                                   f"leading dims with the same last dim", c)
            if len(cd) != rank and self.transposed:
                return result.fail(f"{name} {c.name} has rank {len(cd)}, not {rank}: cannot transpose it with the head "
                                   "layout", c)
        if not self.guard_output(context, result, x, d):
            return result
        return result

    def _transposed(self, op, value: ir.Value) -> ir.Value:
        """cos or sin in X's layout: transposed by the inverse of the head permutation, once per graph."""
        inverse = [self._perm.index(i) for i in range(len(self._perm))]
        key = (id(self._graph), id(value), tuple(inverse))
        cache = self.recorder.__dict__.setdefault("_rotary_transposed", {})
        if key not in cache:
            cache[key] = op.Transpose(value, perm=inverse)
        return cache[key]

    def rewrite(self, op, x, cos, sin, **_):
        if self.transposed:
            cos, sin = self._transposed(op, cos), self._transposed(op, sin)
        shapes = {"X": dims(x), "cos": dims(cos), "sin": dims(sin)}
        return self.emit(op, self.op, [x, cos, sin], {"backend": "auto"}, shapes, x.dtype, 0)  # no GEMM FLOPs


def rules(recorder):
    # The transposed spelling first: it takes the Transposes the plain one would leave around the fused op.
    return [rule_set([(RotaryEmbedding, (recorder, True))]), rule_set([(RotaryEmbedding, (recorder, False))])]

