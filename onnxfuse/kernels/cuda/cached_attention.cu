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
// How many key splits a call's partials take (the same for both launchers; the scratch is planned with it).
int64_t onnxfuse_cached_attention_splits(const struct OnnxfuseCachedAttentionArgs* a);
}

#ifdef __CUDACC__
// The CUDA backend, three kernels a call:
//   prepare: present = past's rows then zeros (skipped where present is past's own buffer), then each new row's key
//            heads rotated and stored, value heads stored, query heads rotated into fp32 scratch;
//   partial: per (sequence, KV head, query row, key split) a block whose warps each own query heads of the group: the
//            split's keys one at a time, a lane holding D / 32 elements (element lane + 32 i: coalesced rows), the
//            score by a warp reduction, the running max, sum and weighted values in fp32 (flash-decoding);
//   combine: per (sequence, row, head) the splits' partials into Y (rows past a sequence's valid ones: 0).
// Correct for any S; at decode (S = 1) the splits spread a long context over the SMs. A prompt's S x S scores are
// a key at a time here, far from onnxruntime's flash kernels: cpu_policy.GPU_LEFT_TO_ORT keeps genai's node on the
// CUDA provider.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

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

// One block per (sequence, new row): rotary on its query and key heads, the key and value heads stored in present.
template <typename T>
__global__ void RotateAppend(const T* __restrict__ query, const int32_t* __restrict__ seqlens, const T* __restrict__ cs,
                             const T* __restrict__ sn, T* __restrict__ pk, T* __restrict__ pv,
                             float* __restrict__ q_rot, Args a) {
  const int64_t b = blockIdx.x / a.S, s = blockIdx.x % a.S;
  const Rows r = RowsOf(a, seqlens, b);
  if (!r.ok || s >= r.valid) return;
  const int64_t pos = r.past + s, half = a.R / 2, width = (a.H + 2 * a.Hkv) * a.D;
  const T* src = query + blockIdx.x * width;
  // pairs (i, i + R / 2) (halves) or (2i, 2i + 1) (interleaved) of the first R dims, rotated by cos/sin row pos,
  // column i; the dims past R as pairs (R + 2j, R + 2j + 1), copied; value heads copied
  const int64_t per_head = a.D / 2;
  for (int64_t t = threadIdx.x; t < (a.H + 2 * a.Hkv) * per_head; t += blockDim.x) {
    const int64_t head = t / per_head, i = t % per_head;
    const bool rotated = i < half;
    int64_t i0 = a.interleaved ? 2 * i : (rotated ? i : a.R + 2 * (i - half));
    int64_t i1 = a.interleaved || !rotated ? i0 + 1 : i + half;
    float x0 = to_f(src[head * a.D + i0]), x1 = to_f(src[head * a.D + i1]);
    if (rotated && head < a.H + a.Hkv) {
      const float c = to_f(cs[pos * half + i]), sv = to_f(sn[pos * half + i]);
      const float y0 = x0 * c - x1 * sv, y1 = x1 * c + x0 * sv;
      x0 = y0, x1 = y1;
    }
    if (head < a.H) {
      float* q = q_rot + (blockIdx.x * a.H + head) * a.D;
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
__device__ inline float NanMax(float x, float y) { return isnan(x) || isnan(y) ? NAN : fmaxf(x, y); }

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

// One block per (sequence, row, head), a thread per element of D.
template <typename T>
__global__ void Combine(const float* __restrict__ part, const int32_t* __restrict__ seqlens, int64_t splits,
                        T* __restrict__ y, Args a) {
  const int64_t h = blockIdx.x % a.H, s = (blockIdx.x / a.H) % a.S, b = blockIdx.x / (a.H * a.S);
  const int64_t G = a.H / a.Hkv, kvh = h / G, g = h % G, stride = 2 + a.D;
  const Rows r = RowsOf(a, seqlens, b);
  const bool valid = r.ok && s < r.valid;
  const float* base = part + (((b * a.Hkv + kvh) * a.S + s) * splits * G + g) * stride;
  float mx = -INFINITY;
  for (int64_t c = 0; valid && c < splits; ++c) mx = NanMax(mx, base[c * G * stride]);
  for (int64_t e = threadIdx.x; e < a.D; e += blockDim.x) {
    float l = 0.f, o = 0.f;
    for (int64_t c = 0; valid && c < splits; ++c) {
      const float* pc = base + c * G * stride;
      if (pc[0] == -INFINITY && pc[1] == 0.f) continue;  // no key of this split counts
      const float w = __expf(pc[0] - mx);
      l += pc[1] * w;
      o += pc[2 + e] * w;
    }
    y[((b * a.S + s) * a.H + h) * a.D + e] = from_f<T>(valid ? o / l : 0.f);
  }
}

int64_t Blocks(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  return blocks > 65536 ? 65536 : (blocks < 1 ? 1 : blocks);
}

template <typename T>
int Prepare(const Args& a, const void* query, const void* past_k, const void* past_v, const int32_t* seqlens,
            const void* cos, const void* sin, void* pk, void* pv, float* q_rot, cudaStream_t stream) {
  const int64_t present = a.B * a.Hkv * a.L * a.D;
  if (past_k != pk && present > 0)
    FillPresent<T>
        <<<unsigned(Blocks(present, 256)), 256, 0, stream>>>(static_cast<const T*>(past_k), static_cast<T*>(pk), a);
  if (past_v != pv && present > 0)
    FillPresent<T>
        <<<unsigned(Blocks(present, 256)), 256, 0, stream>>>(static_cast<const T*>(past_v), static_cast<T*>(pv), a);
  if (a.B * a.S > 0)
    RotateAppend<T><<<unsigned(a.B * a.S), 128, 0, stream>>>(static_cast<const T*>(query), seqlens,
                                                             static_cast<const T*>(cos), static_cast<const T*>(sin),
                                                             static_cast<T*>(pk), static_cast<T*>(pv), q_rot, a);
  return int(cudaGetLastError());
}

int BadArgs(int dtype, const Args* a) {
  if (a == nullptr || dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (a->B < 0 || a->S < 0 || a->H <= 0 || a->Hkv <= 0 || a->H % a->Hkv || a->D <= 0 || a->D % 2 ||
      a->D > 32 * kMaxPerLane || a->R > a->D || a->R % 2 || a->P < 0 || a->L < a->P || !(a->scale > 0.f))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (a->B * a->S > 0x7fffffffLL || a->B * a->Hkv * a->S > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  return 0;
}

template <typename T>
int Run(int dtype, const Args& a, const void* query, const void* past_k, const void* past_v, const int32_t* seqlens,
        const void* cos, const void* sin, void* y, void* pk, void* pv, void* scratch, cudaStream_t stream) {
  float* q_rot = static_cast<float*>(scratch);
  float* part = q_rot + a.B * a.S * a.H * a.D;
  const int64_t splits = onnxfuse_cached_attention_splits(&a);
  int err = Prepare<T>(a, query, past_k, past_v, seqlens, cos, sin, pk, pv, q_rot, stream);
  if (err != 0) return err;
  const dim3 grid(unsigned(a.B * a.Hkv * a.S), unsigned(splits));
  Partial<T><<<grid, kWarps * 32, 0, stream>>>(q_rot, seqlens, static_cast<const T*>(pk), static_cast<const T*>(pv),
                                               part, splits, a);
  err = int(cudaGetLastError());
  if (err != 0) return err;
  return onnxfuse_cuda_cached_attention_combine(dtype, &a, seqlens, part, splits, y, stream);
}

}  // namespace

extern "C" int64_t onnxfuse_cached_attention_splits(const OnnxfuseCachedAttentionArgs* a) {
  // decode: a long context over about two waves of a 132-SM GPU's blocks (at least 256 keys a split); prompts: the
  // rows already make the blocks
  if (a->S != 1) return 1;
  const int64_t tasks = a->B * a->Hkv, keys = a->L;
  int64_t splits = (264 + tasks - 1) / (tasks > 0 ? tasks : 1);
  const int64_t most = (keys + 255) / 256;
  if (splits > most) splits = most;
  return splits < 1 ? 1 : (splits > 64 ? 64 : splits);
}

extern "C" int64_t onnxfuse_cuda_cached_attention_scratch_bytes(const OnnxfuseCachedAttentionArgs* a) {
  const int err = BadArgs(ONNXFUSE_FP32, a);
  if (err != 0) return err;
  const int64_t splits = onnxfuse_cached_attention_splits(a);
  const int64_t q = a->B * a->S * a->H * a->D;
  const int64_t part = a->B * a->Hkv * a->S * splits * (a->H / a->Hkv) * (2 + a->D);
  return (q + part) * int64_t(sizeof(float));
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

extern "C" int onnxfuse_cuda_cached_attention_combine(int dtype, const OnnxfuseCachedAttentionArgs* a,
                                                      const int32_t* seqlens, const float* partials, int64_t splits,
                                                      void* y, void* stream) {
  if (const int err = BadArgs(dtype, a)) return err;
  if (a->B * a->S * a->H == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = unsigned(a->B * a->S * a->H);
  const int threads = a->D < 128 ? int(a->D) : 128;
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
                    0) {}

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
             void* y = ctx.GetOutput(Op::kY, d.y_shape).GetTensorMutableRawData();
             void* pk = ctx.GetOutput(Op::kPresentKey, d.present_shape).GetTensorMutableRawData();
             void* pv = ctx.GetOutput(Op::kPresentValue, d.present_shape).GetTensorMutableRawData();
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
             const int64_t bytes = onnxfuse_cuda_cached_attention_scratch_bytes(&a);
             auto launch = [&](auto fn) {
               return WithScratch(context, Op::kQuery, bytes, [&](void* scratch, int64_t) {
                 return fn(DtypeCode<T>(), &a, q, past_k, past_v, seqlens, cs, sn, y, pk, pv, scratch, stream);
               });
             };
             Dispatch(
                 Op::kName, attrs, [&] { return launch(onnxfuse_cuda_cached_attention); },
                 [&] { return launch(onnxfuse_triton_cached_attention); });
           })
        .release();
  }

  OpAttrs attrs;
  int64_t heads, kv_heads;
  float qk_scale;
  bool interleaved;
};

template <typename T>
struct CachedAttentionCudaOp : Ort::CustomOpBase<CachedAttentionCudaOp<T>, CachedAttentionCuda<T>, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new CachedAttentionCuda<T>(&api, info);
      return nullptr;
    } catch (const Ort::Exception& e) {
      return api.CreateStatus(e.GetOrtErrorCode(), e.what());
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_FAIL, e.what());
    }
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
