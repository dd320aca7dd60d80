// SwiGLU on the CUDA execution provider, in one file: the launchers' C declarations below, then the nvcc half (the CUDA
// kernels) and the host half (the CUDA EP glue and the Triton launcher); cuda/cuda.cmake says how it is built.
#include "cuda/launch.h"

extern "C" {
// SwiGLU: Y = act(X @ W_gate) * (X @ W_up), act an onnxfuse_gate_act code (silu, gelu, gelu_tanh, quick_gelu,
// relu, sigmoid; common/gate_act.h), computed in fp32: two GEMMs (the gate into Y, the up product into scratch),
// then one elementwise pass.
int64_t onnxfuse_cuda_swiglu_scratch_bytes(int dtype, int64_t m, int64_t n);
int onnxfuse_cuda_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y, int64_t m,
                         int64_t k, int64_t n, void* scratch, int64_t scratch_bytes, void* stream);
// The Triton launcher (the host half, Triton builds only: cuda/ops_cuda.h's Dispatch calls it only there).
int onnxfuse_triton_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y, int64_t m,
                           int64_t k, int64_t n, void* stream);
}

#ifdef __CUDACC__
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

#else  // the host half: the CUDA EP glue and the Triton launcher
// SwiGLU on the CUDA EP: the kernel struct calling the nvcc half's launcher or the Triton one
// (at the end of this file) through Dispatch (cuda/ops_cuda.h), and its registration.
#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

template <typename T>
struct SwiGLUCuda {
  static constexpr const char* kName = schema::SwiGLU::kName;
  SwiGLUCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)), act(ReadGateActivation(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Wg,
                      const Ort::Custom::Tensor<T>& Wu, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = SwiGLUDims(kName, X.Shape(), Wg.Shape(), Wu.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *wg = Wg.Data(), *wu = Wu.Data();
      Dispatch(
          kName, attrs,
          [&] {
            return WithScratch(ctx, schema::SwiGLU::kX, onnxfuse_cuda_swiglu_scratch_bytes(DtypeCode<T>(), d.M, d.N),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_swiglu(DtypeCode<T>(), act, x, wg, wu, y, d.M, d.K, d.N, sp,
                                                             bytes, stream);
                               });
          },
          [&] { return onnxfuse_triton_swiglu(DtypeCode<T>(), act, x, wg, wu, y, d.M, d.K, d.N, stream); },
          AutoPrefersCuda(triton::kSwiglu, d.M, d.K));
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act of the node's activation attribute
};

}  // namespace

void RegisterSwiGLUCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<SwiGLUCuda>(domain, schema::SwiGLU::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of SwiGLU (triton/swiglu.py).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

extern "C" int onnxfuse_triton_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y,
                                      int64_t m, int64_t k, int64_t n, void* stream) {
  if (BadCommon(dtype, m, k, n) || act < 0 || act >= ONNXFUSE_NUM_GATE_ACTIVATIONS) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), ACT = act;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &w_gate, &w_up, &y, &M, &N, &K, &ACT, &scratch_global, &scratch_profile};
  const bool aligned =
      Aligned16(x) && Aligned16(w_gate) && Aligned16(w_up) && Aligned16(y) && k % 16 == 0 && n % 16 == 0;
  return Launch(ids::kSwiglu, dtype, m, n, aligned, 0, args, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
