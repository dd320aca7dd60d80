// LoRALinear and LoRALinearRelu on the CUDA EP: the kernel structs calling cuda/lora_linear.cu's
// launcher or the Triton one (cuda/triton/lora_linear.cc) through Dispatch (cuda/ops_cuda.h), and their registration.
#include "cuda/ops_cuda.h"

namespace onnxfuse {
namespace cuda {
namespace {

// Op is schema::LoRALinear (Relu = 0) or schema::LoRALinearRelu (Relu = 1).
template <typename T, int Relu, typename Op>
struct LoRACuda {
  static constexpr const char* kName = Op::kName;
  LoRACuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& A, const Ort::Custom::Tensor<T>& B,
                      const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = LoRADims(kName, X.Shape(), W.Shape(), A.Shape(), B.Shape(), bias.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *w = W.Data(), *a = A.Data(), *b = B.Data(), *bi = bias.Data();
      const float s = attrs.scale;
      Dispatch(
          kName, attrs,
          [&] {
            return WithScratch(ctx, Op::kX, onnxfuse_cuda_lora_scratch_bytes(DtypeCode<T>(), d.M, d.r),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_lora_linear(DtypeCode<T>(), Relu, x, w, a, b, bi, s, y, d.M, d.K,
                                                                  d.N, d.r, sp, bytes, stream);
                               });
          },
          [&] {
            // A negative size (e.g. no cubin for this GPU) comes back as the code: Dispatch may fall back to CUDA.
            return WithScratch(ctx, Op::kX, onnxfuse_triton_lora_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N, d.r),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_triton_lora_linear(DtypeCode<T>(), Relu, x, w, a, b, bi, s, y, d.M,
                                                                    d.K, d.N, d.r, sp, bytes, stream);
                               });
          });
    });
  }
  OpAttrs attrs;
};
template <typename T>
using LoRALinearCuda = LoRACuda<T, 0, schema::LoRALinear>;
template <typename T>
using LoRALinearReluCuda = LoRACuda<T, 1, schema::LoRALinearRelu>;

}  // namespace

void RegisterLoRALinearCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LoRALinearCuda>(domain, schema::LoRALinear::kName, kCudaEp);
  AddOpAllTypes<LoRALinearReluCuda>(domain, schema::LoRALinearRelu::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse
