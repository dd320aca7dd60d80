// C interface between the ORT glue (cuda/ops_cuda.cc, compiled by g++ with the ORT headers) and the GPU kernels
// (cuda/*.cu compiled by nvcc, and the Triton launchers over the AOT cubins). Plain C types only, so neither
// side needs the other's headers: device pointers, int64 sizes, a dtype enum, the CUDA stream as void*.
//
// Every launcher enqueues its work on `stream` and returns at once: no host synchronisation, no device allocation,
// no host read of device data, so ORT can capture it in a CUDA graph. It returns 0 on success, a cudaError_t (> 0)
// when the CUDA runtime refused, or one of the negative ONNXFUSE_ERR_* codes; onnxfuse_cuda_error_string() names it.
//
// Layouts (onnxfuse/schema.py): X [M, K], weights [K, N], LoRA A [K, R] and B [R, N], bias [N], Y [M, N]; all
// row-major and contiguous, all of one element type; fp32 accumulation; activations in fp32.
//
// The dtype codes (ONNXFUSE_FP32/FP16/BF16), activation codes (ONNXFUSE_ACT_*), stack modes (ONNXFUSE_STACK_*),
// ONNXFUSE_MAX_STACK_LAYERS and ONNXFUSE_MAX_LORA_RANK come from the generated onnxfuse_ops.h (onnxfuse/schema.py
// and triton/table.py).
#pragma once
#include <stdint.h>

#include "onnxfuse_ops.h"

// A generated number as a string literal, for messages ("64" for ONNXFUSE_MAX_LORA_RANK).
#define ONNXFUSE_STRINGIFY_(x) #x
#define ONNXFUSE_STRINGIFY(x) ONNXFUSE_STRINGIFY_(x)

#ifdef __cplusplus
extern "C" {
#endif

enum onnxfuse_error {
  ONNXFUSE_OK = 0,
  ONNXFUSE_ERR_BAD_ARGUMENT = -1,         // negative size, unknown dtype / activation, null pointer
  ONNXFUSE_ERR_RANK_TOO_LARGE = -2,       // LoRA rank R > ONNXFUSE_MAX_LORA_RANK
  ONNXFUSE_ERR_NO_TRITON = -3,            // library built without Triton kernels (ONNXFUSE_WITH_TRITON off)
  ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH = -4,   // no cubin for this GPU's compute capability in the library
  ONNXFUSE_ERR_TOO_LARGE = -5,            // a dimension past what the kernel indexes (Triton: 2^31 - 1 per dim)
  ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE = -6,  // no Triton tile compiled for this shape (the embedding ops' NP x DP)
  ONNXFUSE_ERR_NO_CUBLASLT = -7,          // the CUDA backend's GEMMs found no libcublasLt.so.13 / .so.12 to load
  ONNXFUSE_ERR_CUBLAS = -8,               // a cuBLASLt call failed (the error string names the call and status)
};

// The CUDA backend's GEMMs run on cuBLASLt (cuda/gemm.cu) with up to this much workspace, which every GEMM
// launcher's scratch starts with; onnxfuse_cuda_*_scratch_bytes() say how much scratch each launcher needs.
#define ONNXFUSE_CUBLASLT_WORKSPACE_BYTES (32ll << 20)

// The CUDA backend's GEMM launchers take a device scratch of at least the bytes their *_scratch_bytes() function
// returns (a negative code for bad arguments); the caller allocates it from onnxruntime's allocator and may free it
// as soon as the launcher returns (later work on the same stream is what reuses it).
//
// LinearRelu (act = ONNXFUSE_ACT_RELU) and LinearSigmoid (ONNXFUSE_ACT_SIGMOID): Y = act(X @ W + bias). ReLU and the
// bias are cuBLASLt's epilogue; sigmoid is one elementwise pass over Y after it.
int64_t onnxfuse_cuda_linear_act_scratch_bytes(int dtype, int64_t m, int64_t n);
int onnxfuse_cuda_linear_act(int dtype, int act, const void* x, const void* w, const void* bias, void* y, int64_t m,
                             int64_t k, int64_t n, void* scratch, int64_t scratch_bytes, void* stream);
// SwiGLU: Y = act(X @ W_gate) * (X @ W_up), act an onnxfuse_gate_act code (silu, gelu, gelu_tanh, quick_gelu,
// relu, sigmoid; common/gate_act.h), computed in fp32: two GEMMs (the gate into Y, the up product into scratch),
// then one elementwise pass.
int64_t onnxfuse_cuda_swiglu_scratch_bytes(int dtype, int64_t m, int64_t n);
int onnxfuse_cuda_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y, int64_t m,
                         int64_t k, int64_t n, void* scratch, int64_t scratch_bytes, void* stream);
// LoRALinear (relu = 0) and LoRALinearRelu (relu = 1): Y = [relu](X @ W + bias + scale * ((X @ A) @ B)): three GEMMs,
// T = scale * X @ A into scratch, Y = T @ B, then Y = [relu](X @ W + Y + bias) in the big GEMM's epilogue.
int64_t onnxfuse_cuda_lora_scratch_bytes(int dtype, int64_t m, int64_t r);
int onnxfuse_cuda_lora_linear(int dtype, int relu, const void* x, const void* w, const void* a, const void* b,
                              const void* bias, float scale, void* y, int64_t m, int64_t k, int64_t n, int64_t r,
                              void* scratch, int64_t scratch_bytes, void* stream);
// MLPStack: n_layers (1..ONNXFUSE_MAX_STACK_LAYERS) layers h_i = act_i(h_{i-1} @ w[i] + b[i]) with widths[0] = K
// and widths[i + 1] = N of layer i; acts[i] is ONNXFUSE_ACT_RELU or ONNXFUSE_ACT_SIGMOID. The intermediates live
// in the caller's device scratch of onnxfuse_mlp_stack_scratch_bytes() bytes (two [M, SW] buffers of the element
// type, SW = the widest hidden layer rounded up to 16). The CUDA backend runs one linear_act launch per layer and
// needs onnxfuse_cuda_mlp_stack_scratch_bytes(): those buffers, then the cuBLASLt workspace.
int64_t onnxfuse_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths);
int64_t onnxfuse_cuda_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths);
// SW of that scratch: the widest hidden layer (widths[1 .. n_layers-1]) rounded up to 16 elements.
static inline int64_t onnxfuse_mlp_stack_scratch_width(int n_layers, const int64_t* widths) {
  int64_t sw = 0;
  for (int i = 1; i < n_layers; ++i) sw = widths[i] > sw ? widths[i] : sw;
  return (sw + 15) / 16 * 16;
}
int onnxfuse_cuda_mlp_stack(int dtype, int n_layers, const int* acts, const void* x, const void* const* w,
                            const void* const* b, void* y, int64_t m, const int64_t* widths, void* scratch,
                            int64_t scratch_bytes, void* stream);

// RotaryEmbedding: Y = X * cos + rotate_half(X) * sin over `rows` rows of D (even) elements. X is [d0, d1, d2, D]
// (common/dims.h RotaryEmbeddingDims): row r is (i0, i1, i2) with i2 = r % d2, i1 = (r / d2) % d1, and its cos row
// starts at (i0 * cos_stride[0] + i1 * cos_stride[1] + i2 * cos_stride[2]) * D (a stride is 0 where cos broadcasts);
// sin likewise. cos_stride / sin_stride are host arrays of 3.
int onnxfuse_cuda_rotary_embedding(int dtype, const void* x, const void* cos, const void* sin, void* y, int64_t rows,
                                   int64_t d, int64_t d1, int64_t d2, const int64_t* cos_stride,
                                   const int64_t* sin_stride, void* stream);
// The rotary launchers' shared argument check: ONNXFUSE_ERR_BAD_ARGUMENT, 1 for "nothing to do" (no rows), or 0.
static inline int onnxfuse_rotary_check(int dtype, const void* x, const void* cos, const void* sin, const void* y,
                                        int64_t rows, int64_t d, int64_t d1, int64_t d2, const int64_t* cos_stride,
                                        const int64_t* sin_stride) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || rows < 0 || d < 0 || d % 2 || d1 <= 0 || d2 <= 0 ||
      cos_stride == 0 || sin_stride == 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (rows == 0 || d == 0) return 1;
  return (x == 0 || cos == 0 || sin == 0 || y == 0) ? ONNXFUSE_ERR_BAD_ARGUMENT : 0;
}

// The embedding-interaction launchers' shared argument check: ONNXFUSE_ERR_BAD_ARGUMENT, 1 for "nothing to do" (no
// samples or an empty output row), or 0; *width gets the output row width (d + n(n-1)/2 for dot, n d for cat, with
// n = features + 1 vectors per sample).
static inline int onnxfuse_embedding_interaction_check(int dtype, int interaction, int hash, int64_t batch, int64_t d,
                                                       int64_t features, int64_t n_indices, int64_t rows,
                                                       int64_t* width) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || batch < 0 || d < 0 || features < 0 || n_indices < 0 ||
      rows < 0 || (interaction != ONNXFUSE_INTERACTION_DOT && interaction != ONNXFUSE_INTERACTION_CAT) ||
      (hash != ONNXFUSE_HASH_NONE && hash != ONNXFUSE_HASH_MOD))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int64_t n = features + 1;
  *width = interaction == ONNXFUSE_INTERACTION_DOT ? d + n * (n - 1) / 2 : n * d;
  return (batch == 0 || *width == 0) ? 1 : 0;
}

// Embedding: Y [n, D] = table [vocab, D] rows at ids (int64, n of them); negative ids count from the end, ids outside
// [-vocab, vocab) give rows of zeros.
int onnxfuse_cuda_embedding(int dtype, const void* table, const int64_t* ids, void* y, int64_t n, int64_t vocab,
                            int64_t d, void* stream);

// EmbeddingInteraction (offsets == NULL: ids is [batch, features]) and EmbeddingBagInteraction (ids is the indices
// [features, n_indices], offsets [features, batch]): y [batch, width] from x [batch, d], the concatenated table
// [rows, d] and table_offsets / cardinality [features] (int64, device memory); interaction is an
// onnxfuse_interaction code, hash an onnxfuse_hash code (ignored for bags). The CUDA backend runs one warp per sample
// (cuda/embedding_interaction.cu); the Triton one a block of samples per program (triton/embedding_interaction.py,
// ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE when no (features + 1, d) tile was compiled: the CUDA kernel then serves auto).
int onnxfuse_cuda_embedding_interaction(int dtype, int interaction, int hash, const void* x, const int64_t* ids,
                                        const int64_t* offsets, const void* table, const int64_t* table_offsets,
                                        const int64_t* cardinality, void* y, int64_t batch, int64_t d, int64_t features,
                                        int64_t n_indices, int64_t rows, void* stream);

// The Triton AOT cubins: whether the library has them (cuda/triton/runtime.cc, in Triton builds only).
// Each family's Triton launcher is declared and defined in its CUDA EP glue (cuda/<family>_ops.cc), in the library
// only when built with Triton (the glue calls it through cuda/ops_cuda.h's Dispatch, which otherwise answers
// ONNXFUSE_ERR_NO_TRITON); linear_act's is declared here because MLPStack's per-layer mode launches it too.
int onnxfuse_triton_available(void);
// Device scratch (bytes) the Triton LinearRelu/LinearSigmoid launcher may use for these sizes on the current device:
// the TMA descriptors of the persistent TMA kernel (triton/table.py TMA_*), 0 where it cannot run; a negative code
// on bad sizes. onnxfuse_triton_linear_act runs the other kernel when `scratch` is null or short, so the scratch is
// an option (MLPStack's per-layer launches pass theirs); allocated and freed by the caller.
int64_t onnxfuse_triton_linear_act_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n);
int onnxfuse_triton_linear_act(int dtype, int act, const void* x, const void* w, const void* bias, void* y, int64_t m,
                               int64_t k, int64_t n, void* scratch, int64_t scratch_bytes, void* stream);

// Human-readable text for any code the launchers return (static storage, never null).
const char* onnxfuse_cuda_error_string(int code);

#ifdef __cplusplus
}
#endif
