// RotaryEmbedding on the CUDA execution provider, in one file: the launchers' C declarations below, then the nvcc half
// (the CUDA kernels) and the host half (the CUDA EP glue and the Triton launcher); cuda/cuda.cmake says how it is
// built.
#include "cuda/launch.h"

extern "C" {
// RotaryEmbedding: Y = X * cos + rotate_half(X) * sin over `rows` rows of D (even) elements. X is [d0, d1, d2, D]
// (common/dims.h RotaryEmbeddingDims): row r is (i0, i1, i2) with i2 = r % d2, i1 = (r / d2) % d1, and its cos row
// starts at (i0 * cos_stride[0] + i1 * cos_stride[1] + i2 * cos_stride[2]) * D (a stride is 0 where cos broadcasts);
// sin likewise. cos_stride / sin_stride are host arrays of 3.
int onnxfuse_cuda_rotary_embedding(int dtype, const void* x, const void* cos, const void* sin, void* y, int64_t rows,
                                   int64_t d, int64_t d1, int64_t d2, const int64_t* cos_stride,
                                   const int64_t* sin_stride, void* stream);
// The rotary launchers' shared argument check: ONNXFUSE_ERR_BAD_ARGUMENT, 1 for "nothing to do" (no rows), or 0.
static inline int onnxfuse_rotary_check(int dtype, const void* x, const void* cos, const void* sin, const void* y,
                                        int64_t rows, int64_t d, int64_t d1, int64_t d2, const int64_t* cos_stride,
                                        const int64_t* sin_stride) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || rows < 0 || d < 0 || d % 2 || d1 <= 0 || d2 <= 0 ||
      cos_stride == 0 || sin_stride == 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (rows == 0 || d == 0) return 1;
  return (x == 0 || cos == 0 || sin == 0 || y == 0) ? ONNXFUSE_ERR_BAD_ARGUMENT : 0;
}
// The Triton launcher (the host half, Triton builds only: cuda/ops_cuda.h's Dispatch calls it only there).
int onnxfuse_triton_rotary_embedding(int dtype, const void* x, const void* cos, const void* sin, void* y, int64_t rows,
                                     int64_t d, int64_t d1, int64_t d2, const int64_t* cos_stride,
                                     const int64_t* sin_stride, void* stream);
}

#ifdef __CUDACC__
// RotaryEmbedding (onnxfuse.schema) on the CUDA backend: Y = X * cos + rotate_half(X) * sin, one pass, fp32 math.
//
// Memory bound: each thread owns VEC consecutive pairs (row, j .. j + VEC - 1) of the two halves, j < D/2, and
// writes them in Y[row, j..] and Y[row, j + D/2 ..] from the matching X, cos and sin entries, with 16-byte loads and
// stores when D/2 is a multiple of VEC and the pointers are 16-byte aligned (VEC = 16 / sizeof(T)), else VEC = 1. A
// cos/sin row is shared by every head of a position, so it is read from L2 after the first head. Grid-stride loop,
// 64-bit indices; the row's index arithmetic is paid once per VEC pairs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gemm.h"  // to_f / from_f

namespace {

using onnxfuse::cuda_kernels::from_f;
using onnxfuse::cuda_kernels::to_f;

struct RotaryArgs {
  int64_t rows, half, d1, d2;
  int64_t cs0, cs1, cs2, ss0, ss1, ss2;
};

template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

template <typename T, int VEC>
__global__ void RotaryKernel(const T* __restrict__ x, const T* __restrict__ cs, const T* __restrict__ sn,
                             T* __restrict__ y, RotaryArgs a) {
  using V = Vec<T, VEC>;
  const int64_t per_row = a.half / VEC, total = a.rows * per_row, d = 2 * a.half;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, j = (i - r * per_row) * VEC;
    const int64_t i2 = r % a.d2, i1 = (r / a.d2) % a.d1, i0 = r / (a.d2 * a.d1);
    const int64_t crow = (i0 * a.cs0 + i1 * a.cs1 + i2 * a.cs2) * d, srow = (i0 * a.ss0 + i1 * a.ss1 + i2 * a.ss2) * d;
    const int64_t xo = r * d + j;
    const V lo = *reinterpret_cast<const V*>(x + xo), hi = *reinterpret_cast<const V*>(x + xo + a.half);
    const V clo = *reinterpret_cast<const V*>(cs + crow + j), chi = *reinterpret_cast<const V*>(cs + crow + j + a.half);
    const V slo = *reinterpret_cast<const V*>(sn + srow + j), shi = *reinterpret_cast<const V*>(sn + srow + j + a.half);
    V ylo, yhi;
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const float l = to_f(lo.v[e]), h = to_f(hi.v[e]);
      ylo.v[e] = from_f<T>(l * to_f(clo.v[e]) - h * to_f(slo.v[e]));
      yhi.v[e] = from_f<T>(h * to_f(chi.v[e]) + l * to_f(shi.v[e]));
    }
    *reinterpret_cast<V*>(y + xo) = ylo;
    *reinterpret_cast<V*>(y + xo + a.half) = yhi;
  }
}

using onnxfuse::cuda_kernels::Aligned16;

template <typename T, int VEC>
int Launch(const void* x, const void* cs, const void* sn, void* y, const RotaryArgs& a, cudaStream_t stream) {
  const int threads = 256;
  const int64_t total = a.rows * (a.half / VEC);
  int64_t blocks = (total + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;  // grid-stride beyond
  RotaryKernel<T, VEC><<<unsigned(blocks), threads, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(cs),
                                                                 static_cast<const T*>(sn), static_cast<T*>(y), a);
  return int(cudaGetLastError());
}

template <typename T>
int Run(const void* x, const void* cs, const void* sn, void* y, const RotaryArgs& a, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (a.half % kVec == 0 && Aligned16(x) && Aligned16(cs) && Aligned16(sn) && Aligned16(y))
    return Launch<T, kVec>(x, cs, sn, y, a, stream);
  return Launch<T, 1>(x, cs, sn, y, a, stream);
}

}  // namespace

extern "C" int onnxfuse_cuda_rotary_embedding(int dtype, const void* x, const void* cos, const void* sin, void* y,
                                              int64_t rows, int64_t d, int64_t d1, int64_t d2,
                                              const int64_t* cos_stride, const int64_t* sin_stride, void* stream) {
  const int check = onnxfuse_rotary_check(dtype, x, cos, sin, y, rows, d, d1, d2, cos_stride, sin_stride);
  if (check != 0) return check > 0 ? 0 : check;
  const RotaryArgs a{rows,          d / 2,         d1,           d2, cos_stride[0], cos_stride[1], cos_stride[2],
                     sin_stride[0], sin_stride[1], sin_stride[2]};
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case ONNXFUSE_FP32:
      return Run<float>(x, cos, sin, y, a, s);
    case ONNXFUSE_FP16:
      return Run<__half>(x, cos, sin, y, a, s);
    default:
      return Run<__nv_bfloat16>(x, cos, sin, y, a, s);
  }
}

#else  // the host half: the CUDA EP glue and the Triton launcher
// RotaryEmbedding on the CUDA EP: the kernel struct calling the nvcc half's launcher or the Triton one
// (at the end of this file) through Dispatch (cuda/ops_cuda.h), and its registration.
#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

template <typename T>
struct RotaryEmbeddingCuda {
  static constexpr const char* kName = schema::RotaryEmbedding::kName;
  RotaryEmbeddingCuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Cos,
                      const Ort::Custom::Tensor<T>& Sin, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const RotaryDims d = RotaryEmbeddingDims(kName, X.Shape(), Cos.Shape(), Sin.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.rows == 0 || d.D == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *c = Cos.Data(), *s = Sin.Data();
      Dispatch(
          kName, attrs,
          [&] {
            return onnxfuse_cuda_rotary_embedding(DtypeCode<T>(), x, c, s, y, d.rows, d.D, d.d1, d.d2, d.cos_stride,
                                                  d.sin_stride, stream);
          },
          [&] {
            return onnxfuse_triton_rotary_embedding(DtypeCode<T>(), x, c, s, y, d.rows, d.D, d.d1, d.d2, d.cos_stride,
                                                    d.sin_stride, stream);
          });
    });
  }
  OpAttrs attrs;
};

}  // namespace

void RegisterRotaryEmbeddingCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<RotaryEmbeddingCuda>(domain, schema::RotaryEmbedding::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of RotaryEmbedding (triton/rotary_embedding.py).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

extern "C" int onnxfuse_triton_rotary_embedding(int dtype, const void* x, const void* cos, const void* sin, void* y,
                                                int64_t rows, int64_t d, int64_t d1, int64_t d2,
                                                const int64_t* cos_stride, const int64_t* sin_stride, void* stream) {
  const int check = onnxfuse_rotary_check(dtype, x, cos, sin, y, rows, d, d1, d2, cos_stride, sin_stride);
  if (check != 0) return check > 0 ? 0 : check;
  const int64_t big[] = {
      rows, d, d1, d2, cos_stride[0], cos_stride[1], cos_stride[2], sin_stride[0], sin_stride[1], sin_stride[2]};
  for (int64_t v : big)
    if (v > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;  // Triton params are i32 (offsets are 64-bit inside)
  int32_t ROWS = int32_t(rows), HALF = int32_t(d / 2), D1 = int32_t(d1), D2 = int32_t(d2);
  int32_t CS0 = int32_t(cos_stride[0]), CS1 = int32_t(cos_stride[1]), CS2 = int32_t(cos_stride[2]);
  int32_t SS0 = int32_t(sin_stride[0]), SS1 = int32_t(sin_stride[1]), SS2 = int32_t(sin_stride[2]);
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x,   &cos, &sin, &y,   &ROWS,           &HALF,           &D1, &D2, &CS0, &CS1,
                  &CS2, &SS0, &SS1, &SS2, &scratch_global, &scratch_profile};
  const bool aligned = Aligned16(x) && Aligned16(cos) && Aligned16(sin) && Aligned16(y) && HALF % 16 == 0;
  return Launch(ids::kRotaryEmbedding, dtype, rows, d / 2, aligned, 0, args, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
