"""Triton kernel for SwiGLU (onnxfuse.schema): the gate and up GEMMs of a gated MLP sharing each X tile, with
act(gate) * up in the epilogue, so neither [M, N] intermediate touches device memory.

``ACT`` is a run-time code (onnxfuse_gate_act, schema.GATE_ACTIVATIONS order: 0 silu, 1 gelu, 2 gelu_tanh,
3 quick_gelu, 4 relu, 5 sigmoid), so one cubin serves every activation: the branch is uniform over the launch and
runs once per output tile, after the K loop. Every activation is computed in fp32 as PyTorch defines it (erf from
libdevice). gelu_tanh uses the identity ``0.5 * (1 + tanh(u)) = sigmoid(2u)``, so it costs what silu does: with one
CTA per SM the epilogue is not hidden behind another tile's loads, and libdevice's tanh made the GeGLU MLP 12 %
slower than SwiGLU at 2048 tokens on an H100. Compiled ahead of time by `aot.py`; the generated C launchers pass the
arguments in this order.
"""
import triton
import triton.language as tl

from .gemm_loop import (GEMM_TILES_F, GEMM_TILES_H, _down_a, _down_xa, _gemm_main, _multi_chunk, _multi_down_a,
                        _multi_down_add, _multi_down_chunk, _multi_down_xa, _multi_rank_b, _multi_rank_term, _pdl_wait,
                        _rank_b, _rank_dot, _rank_t, _rank_t2, _row_adapters, _store_tile, _tile_ids)
from .table import LORA_GATE_MAX_SPLIT

# (Triton kernels read module globals only as constexpr.)
_SQRT1_2 = tl.constexpr(0.7071067811865476)         # 1 / sqrt(2)
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_GELU_TANH_COEFF = tl.constexpr(0.044715)           # schema.GELU_TANH_COEFF
_QUICK_GELU_ALPHA = tl.constexpr(1.702)             # schema.QUICK_GELU_ALPHA
_GATE_CHUNK = tl.constexpr(LORA_GATE_MAX_SPLIT)     # lora_gate's partials per load: all its launcher makes


@triton.jit
def _gate_activation(g, ACT):
    """act(g) for the fp32 tile g; ACT is the onnxfuse_gate_act code."""
    if ACT == 0:
        a = g / (1.0 + tl.exp(-g))
    elif ACT == 1:
        a = 0.5 * g * (1.0 + tl.math.erf(g * _SQRT1_2))
    elif ACT == 2:
        a = g / (1.0 + tl.exp(-2.0 * _SQRT_2_OVER_PI * (g + _GELU_TANH_COEFF * g * g * g)))  # 0.5 g (1 + tanh u)
    elif ACT == 3:
        a = g / (1.0 + tl.exp(-_QUICK_GELU_ALPHA * g))
    elif ACT == 4:
        a = tl.where(g > 0.0, g, tl.where(g != g, g, 0.0))  # relu; NaN stays NaN, like torch.relu
    else:
        a = 1.0 / (1.0 + tl.exp(-g))
    return a


@triton.jit
def _swiglu_kernel(x_ptr, wg_ptr, wu_ptr, y_ptr, M, N, K, ACT,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    """PyTorch: ``g = x.float() @ wg.float(); u = x.float() @ wu.float(); y = (act(g) * u).to(x.dtype)``.

    x [M, K], wg and wu [K, N], y [M, N], row-major contiguous; fp32 accumulation, act in fp32, 64-bit offsets.
    """
    gate, up, offs_m, offs_n, _, n_ok = _gemm_main(x_ptr, wg_ptr, wu_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
                                                   GROUP_M, True, DOT_PRECISION)
    y = _gate_activation(gate, ACT) * up
    _store_tile(y_ptr, N, y, offs_m, offs_m < M, offs_n, n_ok)


@triton.jit
def _lora_swiglu_kernel(x_ptr, wg_ptr, wu_ptr, tg_ptr, bg_ptr, tu_ptr, bu_ptr, y_ptr, M, N, K, RG, RU, SPLIT,
                        scale_gate, scale_up, ACT, ad_ptr, td_ptr, RD,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    """LoRASwiGLU's second phase: ``g = x @ wg + (sg * tg) @ bg; u = x @ wu + (su * tu) @ bu; y = act(g) * u``.

    SwiGLU's main loop (both products sharing each X tile), then each accumulator's rank-r term (_rank_dot) before
    the activation. tg and tu: the gate's and the up adapter's X @ A partials from _lora_xa_kernel (one launch for
    both, each [SPLIT, M, R_PAD] with R_PAD for the larger rank). With PDL (launched as lora_xa's programmatic
    dependent) the K loop runs beside phase 1 and the epilogue waits for its partials. RD > 0 (LoRAGatedMLP): the
    down adapter's X @ A from the finished tile into td (gemm_loop._down_xa; ad [N, RD], td zeroed by phase 1).
    """
    gate, up, offs_m, offs_n, rows, n_ok = _gemm_main(x_ptr, wg_ptr, wu_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
                                                      GROUP_M, True, DOT_PRECISION)
    # The epilogue's loads go out together (the adapters' tiles before the wait: phase 1 does not write them), so the
    # tail after the K loop waits for one round trip, not one per load.
    bg = _rank_b(bg_ptr, offs_n, n_ok, N, RG, R_PAD)
    bu = _rank_b(bu_ptr, offs_n, n_ok, N, RU, R_PAD)
    ad = _down_a(ad_ptr, offs_n, n_ok, RD, R_PAD)
    _pdl_wait(PDL)
    tg, tu = _rank_t2(rows, tg_ptr, tu_ptr, M, SPLIT, BLOCK_M, R_PAD, 4 if BLOCK_M <= 16 else 1)
    gate = _rank_dot(gate, tg, bg, scale_gate, DOT_PRECISION)
    up = _rank_dot(up, tu, bu, scale_up, DOT_PRECISION)
    y = _gate_activation(gate, ACT) * up
    _store_tile(y_ptr, N, y, offs_m, offs_m < M, offs_n, n_ok)
    _down_xa(y, ad, offs_m, td_ptr, M, RD, R_PAD, DOT_PRECISION)


@triton.jit
def _lora_gate_kernel(g_ptr, u_ptr, tg_ptr, bg_ptr, tu_ptr, bu_ptr, y_ptr, M, N, RG, RU, SPLIT, scale_gate, scale_up,
                      ACT, ad_ptr, td_ptr, RD, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                      R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """LoRASwiGLU's epilogue pass where the base GEMMs ran on cuBLASLt (triton/table.py LORA_SWIGLU_CUBLAS): ``y =
    act(g + (sg * tg) @ bg) * (u + (su * tu) @ bu)``, g and u the two [M, N] base products (g may be y itself: each
    element is read before it is written, by the same program), tg and tu the X @ A partials of _lora_xa_kernel.
    Memory bound: reads two [M, N] and writes one, as SwiGLU's CUDA pass, plus the two rank-r dots, each a fresh
    product added to its loaded tile. scripts/lora_gate_probe.py (H100, M 2048, N 11008, rank 16, 3 partials): 72.9
    us on the 16 x 256 tile, against 96.0 with the loaded tile as the dots' accumulator (64 x 128; 79.0 at its best
    tile) and 209-329 us with FMAs over the rank instead of the dots; PyTorch's silu(g) * u alone 84.3. The partials
    summed 4 at a time (gemm_loop._rank_t2; the launcher splits K in at most table.LORA_GATE_MAX_SPLIT) on the 16 x
    128 tile: 54.3 us at 4 partials, against 68.5 for _rank_t's loop over 5 on the 16 x 256 one. RD > 0: the down
    adapter's X @ A from each finished tile, as _lora_swiglu_kernel's. Every load of a tile goes out before the first
    dot (whose layout conversions put barriers between the loads around them)."""
    pid_m, pid_n = _tile_ids(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.where(offs_m < M, offs_m, 0).to(tl.int64)
    n_ok = offs_n < N
    tg, tu = _rank_t2(rows, tg_ptr, tu_ptr, M, SPLIT, BLOCK_M, R_PAD, _GATE_CHUNK)
    bg = _rank_b(bg_ptr, offs_n, n_ok, N, RG, R_PAD)
    bu = _rank_b(bu_ptr, offs_n, n_ok, N, RU, R_PAD)
    ad = _down_a(ad_ptr, offs_n, n_ok, RD, R_PAD)
    offs = rows[:, None] * N + offs_n[None, :]
    g = tl.load(g_ptr + offs, mask=n_ok[None, :], other=0.0)
    u = tl.load(u_ptr + offs, mask=n_ok[None, :], other=0.0)
    zero = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    gate = g.to(tl.float32) + _rank_dot(zero, tg, bg, scale_gate, DOT_PRECISION)
    up = u.to(tl.float32) + _rank_dot(zero, tu, bu, scale_up, DOT_PRECISION)
    y = _gate_activation(gate, ACT) * up
    _store_tile(y_ptr, N, y, offs_m, offs_m < M, offs_n, n_ok)
    _down_xa(y, ad, offs_m, td_ptr, M, RD, R_PAD, DOT_PRECISION)


@triton.jit
def _multi_lora_swiglu_kernel(x_ptr, wg_ptr, wu_ptr, tg_ptr, bg_ptr, sg_ptr, tu_ptr, bu_ptr, su_ptr, index_ptr, y_ptr,
                              M, N, K, RG, RU, NA, RPI, SPLIT, ACT, ad_ptr, td_ptr, RD,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              GROUP_M: tl.constexpr, R_PAD: tl.constexpr, DOT_PRECISION: tl.constexpr,
                              PDL: tl.constexpr = False):
    """MultiLoRASwiGLU's second phase: SwiGLU's main loop, then each projection's rank-r terms of every row's adapter
    (gemm_loop._multi_rank_term: bg, bu [NA, R, N], scales [NA]) before the activation; NaN in rows whose index is
    >= NA. tg and tu: lora_linear.py's _multi_lora_xa_kernel partials of each stack. RD > 0 (MultiLoRAGatedMLP): each
    row's down adapter's X @ A from the finished tile into td (gemm_loop._multi_down_xa; ad [NA, N, RD]).

    At most 128 / R_PAD adapters (one chunk: 8 of rank 16, a decode batch's) the epilogue's loads go out together:
    both B chunks and the down adapters' A chunk before phase 1's wait, both projections' partials after it, then the
    dots; the chunk loops load T, gate's B, up's B and the down A one after another, four round trips at the end of
    every program. The 7B MLP's mixed batch (8 rows, 8 rank-16 adapters, H200): in the fold probe (its form since
    removed from scripts/lora_mlp_fold_probe.py) 82.1 against 85.3 us, the base MLP 71.7
    (benchmarks/results/h200-2026-12-01/lora/multi-hoisted.txt); in onnxruntime 82.6 against the base's 72.6
    (ab-multi-lora-mlp-8-hoisted.*)."""
    gate, up, offs_m, offs_n, rows, n_ok = _gemm_main(x_ptr, wg_ptr, wu_ptr, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K,
                                                      GROUP_M, True, DOT_PRECISION)
    aid = _row_adapters(index_ptr, offs_m, M, RPI)
    if NA <= 128 // R_PAD:
        bgc = _multi_rank_b(bg_ptr, 0, offs_n, n_ok, N, RG, NA, R_PAD)
        buc = _multi_rank_b(bu_ptr, 0, offs_n, n_ok, N, RU, NA, R_PAD)
        adc = _multi_down_a(ad_ptr, 0, offs_n, n_ok, N, RD, NA, R_PAD)  # nothing read where RD is 0
        _pdl_wait(PDL)
        tgt = _rank_t(rows, tg_ptr, M, SPLIT, BLOCK_M, R_PAD)
        tut = _rank_t(rows, tu_ptr, M, SPLIT, BLOCK_M, R_PAD)
        # A tile without adapters adds nothing (its rows' zeros would meet another adapter's Inf as 0 * Inf): the
        # dots' results are selected, not branched around. With an `if` around the dots, the sm_90 build (aot.py's
        # options) came out wrong in fp32 (max error 2.9 where the interpreter and the JIT agree with the reference:
        # scripts/multi_swiglu_variant_probe.py --aot). The down dot runs where RD is 0 too (a thin dot; no row's sum
        # is added then).
        used = tl.max(((aid >= 0) & (aid < NA)).to(tl.int32), axis=0) > 0
        gate = tl.where(used, _multi_chunk(gate, aid, tgt, bgc, sg_ptr, 0, NA, BLOCK_M, R_PAD, DOT_PRECISION), gate)
        up = tl.where(used, _multi_chunk(up, aid, tut, buc, su_ptr, 0, NA, BLOCK_M, R_PAD, DOT_PRECISION), up)
        y = _gate_activation(gate, ACT) * up
        y = tl.where((aid >= NA)[:, None], float("nan"), y)
        _store_tile(y_ptr, N, y, offs_m, offs_m < M, offs_n, n_ok)
        t = _multi_down_chunk(tl.zeros((BLOCK_M, R_PAD), dtype=tl.float32), y.to(ad_ptr.dtype.element_ty), adc, aid,
                              0, BLOCK_M, R_PAD, DOT_PRECISION)
        _multi_down_add(td_ptr, t, aid, offs_m, M, RD, NA, R_PAD)  # rows with an adapter, ranks below RD
    else:
        _pdl_wait(PDL)
        gate = _multi_rank_term(gate, aid, rows, offs_n, n_ok, tg_ptr, bg_ptr, sg_ptr, M, N, RG, NA, SPLIT, BLOCK_M,
                                R_PAD, DOT_PRECISION)
        up = _multi_rank_term(up, aid, rows, offs_n, n_ok, tu_ptr, bu_ptr, su_ptr, M, N, RU, NA, SPLIT, BLOCK_M,
                              R_PAD, DOT_PRECISION)
        y = _gate_activation(gate, ACT) * up
        y = tl.where((aid >= NA)[:, None], float("nan"), y)
        _store_tile(y_ptr, N, y, offs_m, offs_m < M, offs_n, n_ok)
        _multi_down_xa(y, aid, offs_m, offs_n, n_ok, ad_ptr, td_ptr, M, N, RD, NA, BLOCK_M, R_PAD, DOT_PRECISION)


# The gated LoRA kernels' last arguments: the down adapter's A, the fp32 [M, R_PAD] sum its X @ A goes into, and its
# rank (0: none, LoRASwiGLU alone).
_DOWN = [("ad_ptr", "*T"), ("td_ptr", "*fp32"), ("RD", "i32")]
KERNELS = {
    "swiglu": (_swiglu_kernel, [("x_ptr", "*T"), ("wg_ptr", "*T"), ("wu_ptr", "*T"), ("y_ptr", "*T"),
                                ("M", "i32"), ("N", "i32"), ("K", "i32"), ("ACT", "i32")]),
    # tg_ptr / tu_ptr: fp32 scratch whatever T is
    "lora_swiglu": (_lora_swiglu_kernel, [("x_ptr", "*T"), ("wg_ptr", "*T"), ("wu_ptr", "*T"), ("tg_ptr", "*fp32"),
                                          ("bg_ptr", "*T"), ("tu_ptr", "*fp32"), ("bu_ptr", "*T"), ("y_ptr", "*T"),
                                          ("M", "i32"), ("N", "i32"), ("K", "i32"), ("RG", "i32"), ("RU", "i32"),
                                          ("SPLIT", "i32"), ("scale_gate", "fp32"), ("scale_up", "fp32"),
                                          ("ACT", "i32")] + _DOWN),
    # g_ptr may equal y_ptr (in place); tg_ptr / tu_ptr fp32 scratch
    "lora_gate": (_lora_gate_kernel, [("g_ptr", "*T"), ("u_ptr", "*T"), ("tg_ptr", "*fp32"), ("bg_ptr", "*T"),
                                      ("tu_ptr", "*fp32"), ("bu_ptr", "*T"), ("y_ptr", "*T"), ("M", "i32"),
                                      ("N", "i32"), ("RG", "i32"), ("RU", "i32"), ("SPLIT", "i32"),
                                      ("scale_gate", "fp32"), ("scale_up", "fp32"), ("ACT", "i32")] + _DOWN),
    "multi_lora_swiglu": (_multi_lora_swiglu_kernel, [
        ("x_ptr", "*T"), ("wg_ptr", "*T"), ("wu_ptr", "*T"), ("tg_ptr", "*fp32"), ("bg_ptr", "*T"), ("sg_ptr", "*T"),
        ("tu_ptr", "*fp32"), ("bu_ptr", "*T"), ("su_ptr", "*T"), ("index_ptr", "*i64"), ("y_ptr", "*T"),
        ("M", "i32"), ("N", "i32"), ("K", "i32"), ("RG", "i32"), ("RU", "i32"), ("NA", "i32"), ("RPI", "i32"),
        ("SPLIT", "i32"), ("ACT", "i32")] + _DOWN),
}

# Tile configs per arch (gemm_loop.GEMM_TILES_*). "small" (decode), N=11008: BLOCK_N=64, BLOCK_K=128, 4 stages ->
# 172 programs, 36 KB per stage (108 KB): 2 per SM, all resident (264 slots), 128-byte row segments of W, ~2 stages
# (72 KB) in flight each -> ~12 MB over the chip. (swiglu's tuned small tile, triton/tuned.json, is 16 x 128 x 64.)
_H_SMALL = (16, 64, 128, 1, 4, 4)
# lora_swiglu and multi_lora_swiglu: SwiGLU's tiles, with swiglu's tuned small one (16 x 128 x 64, 86 programs at the
# 7B MLP's N): Nsight Compute on an H100 at 16 rows (ncu-lora-swiglu.txt) had _swiglu_kernel at 86 % of DRAM
# bandwidth (63 us) on it and _lora_swiglu_kernel at 77 % (71 us) on _H_SMALL, the gap the rank-r epilogue had been
# blamed for; the large tile with 2 stages for their operands.
_H_SMALL_TUNED = (16, 128, 64, 1, 4, 4)
# lora_gate (BLOCK_M, BLOCK_N, unused, GROUP_M, warps, stages): an elementwise pass over [M, N] with two thin dots per
# tile; it runs from LORA_SWIGLU_CUBLAS's rows (the large class), the other classes only for completeness. 16 x 128:
# table.py LORA_GATE_MAX_SPLIT's probe (54.3 against 57.4 us for 16 x 256 at 4 partials).
_GATE = {c: (16, 128, 0, 8, 4, 1) for c in ("small", "medium", "large")}
CONFIGS = {
    "90": {"swiglu": {"h": dict(GEMM_TILES_H, small=_H_SMALL, large=(128, 128, 64, 8, 8, 3)), "f": GEMM_TILES_F},
           "lora_swiglu": {"h": dict(GEMM_TILES_H, small=_H_SMALL_TUNED, large=(128, 128, 64, 8, 8, 3)),
                           "f": GEMM_TILES_F},
           "multi_lora_swiglu": {"h": dict(GEMM_TILES_H, small=_H_SMALL_TUNED, large=(128, 128, 64, 8, 8, 3)),
                                 "f": GEMM_TILES_F},
           "lora_gate": {"h": _GATE, "f": _GATE}},
    "80": {"swiglu": {"h": dict(GEMM_TILES_H, small=_H_SMALL, large=(128, 128, 32, 8, 8, 3)), "f": GEMM_TILES_F},
           "lora_swiglu": {"h": dict(GEMM_TILES_H, small=_H_SMALL, large=(128, 128, 32, 8, 8, 3)),
                           "f": GEMM_TILES_F},
           "multi_lora_swiglu": {"h": dict(GEMM_TILES_H, small=_H_SMALL, large=(128, 128, 32, 8, 8, 3)),
                                 "f": GEMM_TILES_F},
           "lora_gate": {"h": _GATE, "f": _GATE}},
}
