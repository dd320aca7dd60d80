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
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
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

// slot >= 0: the counters are g_counters' slot; else `counters` (the scratch's, zeroed by the launcher).
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    Gemv(const T* __restrict__ x, const T* __restrict__ w, float* __restrict__ part, int* __restrict__ counters,
         int slot, T* __restrict__ y, int64_t k, int64_t n, int64_t kps, int splits) {
  __shared__ float sums[kWarps][kCols];
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c = int64_t(blockIdx.x) * kCols + lane * 8;
  const int64_t k0 = int64_t(blockIdx.y) * kps;
  const int64_t k1 = k0 + kps < k ? k0 + kps : k;
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
  const int col = threadIdx.x;  // 256 threads: a column each
  const int64_t nn = int64_t(blockIdx.x) * kCols + col;
  float s = 0.f;
#pragma unroll
  for (int v = 0; v < kWarps; ++v) s += sums[v][col];
  if (splits == 1) {
    if (nn < n) y[nn] = ock::from_f<T>(s);
    return;
  }
  if (nn < n) part[int64_t(blockIdx.y) * n + nn] = s;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = (slot >= 0 ? g_counters + slot * kSlotTiles : counters) + blockIdx.x;
    last = atomicAdd(counter, 1) == splits - 1;
    if (last) *counter = 0;  // every block of the tile has counted: the next launch starts from 0
  }
  __syncthreads();
  if (!last || nn >= n) return;
  __threadfence();
  float t = 0.f;
  for (int p = 0; p < splits; ++p) t += __ldcg(part + int64_t(p) * n + nn);
  y[nn] = ock::from_f<T>(t);
}

int SmCount() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sms[kMaxDevices] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 132;
  int n = sms[device].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) n = 132;
    sms[device].store(n, std::memory_order_relaxed);
  }
  return n;
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

// The GEMV's scratch: a counter a column tile (256-byte aligned), then kMaxSplits fp32 partials [n].
int64_t GemvScratchBytes(int64_t n) { return ock::Align256(Tiles(n) * 4) + kMaxSplits * n * 4; }

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T>
int RunGemv(const void* x, const void* w, void* y, int64_t k, int64_t n, void* scratch, cudaStream_t stream) {
  const int64_t tiles = Tiles(n);
  int64_t splits = (2 * SmCount() + tiles / 2) / tiles;  // about two blocks an SM
  if (splits > kMaxSplits) splits = kMaxSplits;
  if (splits > k / kMinRows) splits = k / kMinRows;
  if (splits < 1) splits = 1;
  const int64_t kps = (k + splits - 1) / splits;
  splits = (k + kps - 1) / kps;  // every slice holds rows
  int* counters = static_cast<int*>(scratch);
  float* part = reinterpret_cast<float*>(static_cast<char*>(scratch) + ock::Align256(tiles * 4));
  const int slot = splits > 1 && tiles <= kSlotTiles ? SlotFor(stream) : -1;
  if (splits > 1 && slot < 0) {
    const cudaError_t e = cudaMemsetAsync(counters, 0, size_t(tiles) * 4, stream);
    if (e != cudaSuccess) return int(e);
  }
  Gemv<T><<<dim3(unsigned(tiles), unsigned(splits)), kWarps * 32, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), part, counters, slot, static_cast<T*>(y), k, n, kps,
      int(splits));
  return int(cudaGetLastError());
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
  if (GemvShape(dtype, m, k, n) && Aligned16(w) && scratch != nullptr && scratch_bytes >= GemvScratchBytes(n)) {
    if (dtype == ONNXFUSE_FP16) return RunGemv<__half>(x, w, y, k, n, scratch, s);
    return RunGemv<__nv_bfloat16>(x, w, y, k, n, scratch, s);
  }
  ock::GemmArgs g;
  g.dtype = dtype, g.x = x, g.w = w, g.y = y, g.m = m, g.k = k, g.n = n;
  return ock::Gemm(g, scratch, scratch_bytes, s);
}

#else  // the host half: the CUDA EP glue and the Triton launcher
// Linear on the CUDA EP: the kernel struct calling the nvcc half's launcher or the Triton one (at the end of this
// file) through Dispatch (cuda/ops_cuda.h), and its registration.
#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

using Op = schema::Linear;

template <typename T>
struct LinearCuda {
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

}  // namespace

void RegisterLinearCuda(Ort::CustomOpDomain& domain) { AddOpAllTypes<LinearCuda>(domain, Op::kName, kCudaEp); }

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
