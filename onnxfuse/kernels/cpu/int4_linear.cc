// Int4Linear on the CPU EP: Y = X @ W^T with W[n, k] = (nibble(Wq, n, k) - 8) * scales[n, k / block].
//
// Tiles of rows x kColumns output columns on onnxruntime's pool: a tile dequantizes its columns' weights once into an
// fp32 [K, kColumns] panel (the padding past K is never read), then accumulates X's rows against it in fp32. This is
// the reference-grade kernel: `fuse --provider cpu` leaves MatMulNBits to onnxruntime (cpu_policy.py), whose MLAS
// kernels quantize X to int8 and run int8 dot products.
#include <cstring>
#include <vector>

#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

constexpr int64_t kColumns = 32;

// W^T columns [n0, n0 + nc) as an fp32 panel [K, nc] (row k holds the nc columns' k-th weights).
template <typename T>
void DequantizePanel(const uint8_t* wq, const T* scales, int64_t K, int64_t n_blocks, int64_t block, int64_t n0,
                     int64_t nc, float* panel) {
  const int64_t row_bytes = n_blocks * block / 2;
  for (int64_t j = 0; j < nc; ++j) {
    const uint8_t* q = wq + (n0 + j) * row_bytes;
    const T* s = scales + (n0 + j) * n_blocks;
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t byte = q[k >> 1];
      const int v = (k & 1) ? (byte >> 4) : (byte & 15);
      panel[k * nc + j] = float(v - 8) * ToF32(s[k / block]);
    }
  }
}

template <typename T>
struct Int4LinearCpu {
  using Op = schema::Int4Linear;
  Int4LinearCpu(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, Op::kName)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<uint8_t>& Wq,
                      const Ort::Custom::Tensor<T>& Scales, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = Int4LinearDims(Op::kName, X.Shape(), Wq.Shape(), Scales.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      const T* x = X.Data();
      const uint8_t* wq = Wq.Data();
      const T* scales = Scales.Data();
      const int64_t K = d.K, N = d.N, block = d.r, n_blocks = (K + block - 1) / block;
      const int64_t col_blocks = (N + kColumns - 1) / kColumns;
      const OrtPool pool(ctx);
      ForTiles(pool, d.M, col_blocks, [&](int64_t m0, int64_t mb, int64_t jb) {
        const int64_t n0 = jb * kColumns, nc = std::min(kColumns, N - n0);
        std::vector<float> panel(size_t(K * nc));
        DequantizePanel(wq, scales, K, n_blocks, block, n0, nc, panel.data());
        float acc[kColumns];
        for (int64_t m = m0; m < m0 + mb; ++m) {
          std::fill(acc, acc + kColumns, 0.f);
          const T* xr = x + m * K;
          for (int64_t k = 0; k < K; ++k) {
            const float xv = ToF32(xr[k]);
            const float* w = panel.data() + k * nc;
            for (int64_t j = 0; j < nc; ++j) acc[j] += xv * w[j];
          }
          for (int64_t j = 0; j < nc; ++j) y[m * N + n0 + j] = FromF32<T>(acc[j]);
        }
      });
    });
  }

  OpAttrs attrs;
};

}  // namespace

void RegisterInt4Linear(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<Int4LinearCpu>(domain, schema::Int4Linear::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
