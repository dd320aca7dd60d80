// LinearRelu and LinearSigmoid on the CUDA EP: the kernel structs calling cuda/linear_act.cu's
// launcher or the Triton one (cuda/triton/linear_act.cc) through Dispatch (cuda/ops_cuda.h), and their registration.
#include "cuda/ops_cuda.h"

namespace onnxfuse {
namespace cuda {
namespace {

// Op is schema::LinearRelu (Act = ONNXFUSE_ACT_RELU) or schema::LinearSigmoid (ONNXFUSE_ACT_SIGMOID).
template <typename T, int Act, typename Op>
struct LinearActCuda {
  static constexpr const char* kName = Op::kName;
  LinearActCuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = LinearActDims(kName, X.Shape(), W.Shape(), bias.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *w = W.Data(), *b = bias.Data();
      Dispatch(
          kName, attrs,
          [&] {
            return WithScratch(ctx, Op::kX, onnxfuse_cuda_linear_act_scratch_bytes(DtypeCode<T>(), d.M, d.N),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_linear_act(DtypeCode<T>(), Act, x, w, b, y, d.M, d.K, d.N, sp,
                                                                 bytes, stream);
                               });
          },
          [&] {
            // A negative size (an error code) comes back as the code: Dispatch may fall back to CUDA.
            return WithScratch(ctx, Op::kX, onnxfuse_triton_linear_act_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_triton_linear_act(DtypeCode<T>(), Act, x, w, b, y, d.M, d.K, d.N, sp,
                                                                   bytes, stream);
                               });
          });
    });
  }
  OpAttrs attrs;
};
template <typename T>
using LinearReluCuda = LinearActCuda<T, ONNXFUSE_ACT_RELU, schema::LinearRelu>;
template <typename T>
using LinearSigmoidCuda = LinearActCuda<T, ONNXFUSE_ACT_SIGMOID, schema::LinearSigmoid>;

}  // namespace

void RegisterLinearActCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LinearReluCuda>(domain, schema::LinearRelu::kName, kCudaEp);
  AddOpAllTypes<LinearSigmoidCuda>(domain, schema::LinearSigmoid::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse
