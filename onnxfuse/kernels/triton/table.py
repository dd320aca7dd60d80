"""The Triton kernel table that the AOT compiler (aot.py) and the C++ launcher (cuda/triton_launch.cc) must agree on.

Plain data, no imports: aot.py loads it from this folder (it runs as a script under CMake), and the build writes it
into the generated C header onnxfuse_ops.h (onnxfuse/kernels/ops_header.py), so the launcher reads the same ids and
thresholds instead of a hand-made copy.
"""

# Kernel entry points, in the id order of the generated table (TritonSpec::kernel).
KERNEL_IDS = {"linear_act": 0, "swiglu": 1, "lora_linear": 2, "lora_xa": 3, "lora_main": 4, "mlp_stack": 5,
              "rotary_embedding": 6, "embedding": 7}

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
