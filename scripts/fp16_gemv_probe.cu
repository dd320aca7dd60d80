// Issue 27, decode: a fp16 GEMV for a batch of M <= 8 rows (Y [M, N] = X [M, K] @ W [K, N], W row-major as
// genai's builder stores its projections) against cuBLAS (torch.mm), for scripts/fp16_gemv_probe.py, which drives it
// on the GPU machine with torch's tensors. Built here as a shared library:
//   nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC scripts/fp16_gemv_probe.cu -o fp16_gemv_probe.so
//
// Form: a block of 8 warps owns 256 columns (a lane 8 of them: one 16-byte load a row) and a slice of K; its warps
// take every 8th row of the slice, UNROLL rows in flight a lane; X's slice is staged in shared memory; the warps'
// sums meet in shared memory and the block writes one fp32 partial [M, 256]; a second kernel sums the slices' partials
// into Y. The slices: enough blocks for `waves` blocks per SM.
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kCols = 256;  // a block's columns
constexpr int kWarps = 8;

template <int M, int UNROLL>
__global__ void __launch_bounds__(256) GemvPartial(const __half* __restrict__ x, const __half* __restrict__ w,
                                                   float* __restrict__ part, int K, int N, int kps) {
  extern __shared__ float smem[];  // [kWarps][M][kCols] sums, then X's slice [M][kps] as halves after them
  __half* xs = reinterpret_cast<__half*>(smem + kWarps * M * kCols);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = blockIdx.x * kCols + lane * 8;
  const int k0 = blockIdx.y * kps;
  const int k1 = min(K, k0 + kps);
  for (int i = threadIdx.x; i < M * kps; i += blockDim.x) {
    const int m = i / kps, k = k0 + i % kps;
    xs[i] = k < k1 ? x[int64_t(m) * K + k] : __float2half(0.f);
  }
  __syncthreads();
  float acc[M][8];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[m][j] = 0.f;
  if (c < N) {
    for (int k = k0 + warp; k < k1; k += kWarps * UNROLL) {
      uint4 wv[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int kk = k + u * kWarps;
        if (kk < k1)
          asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                       : "=r"(wv[u].x), "=r"(wv[u].y), "=r"(wv[u].z), "=r"(wv[u].w)
                       : "l"(w + int64_t(kk) * N + c));
        else
          wv[u] = make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int kk = k + u * kWarps - k0;
        const __half2* h = reinterpret_cast<const __half2*>(&wv[u]);
        float2 f[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) f[j] = __half22float2(h[j]);
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float xv = kk < kps ? __half2float(xs[m * kps + kk]) : 0.f;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            acc[m][2 * j] += xv * f[j].x;
            acc[m][2 * j + 1] += xv * f[j].y;
          }
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int j = 0; j < 8; ++j) smem[(warp * M + m) * kCols + lane * 8 + j] = acc[m][j];
  __syncthreads();
  for (int i = threadIdx.x; i < M * kCols; i += blockDim.x) {
    const int m = i / kCols, col = i % kCols;
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) s += smem[(v * M + m) * kCols + col];
    const int n = blockIdx.x * kCols + col;
    if (n < N) part[(int64_t(blockIdx.y) * M + m) * N + n] = s;
  }
}

__global__ void SumPartials(const float* __restrict__ part, __half* __restrict__ y, int MN, int splits) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= MN) return;
  float s = 0.f;
  for (int p = 0; p < splits; ++p) s += part[int64_t(p) * MN + i];
  y[i] = __float2half(s);
}

template <int M, int UNROLL>
int Launch(const void* x, const void* w, void* y, float* part, int K, int N, int splits, cudaStream_t s) {
  const int kps = ((K + splits - 1) / splits + 7) / 8 * 8;
  const int slices = (K + kps - 1) / kps;
  const size_t smem = size_t(kWarps) * M * kCols * 4 + size_t(M) * kps * 2;
  auto kernel = GemvPartial<M, UNROLL>;
  if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  kernel<<<dim3((N + kCols - 1) / kCols, slices), 256, smem, s>>>(static_cast<const __half*>(x),
                                                                  static_cast<const __half*>(w), part, K, N, kps);
  SumPartials<<<(M * N + 255) / 256, 256, 0, s>>>(part, static_cast<__half*>(y), M * N, slices);
  return int(cudaGetLastError());
}

// Form 2 (M = 1): the same tiles (a block of 8 warps, 256 columns, a K slice; a warp every 8th row), but each lane's
// next UNROLL rows (W and X, straight from global memory: X is a broadcast load) are loaded before this step's are
// used, so a warp always has loads in flight; the slices are summed in the kernel: each block writes its fp32
// partial, and the last block of a column tile to finish (a counter a tile, which it sets back to 0: no memset) sums
// the tile's partials into Y. One launch, no staging barrier.
template <int UNROLL>
__device__ inline void LoadRows(const __half* __restrict__ x, const __half* __restrict__ w, int k, int k1, int N, int c,
                                uint4 (&wv)[UNROLL], __half (&xv)[UNROLL]) {
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int kk = k + u * kWarps;
    if (kk < k1) {
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(wv[u].x), "=r"(wv[u].y), "=r"(wv[u].z), "=r"(wv[u].w)
                   : "l"(w + int64_t(kk) * N + c));
      xv[u] = x[kk];
    } else {
      wv[u] = make_uint4(0, 0, 0, 0);
      xv[u] = __float2half(0.f);
    }
  }
}

// Forms 2 and 3: this block's K slice [k0, k1) of its 256 columns (lane's 8 from c), each warp every 8th row with the
// next UNROLL rows in flight, into sums[warp][column] (then a barrier).
template <int UNROLL>
__device__ inline void SliceSums(const __half* __restrict__ x, const __half* __restrict__ w, int k0, int k1, int N,
                                 int c, int warp, int lane, float (&sums)[kWarps][kCols]) {
  float acc[8] = {};
  if (c < N) {
    uint4 wv[UNROLL];
    __half xv[UNROLL];
    LoadRows<UNROLL>(x, w, k0 + warp, k1, N, c, wv, xv);
    for (int k = k0 + warp; k < k1; k += kWarps * UNROLL) {
      uint4 wn[UNROLL];
      __half xn[UNROLL];
      LoadRows<UNROLL>(x, w, k + kWarps * UNROLL, k1, N, c, wn, xn);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const __half2* h = reinterpret_cast<const __half2*>(&wv[u]);
        const float xf = __half2float(xv[u]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __half22float2(h[j]);
          acc[2 * j] += xf * f.x;
          acc[2 * j + 1] += xf * f.y;
        }
        wv[u] = wn[u], xv[u] = xn[u];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) sums[warp][lane * 8 + j] = acc[j];
  __syncthreads();
}

template <int UNROLL>
__global__ void __launch_bounds__(256)
    GemvPipelined(const __half* __restrict__ x, const __half* __restrict__ w, float* __restrict__ part,
                  int* __restrict__ counters, __half* __restrict__ y, int K, int N, int kps, int slices) {
  __shared__ float sums[kWarps][kCols];
  __shared__ int last;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int c = blockIdx.x * kCols + lane * 8;
  const int k0 = blockIdx.y * kps;
  const int k1 = min(K, k0 + kps);
  SliceSums<UNROLL>(x, w, k0, k1, N, c, warp, lane, sums);
  const int col = threadIdx.x, n = blockIdx.x * kCols + col;  // 256 threads: a column each
  float s = 0.f;
#pragma unroll
  for (int v = 0; v < kWarps; ++v) s += sums[v][col];
  if (slices == 1) {
    if (n < N) y[n] = __float2half(s);
    return;
  }
  if (n < N) part[int64_t(blockIdx.y) * N + n] = s;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(&counters[blockIdx.x], 1) == slices - 1;
    if (last) counters[blockIdx.x] = 0;  // the next launch's count starts at 0
  }
  __syncthreads();
  if (!last || n >= N) return;
  __threadfence();
  float t = 0.f;
  for (int p = 0; p < slices; ++p) t += __ldcg(part + int64_t(p) * N + n);
  y[n] = __float2half(t);
}

template <int UNROLL>
int LaunchPipelined(const void* x, const void* w, void* y, float* part, int* counters, int K, int N, int splits,
                    cudaStream_t s) {
  const int kps = (K + splits - 1) / splits;
  const int slices = (K + kps - 1) / kps;
  GemvPipelined<UNROLL><<<dim3((N + kCols - 1) / kCols, slices), 256, 0, s>>>(
      static_cast<const __half*>(x), static_cast<const __half*>(w), part, counters, static_cast<__half*>(y), K, N, kps,
      slices);
  return int(cudaGetLastError());
}

// Form 3 (M = 1, sm_90): form 2's blocks, the K slices of a column tile one thread-block cluster: each block sums its
// warps into shared memory and the cluster's first block adds the others' sums through distributed shared memory
// (no partials, counters or memset). blockIdx.x = tile * splits + split.
template <int UNROLL>
__global__ void __launch_bounds__(256) GemvCluster(const __half* __restrict__ x, const __half* __restrict__ w,
                                                   __half* __restrict__ y, int K, int N, int kps, int splits) {
  __shared__ float sums[kWarps][kCols];
  __shared__ float mine[kCols];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int tile = blockIdx.x / splits, split = blockIdx.x % splits;
  const int c = tile * kCols + lane * 8;
  const int k0 = split * kps;
  const int k1 = min(K, k0 + kps);
  SliceSums<UNROLL>(x, w, k0, k1, N, c, warp, lane, sums);
  const int col = threadIdx.x, n = tile * kCols + col;
  float s = 0.f;
#pragma unroll
  for (int v = 0; v < kWarps; ++v) s += sums[v][col];
  mine[col] = s;
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();
  if (split == 0) {
    float t = s;
    for (int r = 1; r < splits; ++r) t += cluster.map_shared_rank(mine, r)[col];
    if (n < N) y[n] = __float2half(t);
  }
  cluster.sync();  // the others' shared memory stays until the first block has read it
}

template <int UNROLL>
int LaunchCluster(const void* x, const void* w, void* y, int K, int N, int splits, cudaStream_t s) {
  const int kps = (K + splits - 1) / splits;
  auto kernel = GemvCluster<UNROLL>;
  if (splits > 8) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (e != cudaSuccess) return int(e);
  }
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(splits), at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned((N + kCols - 1) / kCols * splits)), cfg.blockDim = dim3(256), cfg.stream = s;
  cfg.attrs = at, cfg.numAttrs = 1;
  return int(cudaLaunchKernelEx(&cfg, kernel, static_cast<const __half*>(x), static_cast<const __half*>(w),
                                static_cast<__half*>(y), K, N, kps, splits));
}

}  // namespace

// splits: K slices (the partials buffer holds splits * M * N floats); unroll 4 or 8; M 1, 4 or 8.
extern "C" int probe_gemv(int m, int unroll, const void* x, const void* w, void* y, float* part, int K, int N,
                          int splits, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (N % 8 != 0) return -1;
#define ONNXFUSE_GEMV_CASE(MM, UU) \
  if (m == MM && unroll == UU) return Launch<MM, UU>(x, w, y, part, K, N, splits, s);
  ONNXFUSE_GEMV_CASE(1, 4)
  ONNXFUSE_GEMV_CASE(1, 8)
  ONNXFUSE_GEMV_CASE(4, 4)
  ONNXFUSE_GEMV_CASE(8, 4)
#undef ONNXFUSE_GEMV_CASE
  return -2;
}

// Form 2, M = 1: counters holds a zeroed int per 256 columns (the kernel leaves them 0); unroll 4, 8 or 16.
extern "C" int probe_gemv2(int unroll, const void* x, const void* w, void* y, float* part, int* counters, int K, int N,
                           int splits, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (N % 8 != 0) return -1;
  if (unroll == 4) return LaunchPipelined<4>(x, w, y, part, counters, K, N, splits, s);
  if (unroll == 8) return LaunchPipelined<8>(x, w, y, part, counters, K, N, splits, s);
  if (unroll == 16) return LaunchPipelined<16>(x, w, y, part, counters, K, N, splits, s);
  return -2;
}

// Form 3, M = 1 (sm_90): splits (a cluster's size: 1-16) K slices a column tile; unroll 4 or 8.
extern "C" int probe_gemv3(int unroll, const void* x, const void* w, void* y, int K, int N, int splits, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (N % 8 != 0 || splits < 1 || splits > 16) return -1;
  if (unroll == 4) return LaunchCluster<4>(x, w, y, K, N, splits, s);
  if (unroll == 8) return LaunchCluster<8>(x, w, y, K, N, splits, s);
  return -2;
}
