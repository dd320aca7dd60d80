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
