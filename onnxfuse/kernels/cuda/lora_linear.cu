// LoRALinear and LoRALinearRelu (onnxfuse.schema) on the CUDA backend:
// Y = [relu](X @ W + bias + scale * ((X @ A) @ B)). Each block computes its rows of T = X @ A alongside X @ W (the
// X tile is loaded once for both), then adds (scale * T) @ B for its columns: no scratch buffer, one launch.
#include "gemm_kernels.cuh"

namespace ock = onnxfuse::cuda_kernels;

namespace {
template <typename T, int RP>
int RunRank(const ock::GemmParams<T>& p, cudaStream_t stream) {
  return ock::LaunchGemm<T, 1, ock::kEpiLora, RP>(p, stream);
}

template <typename T>
int Run(int relu, const void* x, const void* w, const void* a, const void* b, const void* bias, float scale, void* y,
        int64_t m, int64_t k, int64_t n, int64_t r, cudaStream_t stream) {
  ock::GemmParams<T> p{};
  p.x = static_cast<const T*>(x);
  p.w0 = static_cast<const T*>(w);
  p.la = static_cast<const T*>(a);
  p.lb = static_cast<const T*>(b);
  p.bias = static_cast<const T*>(bias);
  p.y = static_cast<T*>(y);
  p.m = m, p.k = k, p.n = n, p.r = int(r), p.act = relu ? 1 : 0, p.scale = scale;
  // Rank padded to the tensor-core fragment: 16, 32 or 64 (the SmallM kernel ignores the padding).
  if (r <= 16) return RunRank<T, 16>(p, stream);
  if (r <= 32) return RunRank<T, 32>(p, stream);
  return RunRank<T, 64>(p, stream);
}
}  // namespace

extern "C" int onnxfuse_cuda_lora_linear(int dtype, int relu, const void* x, const void* w, const void* a,
                                         const void* b, const void* bias, float scale, void* y, int64_t m, int64_t k,
                                         int64_t n, int64_t r, void* stream) {
  if (!ock::check_common(dtype, x, y, m, k, n) || r < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case ONNXFUSE_FP32: return Run<float>(relu, x, w, a, b, bias, scale, y, m, k, n, r, s);
    case ONNXFUSE_FP16: return Run<__half>(relu, x, w, a, b, bias, scale, y, m, k, n, r, s);
    default: return Run<__nv_bfloat16>(relu, x, w, a, b, bias, scale, y, m, k, n, r, s);
  }
}
