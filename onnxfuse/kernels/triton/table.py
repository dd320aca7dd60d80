"""The Triton kernel table that the AOT compiler (aot.py) and the C++ launchers (cuda/<family>.cu) must agree on.

Plain data and the standard library only: aot.py loads it from this folder (it runs as a script under CMake), and
the build writes it into the generated C header onnxfuse_ops.h (onnxfuse/kernels/ops_header.py), so the launchers
read the same ids and thresholds instead of a hand-made copy. The kernels themselves are declared where they are
written: each kernel file triton/<family>.py has a `KERNELS` table (entry point name -> function and parameters)
and its tile `CONFIGS`; this module reads the names from the files' source, so a new family's kernels get their ids
without an edit here (and without importing triton, which only compiling needs).
"""
import ast
import pathlib

_HERE = pathlib.Path(__file__).resolve().parent


def kernel_names(path: pathlib.Path) -> list[str]:
    """The keys of the module-level `KERNELS` dict of a kernel file, read from its source ([] for other files)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "KERNELS" for t in node.targets):
            if not isinstance(node.value, ast.Dict) or not all(
                    isinstance(k, ast.Constant) and isinstance(k.value, str) for k in node.value.keys):
                raise ValueError(f"{path}: KERNELS must be a dict literal with string keys")
            return [k.value for k in node.value.keys]
    return []


# The kernel files (module names, in name order) and their entry points, numbered in that order: the ids of the
# generated table (TritonSpec::kernel, onnxfuse::triton::k<Kernel>). Ids are internal to one build (the cubin table
# and the launchers are compiled together); configs and tuned.json name kernels, never ids.
KERNEL_FILES = tuple(p.stem for p in sorted(_HERE.glob("*.py")) if kernel_names(p))
KERNEL_IDS = {name: i for i, name in enumerate(n for f in KERNEL_FILES for n in kernel_names(_HERE / f"{f}.py"))}

# Element types and their codes (onnxfuse_dtype in cuda/launch.h); same order as onnxfuse.schema.TYPES.
DTYPES = (("fp32", 0), ("fp16", 1), ("bf16", 2))

# Size classes by M, the launcher's first choice of tile config: class i serves M <= SIZE_CLASS_MAX_M[i]; the last
# class takes every larger M. "small" is the decode path (one 16-row tile, narrow column tiles).
SIZE_CLASSES = ("small", "medium", "large")
SIZE_CLASS_MAX_M = (16, 128)

# LoRA rank padding: a rank r runs on the kernel of the smallest R_PADS entry >= r; the last is the largest rank
# the GPU kernels take (the CUDA backend's launcher checks it too).
R_PADS = (16, 32, 64)
MAX_LORA_RANK = R_PADS[-1]

# Persistent TMA GEMMs (gemm_loop._gemm_tile_tma): on sm_90 and later, the aligned fp16/bf16 "large" builds of
# TMA_KERNELS are compiled twice, with the cp.async loop (one tile per program) and with tiles loaded through TMA
# descriptors built on the device, min(tiles, SMs) programs walking the tiles. The launcher runs the TMA one where K
# >= TMA_MIN_K and the caller gave it the descriptors' scratch (TMA_SCRATCH_PER_PROGRAM bytes per program; aot.py
# checks each cubin's need against it), else the other. H100, fp16, triton.testing.do_bench (scripts/tma_probe.py,
# benchmarks/results/h100-2026-11-23/tma-probe/):
#                                   cp.async   TMA    cuBLAS (torch.matmul)
#   linear_act 2048 x 4096 x 4096     104.9    97.7    93.0 us
#   linear_act 4096 x 4096 x 4096     218.8   205.0   194.6
#   linear_act 2048 x 4096 x 11008    341.2   292.3   296.9
#   linear_act 8192 x  512 x  512      15.7    17.0    13.8   (short K: the cp.async loop stays)
#   lora_main  2048 x 4096 x 4096     108.0   102.5           (rank-r dot after the K loop)
#   swiglu     2048 x 4096 x 11008    669.1   699.7   583.7 (two GEMMs)  -> not on TMA
# The whole LoRALinearRelu node (lora_xa + lora_main) at 2048 tokens, steady-state GPU time per CUDA-graph replay
# (scripts/ab_throughput.py, 3 rounds): 112.7 us -> 105.6 us, cuBLAS base GEMM 92.0 us (1.22x -> 1.15x). Launching
# lora_main as a programmatic dependent of lora_xa (PDL, its K loop overlapping phase 1) measured 107.7 us: not kept.
TMA_KERNELS = ("linear_act", "lora_main")
TMA_SIZE_CLASS = "large"
TMA_MIN_K = 1024
TMA_SCRATCH_PER_PROGRAM = 512

# LoRASwiGLU on the Triton backend from LORA_SWIGLU_CUBLAS = (M, K) up (rows, inner size; SwiGLU's AUTO_CUDA rule,
# where cuBLASLt's two GEMMs beat Triton's dual loop): the two base GEMMs on cuBLASLt (the CUDA backend's, gate into
# Y and up into scratch), both adapters' X @ A in one lora_xa launch, then one gate pass: y = act(g + sg (X @ Ag) @ Bg)
# * (u + su (X @ Au) @ Bu) with the two rank-r dots, in CUDA for 16-bit types, ranks to 16 and N a multiple of 64
# (cuda/lora_gate_pass.h: 57.6 against lora_gate's 73.6 us at 2048 x 11008 on an H100), else lora_gate (swiglu.py).
# Below it, and on GPUs without the rule's shapes, lora_swiglu (SwiGLU's loop and both rank-r terms in one kernel).
# Computing X @ A inside lora_main's and lora_swiglu's K loop instead (one thin dot more per K step, no phase-1
# launch) measured slower on an H100 at 16 rows: lora_main 60 against 35 us, lora_swiglu 75.5 against 64 (255
# registers, spilling); phase 1 stays a launch (both of LoRASwiGLU's adapters in one).
LORA_SWIGLU_CUBLAS = (2048, 2048)
# On that path phase 1 splits K in at most LORA_GATE_MAX_SPLIT slices, which lora_gate sums 4 at a time (one load):
# H100, LoRASwiGLU at 2048 x 4096 x 11008, rank 16, lora_xa (64-row tiles) + lora_gate per CUDA-graph replay
# (scripts/lora_gate_split_probe.py, benchmarks/results/h100-2026-11-27/lora/lora-gate-split-probe.txt): 5 slices
# summed in a loop on the 16 x 256 tile (before) 78.3 us; 4 slices summed at once on the 16 x 128 tile 65.7 (lora_xa
# 5.7, lora_gate 54.3); 3 slices 66.4; 2 66.8; 1 (no split) 73.4; 5 and 8 slices summed 8 at once 75.5 / 78.8.
LORA_GATE_MAX_SPLIT = 4

# Programmatic dependent launch (PDL, sm_90+; gemm_loop._pdl_trigger / _pdl_wait): to LORA_PDL_MAX_M rows the
# launchers start LoRALinear's and LoRASwiGLU's main kernels (PDL_DEPENDENTS, compiled with the wait before they read
# phase 1's partials) as programmatic dependents of phase 1, so their K loops run beside it. H100, fp16, the Llama-2-7B
# MLP with rank-16 adapters, one CUDA graph replayed back to back (scripts/lora_pdl_probe.py,
# benchmarks/results/h100-2026-11-27/lora/lora-pdl-probe.txt; us per run):
#   LoRA MLP, 16 tokens: 108.5 -> 101.8 (base MLP 96.7)
#   mixed batch, 8 rows and 8 adapters: 118.7 -> 120.3 (base 96.0) with phase 1 in 16 slices (its 128 programs
#   fill the GPU before multi_lora_swiglu's may start); in at most MULTI_LORA_PDL_MAX_SPLIT slices, below
#   LoRASwiGLU at 2048 rows on cuBLASLt: lora_gate as phase 1's dependent 633.1 -> 637.1; phase 1 after the GEMMs as
#   their dependent and lora_gate as its 643.8 (666.1 in that order without PDL): not kept
# and earlier (tma-probe above) lora_main at 2048 tokens 105.6 -> 107.7 us. Phase 1 itself does both of a gated MLP's
# stacks from each X tile: at 2048 rows 642.2 us with one program per stack (X read twice) -> 633.1.
# LoRAGatedMLP's down-projection lora_main runs after the gated kernel, whose activation it reads in its K loop: it
# launches the usual way (the gated kernel is the one that waits on phase 1).
LORA_PDL_MAX_M = 16
PDL_DEPENDENTS = ("lora_main", "lora_swiglu", "multi_lora_swiglu", "multi_lora_main")
# To those rows the gated kernels' phase 1 splits K in at most LORA_PDL_MAX_SPLIT slices (16 before): it runs beside
# lora_swiglu's K loop, so fewer, longer programs cost nothing there, and the epilogue sums fewer partials. H100, the
# LoRA MLP (LoRAGatedMLP) at 16 tokens against the base MLP, round-robin (scripts/lora_mlp_fold_probe.py --xa-splits,
# benchmarks/results/h100-2026-11-27/lora/lora-mlp-fold-probe-xa-splits.txt): at most 1, 2, 4, 8, 16 slices 1.042x,
# 1.044x, 1.042x, 1.042x, 1.057x. The mixed batch without PDL (phase 1 alone) measured at most 8 or 16 slices
# 1.161x, 4 1.171x, 1 1.282x; with PDL it takes MULTI_LORA_PDL_MAX_SPLIT.
LORA_PDL_MAX_SPLIT = 4
# The mixed batch's phase 1 (multi_lora_xa: a program per K slice and adapter) to those rows in at most
# MULTI_LORA_PDL_MAX_SPLIT slices, multi_lora_swiglu its programmatic dependent: 16 programs for 8 adapters, so the
# gated kernel's 86 start beside them at once. H100, MultiLoRAGatedMLP at 8 rows with 8 adapters against the base MLP,
# round-robin, 9 rounds (scripts/lora_mlp_fold_probe.py --multi-pdl 1,2,4,8,16 --mixed-only,
# benchmarks/results/h100-2026-11-27/lora/multi-pdl-probe.txt; us per run): without PDL (16 slices) 113.4 us,
# 1.184x the base's 95.8; with PDL in at most 1, 2, 4, 8, 16 slices 119.5, 108.7, 109.5, 115.6, 121.2 (1.135x at 2;
# a second run 113.7 -> 109.0).
MULTI_LORA_PDL_MAX_SPLIT = 2
# MultiLoRALinear alone (a mixed batch's q/k/v and o projections) starts multi_lora_main as phase 1's dependent too,
# phase 1 in at most MULTI_LORA_LINEAR_PDL_MAX_SPLIT slices: its main kernel is shorter than the gated one, so phase
# 1 must be too. H100, 8 rows, 8 rank-16 adapters, round-robin with cuBLAS's GEMM, two runs
# (scripts/multi_lora_linear_pdl_probe.py, benchmarks/results/h100-2026-11-27/lora/multi-lora-linear-pdl-probe*.txt;
# us): q/k/v 4096 -> 12288 without PDL (16 slices) 50.4 / 51.1 (cuBLAS 37.3 / 36.3), with PDL in at most 1, 2, 4, 8,
# 16 slices 71.2, 57.2 / 56.3, 47.9 / 46.9, - / 43.8, 49.6 / 49.9; o 4096 -> 4096 19.9 / 19.8 (cuBLAS 9.0 / 8.7), with
# PDL 37.4, 22.9 / 22.7, 16.4 / 16.1, - / 16.4, 19.8 / 19.5.
MULTI_LORA_LINEAR_PDL_MAX_SPLIT = 8

# ------------------------------------------------------------------------------------------------ MLPStack
# stack_mode=auto on the Triton backend, by M (rows) and the widest layer, for the H100's 132 SMs (the launcher
# scales the SM multiples by the GPU's own count). Measured with `scripts/gpu_check.py --only-stack` (now
# `scripts/gpu_variants.py --stack`; CUDA graphs, ms per run, benchmarks/results/h100-2026-11-23/stack-modes.json;
# bottom MLP 13-512-256-64-16 / top 367-512-256-1):
#                 M=128          M=512          M=2048         M=8192         M=16384
#   grid     0.042 / 0.031  0.033 / 0.043  0.043 / 0.061  0.068 / 0.140  0.090 / 0.252
#   fused    0.044 / 0.045  0.038 / 0.050  0.042 / 0.053  0.050 / 0.069  0.059 / 0.093
#   layers   0.037 / 0.048  0.055 / 0.048  0.033 / 0.053  0.055 / 0.079  0.100 / 0.169
#   ORT      0.049 / 0.040  0.044 / 0.052  0.058 / 0.063  0.092 / 0.111  0.142 / 0.182
# so:
#   * grid: the persistent kernel (every layer's tiles spread over all SMs, a grid barrier between layers) while M
#     is at most STACK_GRID_MAX_M: it fills the GPU at small M, where a row block per program runs on a handful of
#     SMs, and pays no launch or HBM round trip per layer; past M = 1024 its serial chain of layer tiles per SM
#     loses (top MLP at 2048: 0.061 against ORT's 0.063 and the row-block kernel's 0.053);
#   * fused: the row-block kernel from STACK_ROWS_MIN_SM_MULT x SMs rows up (4224 on the H100);
#   * layers: one linear_act launch per layer in between, and for layers wider than STACK_MAX_WIDTH.
STACK_GRID_MAX_M = 1024
STACK_ROWS_MIN_SM_MULT = 32
STACK_MAX_WIDTH = 1024
# Launch the grid kernel cooperatively (cudaLaunchAttributeCooperative: the driver guarantees every program is
# resident, or refuses the launch, so the grid barrier cannot deadlock); 0 only to A/B the attribute's cost.
STACK_GRID_COOPERATIVE = 1

# ------------------------------------------------------------------------------------------------ embeddings
# The Triton embedding kernel is compiled per padded vector count NP (>= features + 1) and padded embedding dim DP
# (>= d); a shape past the largest runs on the CUDA kernel (also what backend=auto runs when
# EMBEDDING_AUTO_TRITON is 0).
EMBED_NPS = (32, 64)
EMBED_DPS = (16, 32, 64, 128)
EMBEDDING_AUTO_TRITON = 1

# ------------------------------------------------------------------------------------------------ backend=auto
# On the CUDA EP, backend=auto runs the Triton kernels except for an op's main kernel, rows M and inner size K (and
# output width N, for a rule with a fifth field: its largest N) in one of these (kernel, first M, last M, least K[,
# largest N]) rules, where the CUDA backend (cuBLASLt GEMMs, cuda/gemm.cu) measured
# faster in the same run (H100, fp16, CUDA graphs, ms; benchmarks/results/h100-2026-11-23/ab-cublaslt-tuned/, Triton
# with tuned.json):
#                                   Triton    CUDA
#   dlrm (two MLPStacks), batch 2048  0.0724   0.0650   MLPStack at M = 2048 runs per layer on Triton too
#   dlrm-top, batch 2048              0.0467   0.0460
#   dlrm-bottom, batch 2048           0.0320   0.0320
# Everywhere else Triton was as fast or faster (SwiGLU 1.03-1.10x, LoRA 1.02x, MLPStack at batch 128 1.07-1.15x,
# rotary and the embedding interaction). The range is MLPStack's per-layer one (between STACK_GRID_MAX_M and
# STACK_ROWS_MIN_SM_MULT x 128 SMs), where both backends launch one GEMM per layer.
# SwiGLU from 2048 rows with K >= 2048, on cuBLASLt (two GEMMs and the vectorised act(gate)*up pass), measured in
# the runs of benchmarks/results/h100-2026-11-23/bench-llama.json and bench-gated.json (2026-11-24; GPU kernel time
# per run, us, CUDA / Triton, the same run):
#   Llama-2-7B layer, 2048 tokens (K 4096, N 11008)   SwiGLU 506 + 42 / 627; whole layer 1455 / 1601
#   llama-mlp / geglu-mlp / phi3-mlp, 2048 tokens     881 / 900, 860 / 922, 901 / 887 (with the down GEMM)
#   seed Llama layer, 2048 tokens (K 1024)            393 / 379 -> stays on Triton
# Int4Linear (H100, fp16, a Llama-2-7B layer's five int4 projections, block 32, GPU kernel time per run in us;
# scripts/int4_probe.py, benchmarks/results/h100-2026-11-27/int4/int4-probe-mma.json): the CUDA backend (its GEMV to 2
# rows, its tensor-core kernel from 3 to 16, its dequantized cuBLASLt GEMM above) at every row count measured:
#   rows                  1      2      3      4      6      8     12     16     32
#   CUDA                 58     82     93     98    101    107    137    147    353
#   Triton              241    231    225    219    205    198    192    191    495
#   onnxruntime          64    134     86     90    152    174    329    351    344
# Int4SwiGLU the same way (the layer's MLP as genai writes it, gate/up/act/product/down, fused to Int4SwiGLU and
# Int4Linear, both on the backend named; the same run):
#   CUDA                 37     43     45     45     46     48     77     88    238
#   Triton              134    130    128    126    123    121    120    120    330
#   onnxruntime          47     84     61     64    101    113    207    223    238
# An lm_head (K 4096) differs past 16 rows: Triton's GEMM beats dequantization + cuBLAS from 17 to 64 rows where N is
# 16384 or more (the same probe, --models lm_head --vocab 16384,32000,49152, int4-probe-lm_head-*.json; us):
#   rows                       16     17     32     64     96    128
#   N 16384  CUDA / Triton     35 /   60  114 /  101  114 /   83  117 /   73  115 /  105  116 /  103
#   N 32000                    74 /   99  223 /  152  221 /  128  224 /  103  223 /  212  228 /  235
#   N 49152                    99 /  137  330 /  198  331 /  171  332 /  144  334 /  281  337 /  279
# so the 17-64 row rule keeps the CUDA backend only up to N 16383 (the layer's projections, N <= 12288, where Triton's
# sum was slower: 495 against 353 us at 32 rows); past 64 rows the margins are mixed and it stays CUDA.
# Where the sm_90 CUTLASS path runs (cuda/int4_linear.cu MixedPath: symmetric weights in blocks of 64 or more, past
# 16 rows) the glue takes the CUDA backend whatever this table says: on an H200 it ran the lm_head 1.19-1.44x
# faster than Triton's GEMM at 17-64 rows (benchmarks/results/h200-2026-11-29/int4/int4-probe-block128-tile128-*).
# LoRASwiGLU (H100, fp16, the lora-mlp case: h4096/i11008, rank 16 on gate/up/down; ms with CUDA graphs,
# benchmarks/results/h100-2026-11-27/lora/bench-lora-2048.json and bench-lora-small.json): Triton (cuBLASLt's base GEMMs
# and lora_gate at 2048, SwiGLU's loop and both rank-r dots at 16) 0.907 at 2048 tokens against the CUDA backend's five
# cuBLASLt GEMMs and pass 1.026, and 0.128 against 0.162 at 16: no CUDA rule, auto runs Triton.
AUTO_CUDA = (("mlp_stack", STACK_GRID_MAX_M + 1, STACK_ROWS_MIN_SM_MULT * 128 - 1, 0),
             ("swiglu", 2048, 1 << 40, 2048),
             ("int4_linear", 0, 16, 0), ("int4_linear", 17, 64, 0, 16383), ("int4_linear", 65, 1 << 40, 0),
             ("int4_swiglu", 0, 1 << 40, 0))

