// RotaryEmbedding on the CUDA EP: the kernel struct calling cuda/rotary_embedding.cu's launcher or the Triton one
// (cuda/triton/rotary_embedding.cc) through Dispatch (cuda/ops_cuda.h), and its registration.
#include "cuda/ops_cuda.h"

namespace onnxfuse {
namespace cuda {
namespace {

template <typename T>
struct RotaryEmbeddingCuda {
  static constexpr const char* kName = schema::RotaryEmbedding::kName;
  RotaryEmbeddingCuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Cos,
                      const Ort::Custom::Tensor<T>& Sin, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const RotaryDims d = RotaryEmbeddingDims(kName, X.Shape(), Cos.Shape(), Sin.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.rows == 0 || d.D == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *c = Cos.Data(), *s = Sin.Data();
      Dispatch(
          kName, attrs,
          [&] {
            return onnxfuse_cuda_rotary_embedding(DtypeCode<T>(), x, c, s, y, d.rows, d.D, d.d1, d.d2, d.cos_stride,
                                                  d.sin_stride, stream);
          },
          [&] {
            return onnxfuse_triton_rotary_embedding(DtypeCode<T>(), x, c, s, y, d.rows, d.D, d.d1, d.d2, d.cos_stride,
                                                    d.sin_stride, stream);
          });
    });
  }
  OpAttrs attrs;
};

}  // namespace

void RegisterRotaryEmbeddingCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<RotaryEmbeddingCuda>(domain, schema::RotaryEmbedding::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse
