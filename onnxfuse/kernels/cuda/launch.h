// C interface between the CUDA EP glue (the host halves of cuda/<family>.cu, compiled by the host compiler with the
// ORT headers) and the GPU kernels (their nvcc halves and cuda/gemm.cu, and the Triton launchers over the AOT
// cubins). Plain C types only, so neither side needs the other's headers: device pointers, int64 sizes, a dtype
// enum, the CUDA stream as void*.
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
// Each family's launchers (onnxfuse_cuda_<op> and onnxfuse_triton_<op>, with their *_scratch_bytes()) are declared
// at the top of its cuda/<family>.cu and defined there: the CUDA one in the nvcc half, the Triton one at the end of
// the host half, in the library only when built with Triton (the glue calls it through cuda/ops_cuda.h's Dispatch,
// which otherwise answers ONNXFUSE_ERR_NO_TRITON). Declared here: what more than one family uses.

// linear_act's CUDA launcher (cuda/linear_act.cu), which MLPStack's CUDA backend runs per layer. LinearRelu (act =
// ONNXFUSE_ACT_RELU) and LinearSigmoid (ONNXFUSE_ACT_SIGMOID): Y = act(X @ W + bias). ReLU and the bias are cuBLASLt's
// epilogue; sigmoid is one elementwise pass over Y after it.
int64_t onnxfuse_cuda_linear_act_scratch_bytes(int dtype, int64_t m, int64_t n);
int onnxfuse_cuda_linear_act(int dtype, int act, const void* x, const void* w, const void* bias, void* y, int64_t m,
                             int64_t k, int64_t n, void* scratch, int64_t scratch_bytes, void* stream);
// Whether launches may be programmatic dependents of the kernel before them (cudaLaunchAttributeProgrammatic-
// StreamSerialization; sm_90 and newer): ONNXFUSE_PDL unset or not "0", read once (cuda/gemm.cu). The CUDA kernels'
// launchers (cuda/gemm.h LaunchDependent) and the Triton runtime's (cuda/triton/runtime.cc) both ask it.
int onnxfuse_cuda_pdl_enabled(void);
// Whether LaunchDependent launches programmatic dependents into a stream being captured too, so that the CUDA graph
// holds programmatic edges between them: ONNXFUSE_PDL_GRAPH unset or not "0", read once (cuda/gemm.cu).
int onnxfuse_cuda_pdl_in_graph(void);
// The current device's compute capability as major * 10 + minor, cached per device (the CUDA EP makes its device
// current on the thread that runs a kernel), its index in *device_out; a negated cudaError_t where CUDA cannot say
// (cuda/gemm.cu). PdlOn (cuda/gemm.h) and the Triton runtime's cubin choice (CurrentArch) both ask it.
int onnxfuse_cuda_current_arch(int* device_out);
// Device `device`'s SM count, cached per device; 132 (an H100 SXM's) where CUDA cannot say (cuda/gemm.cu). Linear's
// split-K GEMV, the Triton runtime's tile choices and CUTLASS's int4 GEMM size their grids by it.
int onnxfuse_cuda_sm_count(int device);
// The Triton AOT cubins: whether the library has them (cuda/triton/runtime.cc, in Triton builds only).
int onnxfuse_triton_available(void);
// linear_act's Triton launcher, which MLPStack's per-layer mode launches too (as its CUDA backend launches the
// CUDA one above). Device scratch (bytes) the Triton LinearRelu/LinearSigmoid launcher may use for these sizes on
// the current device: the TMA descriptors of the persistent TMA kernel (triton/table.py TMA_*), 0 where it cannot run;
// a negative code on bad sizes. onnxfuse_triton_linear_act runs the other kernel when `scratch` is null or short, so
// the scratch is an option (MLPStack's per-layer launches pass theirs); allocated and freed by the caller.
int64_t onnxfuse_triton_linear_act_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n);
int onnxfuse_triton_linear_act(int dtype, int act, const void* x, const void* w, const void* bias, void* y, int64_t m,
                               int64_t k, int64_t n, void* scratch, int64_t scratch_bytes, void* stream);

// LoRALinear's and MultiLoRALinear's launchers (cuda/lora_linear.cu), which LoRAGatedMLP's and MultiLoRAGatedMLP's
// (cuda/swiglu.cu) run for the down projection.
// LoRALinear (relu = 0) and LoRALinearRelu (relu = 1): Y = [relu](X @ W + bias + scale * ((X @ A) @ B)): three GEMMs,
// T = scale * X @ A into scratch, Y = T @ B, then Y = [relu](X @ W + Y + bias) in the big GEMM's epilogue.
int64_t onnxfuse_cuda_lora_scratch_bytes(int dtype, int64_t m, int64_t r);
int onnxfuse_cuda_lora_linear(int dtype, int relu, const void* x, const void* w, const void* a, const void* b,
                              const void* bias, float scale, void* y, int64_t m, int64_t k, int64_t n, int64_t r,
                              void* scratch, int64_t scratch_bytes, void* stream);
// MultiLoRALinear (CUDA backend): the cuBLASLt GEMM with its bias, then each row's adapter term (shrink and expand
// kernels); A [adapters, K, r], B [adapters, r, N], index per row / rows_per_index.
int64_t onnxfuse_cuda_multi_lora_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t r);
int onnxfuse_cuda_multi_lora_linear(int dtype, const void* x, const void* w, const void* a, const void* b,
                                    const void* bias, const void* scales, const int64_t* index, void* y, int64_t m,
                                    int64_t k, int64_t n, int64_t r, int64_t adapters, int64_t rows_per_index,
                                    void* scratch, int64_t scratch_bytes, void* stream);
// Their second phase alone, on partials of X @ A the caller made (t [split, m, r_pad] fp32, r_pad RPad of a rank >= r;
// LoRAGatedMLP: its gated kernel's down-projection X @ A, split 1): lora_main / multi_lora_main as their
// launchers run them. lora_main's scratch: the TMA descriptors of its persistent build (0 where it cannot run).
int64_t onnxfuse_triton_lora_main_scratch_bytes(int dtype, int64_t m, int64_t k);
int onnxfuse_triton_lora_main(int dtype, int relu, const void* x, const void* w, const void* t, int64_t split,
                              int64_t r_pad, const void* b, const void* bias, float scale, void* y, int64_t m,
                              int64_t k, int64_t n, int64_t r, void* scratch, int64_t scratch_bytes, void* stream);
int onnxfuse_triton_multi_lora_main(int dtype, const void* x, const void* w, const void* t, int64_t split,
                                    int64_t r_pad, const void* b, const void* bias, const void* scales,
                                    const int64_t* index, void* y, int64_t m, int64_t k, int64_t n, int64_t r,
                                    int64_t adapters, int64_t rows_per_index, void* stream);

// Human-readable text for any code the launchers return (static storage, never null).
const char* onnxfuse_cuda_error_string(int code);

#ifdef __cplusplus
}
#endif
