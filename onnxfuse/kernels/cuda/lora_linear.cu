// LoRALinear and LoRALinearRelu (onnxfuse.schema) on the CUDA backend: Y = [relu](X @ W + bias + scale * ((X @ A) @ B))
// as three cuBLASLt GEMMs: T = scale * (X @ A) into the scratch after the cuBLASLt workspace ([M, r], the element
// type), Y = T @ B, then Y = [relu](X @ W + Y + bias) with the bias and ReLU in the big GEMM's epilogue.
#include "gemm.h"

namespace ock = onnxfuse::cuda_kernels;

extern "C" int64_t onnxfuse_cuda_lora_scratch_bytes(int dtype, int64_t m, int64_t r) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || r < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return ONNXFUSE_CUBLASLT_WORKSPACE_BYTES + ock::Align256(m * r * ock::ElemBytes(dtype));
}

extern "C" int onnxfuse_cuda_lora_linear(int dtype, int relu, const void* x, const void* w, const void* a,
                                         const void* b, const void* bias, float scale, void* y, int64_t m, int64_t k,
                                         int64_t n, int64_t r, void* scratch, int64_t scratch_bytes, void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || r < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  if (scratch == nullptr || scratch_bytes < onnxfuse_cuda_lora_scratch_bytes(dtype, m, r))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t ws = ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
  const bool low_rank = r > 0 && k > 0 && scale != 0.f;  // else the LoRA term is exactly zero
  if (low_rank) {
    void* t = static_cast<char*>(scratch) + ws;
    ock::GemmArgs ta;  // T = scale * X @ A   [M, r]
    ta.dtype = dtype, ta.x = x, ta.w = a, ta.y = t, ta.m = m, ta.k = k, ta.n = r, ta.alpha = scale;
    if (int err = ock::Gemm(ta, scratch, ws, s)) return err;
    ock::GemmArgs tb;  // Y = T @ B           [M, N]
    tb.dtype = dtype, tb.x = t, tb.w = b, tb.y = y, tb.m = m, tb.k = r, tb.n = n;
    if (int err = ock::Gemm(tb, scratch, ws, s)) return err;
  }
  ock::GemmArgs g;  // Y = [relu](X @ W + Y + bias)
  g.dtype = dtype, g.x = x, g.w = w, g.bias = bias, g.y = y, g.m = m, g.k = k, g.n = n, g.relu = relu != 0;
  if (low_rank) g.c = y, g.beta = 1.f;
  return ock::Gemm(g, scratch, ws, s);
}
