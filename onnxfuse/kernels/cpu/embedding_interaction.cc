// EmbeddingInteraction and EmbeddingBagInteraction on the CPU EP (onnxfuse/schema.py): per sample, the dense vector
// and every feature's embedding (one row, or the fp32 sum of a bag's rows rounded to T as the unfused graph stores
// it) go into a small fp32 buffer, then the output row is written: the strict lower triangle of the pairwise dot
// products after the dense vector (dot), or the vectors one after the other (cat, copied in T without a round
// trip). One pass over the samples, split across onnxruntime's intra-op threads; nothing is allocated per sample.
//
// The dot products are computed from the vectors transposed (vt[c][j] = v_j[c]): for each i the products with every
// j < i are one vectorisable multiply-add per component, no horizontal sums. That loop is compiled for AVX-512,
// AVX2+FMA and baseline x86-64 and chosen like the GEMM's micro-kernel (GemmIsa, ONNXFUSE_CPU_ISA).
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

// out[i(i-1)/2 + j] = sum_c vt[c * ldt + i] * vt[c * ldt + j] for 0 <= j < i < n (fp32, c in order). Made 16 columns
// j at a time for 4 rows i at once over the zero-padded transpose (ldt >= n + 3, a multiple of 16, so rows past n
// read zeros): GCC vector types give 8 independent vector accumulators per step, which hides the multiply-add
// latency; the loop has no tail.
typedef float V8 __attribute__((vector_size(32)));
// A broadcast (one vbroadcastss from memory), not V8{} + x: that is a real add (0 + x), plus a register broadcast.
static inline __attribute__((always_inline)) V8 Splat8(float x) { return V8{x, x, x, x, x, x, x, x}; }
#define ONNXFUSE_TRI_DOTS(SUFFIX, ATTR)                                                        \
  ATTR void TriDots_##SUFFIX(const float* vt, int64_t n, int64_t d, int64_t ldt, float* out) { \
    for (int64_t j0 = 0; j0 + 1 < n; j0 += 16) {                                               \
      for (int64_t i0 = j0 + 1; i0 < n; i0 += 4) {                                             \
        V8 a00 = {}, a01 = {}, a10 = {}, a11 = {}, a20 = {}, a21 = {}, a30 = {}, a31 = {};     \
        for (int64_t c = 0; c < d; ++c) {                                                      \
          const float* col = vt + c * ldt;                                                     \
          V8 r0, r1;                                                                           \
          std::memcpy(&r0, col + j0, sizeof r0);                                               \
          std::memcpy(&r1, col + j0 + 8, sizeof r1);                                           \
          const V8 b0 = Splat8(col[i0]), b1 = Splat8(col[i0 + 1]);                             \
          const V8 b2 = Splat8(col[i0 + 2]), b3 = Splat8(col[i0 + 3]);                         \
          a00 += b0 * r0, a01 += b0 * r1, a10 += b1 * r0, a11 += b1 * r1;                      \
          a20 += b2 * r0, a21 += b2 * r1, a30 += b3 * r0, a31 += b3 * r1;                      \
        }                                                                                      \
        float acc[4][16];                                                                      \
        std::memcpy(acc[0], &a00, 32), std::memcpy(acc[0] + 8, &a01, 32);                      \
        std::memcpy(acc[1], &a10, 32), std::memcpy(acc[1] + 8, &a11, 32);                      \
        std::memcpy(acc[2], &a20, 32), std::memcpy(acc[2] + 8, &a21, 32);                      \
        std::memcpy(acc[3], &a30, 32), std::memcpy(acc[3] + 8, &a31, 32);                      \
        for (int64_t r = 0; r < 4 && i0 + r < n; ++r) {                                        \
          const int64_t i = i0 + r, m = i - j0 < 16 ? i - j0 : 16;                             \
          float* o = out + i * (i - 1) / 2 + j0;                                               \
          if (m == 16) {                                                                       \
            std::memcpy(o, acc[r], 16 * sizeof(float));                                        \
          } else {                                                                             \
            for (int64_t q = 0; q < m; ++q) o[q] = acc[r][q];                                  \
          }                                                                                    \
        }                                                                                      \
      }                                                                                        \
    }                                                                                          \
  }
ONNXFUSE_TRI_DOTS(avx512, __attribute__((target("avx512f,avx512vl,avx2,fma"))))
ONNXFUSE_TRI_DOTS(avx2, __attribute__((target("avx2,fma"))))
ONNXFUSE_TRI_DOTS(generic, )
#undef ONNXFUSE_TRI_DOTS

using TriDotsFn = void (*)(const float*, int64_t, int64_t, int64_t, float*);
TriDotsFn SelectTriDots() {
  static const TriDotsFn fn = [] {
    const std::string isa = GemmIsa();
    return isa == "avx512" ? TriDots_avx512 : isa == "avx2" ? TriDots_avx2 : TriDots_generic;
  }();
  return fn;
}

// Everything one call needs; ids is [B, F] (one id per feature) or, for bags, indices [F, N] or [1, N] with offsets
// [F, B] or [F, B + 1] (EmbeddingDims).
template <typename T>
struct Call {
  EmbeddingDims e;
  int interaction = ONNXFUSE_INTERACTION_DOT;
  int hash = ONNXFUSE_HASH_NONE;
  bool bag = false;
  const T* x = nullptr;
  const int64_t* ids = nullptr;
  const int64_t* offsets = nullptr;
  const T* table = nullptr;
  const int64_t* table_offsets = nullptr;
  const int64_t* cardinality = nullptr;
  T* y = nullptr;
};

template <typename T>
struct SampleBuffers {
  std::vector<float> vt, tri, sum;
  std::vector<T> rounded;
  std::vector<int64_t> rows;
};

// Feature f of sample b as T values (the looked-up row, a zero vector, or the rounded bag sum) into `dst`.
template <typename T>
void Feature(const Call<T>& c, int64_t b, int64_t f, SampleBuffers<T>& buf, T* dst) {
  const EmbeddingDims& e = c.e;
  const int64_t d = e.d;
  if (!c.bag) {
    const int64_t row = onnxfuse_embedding_row(c.ids[b * e.F + f], c.hash, c.cardinality[f], c.table_offsets[f], e.R);
    if (row < 0) {
      std::fill(dst, dst + d, FromF32<T>(0.0f));
    } else {
      std::memcpy(static_cast<void*>(dst), c.table + row * d, size_t(d) * sizeof(T));
    }
    return;
  }
  const int64_t* offs = c.offsets + f * e.offset_cols;
  const int64_t start = std::clamp<int64_t>(offs[b], 0, e.N);
  const int64_t end = b + 1 < e.offset_cols ? std::clamp<int64_t>(offs[b + 1], 0, e.N) : e.N;
  float* s = buf.sum.data();
  std::fill(s, s + d, 0.0f);
  const int64_t* idx = c.ids + f * e.index_stride;
  for (int64_t p = start; p < end; ++p) {
    const int64_t row = onnxfuse_embedding_row(idx[p], ONNXFUSE_HASH_NONE, c.cardinality[f], c.table_offsets[f], e.R);
    if (row < 0) continue;
    const T* r = c.table + row * d;
    for (int64_t k = 0; k < d; ++k) s[k] += ToF32<T>(r[k]);
  }
  for (int64_t k = 0; k < d; ++k) dst[k] = FromF32<T>(s[k]);
}

template <typename T>
void RunSamples(const Call<T>& c, int64_t b0, int64_t b1) {
  const EmbeddingDims& e = c.e;
  const int64_t d = e.d, n = e.F + 1, ldt = (n + 3 + 15) / 16 * 16;  // TriDots reads up to column n + 2
  static thread_local SampleBuffers<T> buf;
  const bool dot = c.interaction == ONNXFUSE_INTERACTION_DOT;
  buf.sum.resize(size_t(d));
  buf.rounded.resize(size_t(d));
  buf.rows.resize(size_t(e.F));
  int64_t* rows = buf.rows.data();
  if (dot) {
    buf.vt.assign(size_t(d * ldt), 0.0f);
    buf.tri.resize(size_t(n * (n - 1) / 2));
  }
  const TriDotsFn tri_dots = SelectTriDots();
  for (int64_t b = b0; b < b1; ++b) {
    T* out = c.y + b * e.width;
    const T* xb = c.x + b * d;
    std::memcpy(static_cast<void*>(out), xb, size_t(d) * sizeof(T));
    if (!dot) {
      for (int64_t f = 0; f < e.F; ++f) Feature(c, b, f, buf, out + (f + 1) * d);
      continue;
    }
    float* vt = buf.vt.data();
    for (int64_t k = 0; k < d; ++k) vt[k * ldt] = ToF32<T>(xb[k]);
    if (!c.bag) {  // one row per feature: its rows first (independent hashes), then read straight into vt
      for (int64_t f = 0; f < e.F; ++f) {
        rows[f] = onnxfuse_embedding_row(c.ids[b * e.F + f], c.hash, c.cardinality[f], c.table_offsets[f], e.R);
        if (rows[f] >= 0) __builtin_prefetch(c.table + rows[f] * d);  // the random rows' misses overlap
      }
      for (int64_t f = 0; f < e.F; ++f) {
        const T* r = rows[f] < 0 ? nullptr : c.table + rows[f] * d;
        for (int64_t k = 0; k < d; ++k) vt[k * ldt + f + 1] = r == nullptr ? 0.0f : ToF32<T>(r[k]);
      }
    } else {
      for (int64_t f = 0; f < e.F; ++f) {
        T* r = buf.rounded.data();
        Feature(c, b, f, buf, r);
        for (int64_t k = 0; k < d; ++k) vt[k * ldt + f + 1] = ToF32<T>(r[k]);
      }
    }
    T* z = out + d;
    if constexpr (std::is_same_v<T, float>) {  // the dots are the output: no copy
      tri_dots(vt, n, d, ldt, z);
      continue;
    }
    tri_dots(vt, n, d, ldt, buf.tri.data());
    const float* t = buf.tri.data();
    for (int64_t k = 0, p = n * (n - 1) / 2; k < p; ++k) z[k] = FromF32<T>(t[k]);
  }
}

template <typename T>
void Run(const Call<T>& c, const ParallelRunner& pool) {
  const EmbeddingDims& e = c.e;
  if (e.B == 0 || e.width == 0) return;
  const int64_t n = e.F + 1;
  const int64_t per_feature = e.index_stride > 0 || e.F == 0 ? e.N : e.N / e.F;  // one shared row: F tables' ids
  const int64_t bag_len = c.bag && e.B > 0 ? std::max<int64_t>(1, per_feature / e.B) : 1;
  // Work per sample in multiply-adds, for chunks of about 32K of them (a few microseconds each).
  const int64_t per_sample =
      (c.interaction == ONNXFUSE_INTERACTION_DOT ? n * (n - 1) / 2 * e.d : 0) + e.F * e.d * bag_len + n * e.d;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(per_sample, 1));
  ParallelRanges(pool, e.B, grain, [&](int64_t b0, int64_t b1) { RunSamples(c, b0, b1); });
}

template <typename T>
struct EmbeddingInteractionCpu {
  using Op = schema::EmbeddingInteraction;
  EmbeddingInteractionCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)),
        interaction(ReadInteraction(api, info, Op::kName)),
        hash(ReadHash(api, info, Op::kName)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<int64_t>& ids,
                      const Ort::Custom::Tensor<T>& table, const Ort::Custom::Tensor<int64_t>& table_offsets,
                      const Ort::Custom::Tensor<int64_t>& cardinality, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      Call<T> c;
      c.e = EmbeddingOpDims(Op::kName, interaction, X.Shape(), ids.Shape(), nullptr, table.Shape(),
                            table_offsets.Shape(), cardinality.Shape());
      c.interaction = interaction;
      c.hash = hash;
      c.y = Y.Allocate(c.e.out_shape);
      if (c.e.B == 0) return;
      c.x = X.Data();
      c.ids = ids.Data();
      c.table = c.e.R > 0 ? table.Data() : nullptr;
      c.table_offsets = table_offsets.Data();
      c.cardinality = cardinality.Data();
      const OrtPool pool(ctx);
      Run(c, pool);
    });
  }

  OpAttrs attrs;  // backend is irrelevant once the node sits on the CPU EP (see common/attrs.h)
  int interaction;
  int hash;
};

template <typename T>
struct EmbeddingBagInteractionCpu {
  using Op = schema::EmbeddingBagInteraction;
  EmbeddingBagInteractionCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), interaction(ReadInteraction(api, info, Op::kName)) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X,
                      const Ort::Custom::Tensor<int64_t>& indices, const Ort::Custom::Tensor<int64_t>& offsets,
                      const Ort::Custom::Tensor<T>& table, const Ort::Custom::Tensor<int64_t>& table_offsets,
                      const Ort::Custom::Tensor<int64_t>& cardinality, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      Call<T> c;
      const std::vector<int64_t> offsets_shape = offsets.Shape();
      c.e = EmbeddingOpDims(Op::kName, interaction, X.Shape(), indices.Shape(), &offsets_shape, table.Shape(),
                            table_offsets.Shape(), cardinality.Shape());
      c.interaction = interaction;
      c.bag = true;
      c.y = Y.Allocate(c.e.out_shape);
      if (c.e.B == 0) return;
      c.x = X.Data();
      c.ids = c.e.N > 0 ? indices.Data() : nullptr;
      c.offsets = offsets.Data();
      c.table = c.e.R > 0 ? table.Data() : nullptr;
      c.table_offsets = table_offsets.Data();
      c.cardinality = cardinality.Data();
      const OrtPool pool(ctx);
      Run(c, pool);
    });
  }

  OpAttrs attrs;
  int interaction;
};

}  // namespace

void RegisterEmbeddingInteraction(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<EmbeddingInteractionCpu>(domain, schema::EmbeddingInteraction::kName, kCpuEp);
  AddOpAllTypes<EmbeddingBagInteractionCpu>(domain, schema::EmbeddingBagInteraction::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
