"""int4_linear: onnxruntime's 4-bit `com.microsoft.MatMulNBits` -> `Int4Linear`.

    Y = X @ W^T,  W[n, k] = (nibble(B, n, k) - 8) * scales[n, k // block_size]

What onnxruntime-genai's builder writes for every projection (qkv, o, gate, up, down, lm_head) with `-p int4`:
MatMulNBits(X, B, scales) with bits 4, a block size of 32 (its default), B uint8 [N, n_blocks, block / 2] and no
zero points (symmetric: the zero point is 8). onnxruntime's CUDA kernel for it reads the packed weights at about a
third of the memory bandwidth at decode (H100, Llama-2-7B shapes: 3.59 ms per token where the weights take 1.3 ms);
onnxfuse's streams them once and dequantizes in registers.

Refused, each with its reason in --explain: zero points, g_idx or a bias (inputs 3-5; the kernels take the symmetric
form only), bits other than 4, a block size the kernels do not take, weights or scales that are not true constants
(a graph input, an overridable initializer), scales of another element type than X, shapes that disagree with the
node's K and N attributes.
"""
from __future__ import annotations

import numpy as np
from onnxscript import ir
from onnxscript.rewriter import MatchResult

from ..ops.int4_linear import BLOCK_SIZES, INT4_LINEAR
from ._base import FusionRule, check_float_dtypes, dims, gemm_flops, new_initializer, rule_set

MS_DOMAIN = "com.microsoft"


class Int4Linear(FusionRule):
    op = INT4_LINEAR.name
    pattern_name = "int4_linear"
    naming_ops = ("MatMulNBits",)

    def __init__(self, recorder):
        super().__init__(recorder, "matmulnbits")

    def pattern(self, op, x, b, scales):
        return op.MatMulNBits(x, b, scales, _domain=MS_DOMAIN, _allow_other_inputs=True, _outputs=["y"])

    def check(self, context, x, b, scales, y, **_):
        self.remember(context)
        result = MatchResult()
        node = y.producer()
        label = node.name or "the MatMulNBits"
        extra = [i for i, v in enumerate(node.inputs) if i >= 3 and v is not None]
        if extra:
            names = {3: "zero points", 4: "g_idx", 5: "a bias"}
            return result.fail(f"{label} has {', '.join(names.get(i, f'input {i}') for i in extra)}: Int4Linear takes "
                               "the symmetric form (no zero points, no g_idx, no bias) that genai's builder writes",
                               node.inputs[extra[0]])
        attr = node.attributes
        bits, block = attr.get_int("bits", 4), attr.get_int("block_size", 0)
        k_attr, n_attr = attr.get_int("K", 0), attr.get_int("N", 0)
        if bits != 4:
            return result.fail(f"{label} has {bits}-bit weights: Int4Linear takes 4 bits", y)
        if block not in BLOCK_SIZES:
            return result.fail(f"{label} has block size {block}: the kernels take {', '.join(map(str, BLOCK_SIZES))}",
                               y)
        if not self.guard(context, result, x):  # the packed weights and scales are true constants
            return result
        dtype = check_float_dtypes(result, X=x, scales=scales)
        if dtype is None and not result:
            return result
        if b.dtype != ir.DataType.UINT8:
            return result.fail(f"the packed weights {b.name} are {b.dtype.name.lower()}, not uint8", b)
        nb = -(-k_attr // block)
        want_b = [n_attr, nb, block // 2]
        b_shape = [int(d) for d in b.const_value.shape]
        if b_shape != want_b:
            return result.fail(f"the packed weights {b.name} have shape {b_shape}, not [N, ceil(K / block), block / 2]"
                               f" = {want_b} for K {k_attr}, N {n_attr}, block {block}", b)
        s_shape = [int(d) for d in scales.const_value.shape]
        if s_shape not in ([n_attr, nb], [n_attr * nb]):
            return result.fail(f"the scales {scales.name} have shape {s_shape}, not [N, n_blocks] = [{n_attr}, {nb}]",
                               scales)
        xd = dims(x)
        if xd is None or not xd or (isinstance(xd[-1], int) and xd[-1] != k_attr):
            return result.fail(f"X {x.name} has shape {xd}: its last dim must be the node's K = {k_attr}", x)
        if not self.guard_output(context, result, x, n_attr):
            return result
        self._k, self._n, self._nb, self._block = k_attr, n_attr, nb, block
        return result

    def rewrite(self, op, x, b, scales, **_):
        s = scales
        if len(scales.const_value.shape) == 1:  # MatMulNBits allows [N * n_blocks]: the op takes [N, n_blocks]
            arr = np.asarray(scales.const_value.numpy()).reshape(self._n, self._nb)
            s = new_initializer(op, self.recorder, f"{scales.name}_2d", arr)
        shapes = {"X": dims(x), "Wq": [self._n, self._nb, self._block // 2], "scales": [self._n, self._nb]}
        return self.emit(op, self.op, [x, b, s], {"backend": "auto"}, shapes, x.dtype,
                         gemm_flops(x, self._k, self._n))


def rules(recorder):
    return rule_set([(Int4Linear, (recorder,))])
