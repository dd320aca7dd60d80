// RotaryEmbedding (onnxfuse.schema) on the CUDA backend: Y = X * cos + rotate_half(X) * sin, one pass, fp32 math.
//
// Memory bound: each thread owns one (row, j) pair of the two halves, j < D/2, and writes Y[row, j] and
// Y[row, j + D/2] from X[row, j], X[row, j + D/2] and the matching cos/sin entries (a cos/sin row is shared by every
// head of a position, so it is read from L2 after the first head). Grid-stride loop over rows * D/2 pairs, 64-bit
// indices.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.h"

namespace {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

struct RotaryArgs {
  int64_t rows, half, d1, d2;
  int64_t cs0, cs1, cs2, ss0, ss1, ss2;
};

template <typename T>
__global__ void RotaryKernel(const T* __restrict__ x, const T* __restrict__ cs, const T* __restrict__ sn,
                             T* __restrict__ y, RotaryArgs a) {
  const int64_t total = a.rows * a.half, d = 2 * a.half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / a.half, j = i - r * a.half;
    const int64_t i2 = r % a.d2, i1 = (r / a.d2) % a.d1, i0 = r / (a.d2 * a.d1);
    const int64_t crow = (i0 * a.cs0 + i1 * a.cs1 + i2 * a.cs2) * d, srow = (i0 * a.ss0 + i1 * a.ss1 + i2 * a.ss2) * d;
    const float lo = to_f(x[r * d + j]), hi = to_f(x[r * d + j + a.half]);
    y[r * d + j] = from_f<T>(lo * to_f(cs[crow + j]) - hi * to_f(sn[srow + j]));
    y[r * d + j + a.half] = from_f<T>(hi * to_f(cs[crow + j + a.half]) + lo * to_f(sn[srow + j + a.half]));
  }
}

template <typename T>
int Run(const void* x, const void* cs, const void* sn, void* y, const RotaryArgs& a, cudaStream_t stream) {
  const int threads = 256;
  const int64_t total = a.rows * a.half;
  int64_t blocks = (total + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;  // grid-stride beyond
  RotaryKernel<T><<<unsigned(blocks), threads, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(cs),
                                                            static_cast<const T*>(sn), static_cast<T*>(y), a);
  return int(cudaGetLastError());
}

}  // namespace

extern "C" int onnxfuse_cuda_rotary_embedding(int dtype, const void* x, const void* cos, const void* sin, void* y,
                                              int64_t rows, int64_t d, int64_t d1, int64_t d2,
                                              const int64_t* cos_stride, const int64_t* sin_stride, void* stream) {
  const int check = onnxfuse_rotary_check(dtype, x, cos, sin, y, rows, d, d1, d2, cos_stride, sin_stride);
  if (check != 0) return check > 0 ? 0 : check;
  const RotaryArgs a{rows, d / 2, d1, d2, cos_stride[0], cos_stride[1], cos_stride[2],
                     sin_stride[0], sin_stride[1], sin_stride[2]};
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case ONNXFUSE_FP32: return Run<float>(x, cos, sin, y, a, s);
    case ONNXFUSE_FP16: return Run<__half>(x, cos, sin, y, a, s);
    default: return Run<__nv_bfloat16>(x, cos, sin, y, a, s);
  }
}
