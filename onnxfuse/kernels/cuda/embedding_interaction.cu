// EmbeddingInteraction and EmbeddingBagInteraction on the CUDA execution provider, in one file: the launchers' C
// declarations below, then the nvcc half (the CUDA kernels) and the host half (the CUDA EP glue and the Triton
// launcher); cuda/cuda.cmake says how it is built.
#include "cuda/launch.h"

extern "C" {
// The embedding-interaction launchers' shared argument check: ONNXFUSE_ERR_BAD_ARGUMENT, 1 for "nothing to do" (no
// samples or an empty output row), or 0; *width gets the output row width (d + n(n-1)/2 for dot, n d for cat, with
// n = features + 1 vectors per sample).
static inline int onnxfuse_embedding_interaction_check(int dtype, int interaction, int hash, int64_t batch, int64_t d,
                                                       int64_t features, int64_t n_indices, int64_t rows,
                                                       int64_t* width) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || batch < 0 || d < 0 || features < 0 || n_indices < 0 ||
      rows < 0 || (interaction != ONNXFUSE_INTERACTION_DOT && interaction != ONNXFUSE_INTERACTION_CAT) ||
      (hash != ONNXFUSE_HASH_NONE && hash != ONNXFUSE_HASH_MOD))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int64_t n = features + 1;
  *width = interaction == ONNXFUSE_INTERACTION_DOT ? d + n * (n - 1) / 2 : n * d;
  return (batch == 0 || *width == 0) ? 1 : 0;
}

// EmbeddingInteraction (offsets == NULL: ids is [batch, features]) and EmbeddingBagInteraction (ids is the indices
// [features, n_indices] with index_stride = n_indices, or one shared row [1, n_indices] with index_stride = 0;
// offsets [features, offset_cols], offset_cols = batch (the last bag ends at n_indices) or batch + 1): y [batch, width]
// from x [batch, d], the concatenated table [rows, d] and table_offsets / cardinality [features] (int64, device
// memory); interaction is an onnxfuse_interaction code, hash an onnxfuse_hash code (ignored for bags). The CUDA backend
// runs one warp per sample (cuda/embedding_interaction.cu); the Triton one a block of samples per program
// (triton/embedding_interaction.py, ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE when no (features + 1, d) tile was compiled: the
// CUDA kernel then serves auto).
int onnxfuse_cuda_embedding_interaction(int dtype, int interaction, int hash, const void* x, const int64_t* ids,
                                        const int64_t* offsets, const void* table, const int64_t* table_offsets,
                                        const int64_t* cardinality, void* y, int64_t batch, int64_t d, int64_t features,
                                        int64_t n_indices, int64_t index_stride, int64_t offset_cols, int64_t rows,
                                        void* stream);
// The Triton launcher (the host half, Triton builds only: cuda/ops_cuda.h's Dispatch calls it only there).
int onnxfuse_triton_embedding_interaction(int dtype, int interaction, int hash, const void* x, const int64_t* ids,
                                          const int64_t* offsets, const void* table, const int64_t* table_offsets,
                                          const int64_t* cardinality, void* y, int64_t batch, int64_t d,
                                          int64_t features, int64_t n_indices, int64_t index_stride,
                                          int64_t offset_cols, int64_t rows, void* stream);
}

#ifdef __CUDACC__
// EmbeddingInteraction and EmbeddingBagInteraction (onnxfuse/schema.py) as one hand-written CUDA kernel: one warp
// per sample. The sample's vectors go to shared memory as fp32 ([n][d + 1]: the odd row stride keeps the lanes of
// the dot loop on different banks): lane f looks up feature f (its bag's rows summed in fp32 and rounded to T, as
// the unfused graph stores them), with 16-byte loads where the rows are aligned. Then the lanes share the
// n(n-1)/2 pairs of the strict lower triangle (lane q takes pairs q, q + 32, ...: consecutive output columns, so the
// stores coalesce), or copy the vectors out for the cat interaction. 64-bit offsets throughout; an id outside its
// table gives a zero vector (common/embedding_row.h). No host synchronisation, no allocation: CUDA-graph safe.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/embedding_row.h"
#include "gemm.h"  // to_f / from_f

namespace ock = onnxfuse::cuda_kernels;

namespace {

constexpr int kMaxWarpsPerBlock = 8;
constexpr size_t kDefaultShared = 48 * 1024;  // more needs the per-kernel opt-in
constexpr size_t kMaxShared = 200 * 1024;     // under every sm_80+ limit (227 KB on sm_90, 163 KB on sm_80)

struct Params {
  const void* x;
  const int64_t* ids;      // [B, F], or indices [F, N] for bags
  const int64_t* offsets;  // [F, OC] for bags, else null
  const void* table;
  const int64_t* table_offsets;
  const int64_t* cardinality;
  void* y;
  int64_t B, d, F, N, R, width;
  int64_t index_stride, offset_cols;  // bags: N or 0 (one shared row of indices); B or B + 1
  int interaction, hash;
  bool vector_rows;  // rows of the table (and X) are 16-byte aligned: load them 16 bytes at a time
};

// dst[0..d) (+)= the table row, converted to fp32.
template <typename T, bool Accumulate>
__device__ __forceinline__ void AddRow(const T* row, float* dst, int64_t d, bool vec) {
  if (vec) {
    constexpr int kPer = 16 / sizeof(T);
    const uint4* src = reinterpret_cast<const uint4*>(row);
    for (int64_t k = 0; k < d / kPer; ++k) {
      const uint4 chunk = __ldg(src + k);
      const T* e = reinterpret_cast<const T*>(&chunk);
#pragma unroll
      for (int u = 0; u < kPer; ++u) {
        const float v = ock::to_f(e[u]);
        dst[k * kPer + u] = Accumulate ? dst[k * kPer + u] + v : v;
      }
    }
    return;
  }
  for (int64_t k = 0; k < d; ++k) {
    const float v = ock::to_f(row[k]);
    dst[k] = Accumulate ? dst[k] + v : v;
  }
}

template <typename T>
__global__ void EmbeddingInteractionKernel(Params p) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int64_t ld = p.d + 1, n = p.F + 1;
  float* v = smem + int64_t(warp) * n * ld;
  const int64_t b = int64_t(blockIdx.x) * warps + warp;
  if (b >= p.B) return;  // warp-uniform; the kernel uses no block-wide barrier
  const T* x = static_cast<const T*>(p.x) + b * p.d;
  const T* table = static_cast<const T*>(p.table);
  for (int64_t c = lane; c < p.d; c += 32) v[c] = ock::to_f(x[c]);
  for (int64_t f = lane; f < p.F; f += 32) {
    float* dst = v + (f + 1) * ld;
    const int64_t card = p.cardinality[f], toff = p.table_offsets[f];
    if (p.offsets == nullptr) {
      const int64_t row = onnxfuse_embedding_row(p.ids[b * p.F + f], p.hash, card, toff, p.R);
      if (row >= 0) {
        AddRow<T, false>(table + row * p.d, dst, p.d, p.vector_rows);
      } else {
        for (int64_t c = 0; c < p.d; ++c) dst[c] = 0.0f;
      }
      continue;
    }
    const int64_t* offs = p.offsets + f * p.offset_cols;
    int64_t start = offs[b], end = b + 1 < p.offset_cols ? offs[b + 1] : p.N;
    start = start < 0 ? 0 : (start > p.N ? p.N : start);
    end = end < 0 ? 0 : (end > p.N ? p.N : end);
    for (int64_t c = 0; c < p.d; ++c) dst[c] = 0.0f;
    const int64_t* idx = p.ids + f * p.index_stride;
    for (int64_t q = start; q < end; ++q) {
      const int64_t row = onnxfuse_embedding_row(idx[q], ONNXFUSE_HASH_NONE, card, toff, p.R);
      if (row >= 0) AddRow<T, true>(table + row * p.d, dst, p.d, p.vector_rows);
    }
    for (int64_t c = 0; c < p.d; ++c) dst[c] = ock::to_f(ock::from_f<T>(dst[c]));  // a bag is stored in T
  }
  __syncwarp();
  T* out = static_cast<T*>(p.y) + b * p.width;
  for (int64_t c = lane; c < p.d; c += 32) out[c] = x[c];
  if (p.interaction == ONNXFUSE_INTERACTION_DOT) {
    // Pair q = i(i-1)/2 + j with j < i. Lane q starts at pair q (i from the square root, then corrected exactly)
    // and steps 32 pairs at a time by moving j on and wrapping it into the next rows: no division per pair.
    // (n <= 51200 / (d + 1) vectors, so the pair count and the indices fit in 32 bits.)
    const int pairs = int(n * (n - 1) / 2), dd = int(p.d), ldi = int(ld);
    int i = int((1.0f + sqrtf(1.0f + 8.0f * float(lane))) * 0.5f);
    while (i * (i - 1) / 2 > lane) --i;
    while ((i + 1) * i / 2 <= lane) ++i;
    int j = lane - i * (i - 1) / 2;
    for (int q = lane; q < pairs; q += 32) {
      const float* vi = v + i * ldi;
      const float* vj = v + j * ldi;
      float s = 0.0f;
      for (int c = 0; c < dd; ++c) s = fmaf(vi[c], vj[c], s);
      out[p.d + q] = ock::from_f<T>(s);
      j += 32;
      while (j >= i) {
        j -= i;
        ++i;
      }
    }
  } else {
    for (int64_t q = lane; q < p.F * p.d; q += 32) out[p.d + q] = ock::from_f<T>(v[(q / p.d + 1) * ld + q % p.d]);
  }
}

using onnxfuse::cuda_kernels::Aligned16;

// `warps` samples per block, each warp with `per_warp` bytes of shared memory (opted in above 48 KB per block).
template <typename T>
int Launch(const Params& p, int warps, size_t per_warp, cudaStream_t stream) {
  const size_t shared = size_t(warps) * per_warp;
  if (shared > kDefaultShared) {
    const cudaError_t e =
        cudaFuncSetAttribute(EmbeddingInteractionKernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared));
    if (e != cudaSuccess) return int(e);
  }
  const int64_t blocks = (p.B + warps - 1) / warps;
  EmbeddingInteractionKernel<T><<<dim3(unsigned(blocks)), dim3(32 * warps), shared, stream>>>(p);
  return int(cudaGetLastError());
}

}  // namespace

extern "C" int onnxfuse_cuda_embedding_interaction(int dtype, int interaction, int hash, const void* x,
                                                   const int64_t* ids, const int64_t* offsets, const void* table,
                                                   const int64_t* table_offsets, const int64_t* cardinality, void* y,
                                                   int64_t batch, int64_t d, int64_t features, int64_t n_indices,
                                                   int64_t index_stride, int64_t offset_cols, int64_t rows,
                                                   void* stream) {
  int64_t width = 0;
  const int check =
      onnxfuse_embedding_interaction_check(dtype, interaction, hash, batch, d, features, n_indices, rows, &width);
  if (check != 0) return check > 0 ? 0 : check;
  const int64_t n = features + 1;
  const size_t per_warp = size_t(n) * size_t(d + 1) * sizeof(float);
  if (per_warp > kMaxShared) return ONNXFUSE_ERR_TOO_LARGE;  // (F + 1)(d + 1) > 51200 floats per sample
  int warps = kMaxWarpsPerBlock;
  while (warps > 1 && size_t(warps) * per_warp > kDefaultShared) --warps;
  if ((batch + warps - 1) / warps > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  Params p{x,        ids,       offsets, table, table_offsets, cardinality, y,           batch, d,
           features, n_indices, rows,    width, index_stride,  offset_cols, interaction, hash,  false};
  const int64_t elem = dtype == ONNXFUSE_FP32 ? 4 : 2;
  p.vector_rows = Aligned16(table) && (d * elem) % 16 == 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case ONNXFUSE_FP32:
      return Launch<float>(p, warps, per_warp, s);
    case ONNXFUSE_FP16:
      return Launch<__half>(p, warps, per_warp, s);
    default:
      return Launch<__nv_bfloat16>(p, warps, per_warp, s);
  }
}

#else  // the host half: the CUDA EP glue and the Triton launcher
// EmbeddingInteraction and EmbeddingBagInteraction on the CUDA EP: the kernel structs calling
// the nvcc half's launcher or the Triton one (at the end of this file) through
// Dispatch (cuda/ops_cuda.h), and their registration.
#include <type_traits>
#include <vector>

#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

// EmbeddingInteraction (Bag = false) and EmbeddingBagInteraction (Bag = true): one launch either way. backend=auto
// runs the Triton kernel when triton/table.py's EMBEDDING_AUTO_TRITON says so and a tile fits, else the CUDA one.
template <typename T, bool Bag>
struct EmbeddingInteractionBase {
  using Op = std::conditional_t<Bag, schema::EmbeddingBagInteraction, schema::EmbeddingInteraction>;
  static constexpr const char* kName = Op::kName;
  EmbeddingInteractionBase(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)),
        interaction(ReadInteraction(api, info, kName)),
        hash(Bag ? ONNXFUSE_HASH_NONE : ReadHash(api, info, kName)) {
    if (attrs.backend == Backend::kAuto && !triton::kEmbeddingAutoTriton) attrs.backend = Backend::kCuda;
  }
  void Run(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<int64_t>& ids,
           const Ort::Custom::Tensor<int64_t>* offsets, const Ort::Custom::Tensor<T>& table,
           const Ort::Custom::Tensor<int64_t>& table_offsets, const Ort::Custom::Tensor<int64_t>& cardinality,
           Ort::Custom::Tensor<T>& Y) {
    std::vector<int64_t> offsets_shape;
    if (offsets != nullptr) offsets_shape = offsets->Shape();
    const EmbeddingDims e =
        EmbeddingOpDims(kName, interaction, X.Shape(), ids.Shape(), offsets != nullptr ? &offsets_shape : nullptr,
                        table.Shape(), table_offsets.Shape(), cardinality.Shape());
    T* y = Y.Allocate(e.out_shape);
    if (e.B == 0 || e.width == 0) return;
    void* stream = StreamOf(ctx);
    const void *x = X.Data(), *tb = e.R > 0 ? table.Data() : nullptr;
    const int64_t* id = (offsets == nullptr || e.N > 0) ? ids.Data() : nullptr;
    const int64_t* off = offsets != nullptr ? offsets->Data() : nullptr;
    const int64_t *to = table_offsets.Data(), *ca = cardinality.Data();
    const int dt = DtypeCode<T>();
    Dispatch(
        kName, attrs,
        [&] {
          return onnxfuse_cuda_embedding_interaction(dt, interaction, hash, x, id, off, tb, to, ca, y, e.B, e.d, e.F,
                                                     e.N, e.index_stride, e.offset_cols, e.R, stream);
        },
        [&] {
          return onnxfuse_triton_embedding_interaction(dt, interaction, hash, x, id, off, tb, to, ca, y, e.B, e.d, e.F,
                                                       e.N, e.index_stride, e.offset_cols, e.R, stream);
        });
  }
  OpAttrs attrs;
  int interaction;
  int hash;
};

template <typename T>
struct EmbeddingInteractionCuda : EmbeddingInteractionBase<T, false> {
  using EmbeddingInteractionBase<T, false>::EmbeddingInteractionBase;
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<int64_t>& ids,
                      const Ort::Custom::Tensor<T>& table, const Ort::Custom::Tensor<int64_t>& table_offsets,
                      const Ort::Custom::Tensor<int64_t>& cardinality, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { this->Run(ctx, X, ids, nullptr, table, table_offsets, cardinality, Y); });
  }
};

template <typename T>
struct EmbeddingBagInteractionCuda : EmbeddingInteractionBase<T, true> {
  using EmbeddingInteractionBase<T, true>::EmbeddingInteractionBase;
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X,
                      const Ort::Custom::Tensor<int64_t>& indices, const Ort::Custom::Tensor<int64_t>& offsets,
                      const Ort::Custom::Tensor<T>& table, const Ort::Custom::Tensor<int64_t>& table_offsets,
                      const Ort::Custom::Tensor<int64_t>& cardinality, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { this->Run(ctx, X, indices, &offsets, table, table_offsets, cardinality, Y); });
  }
};

}  // namespace

void RegisterEmbeddingInteractionCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<EmbeddingInteractionCuda>(domain, schema::EmbeddingInteraction::kName, kCudaEp);
  AddOpAllTypes<EmbeddingBagInteractionCuda>(domain, schema::EmbeddingBagInteraction::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of EmbeddingInteraction and EmbeddingBagInteraction (triton/embedding_interaction.py).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

extern "C" int onnxfuse_triton_embedding_interaction(int dtype, int interaction, int hash, const void* x,
                                                     const int64_t* ids, const int64_t* offsets, const void* table,
                                                     const int64_t* table_offsets, const int64_t* cardinality, void* y,
                                                     int64_t batch, int64_t d, int64_t features, int64_t n_indices,
                                                     int64_t index_stride, int64_t offset_cols, int64_t rows,
                                                     void* stream) {
  int64_t width = 0;
  const int check =
      onnxfuse_embedding_interaction_check(dtype, interaction, hash, batch, d, features, n_indices, rows, &width);
  if (check != 0) return check > 0 ? 0 : check;
  if (TooLarge(batch, width, n_indices) || TooLarge(d, features, 0)) return ONNXFUSE_ERR_TOO_LARGE;
  const int64_t n = features + 1;
  // The smallest compiled tile holding n vectors of d: NP indexes the size class, DP is the r_pad field.
  int np_index = -1, dp = 0;
  for (int i = 0; i < ids::kNumEmbedNps && np_index < 0; ++i)
    if (n <= ids::kEmbedNps[i]) np_index = i;
  for (int i = 0; i < ids::kNumEmbedDps && dp == 0; ++i)
    if (d <= ids::kEmbedDps[i]) dp = int(ids::kEmbedDps[i]);
  if (np_index < 0 || dp == 0) return ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE;  // no tile this large: the CUDA kernel
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  int index = -1;
  const TritonSpec* spec = FindExact(ids::kEmbeddingInteraction, dtype, np_index, 0, dp, arch, &index);
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  int32_t B = int32_t(batch), F = int32_t(features), N = int32_t(n_indices), D = int32_t(d), WIDTH = int32_t(width);
  int32_t IS = int32_t(index_stride), OC = int32_t(offset_cols);
  int64_t R = rows;
  int32_t BAG = offsets != nullptr ? 1 : 0, HASH = hash == ONNXFUSE_HASH_MOD ? 1 : 0;
  int32_t DOT = interaction == ONNXFUSE_INTERACTION_DOT ? 1 : 0;
  const int64_t* offs = offsets != nullptr ? offsets : ids;  // never read without bags
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &ids, &offs, &table, &table_offsets,  &cardinality,    &y, &B, &F, &N, &IS, &OC, &D, &WIDTH,
                  &R, &BAG, &HASH, &DOT,   &scratch_global, &scratch_profile};
  return LaunchSpec(spec, index, device, (batch + spec->block_m - 1) / spec->block_m, args, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
