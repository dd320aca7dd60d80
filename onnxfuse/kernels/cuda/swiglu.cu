// SwiGLU (onnxfuse.schema) on the CUDA backend: Y = act(X @ W_gate) * (X @ W_up), act one of the gate activations
// (common/gate_act.h, by run-time code). Two cuBLASLt GEMMs, the gate product into Y and the up product into the
// scratch after the cuBLASLt workspace, then one elementwise pass Y = act(Y) * U in fp32, 16 bytes per load and
// store where the buffers allow (M x N a multiple of the vector, 16-byte aligned): memory bound, it reads two
// [M, N] and writes one.
#include "common/gate_act.h"
#include "gemm.h"

namespace ock = onnxfuse::cuda_kernels;

namespace {
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// Element block i (VEC elements): y = act(y) * up.
template <typename T, int VEC>
struct GateTimesUp {
  T* y;
  const T* up;
  int act;
  __device__ void operator()(int64_t i) const {
    using V = Vec<T, VEC>;
    V g = reinterpret_cast<const V*>(y)[i];
    const V u = reinterpret_cast<const V*>(up)[i];
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      g.v[e] = ock::from_f<T>(onnxfuse::GateActivation(act, ock::to_f(g.v[e])) * ock::to_f(u.v[e]));
    reinterpret_cast<V*>(y)[i] = g;
  }
};

template <typename T>
int GatePass(T* y, const T* up, int64_t count, int act, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec =
      count % kVec == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 && reinterpret_cast<uintptr_t>(up) % 16 == 0;
  if (vec) return ock::LaunchElementwise(count / kVec, GateTimesUp<T, kVec>{y, up, act}, s);
  return ock::LaunchElementwise(count, GateTimesUp<T, 1>{y, up, act}, s);
}
}  // namespace

extern "C" int64_t onnxfuse_cuda_swiglu_scratch_bytes(int dtype, int64_t m, int64_t n) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || n < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return ONNXFUSE_CUBLASLT_WORKSPACE_BYTES + ock::Align256(m * n * ock::ElemBytes(dtype));
}

extern "C" int onnxfuse_cuda_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y,
                                    int64_t m, int64_t k, int64_t n, void* scratch, int64_t scratch_bytes,
                                    void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || !onnxfuse::ValidGateActivation(act)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || n == 0) return 0;
  if (scratch == nullptr || scratch_bytes < onnxfuse_cuda_swiglu_scratch_bytes(dtype, m, n))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  void* up = static_cast<char*>(scratch) + ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
  ock::GemmArgs g;
  g.dtype = dtype, g.x = x, g.w = w_gate, g.y = y, g.m = m, g.k = k, g.n = n;
  if (int err = ock::Gemm(g, scratch, ONNXFUSE_CUBLASLT_WORKSPACE_BYTES, s)) return err;
  g.w = w_up, g.y = up;
  if (int err = ock::Gemm(g, scratch, ONNXFUSE_CUBLASLT_WORKSPACE_BYTES, s)) return err;
  return ock::ByDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return GatePass<T>(static_cast<T*>(y), static_cast<const T*>(up), m * n, act, s);
  });
}
