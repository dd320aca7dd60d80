// SwiGLU (onnxfuse.schema) on the CUDA backend: Y = act(X @ W_gate) * (X @ W_up), act one of the gate activations
// (common/gate_act.h, by run-time code). Both GEMMs share each X tile in one kernel and act * up runs on the fp32
// accumulators, so the two [M, N] intermediates never reach memory.
#include "gemm_kernels.cuh"

namespace ock = onnxfuse::cuda_kernels;

namespace {
template <typename T>
int Run(int act, const void* x, const void* wg, const void* wu, void* y, int64_t m, int64_t k, int64_t n,
        cudaStream_t stream) {
  ock::GemmParams<T> p{};
  p.act = act;
  p.x = static_cast<const T*>(x);
  p.w0 = static_cast<const T*>(wg);
  p.w1 = static_cast<const T*>(wu);
  p.y = static_cast<T*>(y);
  p.m = m, p.k = k, p.n = n;
  return ock::LaunchGemm<T, 2, ock::kEpiSwiglu, 0>(p, stream);
}
}  // namespace

extern "C" int onnxfuse_cuda_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y,
                                    int64_t m, int64_t k, int64_t n, void* stream) {
  if (!ock::check_common(dtype, x, y, m, k, n) || !onnxfuse::ValidGateActivation(act)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case ONNXFUSE_FP32: return Run<float>(act, x, w_gate, w_up, y, m, k, n, s);
    case ONNXFUSE_FP16: return Run<__half>(act, x, w_gate, w_up, y, m, k, n, s);
    default: return Run<__nv_bfloat16>(act, x, w_gate, w_up, y, m, k, n, s);
  }
}
