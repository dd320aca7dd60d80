// Linear on the CUDA execution provider, in one file: the launchers' C declarations below, then the nvcc half (the
// CUDA kernels) and the host half (the CUDA EP glue and the Triton launcher); cuda/cuda.cmake says how it is built.
#include "cuda/launch.h"

extern "C" {
// Linear: Y [m, n] = X [m, k] @ W [k, n]. One row of a 16-bit type (a decode step) runs the split-K GEMV where n is a
// multiple of 8 and the pointers 16-byte aligned, else a cuBLASLt GEMM; `scratch` holds
// onnxfuse_cuda_linear_scratch_bytes() bytes.
int64_t onnxfuse_cuda_linear_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n);
int onnxfuse_cuda_linear(int dtype, const void* x, const void* w, void* y, int64_t m, int64_t k, int64_t n,
                         void* scratch, int64_t scratch_bytes, void* stream);
// LinearSkipRMSNorm: sum [m, n] = X @ W + skip, Y = sum * rsqrt(mean(sum^2) + eps) * gamma, sum rounded to the type
// before the norm. One row of a 16-bit type with n a multiple of 8 and 16-byte aligned pointers runs Linear's GEMV
// into sum, else a cuBLASLt GEMM into sum; then onnxfuse_cuda_skip_rms_norm_rows (ONNXFUSE_LINEAR_NORM_EPILOGUE=1: one
// row in one kernel, the add and the norm in the GEMV's epilogue).
int64_t onnxfuse_cuda_linear_skip_rms_norm_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n);
int onnxfuse_cuda_linear_skip_rms_norm(int dtype, const void* x, const void* w, const void* skip, const void* gamma,
                                       void* y, void* sum, int64_t m, int64_t k, int64_t n, float eps, void* scratch,
                                       int64_t scratch_bytes, void* stream);
// sum [m, n] += skip (in place, rounded to the type), y = the RMS norm of sum times gamma: one block a row (the norm
// after a GEMM, which the Triton backend runs too).
int onnxfuse_cuda_skip_rms_norm_rows(int dtype, void* sum, const void* skip, const void* gamma, void* y, int64_t m,
                                     int64_t n, float eps, void* stream);
// The Triton launcher (the host half, Triton builds only: cuda/ops_cuda.h's Dispatch calls it only there).
int onnxfuse_triton_linear(int dtype, const void* x, const void* w, void* y, int64_t m, int64_t k, int64_t n,
                           void* stream);
}

#ifdef __CUDACC__
// Linear (onnxfuse.schema) on the CUDA backend.
//
// The GEMV (one row, fp16/bf16): a block of 8 warps owns 256 columns (a lane 8 of them: one 16-byte load of a W row)
// and a slice of K; its warps take every 8th row of the slice, 8 rows in flight a lane, and each lane loads its next
// 8 rows (W and X) before it uses this step's, so a warp always has loads in flight. The warps' sums meet in shared
// memory; each block writes its fp32 partial [256], and the last block of a column tile to finish (a counter a tile)
// sums the tile's partials into Y and sets the counter back to 0. The counters live in module memory, a slot of them
// a (device, stream) (SlotFor): zero when the module loads, and a stream's launches run one after another, so each
// launch finds its slot's counters at 0 and no memset node precedes the kernel (genai's 7B model: 64 memsets, 72 us
// of kernel and a graph node each, a decode step); past kSlots streams of a device, counters in the scratch, zeroed
// by a memset. K slices: about two
// blocks an SM (16 for a 4096-wide projection on 132 SMs), at least 64 rows each. Measured on an H200 with the weights
// past the L2 (benchmarks/results/h200-2026-11-29/generate/fp16-gemv-probe-l2-cold*.txt, scripts/fp16_gemv_probe.cu's
// form 2): o_proj (4096 x 4096) 11.2 against cuBLAS's 13.4 us, down_proj (11008 x 4096) 23.8 against 27.0; clusters
// of K slices summed through distributed shared memory (form 3) were slower (12.7, 27.4).
//
// LinearSkipRMSNorm at one row runs Linear's GEMV into sum, then the norm kernel (SkipRmsNormRowsVec: a block a row,
// the skip added and the row's squares summed from 16-byte vectors kept in registers for the second pass): two kernels
// where onnxruntime runs three (cuBLAS's split-K GEMM, its reduction, SkipSimplifiedLayerNormalization); more rows run
// cuBLASLt's GEMM into sum, then the same norm kernel. With ONNXFUSE_LINEAR_NORM_EPILOGUE=1 (EpilogueNorm) one row runs
// one kernel instead, the GEMV with the norm in its epilogue (SkipNorm set): each thread loads its column's skip and
// gamma before the K loop; the last block of a column tile adds the skip, writes sum and its tile's sum of squares and
// waits at a row barrier (RowBarrier: a count and a generation a slot, as cooperative groups' grid barrier) for the
// other tiles' last blocks, then writes Y for its 256 columns from the values it holds (only where tiles <= SMs, so the
// waiting blocks never hold every slot). It measured slower in a model (EpilogueNorm says by how much): the barrier
// and the tiles' squares cost more than the two launches it saves. A first form (the last tile normalizing the whole
// row from sum after a second counter) took 24.0 us a call against 18.6 for Linear's GEMV alone.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "gemm.h"

namespace ock = onnxfuse::cuda_kernels;

namespace {

constexpr int kCols = 256;  // a block's columns
constexpr int kWarps = 8;
constexpr int kUnroll = 8;  // rows in flight a lane
constexpr int kMaxSplits = 16;
constexpr int kMinRows = 64;  // a K slice's rows at least

__device__ __forceinline__ void Unpack8(uint4 v, const __half*, float (&f)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 p = __half22float2(h[j]);
    f[2 * j] = p.x, f[2 * j + 1] = p.y;
  }
}
__device__ __forceinline__ void Unpack8(uint4 v, const __nv_bfloat16*, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 p = __bfloat1622float2(h[j]);
    f[2 * j] = p.x, f[2 * j + 1] = p.y;
  }
}

// kUnroll rows k, k + 8, ... of this lane's 8 columns of W (16 bytes each, past the L1) and X's values at those rows;
// rows from k1 on give zeros.
template <typename T>
__device__ __forceinline__ void LoadRows(const T* __restrict__ x, const T* __restrict__ w, int64_t k, int64_t k1,
                                         int64_t n, int64_t c, uint4 (&wv)[kUnroll], float (&xv)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t kk = k + u * kWarps;
    if (kk < k1) {
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(wv[u].x), "=r"(wv[u].y), "=r"(wv[u].z), "=r"(wv[u].w)
                   : "l"(w + kk * n + c));
      xv[u] = ock::to_f(x[kk]);
    } else {
      wv[u] = make_uint4(0u, 0u, 0u, 0u);
      xv[u] = 0.f;
    }
  }
}

constexpr int kSlots = 64;       // streams a device with counters in module memory
constexpr int kSlotTiles = 128;  // column tiles a slot: n up to 32768
__device__ int g_counters[kSlots * kSlotTiles];
// LinearSkipRMSNorm's row barrier a slot: the tiles that have arrived, and the generation, bumped by the last one.
__device__ int g_row_counters[kSlots];
__device__ unsigned g_row_generations[kSlots];

// LinearSkipRMSNorm's epilogue of the GEMV (null for Linear).
template <typename T>
struct SkipNorm {
  const T* skip;             // [n]
  const T* gamma;            // [n]
  T* sum;                    // [n]
  float* squares;            // [tiles]: each tile's sum of its rounded sums squared
  int* row_counter;          // the scratch's (after the tile counters) where the slot is -1
  unsigned* row_generation;  // likewise
  float eps;
};

// Thread 0 of the last block of each column tile: waits until every tile's last block has arrived (the tiles' sums of
// squares are then in sn.squares), as cooperative groups' grid barrier does: the generation read before arriving, the
// last arrival resets the count and bumps the generation. Only the tiles' last blocks wait, at most tiles - 1 of them
// resident at once, and the launcher runs this form only where the device holds more blocks than that (tiles <= SMs),
// so the blocks they wait for always find a slot.
__device__ __forceinline__ void RowBarrier(int* counter, unsigned* generation, int tiles) {
  volatile unsigned* gen = generation;
  const unsigned g0 = *gen;  // this launch's: it changes only once every tile, this one too, has arrived
  __threadfence();           // the block's squares (ordered before this thread by the barrier) before the arrival
  if (atomicAdd(counter, 1) == tiles - 1) {
    *counter = 0;
    __threadfence();
    atomicAdd(generation, 1u);
  } else {
    while (*gen == g0) {
    }
  }
  __threadfence();
}

// slot >= 0: the counters are g_counters' slot (and g_row_counters'); else `counters` (the scratch's, zeroed by the
// launcher). NORM: LinearSkipRMSNorm's epilogue (`sn`).
template <typename T, bool NORM>
__global__ void __launch_bounds__(kWarps * 32)
    Gemv(const T* __restrict__ x, const T* __restrict__ w, float* __restrict__ part, int* __restrict__ counters,
         int slot, T* __restrict__ y, int64_t k, int64_t n, int64_t kps, int splits, SkipNorm<T> sn) {
  __shared__ float sums[kWarps][kCols];
  __shared__ float red[kWarps];
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * kCols + lane * 8;
  const int64_t k0 = int64_t(blockIdx.y) * kps;
  const int64_t k1 = k0 + kps < k ? k0 + kps : k;
  const int64_t nn = int64_t(blockIdx.x) * kCols + threadIdx.x;  // the epilogue's column: 256 threads, one each
  float skip = 0.f, gamma = 0.f;  // NORM: this column's, loaded before the K loop so the epilogue never waits for them
  if (NORM && nn < n) skip = ock::to_f(sn.skip[nn]), gamma = ock::to_f(sn.gamma[nn]);
  float acc[8] = {};
  if (c < n) {
    uint4 wv[kUnroll];
    float xv[kUnroll];
    LoadRows(x, w, k0 + warp, k1, n, c, wv, xv);
    for (int64_t r = k0 + warp; r < k1; r += kWarps * kUnroll) {
      uint4 wn[kUnroll];
      float xn[kUnroll];
      LoadRows(x, w, r + kWarps * kUnroll, k1, n, c, wn, xn);  // the next step's rows in flight
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float f[8];
        Unpack8(wv[u], w, f);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += xv[u] * f[j];
        wv[u] = wn[u], xv[u] = xn[u];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) sums[warp][lane * 8 + j] = acc[j];
  __syncthreads();
  float t = 0.f;
#pragma unroll
  for (int v = 0; v < kWarps; ++v) t += sums[v][threadIdx.x];
  if (splits > 1) {
    if (nn < n) part[int64_t(blockIdx.y) * n + nn] = t;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
      int* counter = (slot >= 0 ? g_counters + slot * kSlotTiles : counters) + blockIdx.x;
      last = atomicAdd(counter, 1) == splits - 1;
      if (last) *counter = 0;  // every block of the tile has counted: the next launch starts from 0
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    float v[kMaxSplits];  // every slice's partial requested before the first is added: one L2 round trip
#pragma unroll
    for (int p = 0; p < kMaxSplits; ++p) v[p] = nn < n && p < splits ? __ldcg(part + int64_t(p) * n + nn) : 0.f;
    t = 0.f;
#pragma unroll
    for (int p = 0; p < kMaxSplits; ++p) t += v[p];
  }
  if constexpr (!NORM) {
    if (nn < n) y[nn] = ock::from_f<T>(t);
  } else {
    const T s = ock::from_f<T>(t + skip);
    const float v = nn < n ? ock::to_f(s) : 0.f;
    if (nn < n) sn.sum[nn] = s;  // read by nothing in this kernel: no fence
    const float q = ock::BlockSum(v * v, red);
    if (threadIdx.x == 0) {
      sn.squares[blockIdx.x] = q;
      RowBarrier(slot >= 0 ? g_row_counters + slot : sn.row_counter,
                 slot >= 0 ? g_row_generations + slot : sn.row_generation, int(gridDim.x));
    }
    __syncthreads();
    float sq = 0.f;  // a thread a tile (tiles past the block's threads: a few each)
    for (int i = threadIdx.x; i < int(gridDim.x); i += kWarps * 32) sq += __ldcg(sn.squares + i);
    const float inv = 1.f / sqrtf(ock::BlockSum(sq, red) / float(n) + sn.eps);
    if (nn < n) y[nn] = ock::from_f<T>(v * inv * gamma);
  }
}

// LinearSkipRMSNorm past the GEMV: sum (the GEMM's product) += skip, rounded to T, then Y = the RMS norm of the row
// times gamma; a block a row.
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    SkipRmsNormRows(T* __restrict__ sum, const T* __restrict__ skip, const T* __restrict__ gamma, T* __restrict__ y,
                    int64_t n, float eps) {
  __shared__ float red[kWarps];
  const int64_t row = int64_t(blockIdx.x) * n;
  float q = 0.f;
  for (int64_t c = threadIdx.x; c < n; c += kWarps * 32) {
    const T s = ock::from_f<T>(ock::to_f(sum[row + c]) + ock::to_f(skip[row + c]));
    sum[row + c] = s;
    const float v = ock::to_f(s);
    q += v * v;
  }
  const float inv = 1.f / sqrtf(ock::BlockSum(q, red) / float(n) + eps);
  for (int64_t c = threadIdx.x; c < n; c += kWarps * 32)
    y[row + c] = ock::from_f<T>(ock::to_f(sum[row + c]) * inv * ock::to_f(gamma[c]));
}

// The same for n a multiple of 8, at most kWarps * 32 * 8 * V, and 16-byte aligned rows: V 16-byte vectors a thread,
// loaded at once and kept in registers between the two passes (the add and the squares, then Y).
template <typename T, int V>
__global__ void __launch_bounds__(kWarps * 32)
    SkipRmsNormRowsVec(T* __restrict__ sum, const T* __restrict__ skip, const T* __restrict__ gamma, T* __restrict__ y,
                       int64_t n, float eps) {
  __shared__ float red[kWarps];
  const int64_t row = int64_t(blockIdx.x) * n;
  float v[V][8];
  float q = 0.f;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t c = (int64_t(i) * kWarps * 32 + threadIdx.x) * 8;
    if (c < n) {
      float a[8], b[8];
      Unpack8(*reinterpret_cast<const uint4*>(sum + row + c), sum, a);
      Unpack8(__ldg(reinterpret_cast<const uint4*>(skip + row + c)), sum, b);
      alignas(16) T out[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        out[j] = ock::from_f<T>(a[j] + b[j]);
        v[i][j] = ock::to_f(out[j]);
        q += v[i][j] * v[i][j];
      }
      *reinterpret_cast<uint4*>(sum + row + c) = *reinterpret_cast<const uint4*>(out);
    }
  }
  const float inv = 1.f / sqrtf(ock::BlockSum(q, red) / float(n) + eps);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const int64_t c = (int64_t(i) * kWarps * 32 + threadIdx.x) * 8;
    if (c < n) {
      float g[8];
      Unpack8(__ldg(reinterpret_cast<const uint4*>(gamma + c)), sum, g);
      alignas(16) T out[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) out[j] = ock::from_f<T>(v[i][j] * inv * g[j]);
      *reinterpret_cast<uint4*>(y + row + c) = *reinterpret_cast<const uint4*>(out);
    }
  }
}

int SmCount() {
  int device = 0;
  return onnxfuse_cuda_sm_count(cudaGetDevice(&device) == cudaSuccess ? device : 0);
}

int64_t Tiles(int64_t n) { return (n + kCols - 1) / kCols; }

// The counters' slot of (the current device, `stream`), assigned on first use; -1 past kSlots streams of a device.
int SlotFor(cudaStream_t stream) {
  constexpr int kMaxDevices = 64;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return -1;
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, int> slots;
  static int used[kMaxDevices] = {};
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(device, stream);
  const auto it = slots.find(key);
  if (it != slots.end()) return it->second;
  if (used[device] >= kSlots) return -1;
  slots.emplace(key, used[device]);
  return used[device]++;
}

// Whether the GEMV takes the call (else the GEMM): one row of a 16-bit type, n a multiple of 8, k >= kMinRows.
bool GemvShape(int dtype, int64_t m, int64_t k, int64_t n) {
  return m == 1 && dtype != ONNXFUSE_FP32 && n % 8 == 0 && k >= kMinRows && Tiles(n) <= 0x7fffffffLL;
}

// The GEMV's scratch: a counter a column tile, then the row barrier's count and generation (256-byte aligned), each
// tile's sum of squares (LinearSkipRMSNorm's, 256-byte aligned), then kMaxSplits fp32 partials [n].
int64_t CountersBytes(int64_t n) { return ock::Align256((Tiles(n) + 2) * 4); }
int64_t SquaresBytes(int64_t n) { return ock::Align256(Tiles(n) * 4); }
int64_t GemvScratchBytes(int64_t n) { return CountersBytes(n) + SquaresBytes(n) + kMaxSplits * n * 4; }

// The GEMV: Linear's (sn null) or LinearSkipRMSNorm's.
template <typename T>
int RunGemv(const void* x, const void* w, void* y, int64_t k, int64_t n, void* scratch, cudaStream_t stream,
            const SkipNorm<T>* sn) {
  const int64_t tiles = Tiles(n);
  int64_t splits = (2 * SmCount() + tiles / 2) / tiles;  // about two blocks an SM
  if (splits > kMaxSplits) splits = kMaxSplits;
  if (splits > k / kMinRows) splits = k / kMinRows;
  if (splits < 1) splits = 1;
  const int64_t kps = (k + splits - 1) / splits;
  splits = (k + kps - 1) / kps;  // every slice holds rows
  char* base = static_cast<char*>(scratch);
  int* counters = reinterpret_cast<int*>(base);
  float* squares = reinterpret_cast<float*>(base + CountersBytes(n));
  float* part = reinterpret_cast<float*>(base + CountersBytes(n) + SquaresBytes(n));
  const bool counted = splits > 1 || sn != nullptr;
  const int slot = counted && tiles <= kSlotTiles ? SlotFor(stream) : -1;
  if (counted && slot < 0) {
    const cudaError_t e = cudaMemsetAsync(counters, 0, size_t(tiles + 2) * 4, stream);
    if (e != cudaSuccess) return int(e);
  }
  const dim3 grid{unsigned(tiles), unsigned(splits)};
  const T* xt = static_cast<const T*>(x);
  const T* wt = static_cast<const T*>(w);
  T* yt = static_cast<T*>(y);
  if (sn == nullptr) {
    Gemv<T, false>
        <<<grid, kWarps * 32, 0, stream>>>(xt, wt, part, counters, slot, yt, k, n, kps, int(splits), SkipNorm<T>{});
  } else {
    SkipNorm<T> args = *sn;
    args.squares = squares;
    args.row_counter = counters + tiles;
    args.row_generation = reinterpret_cast<unsigned*>(counters + tiles + 1);
    Gemv<T, true><<<grid, kWarps * 32, 0, stream>>>(xt, wt, part, counters, slot, yt, k, n, kps, int(splits), args);
  }
  return int(cudaGetLastError());
}

template <typename T>
int RunNormRows(void* sum, const void* skip, const void* gamma, void* y, int64_t m, int64_t n, float eps,
                cudaStream_t stream) {
  T* st = static_cast<T*>(sum);
  const T* kt = static_cast<const T*>(skip);
  const T* gt = static_cast<const T*>(gamma);
  T* yt = static_cast<T*>(y);
  const int64_t per_step = kWarps * 32 * 8;  // columns a block covers with one vector a thread
  const int64_t vectors = (n + per_step - 1) / per_step;
  const bool vec = sizeof(T) == 2 && n % 8 == 0 && ock::Aligned16(sum) && ock::Aligned16(skip) &&
                   ock::Aligned16(gamma) && ock::Aligned16(y);
  const dim3 grid{unsigned(m)}, block{kWarps * 32};
  if constexpr (sizeof(T) == 2) {
    if (vec && vectors <= 4) {
      if (vectors == 1)
        SkipRmsNormRowsVec<T, 1><<<grid, block, 0, stream>>>(st, kt, gt, yt, n, eps);
      else if (vectors == 2)
        SkipRmsNormRowsVec<T, 2><<<grid, block, 0, stream>>>(st, kt, gt, yt, n, eps);
      else
        SkipRmsNormRowsVec<T, 4><<<grid, block, 0, stream>>>(st, kt, gt, yt, n, eps);
      return int(cudaGetLastError());
    }
  }
  SkipRmsNormRows<T><<<grid, block, 0, stream>>>(st, kt, gt, yt, n, eps);
  return int(cudaGetLastError());
}

// Whether LinearSkipRMSNorm's one-row calls run the norm in the GEMV's epilogue (RowBarrier):
// ONNXFUSE_LINEAR_NORM_EPILOGUE=1, read once. Off by default: in genai's 7B-shape model that form took 1495 us a decode
// step for the 64 calls against 1390 for cuBLAS's GEMM, its reduction and onnxruntime's norm (H200,
// generate/genai-L32-skipnorm-epilogue-not-kept-decode-profile-p128.txt) and decoded 3.4 % slower than Linear with
// onnxruntime's norm (genai-L32-split-epilogue.json).
bool EpilogueNorm() {
  static const bool on = [] {
    const char* env = std::getenv("ONNXFUSE_LINEAR_NORM_EPILOGUE");
    return env != nullptr && std::strcmp(env, "1") == 0;
  }();
  return on;
}

// LinearSkipRMSNorm at one row: Linear's GEMV into sum and the norm kernel, or (EpilogueNorm) the GEMV with the norm
// in its epilogue where the device holds every tile's last block at once (tiles <= SMs: RowBarrier).
template <typename T>
int RunSkipNorm(const void* x, const void* w, const void* skip, const void* gamma, void* y, void* sum, int64_t k,
                int64_t n, float eps, void* scratch, cudaStream_t stream) {
  if (!EpilogueNorm() || Tiles(n) > SmCount()) {
    const int e = RunGemv<T>(x, w, sum, k, n, scratch, stream, nullptr);
    return e != 0 ? e : RunNormRows<T>(sum, skip, gamma, y, 1, n, eps, stream);
  }
  SkipNorm<T> sn{
      static_cast<const T*>(skip), static_cast<const T*>(gamma), static_cast<T*>(sum), nullptr, nullptr, nullptr, eps};
  return RunGemv<T>(x, w, y, k, n, scratch, stream, &sn);
}

}  // namespace

extern "C" int64_t onnxfuse_cuda_linear_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || k < 0 || n < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  // the GEMV's, or cuBLASLt's workspace (a misaligned GEMV call runs the GEMM within the GEMV's scratch)
  return GemvShape(dtype, m, k, n) ? GemvScratchBytes(n) : ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
}

extern "C" int onnxfuse_cuda_linear(int dtype, const void* x, const void* w, void* y, int64_t m, int64_t k, int64_t n,
                                    void* scratch, int64_t scratch_bytes, void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || (m > 0 && n > 0 && k > 0 && w == nullptr))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (GemvShape(dtype, m, k, n) && ock::Aligned16(w) && scratch != nullptr && scratch_bytes >= GemvScratchBytes(n)) {
    if (dtype == ONNXFUSE_FP16) return RunGemv<__half>(x, w, y, k, n, scratch, s, nullptr);
    return RunGemv<__nv_bfloat16>(x, w, y, k, n, scratch, s, nullptr);
  }
  ock::GemmArgs g;
  g.dtype = dtype, g.x = x, g.w = w, g.y = y, g.m = m, g.k = k, g.n = n;
  return ock::Gemm(g, scratch, scratch_bytes, s);
}

extern "C" int64_t onnxfuse_cuda_linear_skip_rms_norm_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n) {
  return onnxfuse_cuda_linear_scratch_bytes(dtype, m, k, n);  // the GEMV's or cuBLASLt's, as Linear's
}

extern "C" int onnxfuse_cuda_skip_rms_norm_rows(int dtype, void* sum, const void* skip, const void* gamma, void* y,
                                                int64_t m, int64_t n, float eps, void* stream) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || n < 0 || m > 0x7fffffffLL)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || n == 0) return 0;
  if (sum == nullptr || skip == nullptr || gamma == nullptr || y == nullptr) return ONNXFUSE_ERR_BAD_ARGUMENT;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == ONNXFUSE_FP16) return RunNormRows<__half>(sum, skip, gamma, y, m, n, eps, s);
  if (dtype == ONNXFUSE_BF16) return RunNormRows<__nv_bfloat16>(sum, skip, gamma, y, m, n, eps, s);
  return RunNormRows<float>(sum, skip, gamma, y, m, n, eps, s);
}

extern "C" int onnxfuse_cuda_linear_skip_rms_norm(int dtype, const void* x, const void* w, const void* skip,
                                                  const void* gamma, void* y, void* sum, int64_t m, int64_t k,
                                                  int64_t n, float eps, void* scratch, int64_t scratch_bytes,
                                                  void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || (m > 0 && n > 0 && k > 0 && w == nullptr))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || n == 0) return 0;
  if (sum == nullptr || skip == nullptr || gamma == nullptr) return ONNXFUSE_ERR_BAD_ARGUMENT;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (GemvShape(dtype, m, k, n) && ock::Aligned16(w) && ock::Aligned16(gamma) && ock::Aligned16(sum) &&
      ock::Aligned16(y) && scratch != nullptr && scratch_bytes >= GemvScratchBytes(n)) {
    if (dtype == ONNXFUSE_FP16) return RunSkipNorm<__half>(x, w, skip, gamma, y, sum, k, n, eps, scratch, s);
    return RunSkipNorm<__nv_bfloat16>(x, w, skip, gamma, y, sum, k, n, eps, scratch, s);
  }
  ock::GemmArgs g;
  g.dtype = dtype, g.x = x, g.w = w, g.y = sum, g.m = m, g.k = k, g.n = n;
  const int e = ock::Gemm(g, scratch, scratch_bytes, s);
  return e != 0 ? e : onnxfuse_cuda_skip_rms_norm_rows(dtype, sum, skip, gamma, y, m, n, eps, stream);
}

#else  // the host half: the CUDA EP glue and the Triton launcher
// Linear and LinearSkipRMSNorm on the CUDA EP: the kernel structs calling the nvcc half's launchers or the Triton
// ones (at the end of this file) through Dispatch (cuda/ops_cuda.h), and their registration.
#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

template <typename T>
struct LinearCuda {
  using Op = schema::Linear;
  LinearCuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, Op::kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = MatMulDims(Op::kName, X.Shape(), W.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *w = W.Data();
      // backend auto: the CUDA launcher (the GEMV at one row, cuBLASLt's GEMM past it)
      Dispatch(
          Op::kName, attrs,
          [&] {
            return WithScratch(ctx, Op::kX, onnxfuse_cuda_linear_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_linear(DtypeCode<T>(), x, w, y, d.M, d.K, d.N, sp, bytes, stream);
                               });
          },
          [&] { return onnxfuse_triton_linear(DtypeCode<T>(), x, w, y, d.M, d.K, d.N, stream); }, true);
    });
  }
  OpAttrs attrs;
};

template <typename T>
struct LinearSkipRMSNormCuda {
  using Op = schema::LinearSkipRMSNorm;
  LinearSkipRMSNormCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), eps(ReadEpsilon(api, info, Op::kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& Skip, const Ort::Custom::Tensor<T>& Gamma,
                      Ort::Custom::Tensor<T>& Y, Ort::Custom::Tensor<T>& Sum) {
    return GuardCompute([&] {
      const LinearDims d = SkipNormDims(Op::kName, X.Shape(), W.Shape(), Skip.Shape(), Gamma.Shape());
      T* y = Y.Allocate(d.out_shape);
      T* sum = Sum.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *w = W.Data(), *skip = Skip.Data(), *gamma = Gamma.Data();
      const int dt = DtypeCode<T>();
      // backend auto: the CUDA launcher (the GEMV with the norm at one row, cuBLASLt's GEMM and the norm past it)
      Dispatch(
          Op::kName, attrs,
          [&] {
            return WithScratch(ctx, Op::kX, onnxfuse_cuda_linear_skip_rms_norm_scratch_bytes(dt, d.M, d.K, d.N),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_linear_skip_rms_norm(dt, x, w, skip, gamma, y, sum, d.M, d.K, d.N,
                                                                           eps, sp, bytes, stream);
                               });
          },
          [&] {  // the Triton GEMM into sum, then the CUDA norm kernel
            const int e = onnxfuse_triton_linear(dt, x, w, sum, d.M, d.K, d.N, stream);
            return e != 0 ? e : onnxfuse_cuda_skip_rms_norm_rows(dt, sum, skip, gamma, y, d.M, d.N, eps, stream);
          },
          true);
    });
  }
  OpAttrs attrs;
  float eps;
};

}  // namespace

void RegisterLinearCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LinearCuda>(domain, schema::Linear::kName, kCudaEp);
  AddOpAllTypes<LinearSkipRMSNormCuda>(domain, schema::LinearSkipRMSNorm::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of Linear (triton/linear.py).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

extern "C" int onnxfuse_triton_linear(int dtype, const void* x, const void* w, void* y, int64_t m, int64_t k, int64_t n,
                                      void* stream) {
  if (BadCommon(dtype, m, k, n)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k);
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &w, &y, &M, &N, &K, &scratch_global, &scratch_profile};
  const bool aligned = Aligned16(x) && Aligned16(w) && Aligned16(y) && k % 16 == 0 && n % 16 == 0;
  return Launch(ids::kLinear, dtype, m, n, aligned, 0, args, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
