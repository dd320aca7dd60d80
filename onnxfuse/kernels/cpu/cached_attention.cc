// CachedAttention on the CPU EP (onnxfuse/ops/cached_attention.py): rotary on the new query and key rows, the new
// key and value rows written into the present cache, causal attention of each query head over its KV head's keys.
//
// Decode is where onnxruntime's GroupQueryAttention loses on the CPU (270 us a layer at context 2048 on SmolLM2 in
// genai's own session), so calls are split by the work they have: the keys of each (sequence, KV head, query row)
// go in chunks over onnxruntime's intra-op threads (flash-decoding: each chunk's running max, sum and weighted values,
// combined after), and each key and value row is read once for the G query heads that share it. First prompts in
// fp32 (S > 1; every row a query; head sizes of 8 n, which it takes) go to onnxruntime's own kernel through
// InvokeOp: its MLAS GEMMs are faster at S x S scores than this loop, and its outputs on the valid rows are the same
// computation; the rows the op defines past them (Y's padding rows 0, present's rows after the new ones: past's,
// then 0) are set after it.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

// Rotary on x's first R dims (fp32, in place) with the cos/sin rows c and s ([R / 2]).
inline void Rotate(float* x, const float* c, const float* s, int64_t R, bool interleaved) {
  const int64_t half = R / 2;
  if (interleaved) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * c[i] - b * s[i];
      x[2 * i + 1] = b * c[i] + a * s[i];
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = x[i + half];
      x[i] = a * c[i] - b * s[i];
      x[i + half] = b * c[i] + a * s[i];
    }
  }
}

template <typename T>
void ToF32Row(const T* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ToF32<T>(src[i]);
}

// Where sequence b's rows go: its past length p (keys before the new rows) and its valid new rows.
struct SeqRows {
  int64_t past = 0, valid = 0;
};

std::vector<SeqRows> SequenceRows(const char* op, const CachedAttentionDims& d, const int32_t* seqlens) {
  std::vector<SeqRows> rows(size_t(d.B));
  for (int64_t b = 0; b < d.B; ++b) {
    const int64_t total = int64_t(seqlens[b]) + 1;
    SeqRows r;
    if (d.first) {
      r.past = 0, r.valid = total;
      detail::Need(total >= 1 && total <= d.S, op,
                   "a first prompt's seqlens_k[" + std::to_string(b) + "] + 1 = " + std::to_string(total) +
                       " must be in [1, S = " + std::to_string(d.S) + "]");
    } else {
      r.past = total - d.S, r.valid = d.S;
      detail::Need(r.past >= 0 && total <= d.L, op,
                   "seqlens_k[" + std::to_string(b) + "] + 1 = " + std::to_string(total) + " must be in [S = " +
                       std::to_string(d.S) + ", present rows " + std::to_string(d.L) + "] after a past");
    }
    detail::Need(r.past + r.valid <= d.positions, op,
                 "position " + std::to_string(r.past + r.valid - 1) + " is past cos_cache's " +
                     std::to_string(d.positions) + " rows");
    rows[size_t(b)] = r;
  }
  return rows;
}

// Present = past's rows, then zeros (each [P or L, D] plane of a (sequence, KV head)); nothing to do when present is
// past's own buffer.
template <typename T>
void FillPresent(const OrtPool& pool, const CachedAttentionDims& d, const T* past, T* present) {
  if (past == present) return;
  pool.For(d.B * d.Hkv, [&](int64_t plane) {
    const T* src = past + plane * d.P * d.D;
    T* dst = present + plane * d.L * d.D;
    std::memcpy(dst, src, size_t(d.P * d.D) * sizeof(T));
    std::memset(static_cast<void*>(dst + d.P * d.D), 0, size_t((d.L - d.P) * d.D) * sizeof(T));
  });
}

// The decode loop's core, fp32: a chunk of n keys K and values V ([n, D]) against G query heads q ([G, D]); out[g]
// gets (max, sum, weighted values [D]: zeroed by the caller) of head g over the chunk. NaN-propagating max,
// exp(score - max) computed as written: a NaN or +Inf score makes the head's result NaN, as softmax's; -Inf scores
// add nothing. GCC vector types over D in steps of 8 (D % 8 == 0), compiled per ISA (gemm.cc's families).
typedef float V8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) V8 Splat(float x) { return V8{x, x, x, x, x, x, x, x}; }

// e^x on 8 lanes (Cephes' expf: x = n ln2 + r, a degree-5 polynomial in r, times 2^n), within 2 ulp of std::exp on
// [-87.3, 88.4]; 0 below (the softmax weight of a score 87 below the max), +Inf above, NaN for NaN. The softmax's
// exp(score - max) per key is most of the decode loop's arithmetic at long contexts; std::exp per score took as
// long as reading the keys.
static inline __attribute__((always_inline)) V8 Exp8(V8 x) {
  const V8 hi = Splat(88.3762626647949f), lo = Splat(-87.3f);
  V8 xc = x > hi ? hi : x;
  xc = xc < lo ? lo : xc;
  const V8 fx = xc * Splat(1.44269504088896341f);
  I8 n = __builtin_convertvector(fx, I8);  // toward zero; then down to the floor
  V8 nf = __builtin_convertvector(n, V8);
  const I8 over = nf > fx;
  n += over;  // true lanes are -1
  nf = __builtin_convertvector(n, V8);
  const V8 r = xc - nf * Splat(0.693359375f) - nf * Splat(-2.12194440e-4f);
  V8 y = Splat(1.9875691500e-4f);
  y = y * r + Splat(1.3981999507e-3f);
  y = y * r + Splat(8.3334519073e-3f);
  y = y * r + Splat(4.1665795894e-2f);
  y = y * r + Splat(1.6666665459e-1f);
  y = y * r + Splat(5.0000001201e-1f);
  y = y * (r * r) + r + Splat(1.f);
  const I8 bits = (n + 127) << 23;
  V8 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  y *= scale;
  y = x < lo ? Splat(0.f) : y;
  y = x > hi ? Splat(INFINITY) : y;
  return x != x ? x : y;
}
inline float NanMax(float a, float b) { return std::isnan(a) || std::isnan(b) ? NAN : (a > b ? a : b); }

template <bool Vec>
inline __attribute__((always_inline)) float Dot(const float* a, const float* b, int64_t D) {
  if constexpr (Vec) {
    V8 s0 = {}, s1 = {}, x, y;
    int64_t e = 0;
    for (; e + 16 <= D; e += 16) {
      std::memcpy(&x, a + e, sizeof x), std::memcpy(&y, b + e, sizeof y);
      s0 += x * y;
      std::memcpy(&x, a + e + 8, sizeof x), std::memcpy(&y, b + e + 8, sizeof y);
      s1 += x * y;
    }
    if (e < D) {
      std::memcpy(&x, a + e, sizeof x), std::memcpy(&y, b + e, sizeof y);
      s0 += x * y;
    }
    s0 += s1;
    return ((s0[0] + s0[4]) + (s0[1] + s0[5])) + ((s0[2] + s0[6]) + (s0[3] + s0[7]));
  } else {
    float s = 0.f;
    for (int64_t e = 0; e < D; ++e) s += a[e] * b[e];
    return s;
  }
}

typedef float V4 __attribute__((vector_size(16)));

// The sums of a0..a3's lanes: pairs, then quads across two vectors, then the halves (shuffles, no horizontal add).
static inline __attribute__((always_inline)) V4 Sum4(V8 a0, V8 a1, V8 a2, V8 a3) {
  const V8 b01 = __builtin_shufflevector(a0, a1, 0, 8, 2, 10, 4, 12, 6, 14) +
                 __builtin_shufflevector(a0, a1, 1, 9, 3, 11, 5, 13, 7, 15);  // a0 pairs, a1 pairs interleaved
  const V8 b23 = __builtin_shufflevector(a2, a3, 0, 8, 2, 10, 4, 12, 6, 14) +
                 __builtin_shufflevector(a2, a3, 1, 9, 3, 11, 5, 13, 7, 15);
  const V8 c = __builtin_shufflevector(b01, b23, 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(b01, b23, 2, 3, 10, 11, 6, 7, 14, 15);  // [a0..a3 lanes 0-3, a0..a3 4-7]
  return __builtin_shufflevector(c, c, 0, 1, 2, 3) + __builtin_shufflevector(c, c, 4, 5, 6, 7);
}

// Scores of NG query heads q ([NG, D]) against n keys K ([n, D]): sc[g * np + j] = scale q_g . k_j. Four keys a
// step, each K vector loaded once for the NG heads into 4 NG accumulators (independent chains), reduced four at a
// time by Sum4: a dot's horizontal sum once per key instead of a reduction per (key, head).
template <int NG>
inline __attribute__((always_inline)) void Scores(const float* q, const float* K, int64_t n, int64_t D, float scale,
                                                  float* sc, int64_t np) {
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    V8 acc[NG][4] = {};
    const float* k0 = K + j * D;
    for (int64_t e = 0; e < D; e += 8) {
      V8 kv[4];
      for (int u = 0; u < 4; ++u) std::memcpy(&kv[u], k0 + u * D + e, sizeof(V8));
      for (int g = 0; g < NG; ++g) {
        V8 qv;
        std::memcpy(&qv, q + g * D + e, sizeof qv);
        for (int u = 0; u < 4; ++u) acc[g][u] += qv * kv[u];
      }
    }
    for (int g = 0; g < NG; ++g) {
      const V4 s4 = Sum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]) * scale;
      std::memcpy(sc + g * np + j, &s4, sizeof s4);
    }
  }
  for (; j < n; ++j)
    for (int g = 0; g < NG; ++g) sc[g * np + j] = Dot<true>(q + g * D, K + j * D, D) * scale;
}

// out_g[e0, e0 + 8 NV) = sum_j p_g[j] v_j[e0, e0 + 8 NV) for NG heads (weights p: [NG, np]; out_g at out + g *
// ostride): the NG x NV accumulators stay in registers over every key, each V vector loaded once for the NG heads.
template <int NG, int NV>
inline __attribute__((always_inline)) void Values(const float* p, int64_t np, const float* V, int64_t n, int64_t D,
                                                  int64_t e0, float* out, int64_t ostride) {
  V8 acc[NG][NV] = {};
  for (int64_t j = 0; j < n; ++j) {
    V8 v[NV];
    for (int k = 0; k < NV; ++k) std::memcpy(&v[k], V + j * D + e0 + 8 * k, sizeof(V8));
    for (int g = 0; g < NG; ++g) {
      const V8 w = Splat(p[g * np + j]);
      for (int k = 0; k < NV; ++k) acc[g][k] += w * v[k];
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int k = 0; k < NV; ++k) std::memcpy(out + g * ostride + e0 + 8 * k, &acc[g][k], sizeof(V8));
}

// Values<NG, nv> for a count nv in 1..NV known at run time only.
template <int NG, int NV>
inline __attribute__((always_inline)) void ValuesUpTo(int64_t nv, const float* p, int64_t np, const float* V, int64_t n,
                                                      int64_t D, int64_t e0, float* out, int64_t ostride) {
  if constexpr (NV > 1) {
    if (nv < NV) return ValuesUpTo<NG, NV - 1>(nv, p, np, V, n, D, e0, out, ostride);
  }
  Values<NG, NV>(p, np, V, n, D, e0, out, ostride);
}

// Values over D in slices of up to 8 MaxNV dims (MaxNV 8 where 32 vector registers hold 3 x 8 accumulators: one
// pass over V at D = 64; else 4, and the rest of a chunk's V rows come from cache in the next pass).
template <int NG, int MaxNV>
inline __attribute__((always_inline)) void ValuesSlices(const float* p, int64_t np, const float* V, int64_t n,
                                                        int64_t D, float* out, int64_t ostride) {
  for (int64_t e0 = 0; e0 < D; e0 += 8 * MaxNV)
    ValuesUpTo<NG, MaxNV>(std::min<int64_t>(MaxNV, (D - e0) / 8), p, np, V, n, D, e0, out, ostride);
}

// The chunk in two streams: every key's scores for the G heads (K read once, row after row), the softmax terms of
// each head's row of scores (its max, then exp(score - max) eight at a time), then every value row added with the G
// heads' weights (V read once). One sequential stream at a time keeps the hardware prefetcher ahead of the loop: a
// block-at-a-time loop that read K and V in turn ran at half the read rate with 30 layers' caches from memory. With
// vectors (D % 8 == 0) the heads go three at a time through Scores and ValuesSlices.
template <bool Vec, int MaxNV>
inline __attribute__((always_inline)) void ChunkTwoPass(const float* q, const float* K, const float* V, int64_t n,
                                                        int64_t G, int64_t D, float scale, float* out) {
  const int64_t np = (n + 7) / 8 * 8;
  std::vector<float> sc(static_cast<size_t>(G * np));
  if constexpr (Vec) {
    for (int64_t g0 = 0; g0 < G; g0 += 3) {
      const int64_t ng = std::min<int64_t>(3, G - g0);
      float* s = sc.data() + g0 * np;
      ng == 3   ? Scores<3>(q + g0 * D, K, n, D, scale, s, np)
      : ng == 2 ? Scores<2>(q + g0 * D, K, n, D, scale, s, np)
                : Scores<1>(q + g0 * D, K, n, D, scale, s, np);
    }
  } else {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t g = 0; g < G; ++g) sc[size_t(g * np + j)] = Dot<Vec>(q + g * D, K + j * D, D) * scale;
  }
  for (int64_t g = 0; g < G; ++g) {
    float* s = sc.data() + g * np;
    float* o = out + g * (2 + D);
    for (int64_t j = n; j < np; ++j) s[j] = -INFINITY;  // padding: weight 0
    float m = -INFINITY;
    if constexpr (Vec) {  // eight lanes of NaN-propagating max (a NaN lane stays NaN), then across them
      V8 m8 = Splat(-INFINITY);
      for (int64_t j = 0; j < np; j += 8) {
        V8 x;
        std::memcpy(&x, s + j, sizeof x);
        m8 = x != x ? x : (x > m8 ? x : m8);
      }
      for (int i = 0; i < 8; ++i) m = NanMax(m, m8[i]);
    } else {
      for (int64_t j = 0; j < n; ++j) m = NanMax(m, s[j]);
    }
    if (m == -INFINITY) {  // every key scores -Inf: nothing counts (weights 0)
      std::fill(s, s + np, 0.f);
      continue;
    }
    float l = 0.f;
    if constexpr (Vec) {
      V8 l8 = {};
      for (int64_t j = 0; j < np; j += 8) {
        V8 x;
        std::memcpy(&x, s + j, sizeof x);
        x = Exp8(x - m);  // +Inf - +Inf: NaN, as softmax's; the padding's -Inf: 0
        l8 += x;
        std::memcpy(s + j, &x, sizeof x);
      }
      l = ((l8[0] + l8[4]) + (l8[1] + l8[5])) + ((l8[2] + l8[6]) + (l8[3] + l8[7]));
    } else {
      for (int64_t j = 0; j < n; ++j) l += (s[j] = std::exp(s[j] - m));
    }
    o[0] = m;
    o[1] = l;
  }
  if constexpr (Vec) {
    for (int64_t g0 = 0; g0 < G; g0 += 3) {
      const int64_t ng = std::min<int64_t>(3, G - g0);
      const float* p = sc.data() + g0 * np;
      float* o = out + g0 * (2 + D) + 2;
      ng == 3   ? ValuesSlices<3, MaxNV>(p, np, V, n, D, o, 2 + D)
      : ng == 2 ? ValuesSlices<2, MaxNV>(p, np, V, n, D, o, 2 + D)
                : ValuesSlices<1, MaxNV>(p, np, V, n, D, o, 2 + D);
    }
  } else {
    for (int64_t j = 0; j < n; ++j) {
      const float* vr = V + j * D;
      for (int64_t g = 0; g < G; ++g) {
        const float p = sc[size_t(g * np + j)];
        float* acc = out + g * (2 + D) + 2;
        for (int64_t e = 0; e < D; ++e) acc[e] += p * vr[e];
      }
    }
  }
}

#define ONNXFUSE_DECODE_CHUNK(SUFFIX, ATTR, VEC, NV)                                                        \
  ATTR void Chunk_##SUFFIX(const float* q, const float* K, const float* V, int64_t n, int64_t G, int64_t D, \
                           float scale, float* out) {                                                       \
    ChunkTwoPass<VEC, NV>(q, K, V, n, G, D, scale, out);                                                    \
  }
ONNXFUSE_DECODE_CHUNK(avx512, __attribute__((target("avx512f,avx512vl,avx2,fma"))), true, 8)
ONNXFUSE_DECODE_CHUNK(avx2, __attribute__((target("avx2,fma"))), true, 4)
ONNXFUSE_DECODE_CHUNK(generic8, , true, 4)
ONNXFUSE_DECODE_CHUNK(generic, , false, 4)
#undef ONNXFUSE_DECODE_CHUNK

using ChunkFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t, float, float*);
// The host's variant (GemmIsa: the CPU kernels' family) for head size D: vectors where D % 8 == 0.
ChunkFn SelectChunk(int64_t D) {
  static const ChunkFn vec = [] {
    const std::string isa = GemmIsa();
    return isa == "avx512" ? Chunk_avx512 : isa == "avx2" ? Chunk_avx2 : Chunk_generic8;
  }();
  return D % 8 == 0 ? vec : Chunk_generic;
}

template <typename T>
struct CachedAttentionCpu {
  using Op = schema::CachedAttention;
  CachedAttentionCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)),
        heads(ReadNumHeads(api, info, Op::kName)),
        kv_heads(ReadIntAttr(api, info, schema::attr::kKvNumHeads, schema::attr::kKvNumHeadsDefault)),
        qk_scale(ReadQkScale(api, info)),
        interleaved(ReadIntAttr(api, info, schema::attr::kRotaryInterleaved, schema::attr::kRotaryInterleavedDefault) !=
                    0) {
    if constexpr (std::is_same_v<T, float>) prompt_op = CreatePromptOp(info);
  }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& Q, const Ort::Custom::Tensor<T>& PK,
                      const Ort::Custom::Tensor<T>& PV, const Ort::Custom::Tensor<int32_t>& SL,
                      const Ort::Custom::Tensor<int32_t>& TL, const Ort::Custom::Tensor<T>& Cos,
                      const Ort::Custom::Tensor<T>& Sin, Ort::Custom::Tensor<T>& Y, Ort::Custom::Tensor<T>& OK,
                      Ort::Custom::Tensor<T>& OV) {
    return GuardCompute([&] {
      detail::Need(TL.NumberOfElement() == 1, Op::kName,
                   "total_sequence_length must hold one value; got " + ShapeStr(TL.Shape()));
      const CachedAttentionDims d =
          CachedAttentionDimsOf(Op::kName, Q.Shape(), PK.Shape(), PV.Shape(), SL.Shape(), int64_t(TL.Data()[0]),
                                Cos.Shape(), Sin.Shape(), heads, kv_heads);
      const std::vector<SeqRows> rows = SequenceRows(Op::kName, d, SL.Data());
      T* y = Y.Allocate(d.y_shape);
      T* ok = OK.Allocate(d.present_shape);
      T* ov = OV.Allocate(d.present_shape);
      const OrtPool pool(ctx);
      if (prompt_op && d.S > 1 && d.first && d.D % 8 == 0) {  // onnxruntime's kernel: head sizes of 8 n
        RunPrompt(ctx, d, rows, y, ok, ov, PK.Data() == ok, PK.Data(), PV.Data());
        return;
      }
      FillPresent(pool, d, PK.Data(), ok);
      FillPresent(pool, d, PV.Data(), ov);
      std::vector<float> q = RotateAndAppend(pool, d, rows, Q.Data(), Cos.Data(), Sin.Data(), ok, ov);
      Attend(pool, d, rows, q.data(), ok, ov, y);
    });
  }

  // The new rows: each query head rotated into q ([B, S, H, D] fp32, returned), each key head rotated and stored in
  // present_key at the sequence's next row, each value head stored in present_value.
  std::vector<float> RotateAndAppend(const OrtPool& pool, const CachedAttentionDims& d,
                                     const std::vector<SeqRows>& rows, const T* query, const T* cos, const T* sin,
                                     T* ok, T* ov) const {
    std::vector<float> q(static_cast<size_t>(d.B * d.S * d.H * d.D));
    const int64_t width = (d.H + 2 * d.Hkv) * d.D, half = d.R / 2;
    pool.For(d.B * d.S, [&](int64_t bs) {
      const int64_t b = bs / d.S, s = bs % d.S;
      const SeqRows r = rows[size_t(b)];
      if (s >= r.valid) return;
      const int64_t pos = r.past + s;
      std::vector<float> c(static_cast<size_t>(half)), sn(c.size()), row(static_cast<size_t>(d.D));
      ToF32Row(cos + pos * half, c.data(), half);
      ToF32Row(sin + pos * half, sn.data(), half);
      const T* src = query + bs * width;
      for (int64_t h = 0; h < d.H; ++h) {
        float* qh = q.data() + (bs * d.H + h) * d.D;
        ToF32Row(src + h * d.D, qh, d.D);
        Rotate(qh, c.data(), sn.data(), d.R, interleaved);
      }
      for (int64_t h = 0; h < d.Hkv; ++h) {
        ToF32Row(src + (d.H + h) * d.D, row.data(), d.D);
        Rotate(row.data(), c.data(), sn.data(), d.R, interleaved);
        T* kdst = ok + ((b * d.Hkv + h) * d.L + pos) * d.D;
        for (int64_t e = 0; e < d.D; ++e) kdst[e] = FromF32<T>(row[size_t(e)]);
        std::memcpy(ov + ((b * d.Hkv + h) * d.L + pos) * d.D, src + (d.H + d.Hkv + h) * d.D, size_t(d.D) * sizeof(T));
      }
    });
    return q;
  }

  // Y: per (sequence, KV head, query row, key chunk) the G query heads' running max, sum and weighted values over the
  // chunk's keys (each key and value row converted once for the G heads), then the chunks combined per head. A NaN or
  // +Inf score makes the row NaN as softmax does (the max is taken first, then exp(score - max)); a chunk whose keys
  // all score -Inf adds nothing; a row whose keys all do is 0 / 0 = NaN, as softmax's.
  void Attend(const OrtPool& pool, const CachedAttentionDims& d, const std::vector<SeqRows>& rows, const float* q,
              const T* ok, const T* ov, T* y) const {
    const int64_t G = d.H / d.Hkv, D = d.D;
    const float scale = qk_scale != 0.f ? qk_scale : 1.f / std::sqrt(float(D));
    // decode: the keys in chunks (64 or more keys each) so that about 8 tasks a thread balance the pool; prompts: a
    // task per query row already
    int64_t longest = 0;
    for (const SeqRows& r : rows) longest = std::max(longest, r.past + r.valid);
    const int64_t want = (8 * int64_t(NumThreads()) + d.B * d.Hkv - 1) / (d.B * d.Hkv);
    const int64_t chunks = d.S == 1 ? std::max<int64_t>(1, std::min<int64_t>(want, (longest + 63) / 64)) : 1;
    const int64_t stride = 2 + D;  // m, l, acc[D] per head
    std::vector<float> part(static_cast<size_t>(d.B * d.Hkv * d.S * chunks * G * stride));
    pool.For(d.B * d.Hkv * d.S * chunks, [&](int64_t task) {
      const int64_t ch = task % chunks, s = (task / chunks) % d.S, kvh = (task / (chunks * d.S)) % d.Hkv,
                    b = task / (chunks * d.S * d.Hkv);
      const SeqRows r = rows[size_t(b)];
      float* out = part.data() + task * G * stride;
      for (int64_t g = 0; g < G; ++g) out[g * stride] = -INFINITY, out[g * stride + 1] = 0.f;
      if (s >= r.valid) return;
      const int64_t n = r.past + s + 1, per = (n + chunks - 1) / chunks;
      const int64_t j0 = ch * per, j1 = std::min(n, j0 + per);
      const float* qg = q + ((b * d.S + s) * d.H + kvh * G) * D;
      const T* K = ok + (b * d.Hkv + kvh) * d.L * D;
      const T* V = ov + (b * d.Hkv + kvh) * d.L * D;
      ChunkSoftmax(qg, K, V, j0, j1, G, D, scale, out);
    });
    pool.For(d.B * d.S, [&](int64_t bs) {
      const int64_t b = bs / d.S, s = bs % d.S;
      T* yr = y + bs * d.H * D;
      if (s >= rows[size_t(b)].valid) {
        for (int64_t e = 0; e < d.H * D; ++e) yr[e] = FromF32<T>(0.f);
        return;
      }
      std::vector<float> o(static_cast<size_t>(D));
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t kvh = h / G, g = h % G;
        auto at = [&](int64_t ch) {
          return part.data() + ((((b * d.Hkv + kvh) * d.S + s) * chunks + ch) * G + g) * stride;
        };
        float mx = -INFINITY;
        for (int64_t ch = 0; ch < chunks; ++ch) {
          const float m = at(ch)[0];
          mx = std::isnan(m) || m > mx ? m : mx;
        }
        float l = 0.f;
        std::fill(o.begin(), o.end(), 0.f);
        for (int64_t ch = 0; ch < chunks; ++ch) {
          const float* pc = at(ch);
          if (pc[1] == 0.f && pc[0] == -INFINITY) continue;  // no key of this chunk counts
          const float w = std::exp(pc[0] - mx);
          l += pc[1] * w;
          for (int64_t e = 0; e < D; ++e) o[size_t(e)] += pc[2 + e] * w;
        }
        for (int64_t e = 0; e < D; ++e) yr[h * D + e] = FromF32<T>(o[size_t(e)] / l);
      }
    });
  }

  // One chunk [j0, j1) of keys for G query heads qg ([G, D] fp32): out[g] = (max, sum, weighted values). 16-bit
  // caches are converted to fp32 a chunk at a time first.
  static void ChunkSoftmax(const float* qg, const T* K, const T* V, int64_t j0, int64_t j1, int64_t G, int64_t D,
                           float scale, float* out) {
    for (int64_t g = 0; g < G; ++g) std::fill(out + g * (2 + D) + 2, out + (g + 1) * (2 + D), 0.f);
    if constexpr (std::is_same_v<T, float>) {
      SelectChunk(D)(qg, K + j0 * D, V + j0 * D, j1 - j0, G, D, scale, out);
    } else {
      std::vector<float> kf(static_cast<size_t>((j1 - j0) * D)), vf(kf.size());
      ToF32Row(K + j0 * D, kf.data(), (j1 - j0) * D);
      ToF32Row(V + j0 * D, vf.data(), (j1 - j0) * D);
      SelectChunk(D)(qg, kf.data(), vf.data(), j1 - j0, G, D, scale, out);
    }
  }

  // ------------------------------------------------------------------ first prompts through onnxruntime's kernel
  // null on an onnxruntime without the contrib op: every call runs this file's loop then
  std::unique_ptr<Ort::Op> CreatePromptOp(const OrtKernelInfo* info) const {
    return GroupQueryAttentionOp(info, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, heads, kv_heads, interleaved, qk_scale);
  }

  void RunPrompt(OrtKernelContext* ctx, const CachedAttentionDims& d, const std::vector<SeqRows>& rows, T* y, T* ok,
                 T* ov, bool shared, const T* pk, const T* pv) const {
    auto mi = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
    const size_t ny = size_t(d.B * d.S * d.H * d.D), np = size_t(d.B * d.Hkv * d.L * d.D);
    Ort::Value yv = Ort::Value::CreateTensor<T>(mi, y, ny, d.y_shape.data(), d.y_shape.size());
    Ort::Value kv = Ort::Value::CreateTensor<T>(mi, ok, np, d.present_shape.data(), d.present_shape.size());
    Ort::Value vv = Ort::Value::CreateTensor<T>(mi, ov, np, d.present_shape.data(), d.present_shape.size());
    Ort::KernelContext kc(ctx);
    const OrtValue* ins[] = {kc.GetInput(0), nullptr,        nullptr,        kc.GetInput(1), kc.GetInput(2),
                             kc.GetInput(3), kc.GetInput(4), kc.GetInput(5), kc.GetInput(6)};
    OrtValue* outs[] = {yv, kv, vv};
    prompt_op->Invoke(ctx, ins, 9, outs, 3);
    // the rows the op defines past each sequence's valid ones (onnxruntime leaves them as they come)
    for (int64_t b = 0; b < d.B; ++b) {
      const SeqRows r = rows[size_t(b)];
      const int64_t end = r.past + r.valid;
      std::fill(y + (b * d.S + r.valid) * d.H * d.D, y + (b + 1) * d.S * d.H * d.D, FromF32<T>(0.f));
      if (shared) continue;
      for (int64_t h = 0; h < d.Hkv; ++h) {
        const int64_t plane = (b * d.Hkv + h);
        for (int64_t row = end; row < d.L; ++row)
          for (T* dst : {ok, ov}) {
            const T* src = dst == ok ? pk : pv;
            T* to = dst + (plane * d.L + row) * d.D;
            if (row < d.P)
              std::memcpy(to, src + (plane * d.P + row) * d.D, size_t(d.D) * sizeof(T));
            else
              std::fill(to, to + d.D, FromF32<T>(0.f));
          }
      }
    }
  }

  OpAttrs attrs;
  int64_t heads, kv_heads;
  float qk_scale;
  bool interleaved;
  std::unique_ptr<Ort::Op> prompt_op;
};

}  // namespace

void RegisterCachedAttention(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<CachedAttentionCpu>(domain, schema::CachedAttention::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
