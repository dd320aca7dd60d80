// LinearRelu and LinearSigmoid (onnxfuse.schema) on the CUDA backend: Y = act(X @ W + bias), the bias and the
// activation applied to the fp32 accumulators in the GEMM's epilogue (kernels in gemm_kernels.cuh).
#include "gemm_kernels.cuh"

namespace ock = onnxfuse::cuda_kernels;

namespace {
template <typename T>
int Run(int act, const void* x, const void* w, const void* bias, void* y, int64_t m, int64_t k, int64_t n,
        cudaStream_t stream) {
  ock::GemmParams<T> p{};
  p.x = static_cast<const T*>(x);
  p.w0 = static_cast<const T*>(w);
  p.bias = static_cast<const T*>(bias);
  p.y = static_cast<T*>(y);
  p.m = m, p.k = k, p.n = n, p.act = act;
  return ock::LaunchGemm<T, 1, ock::kEpiAct, 0>(p, stream);
}
}  // namespace

extern "C" int onnxfuse_cuda_linear_act(int dtype, int act, const void* x, const void* w, const void* bias, void* y,
                                        int64_t m, int64_t k, int64_t n, void* stream) {
  if (!ock::check_common(dtype, x, y, m, k, n) || (act != ONNXFUSE_ACT_RELU && act != ONNXFUSE_ACT_SIGMOID))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case ONNXFUSE_FP32: return Run<float>(act, x, w, bias, y, m, k, n, s);
    case ONNXFUSE_FP16: return Run<__half>(act, x, w, bias, y, m, k, n, s);
    default: return Run<__nv_bfloat16>(act, x, w, bias, y, m, k, n, s);
  }
}

extern "C" const char* onnxfuse_cuda_error_string(int code) {
  switch (code) {
    case ONNXFUSE_OK: return "no error";
    case ONNXFUSE_ERR_BAD_ARGUMENT: return "onnxfuse: bad argument (negative size, null pointer or unknown dtype)";
    case ONNXFUSE_ERR_RANK_TOO_LARGE:
      return "onnxfuse: LoRA rank larger than " ONNXFUSE_STRINGIFY(ONNXFUSE_MAX_LORA_RANK) " is not supported on the GPU";
    case ONNXFUSE_ERR_NO_TRITON: return "onnxfuse: library built without Triton kernels (ONNXFUSE_WITH_TRITON=OFF)";
    case ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH:
      return "onnxfuse: no kernel for this GPU's compute capability (rebuild with its arch in ONNXFUSE_CUDA_ARCHS)";
    case ONNXFUSE_ERR_TOO_LARGE: return "onnxfuse: tensor dimension too large for the kernel's indexing";
    case ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE:
      return "onnxfuse: no Triton kernel compiled for this shape (backend cuda serves it; auto falls back to it)";
    default: return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "onnxfuse: unknown error";
  }
}
