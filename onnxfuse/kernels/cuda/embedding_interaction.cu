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
  const int64_t* offsets;  // [F, B] for bags, else null
  const void* table;
  const int64_t* table_offsets;
  const int64_t* cardinality;
  void* y;
  int64_t B, d, F, N, R, width;
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
    const int64_t* offs = p.offsets + f * p.B;
    int64_t start = offs[b], end = b + 1 < p.B ? offs[b + 1] : p.N;
    start = start < 0 ? 0 : (start > p.N ? p.N : start);
    end = end < 0 ? 0 : (end > p.N ? p.N : end);
    for (int64_t c = 0; c < p.d; ++c) dst[c] = 0.0f;
    const int64_t* idx = p.ids + f * p.N;
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

bool Aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

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
                                                   int64_t rows, void* stream) {
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
  Params p{x, ids,      offsets,   table, table_offsets, cardinality, y,    batch,
           d, features, n_indices, rows,  width,         interaction, hash, false};
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
