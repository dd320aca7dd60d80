"""The Triton kernel table that the AOT compiler (aot.py) and the C++ launcher (cuda/triton_launch.cc) must agree on.

Plain data, no imports: aot.py loads it from this folder (it runs as a script under CMake), and the build writes it
into the generated C header onnxfuse_ops.h (onnxfuse/kernels/ops_header.py), so the launcher reads the same ids and
thresholds instead of a hand-made copy.
"""

# Kernel entry points, in the id order of the generated table (TritonSpec::kernel).
KERNEL_IDS = {"linear_act": 0, "swiglu": 1, "lora_linear": 2, "lora_xa": 3, "lora_main": 4, "mlp_stack": 5,
              "rotary_embedding": 6, "embedding": 7, "embedding_interaction": 8, "mlp_stack_grid": 9}

# Element types and their codes (onnxfuse_dtype in cuda/launch.h); same order as onnxfuse.schema.TYPES.
DTYPES = (("fp32", 0), ("fp16", 1), ("bf16", 2))

# Size classes by M, the launcher's first choice of tile config: class i serves M <= SIZE_CLASS_MAX_M[i]; the last
# class takes every larger M. "small" is the decode path (one 16-row tile, narrow column tiles).
SIZE_CLASSES = ("small", "medium", "large")
SIZE_CLASS_MAX_M = (16, 128)

# LoRA rank padding: a rank r runs on the kernel of the smallest R_PADS entry >= r; the last is the largest rank
# the GPU kernels take (the hand-written CUDA LoRA kernel sizes its shared memory by it too).
R_PADS = (16, 32, 64)
MAX_LORA_RANK = R_PADS[-1]

# Experiment variants (built only with `onnxfuse build --experiments`): the number of values each knob takes,
# variant 0 being the default kernel. aot.py checks its variant configs against these counts.
EXPERIMENT_VARIANTS = {"small_cfg": 3, "lora_onepass": 2, "stack_cfg": 3}

# ------------------------------------------------------------------------------------------------ MLPStack
# stack_mode=auto on the Triton backend, by M (rows) and the widest layer, for the H100's 132 SMs (the launcher
# scales the SM multiples by the GPU's own count). Re-measure with `scripts/gpu_variants.py --stack` and
# `onnxfuse bench dlrm-bottom dlrm-top --profile`; these are the only numbers the choice reads.
#   * grid: the persistent kernel (every layer's tiles spread over all SMs, a grid barrier between layers) while M
#     is at most STACK_GRID_MAX_M: it fills the GPU at small M, where a row block per program runs on a handful of
#     SMs (DLRM's top MLP at M = 128: 28.5 us of kernel for 19 us unfused), and it never pays a launch or an HBM
#     round trip per layer;
#   * fused: the row-block kernel from STACK_ROWS_MIN_SM_MULT x SMs rows up (M = 16384: 0.059 vs 0.099 ms per run
#     for the bottom MLP, 0.088 vs 0.170 for the top);
#   * layers: one linear_act launch per layer in between, and for layers wider than STACK_MAX_WIDTH.
STACK_GRID_MAX_M = 8192
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
