// SwiGLU on the CUDA EP: the kernel struct calling cuda/swiglu.cu's launcher or the Triton one
// (at the end of this file) through Dispatch (cuda/ops_cuda.h), and its registration.
#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

// The Triton launcher, defined at the end of this file in Triton builds (cuda/ops_cuda.h's Dispatch calls it only
// there).
extern "C" {
int onnxfuse_triton_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y, int64_t m,
                           int64_t k, int64_t n, void* stream);
}

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
