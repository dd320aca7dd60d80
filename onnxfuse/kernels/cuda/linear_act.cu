// LinearRelu and LinearSigmoid (onnxfuse.schema) on the CUDA backend: Y = act(X @ W + bias) as one cuBLASLt GEMM
// whose epilogue adds the bias (and applies ReLU) on the fp32 accumulators; sigmoid, which cuBLASLt has no epilogue
// for, is one elementwise pass over Y.
#include "common/gate_act.h"
#include "gemm.h"

namespace ock = onnxfuse::cuda_kernels;

namespace {
template <typename T>
struct SigmoidInPlace {
  T* y;
  __device__ void operator()(int64_t i) const { y[i] = ock::from_f<T>(onnxfuse::GateSigmoid(ock::to_f(y[i]))); }
};
}  // namespace

extern "C" int64_t onnxfuse_cuda_linear_act_scratch_bytes(int dtype, int64_t m, int64_t n) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || n < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
}

extern "C" int onnxfuse_cuda_linear_act(int dtype, int act, const void* x, const void* w, const void* bias, void* y,
                                        int64_t m, int64_t k, int64_t n, void* scratch, int64_t scratch_bytes,
                                        void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || (act != ONNXFUSE_ACT_RELU && act != ONNXFUSE_ACT_SIGMOID))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  ock::GemmArgs g;
  g.dtype = dtype, g.x = x, g.w = w, g.bias = bias, g.y = y, g.m = m, g.k = k, g.n = n;
  g.relu = act == ONNXFUSE_ACT_RELU;
  if (int err = ock::Gemm(g, scratch, scratch_bytes, s)) return err;
  if (act != ONNXFUSE_ACT_SIGMOID) return 0;
  return ock::ByDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return ock::LaunchElementwise(m * n, SigmoidInPlace<T>{static_cast<T*>(y)}, s);
  });
}
