// RotaryEmbedding on the CPU EP: Y = X * cos + rotate_half(X) * sin, one pass in fp32 (common/dims.h gives the
// broadcast strides of cos and sin). Memory bound: a plain loop over rows; each row reads its cos/sin row once.
#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

template <typename T>
struct RotaryEmbeddingCpu {
  using Op = schema::RotaryEmbedding;
  RotaryEmbeddingCpu(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, Op::kName)) {}

  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Cos,
                      const Ort::Custom::Tensor<T>& Sin, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const RotaryDims d = RotaryEmbeddingDims(Op::kName, X.Shape(), Cos.Shape(), Sin.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.rows == 0 || d.D == 0) return;
      const T* x = X.Data();
      const T* c = Cos.Data();
      const T* s = Sin.Data();
      const int64_t half = d.D / 2;
      for (int64_t r = 0; r < d.rows; ++r) {
        const int64_t i2 = r % d.d2, i1 = (r / d.d2) % d.d1, i0 = r / (d.d2 * d.d1);
        const T* cr = c + (i0 * d.cos_stride[0] + i1 * d.cos_stride[1] + i2 * d.cos_stride[2]) * d.D;
        const T* sr = s + (i0 * d.sin_stride[0] + i1 * d.sin_stride[1] + i2 * d.sin_stride[2]) * d.D;
        const T* xr = x + r * d.D;
        T* yr = y + r * d.D;
        for (int64_t j = 0; j < half; ++j) {
          const float a = ToF32<T>(xr[j]), b = ToF32<T>(xr[j + half]);
          yr[j] = FromF32<T>(a * ToF32<T>(cr[j]) - b * ToF32<T>(sr[j]));
          yr[j + half] = FromF32<T>(b * ToF32<T>(cr[j + half]) + a * ToF32<T>(sr[j + half]));
        }
      }
    });
  }

  OpAttrs attrs;
};

}  // namespace

void RegisterRotaryEmbedding(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<RotaryEmbeddingCpu>(domain, schema::RotaryEmbedding::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
