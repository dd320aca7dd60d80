// FlashAttention on the CPU EP: per batch, head and query row, the scores scale * q . k_j + bias over every key,
// their softmax (fp32, the row's largest score subtracted) and the weighted sum of V, in the order the reference
// computes it. A plain loop: it serves a fused model placed on the CPU (fuse --provider cpu leaves the pattern to
// onnxruntime's MultiHeadAttention, cpu_policy.CPU_ALWAYS_LEFT_TO_ORT); the GPU kernels are where the op wins.
#include <cmath>
#include <vector>

#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

template <typename T>
struct FlashAttentionCpu {
  using Op = schema::FlashAttention;
  FlashAttentionCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)),
        heads(ReadNumHeads(api, info, Op::kName)),
        qk_scale(ReadQkScale(api, info)) {}

  Ort::Status Compute(const Ort::Custom::Tensor<T>& Q, const Ort::Custom::Tensor<T>& K, const Ort::Custom::Tensor<T>& V,
                      const Ort::Custom::Tensor<T>& Bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const AttentionDims d = FlashAttentionDims(Op::kName, Q.Shape(), K.Shape(), V.Shape(), Bias.Shape(), heads);
      T* y = Y.Allocate(d.out_shape);
      if (d.B == 0 || d.S == 0 || d.H == 0 || d.D == 0) return;
      const T *q = Q.Data(), *k = K.Data(), *v = V.Data(), *bias = Bias.Data();
      const int64_t width = d.H * d.D;
      const float scale = qk_scale != 0.f ? qk_scale : 1.f / std::sqrt(float(d.D));
      std::vector<float> qf(size_t(d.D)), s(size_t(d.Skv)), acc(size_t(d.D));
      // K and V of one (batch, head) in fp32, [S_kv, D]: read once per head instead of once per query row
      std::vector<float> kf(size_t(d.Skv * d.D)), vf(size_t(d.Skv * d.D));
      for (int64_t b = 0; b < d.B; ++b) {
        for (int64_t h = 0; h < d.H; ++h) {
          for (int64_t j = 0; j < d.Skv; ++j)
            for (int64_t e = 0; e < d.D; ++e) {
              kf[size_t(j * d.D + e)] = ToF32<T>(k[(b * d.Skv + j) * width + h * d.D + e]);
              vf[size_t(j * d.D + e)] = ToF32<T>(v[(b * d.Skv + j) * width + h * d.D + e]);
            }
          const T* bias_plane = bias + b * d.bias_b + h * d.bias_h;
          for (int64_t i = 0; i < d.S; ++i) {
            const T* qr = q + (b * d.S + i) * width + h * d.D;
            for (int64_t e = 0; e < d.D; ++e) qf[size_t(e)] = ToF32<T>(qr[e]);
            const T* br = bias_plane + i * d.Skv;
            float m = -INFINITY;
            for (int64_t j = 0; j < d.Skv; ++j) {
              const float* kr = kf.data() + j * d.D;
              float dot = 0.f;
              for (int64_t e = 0; e < d.D; ++e) dot += qf[size_t(e)] * kr[e];
              s[size_t(j)] = dot * scale + ToF32<T>(br[j]);
              m = std::isnan(s[size_t(j)]) || s[size_t(j)] > m ? s[size_t(j)] : m;  // a NaN score makes the row NaN
            }
            float l = 0.f;
            std::fill(acc.begin(), acc.end(), 0.f);
            for (int64_t j = 0; j < d.Skv; ++j) {
              const float p = std::exp(s[size_t(j)] - m);  // all -inf: NaN, as the reference's softmax
              l += p;
              const float* vr = vf.data() + j * d.D;
              for (int64_t e = 0; e < d.D; ++e) acc[size_t(e)] += p * vr[e];
            }
            T* yr = y + (b * d.S + i) * width + h * d.D;
            for (int64_t e = 0; e < d.D; ++e) yr[e] = FromF32<T>(acc[size_t(e)] / l);
          }
        }
      }
    });
  }

  OpAttrs attrs;
  int64_t heads;
  float qk_scale;
};

}  // namespace

void RegisterFlashAttention(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<FlashAttentionCpu>(domain, schema::FlashAttention::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
