"""Triton kernels run by Triton's interpreter (TRITON_INTERPRET=1: numpy on the CPU) against onnxfuse.schema.reference:
the embedding kernel (both ops, dot and cat, hash, bags with empty and clamped bounds, both bag forms, odd d and
feature counts), the persistent MLPStack grid kernel (one program: every layer, barrier and ping-pong scratch;
several programs for one layer: the round-robin tiles cover the output exactly once) and the kernels on
gemm_loop.py's shared main loop (linear_act, swiglu with every gate activation, the two LoRA phases).

What the interpreter cannot show is left to the GPU tests (tests/test_gpu.py): bf16 dot products (its bf16 tl.dot is
wrong, the kernels' is not), the grid barrier between concurrently running programs, and speed. Each check runs in a
subprocess so that TRITON_INTERPRET never leaks into a build that compiles cubins.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

_PRELUDE = r"""
import importlib, importlib.util, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import numpy as np, torch, triton, triton.language as tl
import triton.runtime.interpreter as _ti
# Triton 3.6's interpreter turns a kernel's scalar arguments into 1-element arrays, which numpy 2 refuses to index
# with: give range() the element.
_orig = _ti._patch_lang_tensor
def _patched(tensor, scope):
    _orig(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(-1)[0]))
_ti._patch_lang_tensor = _patched
sys.path.insert(0, sys.argv[1])
from onnxfuse import schema, testing
def load(name):
    # As aot.py imports them: the kernel files as one private package (they share gemm_loop.py relatively).
    if "_kernels" not in sys.modules:
        pkg = importlib.util.module_from_spec(importlib.util.spec_from_loader("_kernels", loader=None, is_package=True))
        pkg.__path__ = [os.path.join(sys.argv[1], "onnxfuse/kernels/triton")]
        sys.modules["_kernels"] = pkg
    return importlib.import_module("_kernels." + name)
TT = {"float": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
"""

_EMBEDDING = _PRELUDE + r"""
ei = load("embedding_interaction")
k = ei._embedding_interaction_kernel
g = torch.Generator().manual_seed(0)
def pad(v):
    return max(16, 1 << (int(v) - 1).bit_length())
checks = 0
for dtype, interactions in (("float", ("dot", "cat")), ("float16", ("dot", "cat")), ("bfloat16", ("cat",))):
    for batch, d, sizes in ((5, 4, [3, 7, 2]), (11, 16, [(7 * f + 3) % 50 + 1 for f in range(26)]), (3, 20, [5] * 40)):
        f = len(sizes)
        card = torch.tensor(sizes, dtype=torch.int64)
        toff = torch.cumsum(card, 0) - card
        table = torch.randn(int(card.sum()), d, generator=g).to(TT[dtype])
        x = torch.randn(batch, d, generator=g).to(TT[dtype])
        for interaction in interactions:
            width = schema.interaction_width(f + 1, d, interaction)
            for bag, hash_ in ((0, 0), (0, 1), (1, 0), (2, 0)):
                if bag == 1:
                    n_idx, index_stride, offset_cols = 3 * batch, 3 * batch, batch
                    ids = (torch.rand(f, n_idx, generator=g) * 3 * card[:, None] - card[:, None]).long()
                    offs = torch.sort(torch.randint(-2, n_idx + 3, (f, batch), generator=g), dim=1).values
                elif bag == 2:  # per-table indices concatenated into one row, offsets [F, B + 1]
                    lengths = torch.randint(0, 4 * batch, (f,), generator=g)
                    base = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
                    n_idx, index_stride, offset_cols = int(base[-1]), 0, batch + 1
                    ids = (torch.rand(1, n_idx, generator=g) * 3 * card.max() - card.max()).long()
                    cuts = torch.sort(torch.randint(-1, 4 * batch + 2, (f, batch), generator=g), dim=1).values
                    offs = torch.cat([torch.minimum(cuts.clamp(min=0), lengths[:, None]) + base[:-1, None],
                                      base[1:, None]], 1)
                if bag:
                    ref = schema.reference("EmbeddingBagInteraction", [x, ids, offs, table, toff, card],
                                           {"interaction": interaction})
                else:
                    n_idx, index_stride, offset_cols = 0, 0, 0
                    ids = (torch.rand(batch, f, generator=g) * 3 * card - card).long()
                    ids[0, 0] = 2 ** 63 - 1
                    offs = ids
                    ref = schema.reference("EmbeddingInteraction", [x, ids, table, toff, card],
                                           {"interaction": interaction, "hash": ["none", "mod"][hash_]})
                y = torch.full((batch, width), float("nan")).to(TT[dtype])
                block = 4
                k[((batch + block - 1) // block,)](x, ids, offs, table, toff, card, y, batch, f, n_idx, index_stride,
                                                   offset_cols, d, width, int(card.sum()), int(bag > 0), hash_,
                                                   int(interaction == "dot"),
                                                   BLOCK_M=block, NP=pad(f + 1), DP=pad(d),
                                                   DOT_PRECISION="ieee" if dtype == "float" else "tf32")
                assert not torch.isnan(y.float()).any(), (dtype, batch, interaction, bag, "unwritten output")
                testing.assert_close(y, ref, dtype, str((batch, d, f, interaction, bag, hash_)), kind="interpreter")
                checks += 1
print("ok", checks)
"""

_GRID = _PRELUDE + r"""
ms = load("mlp_stack")

@triton.jit
def one_layer(x_ptr, y_ptr, w_ptr, b_ptr, M, K, N, ACT, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr):
    ms._grid_layer(x_ptr, K, y_ptr, N, w_ptr, b_ptr, M, K, N, ACT, tl.program_id(0), tl.num_programs(0),
                   BLOCK_M, BLOCK_N, BLOCK_K, "ieee")

g = torch.Generator().manual_seed(0)
def stack(widths, acts, m, dtype, block):
    t = TT[dtype]
    n_layers = len(acts)
    x = torch.randn(m, widths[0], generator=g).to(t)
    ws = [(torch.randn(k, n, generator=g) / k ** 0.5).to(t) for k, n in zip(widths[:-1], widths[1:])]
    bs = [(torch.randn(n, generator=g) * 0.5).to(t) for n in widths[1:]]
    sw = (max(widths[1:-1] or [0]) + 15) // 16 * 16
    s = torch.full((2 * m * max(sw, 1),), float("nan")).to(t)
    bar = torch.zeros(4, dtype=torch.int32)
    y = torch.full((m, widths[-1]), float("nan")).to(t)
    codes = [schema.ACTIVATIONS[a] for a in acts]
    pad = 3 - (n_layers - 1)
    hw, hb = ws[:-1] + [x] * pad, bs[:-1] + [x] * pad
    hn, ha = widths[1:-1] + [0] * pad, codes[:-1] + [1] * pad
    args = [a for i in range(3) for a in (hw[i], hb[i], hn[i], ha[i])]
    ms._mlp_stack_grid_kernel[(1,)](x, y, s, bar, m, widths[0], sw, n_layers, *args, ws[-1], bs[-1], widths[-1],
                                    codes[-1], BLOCK_M=block[0], BLOCK_N=block[1], BLOCK_K=block[2],
                                    DOT_PRECISION="ieee" if dtype == "float" else "tf32")
    ref = schema.reference("MLPStack", [x] + [v for p in zip(ws, bs) for v in p], {"activations": ".".join(acts)})
    err = (y.float() - ref.float()).abs().max().item()
    assert err <= (1e-5 if dtype == "float" else 2e-3), (widths, m, dtype, err)
    assert bar[0].item() == n_layers - 1, bar  # one arrival per barrier of the single program
for dtype in ("float", "float16"):
    stack([13, 512, 256, 64, 16], ["relu"] * 4, 37, dtype, (16, 32, 64))
    stack([367, 512, 256, 1], ["relu", "relu", "sigmoid"], 20, dtype, (16, 32, 64))
    stack([29, 40, 1], ["relu", "sigmoid"], 70, dtype, (16, 32, 32))
    stack([29, 33], ["sigmoid"], 5, dtype, (16, 32, 32))
# several programs, one layer: round-robin tiles, every output element written once
for programs in (1, 3, 7, 40):
    m, k, n = 45, 70, 100
    x = torch.randn(m, k, generator=g)
    w = torch.randn(k, n, generator=g) / k ** 0.5
    b = torch.randn(n, generator=g)
    y = torch.full((m, n), float("nan"))
    one_layer[(programs,)](x, y, w, b, m, k, n, 1, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32)
    assert torch.allclose(y, torch.relu(x @ w + b), atol=1e-5), programs
print("ok")
"""


_GEMM = _PRELUDE + r"""
# The kernels on gemm_loop.py's _gemm_main: LinearRelu/LinearSigmoid, SwiGLU (DUAL: two products in one K loop, every
# gate activation) and the two LoRA phases; shapes with ragged M, N and K tiles and more than one group of row tiles.
# linear_act and lora_main also as their persistent TMA builds (gemm_loop._gemm_tile_tma: descriptor loads, zero
# fill past every edge, 3 programs walking all the tiles) on the aligned shapes (K and N multiples of 16).
la, sw, lora = load("linear_act"), load("swiglu"), load("lora_linear")
g = torch.Generator().manual_seed(0)
cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2)
def grid(m, n):
    return (triton.cdiv(m, 16) * triton.cdiv(n, 32),)
checks = 0
for dtype in ("float", "float16"):
    t = TT[dtype]
    prec = "ieee" if dtype == "float" else "tf32"
    for m, k, n in ((37, 40, 70), (5, 16, 32), (64, 33, 17), (37, 48, 80)):
        x = torch.randn(m, k, generator=g).to(t)
        w, w2 = (torch.randn(k, n, generator=g) / k ** 0.5).to(t), (torch.randn(k, n, generator=g) / k ** 0.5).to(t)
        b = torch.randn(n, generator=g).to(t)
        for act, op in ((1, "LinearRelu"), (2, "LinearSigmoid")):
            y = torch.full((m, n), float("nan")).to(t)
            nprog = grid(m, n)[0]
            la._linear_act_kernel[(nprog,)](x, w, b, y, m, n, k, act, nprog, DOT_PRECISION=prec, TMA=False, **cfg)
            testing.assert_close(y, schema.reference(op, [x, w, b]), t, str((op, dtype, m, k, n)), kind="interpreter")
            checks += 1
            if k % 16 == 0 and n % 16 == 0:
                y = torch.full((m, n), float("nan")).to(t)
                la._linear_act_kernel[(3,)](x, w, b, y, m, n, k, act, 3, DOT_PRECISION=prec, TMA=True, **cfg)
                testing.assert_close(y, schema.reference(op, [x, w, b]), t, str((op, "tma", dtype, m, k, n)),
                                     kind="interpreter")
                checks += 1
        for code, name in enumerate(schema.GATE_ACTIVATIONS):
            y = torch.full((m, n), float("nan")).to(t)
            sw._swiglu_kernel[grid(m, n)](x, w, w2, y, m, n, k, code, DOT_PRECISION=prec, **cfg)
            ref = schema.reference("SwiGLU", [x, w, w2], {"activation": name})
            testing.assert_close(y, ref, t, str(("SwiGLU", name, dtype, m, k, n)), kind="interpreter")
            checks += 1
        for r, split in ((4, 1), (16, 3)):
            a = (torch.randn(k, r, generator=g) / k ** 0.5).to(t)
            bm = (torch.randn(r, n, generator=g) / r ** 0.5).to(t)
            kb_per_split = triton.cdiv(triton.cdiv(k, 16), split)
            ts = torch.full((split, m, 16), float("nan"))
            lora._lora_xa_kernel[(triton.cdiv(m, 16) * split,)](x, a, a, ts, ts, m, k, r, r, 1, kb_per_split, ts, 0,
                                                                BLOCK_M=16, BLOCK_K=16, R_PAD=16, DOT_PRECISION=prec)
            for relu, op in ((0, "LoRALinear"), (1, "LoRALinearRelu")):
                y = torch.full((m, n), float("nan")).to(t)
                nprog = grid(m, n)[0]
                lora._lora_main_kernel[(nprog,)](x, w, ts, bm, b, y, m, n, k, r, split, 0.5, relu, nprog, R_PAD=16,
                                                 DOT_PRECISION=prec, TMA=False, **cfg)
                ref = schema.reference(op, [x, w, a, bm, b], {"scale": 0.5})
                testing.assert_close(y, ref, t, str((op, dtype, m, k, n, r, split)), kind="interpreter")
                checks += 1
                if k % 16 == 0 and n % 16 == 0:
                    y = torch.full((m, n), float("nan")).to(t)
                    lora._lora_main_kernel[(3,)](x, w, ts, bm, b, y, m, n, k, r, split, 0.5, relu, 3, R_PAD=16,
                                                 DOT_PRECISION=prec, TMA=True, **cfg)
                    testing.assert_close(y, ref, t, str((op, "tma", dtype, m, k, n, r, split)), kind="interpreter")
                    checks += 1
        # LoRASwiGLU: both adapters' X @ A partials from the same X tiles (ranks 4 and 7, padded to 16; split 2), then
        # SwiGLU's loop with both rank-r terms before the activation
        sl = sw
        ag, au = (torch.randn(k, 4, generator=g) / k ** 0.5).to(t), (torch.randn(k, 7, generator=g) / k ** 0.5).to(t)
        bg, bu = (torch.randn(4, n, generator=g) / 2).to(t), (torch.randn(7, n, generator=g) / 7 ** 0.5).to(t)
        kb = triton.cdiv(triton.cdiv(k, 16), 2)
        tg, tu = torch.full((2, m, 16), float("nan")), torch.full((2, m, 16), float("nan"))
        lora._lora_xa_kernel[(triton.cdiv(m, 16) * 2,)](x, ag, au, tg, tu, m, k, 4, 7, 2, kb, tg, 0, BLOCK_M=16,
                                                            BLOCK_K=16, R_PAD=16, DOT_PRECISION=prec)
        for code, name in ((0, "silu"), (2, "gelu_tanh")):
            y = torch.full((m, n), float("nan")).to(t)
            sl._lora_swiglu_kernel[grid(m, n)](x, w, w2, tg, bg, tu, bu, y, m, n, k, 4, 7, 2, 0.5, 2.0, code,
                                               ag, tg, 0, R_PAD=16, DOT_PRECISION=prec, **cfg)
            attrs = {"activation": name, "scale_gate": 0.5, "scale_up": 2.0}
            ref = schema.reference("LoRASwiGLU", [x, w, w2, ag, bg, au, bu], attrs)
            testing.assert_close(y, ref, t, str(("LoRASwiGLU", name, dtype, m, k, n)), kind="interpreter")
            checks += 1
            # the large-M form: the base products (cuBLASLt's, here torch's, in the input type), then lora_gate in
            # place on the gate product
            y = (x.float() @ w.float()).to(t)
            u = (x.float() @ w2.float()).to(t)
            sl._lora_gate_kernel[grid(m, n)](y, u, tg, bg, tu, bu, y, m, n, 4, 7, 2, 0.5, 2.0, code, ag, tg, 0,
                                             BLOCK_M=16,
                                             BLOCK_N=32, GROUP_M=2, R_PAD=16, DOT_PRECISION=prec)
            testing.assert_close(y, ref, t, str(("LoRASwiGLU gate pass", name, dtype, m, k, n)), kind="interpreter")
            checks += 1
# per dtype: 4 shapes x (2 linear + 6 swiglu + 4 lora + 2 x 2 lora_swiglu), and the TMA builds on the two aligned
# shapes ((37, 48, 80): 9 ragged tiles for 3 programs)
assert checks == 2 * (4 * (2 + 6 + 4 + 4) + 2 * (2 + 4)), checks
# A row with one +Inf through LoRA (r 4 padded to 16): the padded columns of T are x @ 0, NaN in that row, and must
# not reach the outputs, which are +-Inf like the reference's (IEEE semantics, testing.check_special).
m, k, n, r = 9, 40, 70, 4
x = torch.randn(m, k, generator=g)
x[3, 5] = float("inf")
w, b = torch.randn(k, n, generator=g) / k ** 0.5, torch.randn(n, generator=g)
a, bm = torch.randn(k, r, generator=g) / k ** 0.5, torch.randn(r, n, generator=g) / r ** 0.5
ts = torch.full((1, m, 16), float("nan"))
lora._lora_xa_kernel[(1,)](x, a, a, ts, ts, m, k, r, r, 1, triton.cdiv(k, 16), ts, 0, BLOCK_M=16, BLOCK_K=16, R_PAD=16,
                           DOT_PRECISION="ieee")
y = torch.full((m, n), float("nan"))
lora._lora_main_kernel[grid(m, n)](x, w, ts, bm, b, y, m, n, k, r, 1, 0.5, 0, grid(m, n)[0], R_PAD=16,
                                   DOT_PRECISION="ieee", TMA=False, **cfg)
c = testing.check_special(y, schema.reference("LoRALinear", [x, w, a, bm, b], {"scale": 0.5}), "float")
assert c.ok, c.reason
print("ok")
"""

_INT4 = _PRELUDE + r"""
# Int4Linear's GEMM (dequantizing the packed tile in its K loop): every block size, ragged K (the padded last block,
# whose bytes hold garbage), ragged M and N tiles, fp32 and fp16; with zero points (an odd block count among them:
# the last byte's high nibble is padding) and without (ZP 0: the zero-point pointer, here the packed weights, unread).
il = load("int4_linear")
op = schema.op_def("Int4Linear")
checks = 0
for dtype in ("float", "float16"):
    t = TT[dtype]
    prec = "ieee" if dtype == "float" else "tf32"
    for m, k, n, block, zp in ((5, 40, 70, 16, ()), (37, 200, 33, 32, ()), (17, 128, 48, 64, ()), (3, 300, 16, 128, ()),
                               (2, 512, 40, 256, ()), (5, 40, 70, 16, ("zp",)), (19, 200, 33, 32, ("zp",))):
        shapes = op.doctor_entry((m, k, n, block) + zp)[0]
        ins = op.make_doctor_inputs(t, shapes, seed=m + k)
        x, wq, sc = ins[:3]
        nb = shapes["scales"][1]
        y = torch.full((m, n), float("nan")).to(t)
        grid = (triton.cdiv(m, 16) * triton.cdiv(n, 32),)
        il._int4_linear_kernel[grid](x, wq, sc, ins[3] if zp else wq, y, m, n, k, nb * block // 2, nb, block,
                                     int(bool(zp)), BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, DOT_PRECISION=prec)
        testing.assert_close(y, schema.reference("Int4Linear", ins), t, str((dtype, m, k, n, block, zp)),
                             kind="interpreter")
        checks += 1
assert checks == 14, checks
# Int4SwiGLU's GEMM (two weight tiles, two accumulators, act(g) * u): every gate activation over block sizes and
# ragged edges.
sw = schema.op_def("Int4SwiGLU")
for dtype in ("float", "float16"):
    t = TT[dtype]
    prec = "ieee" if dtype == "float" else "tf32"
    for act_code, act in enumerate(schema.GATE_ACTIVATIONS):
        m, k, n, block = ((5, 40, 70, 16), (20, 200, 33, 32), (3, 96, 48, 64))[act_code % 3]
        zp = ("zp",) if act_code % 2 else ()
        shapes, attrs, _ = sw.doctor_entry((m, k, n, block, act) + zp)
        ins = sw.make_doctor_inputs(t, shapes, seed=m + act_code)
        x, wg, sg, wu, su = ins[:5]
        zg, zu = (ins[5], ins[6]) if zp else (wg, wu)
        nb = shapes["scales_gate"][1]
        y = torch.full((m, n), float("nan")).to(t)
        grid = (triton.cdiv(m, 16) * triton.cdiv(n, 32),)
        il._int4_swiglu_kernel[grid](x, wg, sg, zg, wu, su, zu, y, m, n, k, nb * block // 2, nb, block, act_code,
                                     int(bool(zp)), BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=2, DOT_PRECISION=prec)
        testing.assert_close(y, schema.reference("Int4SwiGLU", ins, attrs), t, str((dtype, act, m, k, n, block, zp)),
                             kind="interpreter")
        checks += 1
assert checks == 14 + 2 * len(schema.GATE_ACTIVATIONS), checks
print("ok")
"""


_MULTI_LORA = _PRELUDE + r"""
# MultiLoRALinear's two phases: decode rows each with its own adapter (and rows with none), prefill sequences (the
# segmented form: RPI rows per index), ragged M, N and K, split K; a row whose index is >= NA comes out NaN.
lora = load("lora_linear")
op = schema.op_def("MultiLoRALinear")
cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2)
checks = 0
for dtype in ("float", "float16"):
    t = TT[dtype]
    prec = "ieee" if dtype == "float" else "tf32"
    for entry, split in (((8, 1, 48, 80, 16, 8), 2), ((5, 1, 40, 70, 7, 3), 1), ((3, 7, 33, 17, 4, 2), 3),
                         ((2, 20, 48, 64, 16, 2), 1)):
        shapes = op.doctor_entry(entry)[0]
        x, w, a, bm, b, sc, idx = op.make_doctor_inputs(t, shapes, seed=sum(entry))
        na, r = entry[5], entry[4]
        m, k, n = x.numel() // x.shape[-1], x.shape[-1], w.shape[1]
        rpi = m // x.shape[0]
        x2 = x.reshape(m, k)
        kb = triton.cdiv(triton.cdiv(k, 16), split)
        ts = torch.full((split, m, 16), float("nan"))
        lora._multi_lora_xa_kernel[(triton.cdiv(m, 16) * split * na,)](x2, a, a, idx, ts, ts, m, k, r, r, 1, na,
                                                                       rpi, kb, ts, 0, BLOCK_M=16, BLOCK_K=16, R_PAD=16,
                                                                       DOT_PRECISION=prec)
        y = torch.full((m, n), float("nan")).to(t)
        grid = (triton.cdiv(m, 16) * triton.cdiv(n, 32),)
        lora._multi_lora_main_kernel[grid](x2, w, ts, bm, b, sc, idx, y, m, n, k, r, na, rpi, split, R_PAD=16,
                                           DOT_PRECISION=prec, **cfg)
        ref = schema.reference("MultiLoRALinear", [x, w, a, bm, b, sc, idx]).reshape(m, n)
        testing.assert_close(y, ref, t, str((dtype, entry, split)), kind="interpreter")
        checks += 1
        if dtype == "float" and entry[0] > 2:  # an index past the stack: that row NaN, the others as before
            bad = idx.clone()
            bad[1] = na
            y = torch.zeros((m, n))
            lora._multi_lora_xa_kernel[(triton.cdiv(m, 16) * split * na,)](x2, a, a, bad, ts, ts, m, k, r, r, 1, na,
                                                                           rpi, kb, ts, 0, BLOCK_M=16, BLOCK_K=16,
                                                                           R_PAD=16, DOT_PRECISION=prec)
            lora._multi_lora_main_kernel[grid](x2, w, ts, bm, b, sc, bad, y, m, n, k, r, na, rpi, split, R_PAD=16,
                                               DOT_PRECISION=prec, **cfg)
            y3 = y.reshape(x.shape[0], rpi, n)
            assert torch.isnan(y3[1]).all() and not torch.isnan(y3[0]).any() and not torch.isnan(y3[2:]).any()
            checks += 1
assert checks == 8 + 3, checks
# MultiLoRASwiGLU: both stacks' partials, then SwiGLU's loop with every row's rank-r terms (two ranks, each activation
# code once on a decode batch and on prefill sequences).
sw = load("swiglu")
sop = schema.op_def("MultiLoRASwiGLU")
for dtype in ("float", "float16"):
    t = TT[dtype]
    prec = "ieee" if dtype == "float" else "tf32"
    for entry in ((6, 1, 48, 80, 16, 7, 4, "silu"), (3, 9, 40, 33, 4, 16, 2, "gelu_tanh")):
        shapes, attrs, _ = sop.doctor_entry(entry)
        x, wg, wu, ag, bg, au, bu, sg, su, idx = sop.make_doctor_inputs(t, shapes, seed=len(entry))
        na = entry[6]
        m, k, n = x.numel() // x.shape[-1], x.shape[-1], wg.shape[1]
        rpi, split = m // x.shape[0], 2
        x2 = x.reshape(m, k)
        kb = triton.cdiv(triton.cdiv(k, 16), split)
        tg, tu = torch.full((split, m, 16), float("nan")), torch.full((split, m, 16), float("nan"))
        # both stacks in one launch (NS 2), each program both from one X tile
        lora._multi_lora_xa_kernel[(triton.cdiv(m, 16) * split * na,)](x2, ag, au, idx, tg, tu, m, k, entry[4],
                                                                           entry[5], 2, na, rpi, kb, tg, 0, BLOCK_M=16,
                                                                           BLOCK_K=16, R_PAD=16, DOT_PRECISION=prec)
        y = torch.full((m, n), float("nan")).to(t)
        code = schema.GATE_ACTIVATIONS.index(entry[7])
        sw._multi_lora_swiglu_kernel[(triton.cdiv(m, 16) * triton.cdiv(n, 32),)](
            x2, wg, wu, tg, bg, sg, tu, bu, su, idx, y, m, n, k, entry[4], entry[5], na, rpi, split, code, ag, tg, 0,
            R_PAD=16, DOT_PRECISION=prec, **cfg)
        ref = schema.reference("MultiLoRASwiGLU", [x, wg, wu, ag, bg, au, bu, sg, su, idx], attrs).reshape(m, n)
        testing.assert_close(y, ref, t, str(("MultiLoRASwiGLU", dtype, entry)), kind="interpreter")
        checks += 1
assert checks == 8 + 3 + 4, checks
print("ok")
"""


_GATED_MLP = _PRELUDE + r"""
# LoRAGatedMLP's and MultiLoRAGatedMLP's kernels: phase 1 zeroes the down adapter's X @ A accumulator (ZERO3), the
# gated kernels (lora_swiglu, lora_gate, multi_lora_swiglu) add each finished tile's h @ A_down to it (fp32 atomics),
# and the down projection's main kernel reads it as one partial (SPLIT 1); the whole MLP against the op's reference.
sw, lora = load("swiglu"), load("lora_linear")
cfg = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=2)
op, mop = schema.op_def("LoRAGatedMLP"), schema.op_def("MultiLoRAGatedMLP")
checks = 0
for dtype in ("float", "float16"):
    t = TT[dtype]
    prec = "ieee" if dtype == "float" else "tf32"
    # phase 1 in 2 slices of K, and in 7 (the epilogues sum the partials 4 at a time: a second, masked chunk); the
    # gated kernel on 16-row tiles and on 32 (whose epilogue loads the partials one slice at a time)
    for entry, split in (((37, 48, 70, 4, 7, 5, "silu"), 2), ((5, 33, 40, 16, 16, 16, "gelu_tanh"), 2),
                         ((19, 100, 40, 16, 8, 4, "silu"), 7)):
        shapes, attrs, _ = op.doctor_entry(entry)
        ins = op.make_doctor_inputs(t, shapes, seed=sum(entry[:6]))
        x, wg, wu, ag, bg, au, bu, wd, ad, bd, bias = ins
        m, k, n = x.shape[0], x.shape[1], wg.shape[1]
        rg, ru, rd = entry[3:6]
        kb = triton.cdiv(triton.cdiv(k, 16), split)
        assert triton.cdiv(triton.cdiv(k, 16), kb) == split  # the slices phase 1 makes
        tg, tu = torch.full((split, m, 16), float("nan")), torch.full((split, m, 16), float("nan"))
        ref = schema.reference("LoRAGatedMLP", ins, attrs)
        code = schema.GATE_ACTIVATIONS.index(entry[6])
        for form, bm in (("lora_swiglu", 16), ("lora_swiglu", 32), ("lora_gate", 16)):
            td = torch.full((m, 16), float("nan"))
            lora._lora_xa_kernel[(triton.cdiv(m, 16) * split,)](x, ag, au, tg, tu, m, k, rg, ru, 2, kb, td, 1,
                                                                BLOCK_M=16, BLOCK_K=16, R_PAD=16, DOT_PRECISION=prec)
            assert torch.equal(td, torch.zeros_like(td)), "phase 1 did not zero the down accumulator"
            h = torch.full((m, n), float("nan")).to(t)
            if form == "lora_swiglu":
                sw._lora_swiglu_kernel[(triton.cdiv(m, bm) * triton.cdiv(n, 32),)](
                    x, wg, wu, tg, bg, tu, bu, h, m, n, k, rg, ru, split, attrs["scale_gate"], attrs["scale_up"], code,
                    ad, td, rd, R_PAD=16, DOT_PRECISION=prec, **dict(cfg, BLOCK_M=bm))
            else:
                h.copy_((x.float() @ wg.float()).to(t))
                u = (x.float() @ wu.float()).to(t)
                sw._lora_gate_kernel[(triton.cdiv(m, 16) * triton.cdiv(n, 32),)](
                    h, u, tg, bg, tu, bu, h, m, n, rg, ru, split, attrs["scale_gate"], attrs["scale_up"], code, ad, td,
                    rd, BLOCK_M=16, BLOCK_N=32, GROUP_M=2, R_PAD=16, DOT_PRECISION=prec)
            xa = h.float() @ ad.float()
            assert torch.allclose(td[:, :rd], xa, rtol=1e-4, atol=1e-4 * float(xa.abs().max())), (form, bm, dtype,
                                                                                                    entry)
            assert torch.equal(td[:, rd:], torch.zeros_like(td[:, rd:])), (form, "padded columns")
            y = torch.full((m, wd.shape[1]), float("nan")).to(t)
            nd = wd.shape[1]
            nprog = triton.cdiv(m, 16) * triton.cdiv(nd, 32)
            lora._lora_main_kernel[(nprog,)](h, wd, td, bd, bias, y, m, nd, n, rd, 1, attrs["scale_down"], 0, nprog,
                                             R_PAD=16, DOT_PRECISION=prec, TMA=False, **cfg)
            testing.assert_close(y, ref, t, str(("LoRAGatedMLP", form, bm, split, dtype, entry)),
                                 kind="interpreter")
            checks += 1
    # the mixed batch: decode rows (one without an adapter) and prefill sequences
    for entry in ((6, 1, 48, 80, 16, 7, 5, 4, "silu"), (3, 9, 40, 33, 4, 16, 16, 2, "gelu_tanh")):
        shapes, attrs, _ = mop.doctor_entry(entry)
        ins = mop.make_doctor_inputs(t, shapes, seed=len(entry))
        x, wg, wu, ag, bg, au, bu, wd, ad, bd, bias, sg, su, sd, idx = ins
        na, rg, ru, rd = entry[7], entry[4], entry[5], entry[6]
        m, k, n = x.numel() // x.shape[-1], x.shape[-1], wg.shape[1]
        rpi, split = m // x.shape[0], 2
        x2 = x.reshape(m, k)
        kb = triton.cdiv(triton.cdiv(k, 16), split)
        tg, tu = torch.full((split, m, 16), float("nan")), torch.full((split, m, 16), float("nan"))
        td = torch.full((m, 16), float("nan"))
        lora._multi_lora_xa_kernel[(triton.cdiv(m, 16) * split * na,)](x2, ag, au, idx, tg, tu, m, k, rg, ru, 2, na,
                                                                       rpi, kb, td, 1, BLOCK_M=16, BLOCK_K=16,
                                                                       R_PAD=16, DOT_PRECISION=prec)
        assert torch.equal(td, torch.zeros_like(td)), "multi phase 1 did not zero the down accumulator"
        h = torch.full((m, n), float("nan")).to(t)
        code = schema.GATE_ACTIVATIONS.index(entry[8])
        sw._multi_lora_swiglu_kernel[(triton.cdiv(m, 16) * triton.cdiv(n, 32),)](
            x2, wg, wu, tg, bg, sg, tu, bu, su, idx, h, m, n, k, rg, ru, na, rpi, split, code, ad, td, rd, R_PAD=16,
            DOT_PRECISION=prec, **cfg)
        rows = idx.repeat_interleave(rpi)
        xa = torch.stack([h[i].float() @ ad[j].float() if j >= 0 else torch.zeros(rd)
                          for i, j in enumerate(rows.tolist())])
        assert torch.allclose(td[:, :rd], xa, rtol=1e-4, atol=1e-4 * float(xa.abs().max())), ("multi", dtype, entry)
        nd = wd.shape[1]
        y = torch.full((m, nd), float("nan")).to(t)
        lora._multi_lora_main_kernel[(triton.cdiv(m, 16) * triton.cdiv(nd, 32),)](
            h, wd, td, bd, bias, sd, idx, y, m, nd, n, rd, na, rpi, 1, R_PAD=16, DOT_PRECISION=prec, **cfg)
        ref = schema.reference("MultiLoRAGatedMLP", ins, attrs).reshape(m, nd)
        testing.assert_close(y, ref, t, str(("MultiLoRAGatedMLP", dtype, entry)), kind="interpreter")
        checks += 1
assert checks == 2 * (3 * 3 + 2), checks
print("ok")
"""


def _run(script: str) -> str:
    p = subprocess.run([sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, timeout=1200,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def test_embedding_kernel_in_the_interpreter():
    pytest.importorskip("triton")
    out = _run(_EMBEDDING)
    assert int(out.split()[-1]) == (2 + 2 + 1) * 3 * 4  # every (dtype interaction, shape, op/hash/bag form) ran


def test_mlp_stack_grid_kernel_in_the_interpreter():
    pytest.importorskip("triton")
    _run(_GRID)


def test_gemm_loop_kernels_in_the_interpreter():
    """linear_act, swiglu (every gate activation) and the LoRA pair, which share gemm_loop._gemm_main: against the
    schema reference in fp32 and fp16 (the GPU tests cover bf16, speed and the aligned cubins)."""
    _run(_GEMM)


def test_int4_linear_kernel_in_the_interpreter():
    """Int4Linear's and Int4SwiGLU's Triton GEMMs against the schema reference in fp32 and fp16 over every block size
    (Int4SwiGLU: every gate activation) and ragged K, M and N (the GPU tests cover bf16, the cubins and speed)."""
    pytest.importorskip("triton")
    _run(_INT4)


def test_multi_lora_kernels_in_the_interpreter():
    """MultiLoRALinear's phases (multi_lora_xa, multi_lora_main) against the reference, and the NaN row of an index
    past the stack."""
    _run(_MULTI_LORA)


def test_gated_lora_mlp_kernels_in_the_interpreter():
    """LoRAGatedMLP's kernel chain (phase 1 zeroing the down accumulator, the gated kernels' down X @ A epilogue, the
    down main kernel reading it) and the mixed batch's, against the ops' references."""
    pytest.importorskip("triton")
    _run(_GATED_MLP)
