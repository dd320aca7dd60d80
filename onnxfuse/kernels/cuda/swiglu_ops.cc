// SwiGLU on the CUDA EP: the kernel struct calling cuda/swiglu.cu's launcher or the Triton one
// (cuda/triton/swiglu.cc) through Dispatch (cuda/ops_cuda.h), and its registration.
#include "cuda/ops_cuda.h"

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
