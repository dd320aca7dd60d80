// RotaryEmbedding on the CUDA EP: the kernel struct calling cuda/rotary_embedding.cu's launcher or the Triton one
// (at the end of this file) through Dispatch (cuda/ops_cuda.h), and its registration.
#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

// The Triton launcher, defined at the end of this file in Triton builds (cuda/ops_cuda.h's Dispatch calls it only
// there).
extern "C" {
int onnxfuse_triton_rotary_embedding(int dtype, const void* x, const void* cos, const void* sin, void* y, int64_t rows,
                                     int64_t d, int64_t d1, int64_t d2, const int64_t* cos_stride,
                                     const int64_t* sin_stride, void* stream);
}

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

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of RotaryEmbedding (triton/rotary_embedding.py).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

extern "C" int onnxfuse_triton_rotary_embedding(int dtype, const void* x, const void* cos, const void* sin, void* y,
                                                int64_t rows, int64_t d, int64_t d1, int64_t d2,
                                                const int64_t* cos_stride, const int64_t* sin_stride, void* stream) {
  const int check = onnxfuse_rotary_check(dtype, x, cos, sin, y, rows, d, d1, d2, cos_stride, sin_stride);
  if (check != 0) return check > 0 ? 0 : check;
  const int64_t big[] = {
      rows, d, d1, d2, cos_stride[0], cos_stride[1], cos_stride[2], sin_stride[0], sin_stride[1], sin_stride[2]};
  for (int64_t v : big)
    if (v > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;  // Triton params are i32 (offsets are 64-bit inside)
  int32_t ROWS = int32_t(rows), HALF = int32_t(d / 2), D1 = int32_t(d1), D2 = int32_t(d2);
  int32_t CS0 = int32_t(cos_stride[0]), CS1 = int32_t(cos_stride[1]), CS2 = int32_t(cos_stride[2]);
  int32_t SS0 = int32_t(sin_stride[0]), SS1 = int32_t(sin_stride[1]), SS2 = int32_t(sin_stride[2]);
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x,   &cos, &sin, &y,   &ROWS,           &HALF,           &D1, &D2, &CS0, &CS1,
                  &CS2, &SS0, &SS1, &SS2, &scratch_global, &scratch_profile};
  const bool aligned = Aligned16(x) && Aligned16(cos) && Aligned16(sin) && Aligned16(y) && HALF % 16 == 0;
  return Launch(ids::kRotaryEmbedding, dtype, rows, d / 2, aligned, 0, args, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
