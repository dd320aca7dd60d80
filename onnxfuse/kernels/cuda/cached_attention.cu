// CachedAttention on the CUDA execution provider, in one file: the launchers' C declarations below, then the nvcc half
// (the CUDA kernels) and the host half (the CUDA EP glue and the Triton launcher); cuda/cuda.cmake says how it is
// built.
#include "cuda/launch.h"

extern "C" {
// CachedAttention (onnxfuse/ops/cached_attention.py), packed QKV `query` [B, S, (H + 2 Hkv) D], past_key/value
// [B, Hkv, P, D], seqlens_k [B] (device int32), cos/sin [positions, R / 2]; Y [B, S, H D], present_key/value
// [B, Hkv, L, D]. `first`: a first prompt (S == total_sequence_length). Sequence b's rows: a first prompt's are its
// first seqlens_k[b] + 1 at positions 0..; a later call's all S at p_b = seqlens_k[b] + 1 - S. Lengths that do not fit
// (negative p_b, rows past L or past cos's positions: the CPU kernel's errors) leave that sequence's Y rows 0 and
// present unchanged past its copy of past: device data cannot raise an error without a synchronisation.
struct OnnxfuseCachedAttentionArgs {
  int64_t B, S, H, Hkv, D, P, L, R, positions;
  int first, interleaved;
  float scale;  // > 0
};
// Scratch bytes a call needs (the rotated queries and the split-KV partials), or a negative error code.
int64_t onnxfuse_cuda_cached_attention_scratch_bytes(const struct OnnxfuseCachedAttentionArgs* a);
int onnxfuse_cuda_cached_attention(int dtype, const struct OnnxfuseCachedAttentionArgs* a, const void* query,
                                   const void* past_key, const void* past_value, const int32_t* seqlens,
                                   const void* cos, const void* sin, void* y, void* present_key, void* present_value,
                                   void* scratch, void* stream);
// The Triton launcher (the host half, Triton builds only): the split-KV partials by triton/cached_attention.py, the
// rest (present, rotary, the combine) by the CUDA kernels.
int onnxfuse_triton_cached_attention(int dtype, const struct OnnxfuseCachedAttentionArgs* a, const void* query,
                                     const void* past_key, const void* past_value, const int32_t* seqlens,
                                     const void* cos, const void* sin, void* y, void* present_key, void* present_value,
                                     void* scratch, void* stream);
// The CUDA kernels' steps the Triton launcher shares: present from past and the new rows (rotated keys), the rotated
// queries in fp32 (scratch), and the combine of `splits` partials into Y.
int onnxfuse_cuda_cached_attention_prepare(int dtype, const struct OnnxfuseCachedAttentionArgs* a, const void* query,
                                           const void* past_key, const void* past_value, const int32_t* seqlens,
                                           const void* cos, const void* sin, void* present_key, void* present_value,
                                           float* q_rot, void* stream);
int onnxfuse_cuda_cached_attention_combine(int dtype, const struct OnnxfuseCachedAttentionArgs* a,
                                           const int32_t* seqlens, const float* partials, int64_t splits, void* y,
                                           void* stream);
// After onnxruntime's GroupQueryAttention ran a call for the op (InvokeOp, the host half): the rows the op defines
// and onnxruntime leaves as they come, Y's rows past each sequence's valid ones (0) and, where present is not
// past's own buffer, present's rows past each sequence's end (past's rows, then 0).
int onnxfuse_cuda_cached_attention_prompt_fixup(int dtype, const struct OnnxfuseCachedAttentionArgs* a,
                                                const int32_t* seqlens, const void* past_key, const void* past_value,
                                                void* y, void* present_key, void* present_value, void* stream);
// How many key splits a call's partials take (the same for both launchers; the scratch is planned with it).
int64_t onnxfuse_cached_attention_splits(const struct OnnxfuseCachedAttentionArgs* a);
}

#ifdef __CUDACC__
// The CUDA backend. A decode step (S = 1) whose head size suits 16-byte row loads (D / E from 8 to 32 lanes, G <= 8;
// fp16 / bf16 D 64 or 128, fp32 D 128) is one kernel, DecodeAttention (below: rotary, the new row stored, split-KV
// attention and the splits' combine, in a thread-block cluster on sm_90), after a copy of past into present where they
// are not one buffer. Any other call, three steps:
//   prepare: present = past's rows then zeros (skipped where present is past's own buffer), then each new row's key
//            heads rotated and stored, value heads stored, query heads rotated into fp32 scratch;
//   partial: per (sequence, KV head, query row, key split) SplitPartial (the shapes above) or Partial (a warp per query
//            head, a key at a time, a lane holding D / 32 elements), the running max, sum and weighted values in fp32;
//   combine: per (sequence, row, head) the splits' partials into Y (rows past a sequence's valid ones: 0).
// Correct for any S, but a prompt's S x S scores are a key at a time here: backend auto (the host half) hands first
// prompts to onnxruntime's own CUDA GroupQueryAttention (InvokeOp).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "gemm.h"  // to_f / from_f

namespace {

using onnxfuse::cuda_kernels::from_f;
using onnxfuse::cuda_kernels::to_f;
using Args = OnnxfuseCachedAttentionArgs;

constexpr int kMaxPerLane = 8;  // D <= 256
constexpr int kWarps = 4;

// Sequence b's past length and valid rows, and whether they fit (the CPU kernel's checks).
struct Rows {
  int64_t past, valid;
  bool ok;
};
__device__ inline Rows RowsOf(const Args& a, const int32_t* seqlens, int64_t b) {
  const int64_t total = int64_t(seqlens[b]) + 1;
  Rows r;
  if (a.first) {
    r.past = 0, r.valid = total;
    r.ok = total >= 1 && total <= a.S;
  } else {
    r.past = total - a.S, r.valid = a.S;
    r.ok = r.past >= 0 && total <= a.L;
  }
  r.ok = r.ok && r.past + r.valid <= a.positions;
  return r;
}

template <typename T>
__global__ void FillPresent(const T* __restrict__ past, T* __restrict__ present, Args a) {
  const int64_t total = a.B * a.Hkv * a.L * a.D;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t e = i % a.D, row = (i / a.D) % a.L, plane = i / (a.D * a.L);
    present[i] = row < a.P ? past[(plane * a.P + row) * a.D + e] : from_f<T>(0.f);
  }
}

// One block per (sequence, new row, head of the packed row), a thread per pair of its dims: rotary on query and key
// heads, the key and value heads stored in present, the query heads in fp32 scratch.
template <typename T>
__global__ void RotateAppend(const T* __restrict__ query, const int32_t* __restrict__ seqlens, const T* __restrict__ cs,
                             const T* __restrict__ sn, T* __restrict__ pk, T* __restrict__ pv,
                             float* __restrict__ q_rot, Args a) {
  const int64_t heads = a.H + 2 * a.Hkv, row = blockIdx.x / heads, head = blockIdx.x % heads;
  const int64_t b = row / a.S, s = row % a.S;
  const Rows r = RowsOf(a, seqlens, b);
  if (!r.ok || s >= r.valid) return;
  const int64_t pos = r.past + s, half = a.R / 2;
  const T* src = query + row * heads * a.D + head * a.D;
  // pairs (i, i + R / 2) (halves) or (2i, 2i + 1) (interleaved) of the first R dims, rotated by cos/sin row pos,
  // column i; the dims past R as pairs (R + 2j, R + 2j + 1), copied; value heads copied
  for (int64_t i = threadIdx.x; i < a.D / 2; i += blockDim.x) {
    const bool rotated = i < half;
    const int64_t i0 = a.interleaved ? 2 * i : (rotated ? i : a.R + 2 * (i - half));
    const int64_t i1 = a.interleaved || !rotated ? i0 + 1 : i + half;
    float x0 = to_f(src[i0]), x1 = to_f(src[i1]);
    if (rotated && head < a.H + a.Hkv) {
      const float c = to_f(cs[pos * half + i]), sv = to_f(sn[pos * half + i]);
      const float y0 = x0 * c - x1 * sv, y1 = x1 * c + x0 * sv;
      x0 = y0, x1 = y1;
    }
    if (head < a.H) {
      float* q = q_rot + (row * a.H + head) * a.D;
      q[i0] = x0, q[i1] = x1;
    } else {
      const bool is_key = head < a.H + a.Hkv;
      const int64_t kvh = is_key ? head - a.H : head - a.H - a.Hkv;
      T* dst = (is_key ? pk : pv) + ((b * a.Hkv + kvh) * a.L + pos) * a.D;
      dst[i0] = from_f<T>(x0), dst[i1] = from_f<T>(x1);
    }
  }
}

__device__ inline float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// max(x, y), NaN where either is NaN (one instruction from sm_80: max.NaN)
__device__ inline float NanMax(float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(x), "f"(y));
  return r;
#else
  return isnan(x) || isnan(y) ? NAN : fmaxf(x, y);
#endif
}

// Partials [B, Hkv, S, splits, G, 2 + D]: max, sum, weighted values of the split's keys for each query head.
template <typename T>
__global__ void Partial(const float* __restrict__ q_rot, const int32_t* __restrict__ seqlens, const T* __restrict__ pk,
                        const T* __restrict__ pv, float* __restrict__ part, int64_t splits, Args a) {
  const int64_t split = blockIdx.y, task = blockIdx.x;  // task = (b, kvh, s)
  const int64_t s = task % a.S, kvh = (task / a.S) % a.Hkv, b = task / (a.S * a.Hkv);
  const int64_t G = a.H / a.Hkv, stride = 2 + a.D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const Rows r = RowsOf(a, seqlens, b);
  const int64_t n = (r.ok && s < r.valid) ? r.past + s + 1 : 0;
  const int64_t per = (n + splits - 1) / splits, j0 = split * per, j1 = j0 + per < n ? j0 + per : n;
  const T* K = pk + (b * a.Hkv + kvh) * a.L * a.D;
  const T* V = pv + (b * a.Hkv + kvh) * a.L * a.D;
  const int per_lane = int((a.D + 31) / 32);
  for (int64_t g = warp; g < G; g += kWarps) {
    const float* q = q_rot + ((b * a.S + s) * a.H + kvh * G + g) * a.D;
    float qv[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t e = lane + 32 * i;
      qv[i] = (i < per_lane && e < a.D) ? q[e] : 0.f;
      acc[i] = 0.f;
    }
    float m = -INFINITY, l = 0.f;
    for (int64_t j = j0; j < j1; ++j) {
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int64_t e = lane + 32 * i;
        if (i < per_lane && e < a.D) dot += qv[i] * to_f(K[j * a.D + e]);
      }
      const float sc = WarpSum(dot) * a.scale;
      const float m_new = NanMax(m, sc);
      if (m_new == -INFINITY) continue;  // every key so far scores -Inf
      const float corr = m == -INFINITY ? 0.f : __expf(m - m_new);
      const float p = __expf(sc - m_new);  // +Inf - +Inf: NaN, as softmax's
      m = m_new;
      l = l * corr + p;
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int64_t e = lane + 32 * i;
        if (i < per_lane && e < a.D) acc[i] = acc[i] * corr + p * to_f(V[j * a.D + e]);
      }
    }
    float* out = part + ((task * splits + split) * G + g) * stride;
    if (lane == 0) out[0] = m, out[1] = l;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t e = lane + 32 * i;
      if (i < per_lane && e < a.D) out[2 + e] = acc[i];
    }
  }
}

// The split-KV form of Partial for D / E a power of two from 8 to 32 (E = 16 bytes of T, 8 fp16 or 4 fp32 elements:
// D 64 or 128 in fp16, 128 in fp32) and G <= GM query heads a KV head: a block of kSplitThreads (DecodeAttention's
// clustered form: 128 or 256) per (sequence, KV head, row, split) in groups of D / E lanes, a group per key at a time
// (SplitKeys): each lane one 16-byte load of the key row and one of the value row (kUnroll keys a step, all issued
// before any is used: the loads stream the cache), E multiply-adds a head, the group's dot by shuffles, then the
// group's own running max, sum and weighted values for each of the G heads (flash-decoding inside the block, no barrier
// in the loop); the groups merged through shared memory (MergeGroups). Every key row is read once for all G heads of
// its KV head. Same NaN and -Inf rules as Partial.
//   SplitPartial: the queries rotated in fp32 scratch by RotateAppend, the partials out for Combine (any S).
//   DecodeAttention (S == 1, the decode step): the whole node in one kernel, a block per (sequence, query head,
//     split): each block issues its first step's loads, then rotates its query head from the packed input; the split
//     holding the new row rotates its key (present gets it and the value from the KV head's first query head); then
//     the splits are combined into Y: on sm_90 the splits of a (sequence, query head) are one thread-block cluster and
//     its first block reads the others' partials from their shared memory; else each block's partial goes out and the
//     last block of the task to finish (a counter per task, zeroed by the launcher) combines them (the kernel's own
//     comment has the details). The clustered form launches as a programmatic dependent (LaunchDependent's rule): it
//     waits before its first read and lets the kernel after it start at once (genai's int4 7B-shape model at batch 1
//     in genai's graph: 1.941 / 1.979 against 2.006 / 2.061 ms/token, two runs on an H200; its fp16 model the same:
//     benchmarks/results/h200-2026-11-30/int4/genai-int4-attnpdl*, generate/genai-L32-attnpdl*).
constexpr int kSplitThreads = 128;
constexpr int kCombineThreads = 128;  // == kSplitThreads: BlockReduce serves both
constexpr int kMaxSplits = 1024;

template <int NT = kCombineThreads>
__device__ inline float BlockReduce(float v, float* red, bool is_max) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? NanMax(v, w) : v + w;
  }
  __syncthreads();  // red may still be read by an earlier reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int i = 1; i < NT / 32; ++i) v = is_max ? NanMax(v, red[i]) : v + red[i];
  return v;
}

constexpr int kUnroll = 4;
constexpr int kMinLanes = 8;  // D / E >= 8

template <typename T>
__device__ inline void Unpack16(const uint4& raw, float* f) {
  constexpr int E = 16 / int(sizeof(T));
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < E; ++i) f[i] = to_f(e[i]);
}

// One step of SplitKeys' key loop: this lane's 16 bytes of the key and value rows base + grp + u * groups (zeros past
// j1), raw.
template <typename T>
__device__ inline void LoadStep(const T* K, const T* V, int64_t base, int64_t j1, int64_t D, int grp, int groups,
                                uint4 (&kr)[kUnroll], uint4 (&vr)[kUnroll]) {
  // one 64-bit offset a step and 32-bit row checks (the per-row 64-bit products and compares were a quarter of the
  // decode loop's instructions)
  const int64_t k0 = base + grp, left = j1 - k0;
  const int rows = left <= 0 ? 0 : (left > int64_t(kUnroll) * groups ? kUnroll * groups : int(left));
  const T* kp = K + k0 * D;
  const T* vp = V + k0 * D;
  const int64_t rs = int64_t(groups) * D;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (u * groups < rows) {
      kr[u] = *reinterpret_cast<const uint4*>(kp + u * rs);
      vr[u] = *reinterpret_cast<const uint4*>(vp + u * rs);
    } else {
      kr[u] = make_uint4(0u, 0u, 0u, 0u), vr[u] = make_uint4(0u, 0u, 0u, 0u);
    }
  }
}

// SplitPartial's and MergeGroups' shared memory: NT threads a block (DecodeAttention's clustered form: 128 or 256;
// else 128), GM query heads.
template <typename T, int GM, int NT = kSplitThreads>
struct SplitSmem {
  static constexpr int E = 16 / int(sizeof(T));
  float m[NT / kMinLanes][GM], l[NT / kMinLanes][GM];
  float acc[GM][NT * E];  // each group's weighted values, [g][group * D + element]
  float red[NT / 32];
};

// DecodeAttention's: SplitSmem's and what only the decode step keeps.
template <typename T, int NT>
struct DecodeSmem : SplitSmem<T, 1, NT> {
  // the block's query head, scaled; once it is in registers, the clustered form's partial of the block ([2 + D],
  // MergeGroups' layout)
  float q[2 + 256];
  alignas(16) T knew[256];  // the new key and value rows (the owner block)
  alignas(16) T vnew[256];
  float w[64];  // the combining block's split weights
  int last;
};

// One step of SplitKeys: kUnroll keys (live: inside the split) of this lane's elements kf / vf into the G heads'
// running max, sum and weighted values. LANES: the lanes a key row (`lanes`) as a constant, so that the kUnroll dots'
// shuffle sums unroll and interleave (a loop over a run-time count ran them one key after another); 0: `lanes`.
template <typename T, int GM, int LANES = 0>
__device__ inline void KeyStep(const float (&qf)[GM][16 / sizeof(T)], const float (&kf)[kUnroll][16 / sizeof(T)],
                               const float (&vf)[kUnroll][16 / sizeof(T)], const bool (&live)[kUnroll], int G,
                               int lanes, float (&acc)[GM][16 / sizeof(T)], float (&m)[GM], float (&l)[GM]) {
  constexpr int E = 16 / int(sizeof(T));
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    if (g >= G) break;
    float sc[kUnroll];
    float mx = m[g];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float dot = 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) dot += qf[g][e] * kf[u][e];
      sc[u] = dot;
    }
    if constexpr (LANES > 0) {
#pragma unroll
      for (int o = LANES / 2; o > 0; o >>= 1)
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], o);
    } else {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        for (int o = lanes / 2; o > 0; o >>= 1) sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], o);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (live[u]) mx = NanMax(mx, sc[u]);
    if (mx == -INFINITY) continue;  // every key so far scores -Inf
    const float corr = m[g] == -INFINITY ? 0.f : __expf(m[g] - mx);
    float psum = 0.f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] *= corr;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const float p = live[u] ? __expf(sc[u] - mx) : 0.f;  // +Inf - +Inf: NaN, as softmax's
      psum += p;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[g][e] += p * vf[u][e];
    }
    m[g] = mx;
    l[g] = l[g] * corr + psum;
  }
}

// The keys j0..j1 of K / V (already offset to this lane's elements) for the G heads whose queries qf holds: each
// group's max, sum and weighted values (m, l, acc; m -Inf and l 0 where no key counted). kr / vr: the first step's
// rows, which the caller loaded (LoadStep(j0)) so that they are in flight while it prepares the queries.
template <typename T, int GM, int LANES = 0>
__device__ inline void SplitKeys(const float (&qf)[GM][16 / sizeof(T)], const T* K, const T* V, int64_t j0, int64_t j1,
                                 int64_t D, int G, int lanes, int groups, int grp, uint4 (&kr)[kUnroll],
                                 uint4 (&vr)[kUnroll], float (&acc)[GM][16 / sizeof(T)], float (&m)[GM],
                                 float (&l)[GM]) {
  constexpr int E = 16 / int(sizeof(T));
#pragma unroll
  for (int g = 0; g < GM; ++g) {
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] = 0.f;
    m[g] = -INFINITY, l[g] = 0.f;
  }
  // the same trips for every lane of a warp (a warp holds 32 / lanes groups): the shuffles stay converged
  const int64_t stride = int64_t(kUnroll) * groups;
  float kf[kUnroll][E], vf[kUnroll][E];
  bool live[kUnroll];
  for (int64_t base = j0; base < j1; base += stride) {
    // one query head a KV head: the next step's rows are loaded (raw 16 bytes) before this step's are used, so a
    // block keeps loads in flight across its steps instead of waiting a memory latency each step (in 128 registers,
    // four blocks an SM: the waves the launchers count); more heads' accumulators leave no registers for that, and
    // load the next step after this one's use
    uint4 kn[kUnroll], vn[kUnroll];
    if constexpr (GM == 1) LoadStep(K, V, base + stride, j1, D, grp, groups, kn, vn);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      live[u] = base + grp + u * groups < j1;
      Unpack16<T>(kr[u], kf[u]);
      Unpack16<T>(vr[u], vf[u]);
      if constexpr (GM == 1) kr[u] = kn[u], vr[u] = vn[u];
    }
    KeyStep<T, GM, LANES>(qf, kf, vf, live, G, lanes, acc, m, l);
    if constexpr (GM != 1) LoadStep(K, V, base + stride, j1, D, grp, groups, kr, vr);
  }
}

// The groups' (m, l, acc) into the block's partial of each head at part + g * (2 + D): the block max, each group's
// sums rescaled to it and added in shared memory (no atomics).
template <typename T, int GM, int NT>
__device__ inline void MergeGroups(SplitSmem<T, GM, NT>& sm, const float (&acc)[GM][16 / sizeof(T)],
                                   const float (&m)[GM], const float (&l)[GM], int G, int D, int groups, int grp,
                                   int sub, float* part) {
  constexpr int E = 16 / int(sizeof(T));
  if (sub == 0)
#pragma unroll
    for (int g = 0; g < GM; ++g) sm.m[grp][g] = m[g];
  __syncthreads();
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    if (g >= G) break;
    float mb = -INFINITY;
    for (int i = 0; i < groups; ++i) mb = NanMax(mb, sm.m[i][g]);
    const float w = m[g] == -INFINITY ? 0.f : __expf(m[g] - mb);
#pragma unroll
    for (int e = 0; e < E; ++e) sm.acc[g][grp * D + sub * E + e] = acc[g][e] * w;
    if (sub == 0) sm.l[grp][g] = l[g] * w;
  }
  __syncthreads();
  const int stride = 2 + D;
  for (int i = threadIdx.x; i < G * D; i += NT) {
    const int g = i / D, e = i % D;
    float o = 0.f;
    for (int k = 0; k < groups; ++k) o += sm.acc[g][k * D + e];
    part[g * stride + 2 + e] = o;
    if (e == 0) {
      float mb = -INFINITY, lb = 0.f;
      for (int k = 0; k < groups; ++k) mb = NanMax(mb, sm.m[k][g]), lb += sm.l[k][g];
      part[g * stride] = mb, part[g * stride + 1] = lb;
    }
  }
}

template <typename T, int GM>
__global__ void __launch_bounds__(kSplitThreads, GM == 1 ? 4 : 1)
    SplitPartial(const float* __restrict__ q_rot, const int32_t* __restrict__ seqlens, const T* __restrict__ pk,
                 const T* __restrict__ pv, float* __restrict__ part, int64_t splits, Args a, int lanes) {
  constexpr int E = 16 / int(sizeof(T));
  __shared__ SplitSmem<T, GM> sm;
  const int64_t split = blockIdx.y, task = blockIdx.x;  // task = (b, kvh, s)
  const int64_t s = task % a.S, kvh = (task / a.S) % a.Hkv, b = task / (a.S * a.Hkv);
  const int G = int(a.H / a.Hkv), D = int(a.D);
  const int groups = kSplitThreads / lanes, grp = threadIdx.x / lanes, sub = threadIdx.x % lanes;
  const Rows r = RowsOf(a, seqlens, b);
  const int64_t n = (r.ok && s < r.valid) ? r.past + s + 1 : 0;
  const int64_t step = kUnroll * groups;  // a split's keys: whole steps of the key loop
  const int64_t per = ((n + splits - 1) / splits + step - 1) / step * step, j0 = split * per;
  const int64_t j1 = j0 + per < n ? j0 + per : n;
  float qf[GM][E], acc[GM][E], m[GM], l[GM];
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    const float* q = q_rot + ((b * a.S + s) * a.H + kvh * G + (g < G ? g : 0)) * a.D + sub * E;
#pragma unroll
    for (int e = 0; e < E; ++e) qf[g][e] = g < G ? q[e] * a.scale : 0.f;
  }
  const int64_t plane = (b * a.Hkv + kvh) * a.L * a.D + sub * E;
  uint4 kr[kUnroll], vr[kUnroll];
  LoadStep(pk + plane, pv + plane, j0, j1, a.D, grp, groups, kr, vr);
  SplitKeys<T, GM>(qf, pk + plane, pv + plane, j0, j1, a.D, G, lanes, groups, grp, kr, vr, acc, m, l);
  MergeGroups<T, GM>(sm, acc, m, l, G, D, groups, grp, sub, part + (task * splits + split) * G * (2 + a.D));
}

// The splits' partials of one head into Y's row y (NT threads): load(c, i) reads element i of split c's partial
// ([2 + D]: the max, sum and weighted values; global memory past the L1, or another block's shared memory); a split
// whose keys all scored -Inf, or none, weighs 0; `any`: the row has keys (else Y is 0). w: a weight a split, red:
// BlockReduce's NT / 32 floats (shared memory).
template <typename T, int NT, typename Load>
__device__ inline void CombineSplits(float* w, float* red, Load load, int64_t splits, int64_t D, bool any,
                                     T* __restrict__ y) {
  float mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < splits; c += NT) mx = NanMax(mx, load(c, 0));
  mx = BlockReduce<NT>(mx, red, true);
  float lsum = 0.f;
  for (int64_t c = threadIdx.x; c < splits; c += NT) {
    const float mc = load(c, 0), lc = load(c, 1);
    const float wc = mc == -INFINITY && lc == 0.f ? 0.f : __expf(mc - mx);
    w[c] = wc;
    lsum += lc * wc;
  }
  lsum = BlockReduce<NT>(lsum, red, false);  // its barriers publish w
  for (int64_t e = threadIdx.x; e < D; e += NT) {
    float o = 0.f;
#pragma unroll 8
    for (int64_t c = 0; c < splits; ++c) o += load(c, 2 + e) * w[c];
    y[e] = from_f<T>(any ? o / lsum : 0.f);
  }
}

// Thread block clusters (sm_90 and newer; the host launches the clustered kernel only there).
__device__ inline void ClusterSync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __trap();
#endif
}
__device__ inline const float* ClusterRank(const float* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  __trap();
  return p;
#endif
}

// One query head a block: task = (sequence, query head), so a KV head's G query heads are G tasks reading the same
// key and value rows at about the same time (the repeats from L2); every block runs SplitKeys' pipelined one-head
// loop. kCluster: a cluster of `splits` blocks per task, blockIdx.x = task * splits + split; each block's partial
// stays in its shared memory and the cluster's first block combines them through distributed shared memory (no
// partials in global memory, no counters). Else a grid of (task, split) whose partials go to `part` and whose last
// block to finish (a counter per task, zeroed by the launcher) combines them. The split holding the new row (the
// sequence's last key) stores it in present where it is its KV head's first query head's; with one query head a KV
// head it reads it back in its loop (its first step, loaded before the store, from shared memory), else every
// query head's owner split adds it from shared memory after its loop (another block stores it). LANES: `lanes` as a
// constant (KeyStep's), 0 for any.
template <typename T, bool kCluster, int NT = kSplitThreads, int LANES = 0>
__global__ void __launch_bounds__(NT, 512 / NT)
    DecodeAttention(const T* __restrict__ query, const int32_t* __restrict__ seqlens, const T* __restrict__ cs,
                    const T* __restrict__ sn, T* __restrict__ pk, T* __restrict__ pv, float* __restrict__ part,
                    int* __restrict__ counters, T* __restrict__ y, int64_t splits, Args a, int lanes_arg) {
  constexpr int E = 16 / int(sizeof(T));
  const int lanes = LANES > 0 ? LANES : lanes_arg;
  __shared__ DecodeSmem<T, NT> sm;
  // the prologue's index math in 32 bits (a grid's blocks, heads and splits fit; 64-bit divisions are about 70
  // instructions each, a 32-bit one about 20), D a constant where LANES is (lanes x 16 bytes a row)
  const int nsplit = int(splits), H = int(a.H);
  const int split = kCluster ? int(blockIdx.x) % nsplit : int(blockIdx.y);
  const int task = kCluster ? int(blockIdx.x) / nsplit : int(blockIdx.x);  // task = (b, h); S == 1
  const int h = task % H, b = task / H, G = H / int(a.Hkv), kvh = h / G;
  const int D = LANES > 0 ? LANES * E : int(a.D);
  const int groups = NT / lanes, grp = threadIdx.x / lanes, sub = threadIdx.x % lanes;
  // launched as a programmatic dependent of the kernel before it (the clustered form): nothing is read before it has
  // completed (the packed query is its output; seqlens and the cache are not, but whichever kernel wrote them last
  // may be that one), and the kernel after it (the o projection: its weights) may start at once
  onnxfuse::cuda_kernels::PdlWait();
  onnxfuse::cuda_kernels::PdlTrigger();
  const Rows r = RowsOf(a, seqlens, b);
  const int64_t n = (r.ok && r.valid >= 1) ? r.past + 1 : 0, pos = r.past;
  const int step = kUnroll * groups;  // a split's keys: whole steps of the key loop (n: a cache's length, in 32 bits)
  const int64_t per = int64_t((int(n) + nsplit - 1) / nsplit + step - 1) / step * step, j0 = split * per;
  const int64_t j1 = j0 + per < n ? j0 + per : n;
  const bool owner = n > 0 && pos >= j0 && pos < j1;  // pos is then j1 - 1
  const bool after = owner && G > 1;                  // the new row added after the loop
  const int64_t jk = after ? pos : j1;                // the loop's keys
  const int64_t plane = (b * a.Hkv + kvh) * a.L * a.D;
  const T* K = pk + plane + sub * E;
  const T* V = pv + plane + sub * E;
  // the split's first step of rows in flight while the query is rotated
  uint4 kr[kUnroll], vr[kUnroll];
  LoadStep(K, V, j0, jk, a.D, grp, groups, kr, vr);
  // the rotated query head (shared memory, scaled); the new key and value rows where this split holds them (shared
  // memory; present too from the KV head's first query head): pairs (i, i + R / 2) or (2i, 2i + 1) of the first R
  // dims rotated by cos/sin row pos, the rest copied
  const int64_t width = (a.H + 2 * a.Hkv) * a.D, half = a.R / 2;
  const int heads = owner ? 3 : 1;
  const bool store = owner && h % G == 0;
  for (int t = threadIdx.x; n > 0 && t < heads * (D / 2); t += NT) {
    const int hh = t / (D / 2), i = t % (D / 2);
    const int64_t head = hh == 0 ? h : (hh == 1 ? a.H + kvh : a.H + a.Hkv + kvh);
    const T* src = query + b * width + head * a.D;
    const bool rotated = i < half && hh <= 1;
    const int64_t i0 = a.interleaved ? 2 * i : (i < half ? i : a.R + 2 * (i - half));
    const int64_t i1 = a.interleaved || i >= half ? i0 + 1 : i + half;
    float x0 = to_f(src[i0]), x1 = to_f(src[i1]);
    if (rotated) {
      const float c = to_f(cs[pos * half + i]), sv = to_f(sn[pos * half + i]);
      const float y0 = x0 * c - x1 * sv, y1 = x1 * c + x0 * sv;
      x0 = y0, x1 = y1;
    }
    if (hh == 0) {
      sm.q[i0] = x0 * a.scale, sm.q[i1] = x1 * a.scale;
    } else {
      T* keep = hh == 1 ? sm.knew : sm.vnew;
      keep[i0] = from_f<T>(x0), keep[i1] = from_f<T>(x1);
      if (store) {
        T* dst = (hh == 1 ? pk : pv) + plane + pos * a.D;
        dst[i0] = keep[i0], dst[i1] = keep[i1];
      }
    }
  }
  __syncthreads();  // the query and the new row in shared memory (and present, G == 1): read below
  if (owner && !after)
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (j0 + grp + u * groups == pos) {  // loaded above before it was stored
        kr[u] = *reinterpret_cast<const uint4*>(sm.knew + sub * E);
        vr[u] = *reinterpret_cast<const uint4*>(sm.vnew + sub * E);
      }
  float qf[1][E], acc[1][E], m[1], l[1];
#pragma unroll
  for (int e = 0; e < E; ++e) qf[0][e] = sm.q[sub * E + e];
  SplitKeys<T, 1, LANES>(qf, K, V, j0, jk, a.D, 1, lanes, groups, grp, kr, vr, acc, m, l);
  if (after) {  // the new row, as group 0's key
    float kf[kUnroll][E] = {}, vf[kUnroll][E] = {};
    bool live[kUnroll] = {};
    Unpack16<T>(*reinterpret_cast<const uint4*>(sm.knew + sub * E), kf[0]);
    Unpack16<T>(*reinterpret_cast<const uint4*>(sm.vnew + sub * E), vf[0]);
    live[0] = grp == 0;
    KeyStep<T, 1, LANES>(qf, kf, vf, live, 1, lanes, acc, m, l);
  }
  const int64_t stride = 2 + a.D;
  T* yb = y + (b * a.H + h) * a.D;
  if constexpr (kCluster) {
    float* mine = sm.q;  // the query is in registers now
    MergeGroups<T, 1>(sm, acc, m, l, 1, D, groups, grp, sub, mine);
    ClusterSync();  // every split's partial written
    if (split == 0)
      CombineSplits<T, NT>(
          sm.w, sm.red, [&](int64_t c, int64_t i) { return ClusterRank(mine, int(c))[i]; }, splits, a.D, n > 0, yb);
    ClusterSync();  // a block's shared memory stays until the first block has read it
  } else {
    float* mine = part + task * splits * stride;
    MergeGroups<T, 1>(sm, acc, m, l, 1, D, groups, grp, sub, mine + split * stride);
    // the last block of the task to finish combines the splits
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) sm.last = atomicAdd(&counters[task], 1) == int(splits) - 1;
    __syncthreads();
    if (!sm.last) return;
    __threadfence();
    CombineSplits<T, NT>(
        sm.w, sm.red, [&](int64_t c, int64_t i) { return __ldcg(mine + c * stride + i); }, splits, a.D, n > 0, yb);
  }
}

#ifndef ONNXFUSE_DECODE_MAX_CLUSTER  // scripts/decode_attention_probe.cu builds other sizes
#define ONNXFUSE_DECODE_MAX_CLUSTER 16
#endif
constexpr int kMaxCluster = ONNXFUSE_DECODE_MAX_CLUSTER;

// A launch of DecodeAttention<T, true, NT, LANES>: `blocks` blocks in clusters of `size` (past the portable 8 the
// kernel opts in first: err), a programmatic dependent of the kernel before it where `dependent` (LaunchDependent's
// rule: PdlLaunchHere). Not copyable: cfg points at at.
template <typename T, int NT, int LANES>
struct ClusterLaunch {
  cudaLaunchAttribute at[2];
  cudaLaunchConfig_t cfg = {};
  cudaError_t err = cudaSuccess;
  ClusterLaunch(int size, unsigned blocks, cudaStream_t stream, bool dependent) {
    if (size > 8)
      err =
          cudaFuncSetAttribute(DecodeAttention<T, true, NT, LANES>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = unsigned(size), at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.gridDim = dim3(blocks), cfg.blockDim = dim3(NT), cfg.stream = stream, cfg.attrs = at;
    cfg.numAttrs = dependent ? 2 : 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// How many clusters of `size` blocks of DecodeAttention<T, true, NT, LANES> the device holds at once (asked once per
// device and size; 0 where it holds none or refuses the size).
template <typename T, int NT, int LANES>
int HeldClusters(int device, int size) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> held[kMaxDevices][5] = {};  // sizes 1, 2, 4, 8, 16: the count + 1 once asked
  const int slot = size == 1 ? 0 : size == 2 ? 1 : size == 4 ? 2 : size == 8 ? 3 : 4;
  if (device < 0 || device >= kMaxDevices) return 0;
  int n = held[device][slot].load(std::memory_order_relaxed);
  if (n == 0) {
    const ClusterLaunch<T, NT, LANES> launch(size, unsigned(size), nullptr, false);
    int clusters = 0;
    if (launch.err != cudaSuccess ||  // past the portable size and refused
        cudaOccupancyMaxActiveClusters(&clusters, DecodeAttention<T, true, NT, LANES>, &launch.cfg) != cudaSuccess)
      clusters = 0;
    (void)cudaGetLastError();  // a refusal here is an answer, not the call's error
    n = clusters + 1;
    held[device][slot].store(n, std::memory_order_relaxed);
  }
  return n - 1;
}

// The largest power of two to kMaxCluster (at least 32 of present's L keys a split) whose clusters of NT-thread
// blocks the device holds for all `tasks` at once (one wave), or 0.
template <typename T, int NT, int LANES>
int WaveSplits(int device, int64_t tasks, int64_t L) {
  int best = 0;
  for (int s = 1; s <= kMaxCluster && (s == 1 || s * 32 <= L); s *= 2)
    if (tasks <= HeldClusters<T, NT, LANES>(device, s)) best = s;
  return best;
}

// The clustered decode step's blocks: `threads` a block, `splits` blocks (a cluster) a (sequence, query head). 256
// threads where they split a task as finely as 128 do within one wave (twice the rows in flight), else 128. splits 0:
// clusters off (before sm_90, or ONNXFUSE_DECODE_CLUSTERS=0), or no split holds every task in one wave (the
// counters' form then).
struct ClusterShape {
  int threads, splits;
};
template <typename T, int LANES>
ClusterShape ClusterSplits(const Args& a) {
  static const bool off = [] {
    const char* v = std::getenv("ONNXFUSE_DECODE_CLUSTERS");
    return v != nullptr && std::strcmp(v, "0") == 0;
  }();
  int device = 0;
  if (off || onnxfuse_cuda_current_arch(&device) < 90) return {0, 0};
  const int64_t tasks = a.B * a.H;
  const int s128 = WaveSplits<T, 128, LANES>(device, tasks, a.L);
  const int s256 = WaveSplits<T, 256, LANES>(device, tasks, a.L);
#ifdef ONNXFUSE_DECODE_BLOCK  // probes: one block size
  if (ONNXFUSE_DECODE_BLOCK == 128) return {128, s128};
  return {256, s256};
#endif
  if (s256 > 0 && s256 >= s128) return {256, s256};
  return {128, s128};
}

template <typename T, int NT, int LANES>
int LaunchClustered(const Args& a, int splits, const T* q, const int32_t* seqlens, const T* c, const T* sn, T* k, T* v,
                    T* out, int lanes, cudaStream_t stream) {
  const ClusterLaunch<T, NT, LANES> launch(splits, unsigned(a.B * a.H * splits), stream,
                                           onnxfuse::cuda_kernels::PdlLaunchHere(stream));
  if (launch.err != cudaSuccess) return int(launch.err);
  float* no_part = nullptr;
  int* no_counters = nullptr;
  return int(cudaLaunchKernelEx(&launch.cfg, DecodeAttention<T, true, NT, LANES>, q, seqlens, c, sn, k, v, no_part,
                                no_counters, out, int64_t(splits), a, lanes));
}

// A decode step's attention in one kernel: clustered where ClusterSplits finds a shape, else the counters' form over
// `splits` (zeroed counters first). LANES: as DecodeAttention's.
template <typename T, int LANES>
int DecodeLanes(const Args& a, const T* q, const int32_t* seqlens, const T* c, const T* sn, T* k, T* v, float* part,
                int* counters, T* out, int64_t splits, int lanes, cudaStream_t stream) {
  const ClusterShape shape = ClusterSplits<T, LANES>(a);
  if (shape.splits > 0) {
    if (shape.threads == 256)
      return LaunchClustered<T, 256, LANES>(a, shape.splits, q, seqlens, c, sn, k, v, out, lanes, stream);
    return LaunchClustered<T, 128, LANES>(a, shape.splits, q, seqlens, c, sn, k, v, out, lanes, stream);
  }
  const cudaError_t e = cudaMemsetAsync(counters, 0, size_t(a.B * a.H) * sizeof(int), stream);
  if (e != cudaSuccess) return int(e);
  const dim3 grid(unsigned(a.B * a.H), unsigned(splits));
  DecodeAttention<T, false, kSplitThreads, LANES>
      <<<grid, kSplitThreads, 0, stream>>>(q, seqlens, c, sn, k, v, part, counters, out, splits, a, lanes);
  return int(cudaGetLastError());
}

// The lanes a key row of a head of 128 (16 bytes a lane): the kernels' constant-lanes build; other heads: any lanes.
template <typename T>
int Decode(const Args& a, const T* q, const int32_t* seqlens, const T* c, const T* sn, T* k, T* v, float* part,
           int* counters, T* out, int64_t splits, int lanes, cudaStream_t stream) {
  constexpr int kLanes128 = 128 * int(sizeof(T)) / 16;
  if (lanes == kLanes128)
    return DecodeLanes<T, kLanes128>(a, q, seqlens, c, sn, k, v, part, counters, out, splits, lanes, stream);
  return DecodeLanes<T, 0>(a, q, seqlens, c, sn, k, v, part, counters, out, splits, lanes, stream);
}

// Whether SplitPartial takes a call (its lanes a key row, or 0): D / E a power of two up to 32, G <= 8, 16-byte rows.
template <typename T>
int SplitLanes(const Args& a, const void* pk, const void* pv) {
  constexpr int E = 16 / int(sizeof(T));
  const int64_t lanes = a.D / E, G = a.H / a.Hkv;
  const bool aligned = (reinterpret_cast<uintptr_t>(pk) | reinterpret_cast<uintptr_t>(pv)) % 16 == 0;
  if (a.D % E || lanes > 32 || lanes < kMinLanes || (lanes & (lanes - 1)) || G > 8 || !aligned) return 0;
  return int(lanes);
}

// One block per (sequence, row, head) of kCombineThreads: CombineSplits over the head's partials (SplitPartial's
// layout: [sequence, KV head, row, split][G][2 + D]).
template <typename T>
__global__ void __launch_bounds__(kCombineThreads)
    Combine(const float* __restrict__ part, const int32_t* __restrict__ seqlens, int64_t splits, T* __restrict__ y,
            Args a) {
  __shared__ float s_w[kMaxSplits], red[kCombineThreads / 32];
  const int64_t h = blockIdx.x % a.H, s = (blockIdx.x / a.H) % a.S, b = blockIdx.x / (a.H * a.S);
  const int64_t G = a.H / a.Hkv, kvh = h / G, g = h % G, step = G * (2 + a.D);
  const Rows r = RowsOf(a, seqlens, b);
  const bool valid = r.ok && s < r.valid;
  const float* base = part + (((b * a.Hkv + kvh) * a.S + s) * splits * G + g) * (2 + a.D);
  CombineSplits<T, kCombineThreads>(
      s_w, red, [&](int64_t c, int64_t i) { return base[c * step + i]; }, valid ? splits : 0, a.D, valid,
      y + ((b * a.S + s) * a.H + h) * a.D);
}

// One block per (sequence, row) of Y then per (sequence, KV head, present row): what PromptFixup's declaration says.
template <typename T>
__global__ void PromptFixup(const int32_t* __restrict__ seqlens, const T* __restrict__ past_k,
                            const T* __restrict__ past_v, T* __restrict__ y, T* __restrict__ pk, T* __restrict__ pv,
                            int fix_present, Args a) {
  const int64_t y_rows = a.B * a.S;
  if (blockIdx.x < y_rows) {
    const int64_t b = blockIdx.x / a.S, s = blockIdx.x % a.S;
    const Rows r = RowsOf(a, seqlens, b);
    if (r.ok && s < r.valid) return;
    T* dst = y + blockIdx.x * a.H * a.D;
    for (int64_t i = threadIdx.x; i < a.H * a.D; i += blockDim.x) dst[i] = from_f<T>(0.f);
    return;
  }
  if (!fix_present) return;
  const int64_t i = blockIdx.x - y_rows, row = i % a.L, plane = i / a.L, b = plane / a.Hkv;
  const Rows r = RowsOf(a, seqlens, b);
  if (row < (r.ok ? r.past + r.valid : 0)) return;
  for (int64_t e = threadIdx.x; e < a.D; e += blockDim.x) {
    pk[(plane * a.L + row) * a.D + e] = row < a.P ? past_k[(plane * a.P + row) * a.D + e] : from_f<T>(0.f);
    pv[(plane * a.L + row) * a.D + e] = row < a.P ? past_v[(plane * a.P + row) * a.D + e] : from_f<T>(0.f);
  }
}

int64_t Blocks(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  return blocks > 65536 ? 65536 : (blocks < 1 ? 1 : blocks);
}

template <typename T>
int Prepare(const Args& a, const void* query, const void* past_k, const void* past_v, const int32_t* seqlens,
            const void* cos, const void* sin, void* pk, void* pv, float* q_rot, cudaStream_t stream,
            bool rotate = true) {
  const int64_t present = a.B * a.Hkv * a.L * a.D;
  if (past_k != pk && present > 0)
    FillPresent<T>
        <<<unsigned(Blocks(present, 256)), 256, 0, stream>>>(static_cast<const T*>(past_k), static_cast<T*>(pk), a);
  if (past_v != pv && present > 0)
    FillPresent<T>
        <<<unsigned(Blocks(present, 256)), 256, 0, stream>>>(static_cast<const T*>(past_v), static_cast<T*>(pv), a);
  const int threads = a.D / 2 < 32 ? 32 : (a.D / 2 > 128 ? 128 : int(a.D / 2));
  if (rotate && a.B * a.S > 0)
    RotateAppend<T><<<unsigned(a.B * a.S * (a.H + 2 * a.Hkv)), threads, 0, stream>>>(
        static_cast<const T*>(query), seqlens, static_cast<const T*>(cos), static_cast<const T*>(sin),
        static_cast<T*>(pk), static_cast<T*>(pv), q_rot, a);
  return int(cudaGetLastError());
}

int BadArgs(int dtype, const Args* a) {
  if (a == nullptr || dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (a->B < 0 || a->S < 0 || a->H <= 0 || a->Hkv <= 0 || a->H % a->Hkv || a->D <= 0 || a->D % 2 ||
      a->D > 32 * kMaxPerLane || a->R > a->D || a->R % 2 || a->P < 0 || a->L < a->P || !(a->scale > 0.f))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (a->B * a->S * (a->H + 2 * a->Hkv) > 0x7fffffffLL || a->B * a->Hkv * a->S > 0x7fffffffLL)
    return ONNXFUSE_ERR_TOO_LARGE;
  return 0;
}

template <typename T>
int Run(int dtype, const Args& a, const void* query, const void* past_k, const void* past_v, const int32_t* seqlens,
        const void* cos, const void* sin, void* y, void* pk, void* pv, void* scratch, cudaStream_t stream) {
  float* q_rot = static_cast<float*>(scratch);
  float* part = q_rot + a.B * a.S * a.H * a.D;
  const int64_t splits = onnxfuse_cached_attention_splits(&a);
  int* counters = reinterpret_cast<int*>(part + a.B * a.Hkv * a.S * splits * a.H / a.Hkv * (2 + a.D));
  const dim3 grid(unsigned(a.B * a.Hkv * a.S), unsigned(splits));
  const int64_t G = a.H / a.Hkv;
  const int lanes = SplitLanes<T>(a, pk, pv);
  if (a.S == 1 && lanes && splits <= 64) {  // the decode step: one kernel (after present's copy of past, if any)
    const int err = Prepare<T>(a, query, past_k, past_v, seqlens, cos, sin, pk, pv, q_rot, stream, false);
    if (err != 0) return err;
    const T* q = static_cast<const T*>(query);
    const T* c = static_cast<const T*>(cos);
    const T* sn = static_cast<const T*>(sin);
    T* k = static_cast<T*>(pk);
    T* v = static_cast<T*>(pv);
    T* out = static_cast<T*>(y);
    return Decode<T>(a, q, seqlens, c, sn, k, v, part, counters, out, splits, lanes, stream);
  }
  int err = Prepare<T>(a, query, past_k, past_v, seqlens, cos, sin, pk, pv, q_rot, stream);
  if (err != 0) return err;
  const T* k = static_cast<const T*>(pk);
  const T* v = static_cast<const T*>(pv);
  if (lanes) {
    if (G == 1)
      SplitPartial<T, 1><<<grid, kSplitThreads, 0, stream>>>(q_rot, seqlens, k, v, part, splits, a, lanes);
    else if (G == 2)
      SplitPartial<T, 2><<<grid, kSplitThreads, 0, stream>>>(q_rot, seqlens, k, v, part, splits, a, lanes);
    else if (G <= 4)
      SplitPartial<T, 4><<<grid, kSplitThreads, 0, stream>>>(q_rot, seqlens, k, v, part, splits, a, lanes);
    else
      SplitPartial<T, 8><<<grid, kSplitThreads, 0, stream>>>(q_rot, seqlens, k, v, part, splits, a, lanes);
  } else {
    Partial<T><<<grid, kWarps * 32, 0, stream>>>(q_rot, seqlens, k, v, part, splits, a);
  }
  err = int(cudaGetLastError());
  if (err != 0) return err;
  return onnxfuse_cuda_cached_attention_combine(dtype, &a, seqlens, part, splits, y, stream);
}

}  // namespace

extern "C" int64_t onnxfuse_cached_attention_splits(const OnnxfuseCachedAttentionArgs* a) {
  // decode: a long context over about four waves of a 132-SM GPU's blocks (at least 32 keys a split); prompts: the
  // rows already make the blocks. The keys are present's rows, L, not total_sequence_length: a CUDA graph captured at
  // one step is replayed at later ones (genai), where the kernels split each row's keys as seqlens_k says on the device
  if (a->S != 1) return 1;
  const int64_t tasks = a->B * a->Hkv, keys = a->L;
  int64_t splits = (528 + tasks - 1) / (tasks > 0 ? tasks : 1);
  const int64_t most = (keys + 31) / 32;
  if (splits > most) splits = most;
  return splits < 1 ? 1 : (splits > 64 ? 64 : splits);
}

extern "C" int64_t onnxfuse_cuda_cached_attention_scratch_bytes(const OnnxfuseCachedAttentionArgs* a) {
  const int err = BadArgs(ONNXFUSE_FP32, a);
  if (err != 0) return err;
  const int64_t splits = onnxfuse_cached_attention_splits(a);
  const int64_t q = a->B * a->S * a->H * a->D;
  const int64_t part = a->B * a->Hkv * a->S * splits * (a->H / a->Hkv) * (2 + a->D);
  const int64_t counters = a->B * a->H * a->S;  // int32, the decode kernel's (a task a query head)
  return (q + part + counters) * int64_t(sizeof(float));
}

extern "C" int onnxfuse_cuda_cached_attention_prepare(int dtype, const OnnxfuseCachedAttentionArgs* a,
                                                      const void* query, const void* past_key, const void* past_value,
                                                      const int32_t* seqlens, const void* cos, const void* sin,
                                                      void* present_key, void* present_value, float* q_rot,
                                                      void* stream) {
  if (const int err = BadArgs(dtype, a)) return err;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case ONNXFUSE_FP32:
      return Prepare<float>(*a, query, past_key, past_value, seqlens, cos, sin, present_key, present_value, q_rot, s);
    case ONNXFUSE_FP16:
      return Prepare<__half>(*a, query, past_key, past_value, seqlens, cos, sin, present_key, present_value, q_rot, s);
    default:
      return Prepare<__nv_bfloat16>(*a, query, past_key, past_value, seqlens, cos, sin, present_key, present_value,
                                    q_rot, s);
  }
}

extern "C" int onnxfuse_cuda_cached_attention_prompt_fixup(int dtype, const OnnxfuseCachedAttentionArgs* a,
                                                           const int32_t* seqlens, const void* past_key,
                                                           const void* past_value, void* y, void* present_key,
                                                           void* present_value, void* stream) {
  if (const int err = BadArgs(dtype, a)) return err;
  const int fix_present = past_key != present_key || past_value != present_value;
  const int64_t blocks = a->B * a->S + (fix_present ? a->B * a->Hkv * a->L : 0);
  if (blocks == 0) return 0;
  if (blocks > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case ONNXFUSE_FP32:
      PromptFixup<float><<<unsigned(blocks), 128, 0, s>>>(
          seqlens, static_cast<const float*>(past_key), static_cast<const float*>(past_value), static_cast<float*>(y),
          static_cast<float*>(present_key), static_cast<float*>(present_value), fix_present, *a);
      break;
    case ONNXFUSE_FP16:
      PromptFixup<__half><<<unsigned(blocks), 128, 0, s>>>(seqlens, static_cast<const __half*>(past_key),
                                                           static_cast<const __half*>(past_value),
                                                           static_cast<__half*>(y), static_cast<__half*>(present_key),
                                                           static_cast<__half*>(present_value), fix_present, *a);
      break;
    default:
      PromptFixup<__nv_bfloat16><<<unsigned(blocks), 128, 0, s>>>(
          seqlens, static_cast<const __nv_bfloat16*>(past_key), static_cast<const __nv_bfloat16*>(past_value),
          static_cast<__nv_bfloat16*>(y), static_cast<__nv_bfloat16*>(present_key),
          static_cast<__nv_bfloat16*>(present_value), fix_present, *a);
  }
  return int(cudaGetLastError());
}

extern "C" int onnxfuse_cuda_cached_attention_combine(int dtype, const OnnxfuseCachedAttentionArgs* a,
                                                      const int32_t* seqlens, const float* partials, int64_t splits,
                                                      void* y, void* stream) {
  if (const int err = BadArgs(dtype, a)) return err;
  if (a->B * a->S * a->H == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (splits > kMaxSplits) return ONNXFUSE_ERR_BAD_ARGUMENT;
  const unsigned blocks = unsigned(a->B * a->S * a->H);
  const int threads = kCombineThreads;
  switch (dtype) {
    case ONNXFUSE_FP32:
      Combine<float><<<blocks, threads, 0, s>>>(partials, seqlens, splits, static_cast<float*>(y), *a);
      break;
    case ONNXFUSE_FP16:
      Combine<__half><<<blocks, threads, 0, s>>>(partials, seqlens, splits, static_cast<__half*>(y), *a);
      break;
    default:
      Combine<__nv_bfloat16><<<blocks, threads, 0, s>>>(partials, seqlens, splits, static_cast<__nv_bfloat16*>(y), *a);
  }
  return int(cudaGetLastError());
}

extern "C" int onnxfuse_cuda_cached_attention(int dtype, const OnnxfuseCachedAttentionArgs* a, const void* query,
                                              const void* past_key, const void* past_value, const int32_t* seqlens,
                                              const void* cos, const void* sin, void* y, void* present_key,
                                              void* present_value, void* scratch, void* stream) {
  if (const int err = BadArgs(dtype, a)) return err;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case ONNXFUSE_FP32:
      return Run<float>(dtype, *a, query, past_key, past_value, seqlens, cos, sin, y, present_key, present_value,
                        scratch, s);
    case ONNXFUSE_FP16:
      return Run<__half>(dtype, *a, query, past_key, past_value, seqlens, cos, sin, y, present_key, present_value,
                         scratch, s);
    default:
      return Run<__nv_bfloat16>(dtype, *a, query, past_key, past_value, seqlens, cos, sin, y, present_key,
                                present_value, scratch, s);
  }
}

#else  // the host half: the CUDA EP glue and the Triton launcher
// CachedAttention on the CUDA EP: an Ort::CustomOpBase op (not the lite API) because total_sequence_length, which
// sizes the present outputs, must be read on the host: the op declares it in CPU memory, as onnxruntime's own
// GroupQueryAttention does, so neither a synchronisation nor a device read is needed and CUDA graphs capture it.
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

using Op = schema::CachedAttention;

template <typename T>
struct CachedAttentionCuda {
  CachedAttentionCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)),
        heads(ReadNumHeads(api, info, Op::kName)),
        kv_heads(ReadIntAttr(api, info, schema::attr::kKvNumHeads, schema::attr::kKvNumHeadsDefault)),
        qk_scale(ReadQkScale(api, info)),
        interleaved(ReadIntAttr(api, info, schema::attr::kRotaryInterleaved, schema::attr::kRotaryInterleavedDefault) !=
                    0),
        prompt_op(CreatePromptOp(info)) {}

  // onnxruntime's CUDA GroupQueryAttention for first prompts (fp16 and bf16, its flash kernels: the op's own kernels
  // take a key at a time), as the CPU kernel hands fp32 prompts to onnxruntime's CPU op; null where onnxruntime has
  // no such op (every call runs this file's kernels then)
  std::unique_ptr<Ort::Op> CreatePromptOp(const OrtKernelInfo* info) const {
    if constexpr (std::is_same_v<T, float>) {
      return nullptr;
    } else {
      return GroupQueryAttentionOp(info, DTypeOf<T>::onnx, heads, kv_heads, interleaved, qk_scale);
    }
  }

  // backend auto (cuda and triton name the op's own kernels) hands onnxruntime's op prompts (its flash kernels):
  // first prompts, and later ones -- genai's CUDA-graph mode feeds its prompt as one, total_sequence_length being its
  // static mask's max length, and the op's own kernels took 6 ms a 7B layer at 2048 tokens there (H200) --, a batch
  // of later ones a sequence a call (onnxruntime refuses a batch of them: "batch_size must be 1 when sequence_length
  // > 1 and past context is given"; the op's kernels took 8 prompts of 128 tokens in 41.5 ms against 29.3 through
  // onnxruntime's for genai's int4 7B-shape model); then fixes the rows it leaves as they come. False where it does
  // not take the call (then the op's kernels run: every decode step, grouped query heads too).
  bool RunPrompt(OrtKernelContext* context, const OnnxfuseCachedAttentionArgs& a, const int32_t* seqlens,
                 const void* past_k, const void* past_v, Ort::UnownedValue& y, Ort::UnownedValue& pk,
                 Ort::UnownedValue& pv, void* stream) const {
    if (!prompt_op || a.S <= 1 || a.D % 8 || attrs.backend == Backend::kCuda || attrs.backend == Backend::kTriton)
      return false;
    Ort::KernelContext kc(context);
    if (a.first || a.B == 1) {
      const OrtValue* ins[] = {kc.GetInput(0), nullptr,        nullptr,        kc.GetInput(1), kc.GetInput(2),
                               kc.GetInput(3), kc.GetInput(4), kc.GetInput(5), kc.GetInput(6)};
      OrtValue* outs[] = {y, pk, pv};
      prompt_op->Invoke(context, ins, 9, outs, 3);
    } else {
      // sequence b's slices of the batch's tensors (query, past, seqlens_k, Y, present: each [B, ...] row-major)
      auto slice = [&](const auto& v, int64_t b) {  // an input (ConstValue) or an output (UnownedValue)
        auto info = v.GetTensorTypeAndShapeInfo();
        std::vector<int64_t> shape = info.GetShape();
        const int64_t count = int64_t(info.GetElementCount()) / shape[0];
        const size_t elem = info.GetElementType() == ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 ? 4 : sizeof(T);
        shape[0] = 1;
        char* base = static_cast<char*>(const_cast<void*>(v.GetTensorRawData()));
        return Ort::Value::CreateTensor(v.GetTensorMemoryInfo(), base + b * count * elem, size_t(count) * elem,
                                        shape.data(), shape.size(), info.GetElementType());
      };
      for (int64_t b = 0; b < a.B; ++b) {
        Ort::Value q = slice(kc.GetInput(0), b), k = slice(kc.GetInput(1), b), v = slice(kc.GetInput(2), b),
                   sl = slice(kc.GetInput(3), b), yb = slice(y, b), kb = slice(pk, b), vb = slice(pv, b);
        const OrtValue* ins[] = {q, nullptr, nullptr, k, v, sl, kc.GetInput(4), kc.GetInput(5), kc.GetInput(6)};
        OrtValue* outs[] = {yb, kb, vb};
        prompt_op->Invoke(context, ins, 9, outs, 3);
      }
    }
    const int err = onnxfuse_cuda_cached_attention_prompt_fixup(
        DtypeCode<T>(), &a, seqlens, past_k, past_v, y.GetTensorMutableRawData(), pk.GetTensorMutableRawData(),
        pv.GetTensorMutableRawData(), stream);
    if (err != 0)
      Fail(std::string(Op::kName) +
               " (CUDA EP, onnxruntime's GroupQueryAttention for a prompt): " + onnxfuse_cuda_error_string(err),
           ORT_RUNTIME_EXCEPTION);
    return true;
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    return GuardCompute([&] {
             Ort::KernelContext ctx(context);
             auto shape = [&](size_t i) { return ctx.GetInput(i).GetTensorTypeAndShapeInfo().GetShape(); };
             Ort::ConstValue total = ctx.GetInput(Op::kTotalSequenceLength);
             detail::Need(
                 total.GetTensorTypeAndShapeInfo().GetElementCount() == 1, Op::kName,
                 "total_sequence_length must hold one value; got " + ShapeStr(shape(Op::kTotalSequenceLength)));
             const CachedAttentionDims d = CachedAttentionDimsOf(
                 Op::kName, shape(Op::kQuery), shape(Op::kPastKey), shape(Op::kPastValue), shape(Op::kSeqlensK),
                 int64_t(*total.GetTensorData<int32_t>()), shape(Op::kCosCache), shape(Op::kSinCache), heads, kv_heads);
             Ort::UnownedValue y_out = ctx.GetOutput(Op::kY, d.y_shape);
             Ort::UnownedValue pk_out = ctx.GetOutput(Op::kPresentKey, d.present_shape);
             Ort::UnownedValue pv_out = ctx.GetOutput(Op::kPresentValue, d.present_shape);
             void* y = y_out.GetTensorMutableRawData();
             void* pk = pk_out.GetTensorMutableRawData();
             void* pv = pv_out.GetTensorMutableRawData();
             OnnxfuseCachedAttentionArgs a{d.B,
                                           d.S,
                                           d.H,
                                           d.Hkv,
                                           d.D,
                                           d.P,
                                           d.L,
                                           d.R,
                                           d.positions,
                                           d.first ? 1 : 0,
                                           interleaved ? 1 : 0,
                                           qk_scale != 0.f ? qk_scale : 1.f / std::sqrt(float(d.D))};
             const void* q = ctx.GetInput(Op::kQuery).GetTensorRawData();
             const void* past_k = ctx.GetInput(Op::kPastKey).GetTensorRawData();
             const void* past_v = ctx.GetInput(Op::kPastValue).GetTensorRawData();
             const int32_t* seqlens = ctx.GetInput(Op::kSeqlensK).GetTensorData<int32_t>();
             const void* cs = ctx.GetInput(Op::kCosCache).GetTensorRawData();
             const void* sn = ctx.GetInput(Op::kSinCache).GetTensorRawData();
             void* stream = StreamOf(context);
             if (RunPrompt(context, a, seqlens, past_k, past_v, y_out, pk_out, pv_out, stream)) return;
             const int64_t bytes = onnxfuse_cuda_cached_attention_scratch_bytes(&a);
             auto launch = [&](auto fn) {
               return WithScratch(context, Op::kQuery, bytes, [&](void* scratch, int64_t) {
                 return fn(DtypeCode<T>(), &a, q, past_k, past_v, seqlens, cs, sn, y, pk, pv, scratch, stream);
               });
             };
             // backend auto past RunPrompt: the CUDA kernels (the decode kernel measured ahead of the Triton one)
             Dispatch(
                 Op::kName, attrs, [&] { return launch(onnxfuse_cuda_cached_attention); },
                 [&] { return launch(onnxfuse_triton_cached_attention); }, true);
           })
        .release();
  }

  OpAttrs attrs;
  int64_t heads, kv_heads;
  float qk_scale;
  bool interleaved;
  std::unique_ptr<Ort::Op> prompt_op;
};

template <typename T>
struct CachedAttentionCudaOp : Ort::CustomOpBase<CachedAttentionCudaOp<T>, CachedAttentionCuda<T>, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    return CreateKernelOrStatus<CachedAttentionCuda<T>>(api, info, kernel);
  }
  const char* GetName() const { return Op::kName; }
  const char* GetExecutionProviderType() const { return kCudaEp; }
  size_t GetInputTypeCount() const { return Op::kNumInputs; }
  // optional, as the lite API declares every input and output of the CPU kernel (onnxruntime merges the two
  // registrations of one name into one schema and refuses characteristics that differ)
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const { return INPUT_OUTPUT_OPTIONAL; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const { return INPUT_OUTPUT_OPTIONAL; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == size_t(Op::kSeqlensK) || i == size_t(Op::kTotalSequenceLength) ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32
                                                                               : DTypeOf<T>::onnx;
  }
  OrtMemType GetInputMemoryType(size_t i) const {
    return i == size_t(Op::kTotalSequenceLength) ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  }
  size_t GetOutputTypeCount() const { return Op::kNumOutputs; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return DTypeOf<T>::onnx; }
};

}  // namespace

void RegisterCachedAttentionCuda(Ort::CustomOpDomain& domain) {
  // never freed: onnxruntime keeps raw pointers to the op objects (common/registry.h)
  domain.Add(new CachedAttentionCudaOp<float>());
  domain.Add(new CachedAttentionCudaOp<Ort::Float16_t>());
  domain.Add(new CachedAttentionCudaOp<Ort::BFloat16_t>());
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of CachedAttention (triton/cached_attention.py): the partials of every (sequence, KV head, row,
// split) by the Triton kernel, present, the rotation and the combine by the CUDA kernels above.
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

extern "C" int onnxfuse_triton_cached_attention(int dtype, const OnnxfuseCachedAttentionArgs* a, const void* query,
                                                const void* past_key, const void* past_value, const int32_t* seqlens,
                                                const void* cos, const void* sin, void* y, void* present_key,
                                                void* present_value, void* scratch, void* stream) {
  if (a->D > 128 || a->D % 16) return ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE;  // the kernel's D tile (BLOCK_N 128)
  const int64_t big[] = {a->B * a->Hkv * a->S, a->L * a->D, a->B * a->S * a->H * a->D};
  for (int64_t v : big)
    if (v > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;  // Triton params are i32
  float* q_rot = static_cast<float*>(scratch);
  float* part = q_rot + a->B * a->S * a->H * a->D;
  const int64_t splits = onnxfuse_cached_attention_splits(a);
  int err = onnxfuse_cuda_cached_attention_prepare(dtype, a, query, past_key, past_value, seqlens, cos, sin,
                                                   present_key, present_value, q_rot, stream);
  if (err != 0) return err;
  int32_t S = int32_t(a->S), H = int32_t(a->H), HKV = int32_t(a->Hkv), D = int32_t(a->D), L = int32_t(a->L);
  int32_t SPLITS = int32_t(splits), FIRST = a->first;
  float SCALE = a->scale;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&q_rot,  &seqlens, &present_key, &present_value,  &part,           &S, &H, &HKV, &D, &L,
                  &SPLITS, &FIRST,   &SCALE,       &scratch_global, &scratch_profile};
  // rows of the grid: every (sequence, KV head, row, split) x query head of the group, one program each
  const int64_t programs = a->B * a->Hkv * a->S * splits * (a->H / a->Hkv);
  const bool aligned =
      Aligned16(present_key) && Aligned16(present_value) && Aligned16(q_rot) && Aligned16(part) && Aligned16(seqlens);
  err = Launch(ids::kCachedAttention, dtype, programs, 1, aligned, 0, args, stream);
  if (err != 0) return err;
  return onnxfuse_cuda_cached_attention_combine(dtype, a, seqlens, part, splits, y, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
