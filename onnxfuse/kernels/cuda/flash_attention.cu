// FlashAttention on the CUDA execution provider, in one file: the launchers' C declarations below, then the nvcc half
// (the CUDA kernel) and the host half (the CUDA EP glue and the Triton launcher); cuda/cuda.cmake says how it is built.
#include "cuda/launch.h"

extern "C" {
// One attention call: Q [B, S, H D], K and V [B, S_kv, H D] (rows of H D elements, head h at column h D), the bias
// [bias_batches, bias_heads, S, S_kv] (each 1 or B / H) whose (b, h) plane starts at b bias_b + h bias_h elements (0
// where it broadcasts), Y like Q; scale > 0 (the caller resolves qk_scale 0 to 1 / sqrt(D)).
struct onnxfuse_attention_dims {
  int64_t B, S, Skv, H, D, bias_b, bias_h, bias_batches, bias_heads;
  float scale;
};
// The CUDA backend: a warp per query row, every key in turn with an online softmax (no tensor cores: correct at any
// D to 256, slow; backend=auto runs Triton's kernel, falling back here where it has no tile for D).
int onnxfuse_cuda_flash_attention(int dtype, const void* q, const void* k, const void* v, const void* bias, void* y,
                                  const onnxfuse_attention_dims* d, void* stream);
// The Triton launcher (the host half, Triton builds only): the bias and key passes into `scratch` (the bias's tile
// maxima and its copy padded to whole tiles, the key tiles' |k| bounds), then the flash kernel
// (triton/flash_attention.py). Scratch bytes for these sizes (negative: an ONNXFUSE_ERR_* code, e.g. no tile
// for D: then backend=auto takes the CUDA kernel).
int64_t onnxfuse_triton_flash_attention_scratch_bytes(int dtype, const onnxfuse_attention_dims* d);
int onnxfuse_triton_flash_attention(int dtype, const void* q, const void* k, const void* v, const void* bias, void* y,
                                    const onnxfuse_attention_dims* d, void* scratch, int64_t scratch_bytes,
                                    void* stream);
// The launchers' shared checks: ONNXFUSE_ERR_BAD_ARGUMENT, 1 for "nothing to do", or 0. The sizes alone:
static inline int onnxfuse_attention_check_dims(int dtype, const onnxfuse_attention_dims* d) {
  if (d == 0 || dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || d->B < 0 || d->S < 0 || d->Skv < 0 || d->H <= 0 ||
      d->D <= 0 || !(d->scale > 0.f) || d->bias_b < 0 || d->bias_h < 0 || d->bias_batches <= 0 || d->bias_heads <= 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  return (d->B == 0 || d->S == 0) ? 1 : 0;
}
// and with the tensors:
static inline int onnxfuse_attention_check(int dtype, const void* q, const void* k, const void* v, const void* bias,
                                           const void* y, const onnxfuse_attention_dims* d) {
  const int check = onnxfuse_attention_check_dims(dtype, d);
  if (check != 0) return check;
  return (q == 0 || k == 0 || v == 0 || bias == 0 || y == 0) ? ONNXFUSE_ERR_BAD_ARGUMENT : 0;
}
}

#ifdef __CUDACC__
// FlashAttention (onnxfuse.schema) on the CUDA backend. A warp per query row (b, i, h): lane l holds Q's and the
// output's values l, l + 32, ... of the head (DPL of them), and for each key the warp sums q . k_j by shuffles, adds
// the bias, and updates the online softmax (fp32; a row whose maximum is still -inf adds nothing, a NaN or +inf score
// makes the row NaN as in the reference's softmax). Four rows a block; 64-bit offsets.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gemm.h"  // to_f / from_f

namespace {

using onnxfuse::cuda_kernels::from_f;
using onnxfuse::cuda_kernels::to_f;

template <typename T, int DPL>
__global__ void AttentionRows(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                              const T* __restrict__ bias, T* __restrict__ y, onnxfuse_attention_dims a) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= a.B * a.H * a.S) return;
  const int lane = threadIdx.x & 31;
  const int64_t i = row % a.S, bh = row / a.S, b = bh / a.H, h = bh % a.H;
  const int64_t width = a.H * a.D;
  const T* qr = q + (b * a.S + i) * width + h * a.D;
  const T* kb = k + b * a.Skv * width + h * a.D;
  const T* vb = v + b * a.Skv * width + h * a.D;
  const T* br = bias + b * a.bias_b + h * a.bias_h + i * a.Skv;
  float qv[DPL], acc[DPL];
#pragma unroll
  for (int t = 0; t < DPL; ++t) {
    const int64_t e = lane + 32 * t;
    qv[t] = e < a.D ? to_f(qr[e]) : 0.f;
    acc[t] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t j = 0; j < a.Skv; ++j) {
    float dot = 0.f;
#pragma unroll
    for (int t = 0; t < DPL; ++t) {
      const int64_t e = lane + 32 * t;
      if (e < a.D) dot += qv[t] * to_f(kb[j * width + e]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float s = dot * a.scale + to_f(br[j]);
    const float m_new = (isnan(m) || isnan(s)) ? NAN : fmaxf(m, s);
    const float m_safe = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = expf(m - m_safe), p = expf(s - m_safe);
    l = l * alpha + p;
#pragma unroll
    for (int t = 0; t < DPL; ++t) {
      const int64_t e = lane + 32 * t;
      if (e < a.D) acc[t] = acc[t] * alpha + p * to_f(vb[j * width + e]);
    }
    m = m_new;
  }
  T* yr = y + (b * a.S + i) * width + h * a.D;
#pragma unroll
  for (int t = 0; t < DPL; ++t) {
    const int64_t e = lane + 32 * t;
    if (e < a.D) yr[e] = from_f<T>(acc[t] / l);
  }
}

template <typename T>
int Run(const void* q, const void* k, const void* v, const void* bias, void* y, const onnxfuse_attention_dims& a,
        cudaStream_t s) {
  const int64_t rows = a.B * a.H * a.S, blocks = (rows + 3) / 4;
  if (blocks > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  auto launch = [&](auto kernel) {
    kernel<<<unsigned(blocks), 128, 0, s>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                            static_cast<const T*>(v), static_cast<const T*>(bias), static_cast<T*>(y),
                                            a);
    return int(cudaGetLastError());
  };
  if (a.D <= 32) return launch(AttentionRows<T, 1>);
  if (a.D <= 64) return launch(AttentionRows<T, 2>);
  if (a.D <= 128) return launch(AttentionRows<T, 4>);
  if (a.D <= 256) return launch(AttentionRows<T, 8>);
  return ONNXFUSE_ERR_TOO_LARGE;  // D past 256: a lane holds at most 8 of a head's values
}

}  // namespace

extern "C" int onnxfuse_cuda_flash_attention(int dtype, const void* q, const void* k, const void* v, const void* bias,
                                             void* y, const onnxfuse_attention_dims* d, void* stream) {
  const int check = onnxfuse_attention_check(dtype, q, k, v, bias, y, d);
  if (check != 0) return check > 0 ? 0 : check;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case ONNXFUSE_FP32:
      return Run<float>(q, k, v, bias, y, *d, s);
    case ONNXFUSE_FP16:
      return Run<__half>(q, k, v, bias, y, *d, s);
    default:
      return Run<__nv_bfloat16>(q, k, v, bias, y, *d, s);
  }
}

#else  // the host half: the CUDA EP glue and the Triton launcher
// FlashAttention on the CUDA EP: the kernel struct calling the nvcc half's launcher or the Triton one (at the end of
// this file) through Dispatch (cuda/ops_cuda.h), and its registration.
#include <cmath>

#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

template <typename T>
struct FlashAttentionCuda {
  using Op = schema::FlashAttention;
  static constexpr const char* kName = Op::kName;
  FlashAttentionCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)), heads(ReadNumHeads(api, info, kName)), qk_scale(ReadQkScale(api, info)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& Q, const Ort::Custom::Tensor<T>& K,
                      const Ort::Custom::Tensor<T>& V, const Ort::Custom::Tensor<T>& Bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const AttentionDims d = FlashAttentionDims(kName, Q.Shape(), K.Shape(), V.Shape(), Bias.Shape(), heads);
      T* y = Y.Allocate(d.out_shape);
      if (d.B == 0 || d.S == 0) return;
      const onnxfuse_attention_dims a{
          d.B,      d.S,      d.Skv,          d.H,          d.D,
          d.bias_b, d.bias_h, d.bias_batches, d.bias_heads, qk_scale != 0.f ? qk_scale : 1.f / std::sqrt(float(d.D))};
      void* stream = StreamOf(ctx);
      const void *q = Q.Data(), *k = K.Data(), *v = V.Data(), *b = Bias.Data();
      Dispatch(
          kName, attrs, [&] { return onnxfuse_cuda_flash_attention(DtypeCode<T>(), q, k, v, b, y, &a, stream); },
          [&] {
            // A negative size (no tile for D, no cubin for this GPU) comes back as the code: Dispatch may fall back
            // to the CUDA kernel.
            return WithScratch(ctx, Op::kQ, onnxfuse_triton_flash_attention_scratch_bytes(DtypeCode<T>(), &a),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_triton_flash_attention(DtypeCode<T>(), q, k, v, b, y, &a, sp, bytes,
                                                                        stream);
                               });
          });
    });
  }
  OpAttrs attrs;
  int64_t heads;
  float qk_scale;
};

}  // namespace

void RegisterFlashAttentionCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<FlashAttentionCuda>(domain, schema::FlashAttention::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of FlashAttention (triton/flash_attention.py).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

namespace {

// The size class of a head dim: triton/flash_attention.py's CONFIGS (small D = 64, medium D = 128); -1: none.
int AttentionClass(int64_t d) { return d == 64 ? 0 : d == 128 ? 1 : -1; }

struct AttentionPlan {
  const TritonSpec *main = nullptr, *bias = nullptr, *keys = nullptr;
  int main_index = -1, bias_index = -1, keys_index = -1, device = 0;
  int64_t tiles_m = 0, tiles_n = 0, kinfo_floats = 0, bmax_floats = 0, plane_elems = 0, padded_elems = 0;
};

// The three kernels' specs and the passes' sizes, or an ONNXFUSE_ERR_* code (no tile for D, sizes past i32, no
// cubin for this GPU). The bias is copied padded to whole tiles (plane_elems a plane): its rows are then a multiple
// of 16 elements whatever S_kv is.
int PlanAttention(int dtype, const onnxfuse_attention_dims& a, bool aligned, AttentionPlan* p) {
  const int cls = AttentionClass(a.D);
  if (cls < 0) return ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE;
  const int arch = CurrentArch(&p->device);
  if (arch < 0) return -arch;
  p->main = FindExact(ids::kFlashAttention, dtype, cls, aligned ? 1 : 0, 0, arch, &p->main_index);
  p->bias = FindExact(ids::kFlashAttentionBias, dtype, cls, aligned ? 1 : 0, 0, arch, &p->bias_index);
  p->keys = FindExact(ids::kFlashAttentionKeys, dtype, cls, aligned ? 1 : 0, 0, arch, &p->keys_index);
  if (p->main == nullptr || p->bias == nullptr || p->keys == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  p->tiles_m = (a.S + p->main->block_m - 1) / p->main->block_m;
  p->tiles_n = (a.Skv + p->main->block_n - 1) / p->main->block_n;
  p->kinfo_floats = a.B * a.H * p->tiles_n;
  p->bmax_floats = a.bias_batches * a.bias_heads * p->tiles_m * p->tiles_n;
  p->plane_elems = p->tiles_m * p->main->block_m * p->tiles_n * p->main->block_n;
  p->padded_elems = a.bias_batches * a.bias_heads * p->plane_elems;
  const int64_t width = a.H * a.D;
  const int64_t big[] = {a.S * width,     a.Skv * width,          a.bias_b,        a.bias_h,
                         p->padded_elems, p->tiles_m * a.B * a.H, p->kinfo_floats, p->bmax_floats};
  for (int64_t v : big)
    if (v > 0x7fffffffLL) return ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE;  // Triton params are i32: the CUDA kernel takes it
  return 0;
}

int64_t AttentionScratch(int dtype, const AttentionPlan& p) {
  return RoundUp128(p.kinfo_floats * int64_t(sizeof(float))) + RoundUp128(p.bmax_floats * int64_t(sizeof(float))) +
         RoundUp128(p.padded_elems * (dtype == ONNXFUSE_FP32 ? 4 : 2));
}

}  // namespace

extern "C" int64_t onnxfuse_triton_flash_attention_scratch_bytes(int dtype, const onnxfuse_attention_dims* d) {
  const int check = onnxfuse_attention_check_dims(dtype, d);  // the pointers are not yet known
  if (check != 0) return check > 0 ? 0 : check;
  AttentionPlan p;
  if (const int err = PlanAttention(dtype, *d, true, &p)) return err;  // the unaligned build has the same tiles
  return AttentionScratch(dtype, p);
}

extern "C" int onnxfuse_triton_flash_attention(int dtype, const void* q, const void* k, const void* v, const void* bias,
                                               void* y, const onnxfuse_attention_dims* d, void* scratch,
                                               int64_t scratch_bytes, void* stream) {
  const int check = onnxfuse_attention_check(dtype, q, k, v, bias, y, d);
  if (check != 0) return check > 0 ? 0 : check;
  const onnxfuse_attention_dims& a = *d;
  const int64_t width = a.H * a.D;
  const bool aligned =
      Aligned16(q) && Aligned16(k) && Aligned16(v) && Aligned16(bias) && Aligned16(y) && width % 16 == 0;
  AttentionPlan p;
  if (const int err = PlanAttention(dtype, a, aligned, &p)) return err;
  if (scratch == nullptr || scratch_bytes < AttentionScratch(dtype, p)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  void* kinfo = scratch;
  void* bmax = static_cast<char*>(kinfo) + RoundUp128(p.kinfo_floats * int64_t(sizeof(float)));
  void* padded = static_cast<char*>(bmax) + RoundUp128(p.bmax_floats * int64_t(sizeof(float)));
  int32_t S = int32_t(a.S), SKV = int32_t(a.Skv), H = int32_t(a.H), HD = int32_t(width);
  int32_t SQB = int32_t(a.S * width), SKB = int32_t(a.Skv * width), SBB = int32_t(a.bias_b), SBH = int32_t(a.bias_h);
  int32_t SBS = int32_t(a.Skv), HB = int32_t(a.bias_heads), TM = int32_t(p.tiles_m), TN = int32_t(p.tiles_n);
  // the padded copy's strides: planes of plane_elems, plane b BPB + h BPH
  int32_t BPB = a.bias_batches > 1 ? int32_t(a.bias_heads) : 0, BPH = a.bias_heads > 1 ? 1 : 0;
  int32_t PBB = int32_t(BPB * p.plane_elems), PBH = int32_t(BPH * p.plane_elems);
  int32_t PBS = int32_t(p.tiles_n * p.main->block_n);
  float scale = a.scale;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  // the bias tiles' maxima (planes x query tiles x key tiles) and the padded copy
  void* bias_args[] = {&bias, &bmax,           &padded,         &S, &SKV, &SBB, &SBH, &SBS, &HB, &TM,
                       &TN,   &scratch_global, &scratch_profile};
  int err = LaunchSpec(p.bias, p.bias_index, p.device, a.bias_batches * a.bias_heads * p.tiles_m * p.tiles_n, bias_args,
                       stream);
  if (err != 0) return err;
  // the key tiles' |k| bounds, key tiles x batch x heads
  void* keys_args[] = {&k, &v, &kinfo, &SKV, &H, &HD, &SKB, &TN, &scratch_global, &scratch_profile};
  if ((err = LaunchSpec(p.keys, p.keys_index, p.device, p.kinfo_floats, keys_args, stream)) != 0) return err;
  // the flash loop on the padded bias, query tiles x batch x heads
  void* args[] = {&q,
                  &k,
                  &v,
                  &padded,
                  &y,
                  &kinfo,
                  &bmax,
                  &S,
                  &SKV,
                  &H,
                  &HD,
                  &SQB,
                  &SKB,
                  &PBB,
                  &PBH,
                  &PBS,
                  &BPB,
                  &BPH,
                  &TM,
                  &TN,
                  &scale,
                  &scratch_global,
                  &scratch_profile};
  return LaunchSpec(p.main, p.main_index, p.device, p.tiles_m * a.B * a.H, args, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
