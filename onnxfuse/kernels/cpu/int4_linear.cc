// Int4Linear on the CPU EP: Y = X @ W^T with W[n, k] = (nibble(Wq, n, k) - zp) * scales[n, k / block], zp the block's
// zero point (zero_points [N, ceil(n_blocks / 2)], two a byte) or 8 without them.
//
// Tiles of rows x kColumns output columns on onnxruntime's pool. A tile converts its rows of X to fp32 once, then per
// column dequantizes that column's packed row into an fp32 buffer (both nibbles of a byte at once, the padding past K
// never read) and takes its dot products with the rows, four rows at a time (each weight loaded once for them), in
// independent partial sums so that the compiler vectorizes them without reassociating. `fuse --provider cpu` still
// leaves MatMulNBits to onnxruntime (cpu_policy.py): MLAS quantizes X to int8 and runs int8 dot products.
//
// SkipRMSNormInt4Linear and SkipRMSNormInt4SwiGLU: onnxruntime's residual add and RMS norm into sum and a buffer of
// the normed rows (both rounded to T, as onnxruntime's kernel rounds them), then the projection's tiles on the buffer.
//
// Int4SwiGLU: the same tiles, each column's gate and up rows dequantized side by side; the two dot products of a row
// meet in act(g) * u (common/gate_act.h, in fp32) and are written once.
#include <cstring>
#include <optional>
#include <vector>

#include "common/gate_act.h"
#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

constexpr int64_t kColumns = 16;
constexpr int kLanes = 16;

// One column's weights W[n, 0 .. K) in fp32 (zp: the column's packed zero points, or null for 8).
template <typename T>
void DequantizeColumn(const uint8_t* q, const T* s, const uint8_t* zp, int64_t K, int64_t block, float* w) {
  const int64_t half = block / 2;
  for (int64_t b0 = 0, kb = 0; kb < K; ++b0, kb += block) {
    const float sc = ToF32(s[b0]);
    const int zero = zp == nullptr ? 8 : int((zp[b0 >> 1] >> (4 * (b0 & 1))) & 15);
    const uint8_t* bytes = q + b0 * half;
    float* out = w + kb;
    const int64_t n = std::min(half, (K - kb + 1) / 2);
    for (int64_t j = 0; j < n; ++j) {
      out[2 * j] = float(int(bytes[j] & 15) - zero) * sc;
      out[2 * j + 1] = float(int(bytes[j] >> 4) - zero) * sc;
    }
  }
}

// Four rows' dot products with one column: each weight loaded once for the four.
void Dot4(const float* a, int64_t lda, const float* b, int64_t K, float out[4]) {
  constexpr int kL = kLanes / 2;
  float acc[4][kL] = {};
  int64_t k = 0;
  for (; k + kL <= K; k += kL)
    for (int j = 0; j < kL; ++j) {
      const float w = b[k + j];
      for (int r = 0; r < 4; ++r) acc[r][j] += a[r * lda + k + j] * w;
    }
  for (int r = 0; r < 4; ++r) {
    float sum = 0.f;
    for (int64_t t = k; t < K; ++t) sum += a[r * lda + t] * b[t];
    for (int j = 0; j < kL; ++j) sum += acc[r][j];
    out[r] = sum;
  }
}

float Dot(const float* a, const float* b, int64_t K) {
  float acc[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[k + j] * b[k + j];
  float sum = 0.f;
  for (; k < K; ++k) sum += a[k] * b[k];
  for (int j = 0; j < kLanes; ++j) sum += acc[j];
  return sum;
}

// Y [M, N] = X @ W^T over onnxruntime's pool (both Int4Linear ops).
template <typename T>
void RunInt4Linear(const OrtPool& pool, const LinearDims& d, const T* x, const uint8_t* wq, const T* scales,
                   const uint8_t* zp, T* y) {
  const int64_t K = d.K, N = d.N, block = d.r, n_blocks = (K + block - 1) / block;
  const int64_t row_bytes = n_blocks * block / 2, zp_bytes = (n_blocks + 1) / 2;
  ForTiles(pool, d.M, (N + kColumns - 1) / kColumns, [&](int64_t m0, int64_t mb, int64_t jb) {
    // padded to a whole block so that the dequantization may write the last block's second nibble
    std::vector<float> xf(size_t(mb * K)), w(size_t(n_blocks * block));
    for (int64_t i = 0; i < mb * K; ++i) xf[size_t(i)] = ToF32(x[m0 * K + i]);
    for (int64_t n = jb * kColumns; n < std::min(N, (jb + 1) * kColumns); ++n) {
      DequantizeColumn(wq + n * row_bytes, scales + n * n_blocks, zp ? zp + n * zp_bytes : nullptr, K, block, w.data());
      int64_t m = 0;
      for (; m + 4 <= mb; m += 4) {
        float out[4];
        Dot4(xf.data() + m * K, K, w.data(), K, out);
        for (int r = 0; r < 4; ++r) y[(m0 + m + r) * N + n] = FromF32<T>(out[r]);
      }
      for (; m < mb; ++m) y[(m0 + m) * N + n] = FromF32<T>(Dot(xf.data() + m * K, w.data(), K));
    }
  });
}

// Y [M, N] = act(X @ W_gate^T) * (X @ W_up^T) over onnxruntime's pool (both Int4SwiGLU ops).
template <typename T>
void RunInt4SwiGLU(const OrtPool& pool, const LinearDims& d, int act, const T* x, const uint8_t* wg, const T* sg,
                   const uint8_t* zg, const uint8_t* wu, const T* su, const uint8_t* zu, T* y) {
  const int64_t K = d.K, N = d.N, block = d.r, n_blocks = (K + block - 1) / block;
  const int64_t row_bytes = n_blocks * block / 2, zp_bytes = (n_blocks + 1) / 2;
  ForTiles(pool, d.M, (N + kColumns - 1) / kColumns, [&](int64_t m0, int64_t mb, int64_t jb) {
    std::vector<float> xf(size_t(mb * K)), g(size_t(n_blocks * block)), u(size_t(n_blocks * block));
    for (int64_t i = 0; i < mb * K; ++i) xf[size_t(i)] = ToF32(x[m0 * K + i]);
    for (int64_t n = jb * kColumns; n < std::min(N, (jb + 1) * kColumns); ++n) {
      DequantizeColumn(wg + n * row_bytes, sg + n * n_blocks, zg ? zg + n * zp_bytes : nullptr, K, block, g.data());
      DequantizeColumn(wu + n * row_bytes, su + n * n_blocks, zu ? zu + n * zp_bytes : nullptr, K, block, u.data());
      int64_t m = 0;
      for (; m + 4 <= mb; m += 4) {
        float og[4], ou[4];
        Dot4(xf.data() + m * K, K, g.data(), K, og);
        Dot4(xf.data() + m * K, K, u.data(), K, ou);
        for (int r = 0; r < 4; ++r) y[(m0 + m + r) * N + n] = FromF32<T>(GateActivation(act, og[r]) * ou[r]);
      }
      for (; m < mb; ++m) {
        const float* row = xf.data() + m * K;
        y[(m0 + m) * N + n] = FromF32<T>(GateActivation(act, Dot(row, g.data(), K)) * Dot(row, u.data(), K));
      }
    }
  });
}

// The norm ops' first step: sum = X + skip rounded to T, Xn = its RMS norm times gamma rounded to T, a row a task.
template <typename T>
void SkipNormRows(const OrtPool& pool, const T* x, const T* skip, const T* gamma, float eps, int64_t M, int64_t K,
                  T* sum, T* xn) {
  const std::vector<float> g = ToF32Vector(gamma, K);
  pool.For(M, [&](int64_t m) { SkipRmsNormRow(x + m * K, skip + m * K, g.data(), eps, K, sum + m * K, xn + m * K); });
}

template <typename T>
struct Int4LinearCpu {
  using Op = schema::Int4Linear;
  Int4LinearCpu(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, Op::kName)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<uint8_t>& Wq,
                      const Ort::Custom::Tensor<T>& Scales, std::optional<const Ort::Custom::Tensor<uint8_t>*> Zp,
                      Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = Int4LinearDims(Op::kName, X.Shape(), Wq.Shape(), Scales.Shape());
      const uint8_t* zp = Int4ZeroPoints(Op::kName, "zero_points", Zp, Wq.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      RunInt4Linear(OrtPool(ctx), d, X.Data(), Wq.Data(), Scales.Data(), zp, y);
    });
  }

  OpAttrs attrs;
};

template <typename T>
struct Int4SwiGLUCpu {
  using Op = schema::Int4SwiGLU;
  Int4SwiGLUCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), act(ReadGateActivation(api, info, Op::kName)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<uint8_t>& Wg,
                      const Ort::Custom::Tensor<T>& Sg, const Ort::Custom::Tensor<uint8_t>& Wu,
                      const Ort::Custom::Tensor<T>& Su, std::optional<const Ort::Custom::Tensor<uint8_t>*> Zg,
                      std::optional<const Ort::Custom::Tensor<uint8_t>*> Zu, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = Int4SwiGLUDims(Op::kName, X.Shape(), Wg.Shape(), Sg.Shape(), Wu.Shape(), Su.Shape());
      const auto [zg, zu] = Int4ZeroPointPair(Op::kName, Zg, Zu, Wg.Shape(), Wu.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      RunInt4SwiGLU(OrtPool(ctx), d, act, X.Data(), Wg.Data(), Sg.Data(), zg, Wu.Data(), Su.Data(), zu, y);
    });
  }

  OpAttrs attrs;
  int act;  // onnxfuse_gate_act, checked when the kernel is created
};

// SkipRMSNormInt4Linear: the norm into sum and a buffer, then Int4Linear's tiles on the buffer.
template <typename T>
struct SkipRMSNormInt4LinearCpu {
  using Op = schema::SkipRMSNormInt4Linear;
  SkipRMSNormInt4LinearCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), eps(ReadEpsilon(api, info, Op::kName)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Skip,
                      const Ort::Custom::Tensor<T>& Gamma, const Ort::Custom::Tensor<uint8_t>& Wq,
                      const Ort::Custom::Tensor<T>& Scales, std::optional<const Ort::Custom::Tensor<uint8_t>*> Zp,
                      Ort::Custom::Tensor<T>& Y, Ort::Custom::Tensor<T>& Sum) {
    return GuardCompute([&] {
      Int4SkipNormCheck(Op::kName, X.Shape(), Skip.Shape(), Gamma.Shape());
      const LinearDims d = Int4LinearDims(Op::kName, X.Shape(), Wq.Shape(), Scales.Shape());
      const uint8_t* zp = Int4ZeroPoints(Op::kName, "zero_points", Zp, Wq.Shape());
      T* y = Y.Allocate(d.out_shape);
      T* sum = Sum.Allocate(X.Shape());
      if (d.M == 0) return;
      const OrtPool pool(ctx);
      std::vector<T> xn(size_t(d.M * d.K));
      SkipNormRows(pool, X.Data(), Skip.Data(), Gamma.Data(), eps, d.M, d.K, sum, xn.data());
      if (d.N > 0) RunInt4Linear(pool, d, xn.data(), Wq.Data(), Scales.Data(), zp, y);
    });
  }

  OpAttrs attrs;
  float eps;
};

// SkipRMSNormInt4SwiGLU: the norm into sum and a buffer, then Int4SwiGLU's tiles on the buffer.
template <typename T>
struct SkipRMSNormInt4SwiGLUCpu {
  using Op = schema::SkipRMSNormInt4SwiGLU;
  SkipRMSNormInt4SwiGLUCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)),
        act(ReadGateActivation(api, info, Op::kName)),
        eps(ReadEpsilon(api, info, Op::kName)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Skip,
                      const Ort::Custom::Tensor<T>& Gamma, const Ort::Custom::Tensor<uint8_t>& Wg,
                      const Ort::Custom::Tensor<T>& Sg, const Ort::Custom::Tensor<uint8_t>& Wu,
                      const Ort::Custom::Tensor<T>& Su, std::optional<const Ort::Custom::Tensor<uint8_t>*> Zg,
                      std::optional<const Ort::Custom::Tensor<uint8_t>*> Zu, Ort::Custom::Tensor<T>& Y,
                      Ort::Custom::Tensor<T>& Sum) {
    return GuardCompute([&] {
      Int4SkipNormCheck(Op::kName, X.Shape(), Skip.Shape(), Gamma.Shape());
      const LinearDims d = Int4SwiGLUDims(Op::kName, X.Shape(), Wg.Shape(), Sg.Shape(), Wu.Shape(), Su.Shape());
      const auto [zg, zu] = Int4ZeroPointPair(Op::kName, Zg, Zu, Wg.Shape(), Wu.Shape());
      T* y = Y.Allocate(d.out_shape);
      T* sum = Sum.Allocate(X.Shape());
      if (d.M == 0) return;
      const OrtPool pool(ctx);
      std::vector<T> xn(size_t(d.M * d.K));
      SkipNormRows(pool, X.Data(), Skip.Data(), Gamma.Data(), eps, d.M, d.K, sum, xn.data());
      if (d.N > 0) RunInt4SwiGLU(pool, d, act, xn.data(), Wg.Data(), Sg.Data(), zg, Wu.Data(), Su.Data(), zu, y);
    });
  }

  OpAttrs attrs;
  int act;
  float eps;
};

}  // namespace

void RegisterInt4Linear(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<Int4LinearCpu>(domain, schema::Int4Linear::kName, kCpuEp);
  AddOpAllTypes<Int4SwiGLUCpu>(domain, schema::Int4SwiGLU::kName, kCpuEp);
  AddOpAllTypes<SkipRMSNormInt4LinearCpu>(domain, schema::SkipRMSNormInt4Linear::kName, kCpuEp);
  AddOpAllTypes<SkipRMSNormInt4SwiGLUCpu>(domain, schema::SkipRMSNormInt4SwiGLU::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
