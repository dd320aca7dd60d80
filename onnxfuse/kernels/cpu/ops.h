// Pieces shared by the CPU op files (linear_act.cc, swiglu.cc, lora_linear.cc): element-type mapping, the
// bias + activation epilogue, and the per-file registration hooks that register_cpu.cc calls.
#pragma once

#include <cmath>

#include "../ort/common.h"
#include "gemm.h"

namespace onnxfuse {
namespace cpu {

template <typename T> struct FormatOf;
template <> struct FormatOf<float> { static constexpr Format value = Format::F32; };
template <> struct FormatOf<Ort::Float16_t> { static constexpr Format value = Format::F16; };
template <> struct FormatOf<Ort::BFloat16_t> { static constexpr Format value = Format::BF16; };

template <typename T> inline float ToF32(T v);
template <> inline float ToF32<float>(float v) { return v; }
template <> inline float ToF32<Ort::Float16_t>(Ort::Float16_t v) { return F16BitsToF32(v.val); }
template <> inline float ToF32<Ort::BFloat16_t>(Ort::BFloat16_t v) { return Bf16BitsToF32(v.val); }

template <typename T> inline T FromF32(float v);
template <> inline float FromF32<float>(float v) { return v; }
template <> inline Ort::Float16_t FromF32<Ort::Float16_t>(float v) { return Ort::Float16_t::FromBits(F32ToF16Bits(v)); }
template <> inline Ort::BFloat16_t FromF32<Ort::BFloat16_t>(float v) { return Ort::BFloat16_t::FromBits(F32ToBf16Bits(v)); }

// Transcendentals in fp32 (schema rule). 1 / (1 + e^-z) is exact enough and saturates cleanly: e^-z = inf -> 0.
inline float Sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

enum class Act { None, Relu, Sigmoid };

// Y = act(acc + bias) for one tile; bias is converted to fp32 once per call.
template <typename T, Act A>
struct BiasActEpilogue final : Epilogue {
  const float* bias;  // [N] fp32
  T* y;               // [M, N]
  int64_t N;
  void Apply(int64_t m0, int64_t mb, int64_t n0, int64_t nc, const float* const* acc, int64_t ld) const override {
    for (int64_t i = 0; i < mb; ++i) {
      const float* a = acc[0] + i * ld;
      T* out = y + (m0 + i) * N + n0;
      const float* bs = bias + n0;
      for (int64_t j = 0; j < nc; ++j) {
        float z = a[j] + bs[j];
        if (A == Act::Relu) z = z > 0.f ? z : (z == z ? 0.f : z);  // NaN stays NaN, like torch.relu
        if (A == Act::Sigmoid) z = Sigmoid(z);
        out[j] = FromF32<T>(z);
      }
    }
  }
};

template <typename T>
std::vector<float> ToF32Vector(const T* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = ToF32<T>(p[i]);
  return out;
}

// The GEMM every op runs: X [M, K] (row-major, type T) times the B operands the caller adds, fp32 accumulation,
// `epilogue` applied per output tile.
template <typename T>
GemmArgs GemmFor(const LinearDims& d, const T* x, const Epilogue* epilogue) {
  GemmArgs g;
  g.fmt = FormatOf<T>::value;
  g.M = d.M, g.K = d.K, g.N = d.N;
  g.x = x;
  g.epilogue = epilogue;
  return g;
}

// Bias + activation epilogue that owns the bias converted to fp32 once per call.
template <typename T, Act A>
struct BiasAct {
  std::vector<float> bias_f32;
  BiasActEpilogue<T, A> epilogue;
  BiasAct(const T* bias, int64_t n, T* y) : bias_f32(ToF32Vector(bias, n)) {
    epilogue.bias = bias_f32.data();
    epilogue.y = y;
    epilogue.N = n;
  }
  BiasAct(const BiasAct&) = delete;
  BiasAct& operator=(const BiasAct&) = delete;
};

void RegisterLinearAct(Ort::CustomOpDomain& domain);
void RegisterSwiGLU(Ort::CustomOpDomain& domain);
void RegisterLoRALinear(Ort::CustomOpDomain& domain);

}  // namespace cpu
}  // namespace onnxfuse
