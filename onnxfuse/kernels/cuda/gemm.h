// The CUDA backend's GEMM: cuBLASLt (loaded at run time, cuda/cublaslt_api.h) with its fused epilogues, shared by
// linear_act.cu, swiglu.cu, lora_linear.cu and mlp_stack.cu; plus the small elementwise kernels for what cuBLASLt
// has no epilogue for (sigmoid, act(gate) * up) and for K = 0; and the element conversions (to_f, from_f) and dtype
// dispatch (ByDtype) every .cu uses. Compiled by nvcc only.
//
// Row-major [M, K] @ [K, N] -> [M, N] is cuBLASLt's column-major Y^T = W^T X^T: W is the column-major A [N, K]
// (ld N), X the column-major B [K, M] (ld K), Y the column-major D [N, M] (ld N), and the bias runs along D's rows.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.h"

namespace onnxfuse::cuda_kernels {

// Y = [relu](alpha * X @ W + beta * C + bias); C may be Y itself (read before written), bias may be null.
struct GemmArgs {
  int dtype = ONNXFUSE_FP32;
  const void* x = nullptr;     // [M, K]
  const void* w = nullptr;     // [K, N]; [N, K] (W^T, row-major) when trans_w
  const void* bias = nullptr;  // [N] or null
  const void* c = nullptr;     // [M, N] when beta != 0
  void* y = nullptr;           // [M, N]
  int64_t m = 0, k = 0, n = 0;
  float alpha = 1.f, beta = 0.f;
  bool relu = false;
  bool trans_w = false;  // w holds W^T [N, K] (Int4Linear's dequantized weights: its packed rows' layout)
};

// Enqueues the GEMM on `stream` with a cuBLASLt algorithm chosen once per shape, alignment and thread (heuristic,
// cached), using up to `workspace_bytes` of `workspace`. M, N >= 1; K = 0 gives Y = [relu](beta * C + bias). Returns
// a launch.h code (ONNXFUSE_ERR_NO_CUBLASLT, ONNXFUSE_ERR_CUBLAS, a cudaError_t).
int Gemm(const GemmArgs& g, void* workspace, int64_t workspace_bytes, cudaStream_t stream);

// Y = [relu](X @ W + bias + scale * (X @ A) @ B) (LoRALinear's and LoRASwiGLU's CUDA backend): T = scale * X @ A
// into `t` ([M, r], the element type), Y = T @ B, then X @ W + Y (+ bias, relu) in the last GEMM's epilogue; the
// rank-r term is skipped where it is exactly zero (r, K or scale 0). `g` holds X, W, Y, bias, relu and the sizes.
int LoRAGemm(GemmArgs g, const void* a, const void* b, float scale, int64_t r, void* t, void* workspace,
             int64_t workspace_bytes, cudaStream_t stream);

// Y = X @ W + bias + scales[j] * (X @ A[j]) @ B[j] for each row (j = index[row / rows_per_index]; none where j < 0,
// NaN where j >= adapters; A [adapters, K, r], B [adapters, r, N]): MultiLoRALinear's and MultiLoRASwiGLU's CUDA
// backend. The GEMM (with `g`'s bias), then a shrink kernel (each row's X @ A[j], fp32 partials over slices of K into
// `t`, MultiLoRAPartialsBytes(M, K, r) bytes) and an expand kernel adding the scaled T @ B[j] to Y.
int64_t MultiLoRAPartialsBytes(int64_t m, int64_t k, int64_t r);
int MultiLoRAGemm(GemmArgs g, const void* a, const void* b, const void* scales, const int64_t* index, int64_t r,
                  int64_t adapters, int64_t rows_per_index, float* t, void* workspace, int64_t workspace_bytes,
                  cudaStream_t stream);

int64_t ElemBytes(int dtype);
// Bytes rounded up to 256, so a buffer placed after it in one scratch block keeps cuBLASLt's preferred alignment.
inline int64_t Align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }
// Whether a pointer allows 16-byte vector loads and stores (the nvcc halves' kernels; the Triton launchers have
// triton/runtime.h's).
inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline bool CheckCommon(int dtype, const void* x, const void* y, int64_t m, int64_t k, int64_t n) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || k < 0 || n < 0) return false;
  if (m > 0 && n > 0 && (y == nullptr || (k > 0 && x == nullptr))) return false;
  return true;
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Runs f<T>() with T the element type of `dtype` (float, __half, __nv_bfloat16).
template <typename F>
int ByDtype(int dtype, F&& f) {
  switch (dtype) {
    case ONNXFUSE_FP32:
      return f(float{});
    case ONNXFUSE_FP16:
      return f(__half{});
    default:
      return f(__nv_bfloat16{});
  }
}

// Programmatic dependent launch (sm_90 and newer): a kernel started by LaunchDependent may begin while the kernel
// before it on the stream still runs (its blocks take the SMs that kernel's last wave leaves free), so it can request
// what that kernel does not write (constant weights) early; it must read nothing that kernel writes before PdlWait()
// (griddepcontrol.wait: the kernel before has completed and its writes are visible). PdlTrigger() lets the next
// dependent launch begin once every block of this grid has called it or exited. Both are no-ops below sm_90 and in a
// kernel launched the ordinary way.
__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void PdlTrigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The sum of v over a block of W warps, in every thread (red: W floats of shared memory; callable again on the same
// red).
template <int W>
__device__ __forceinline__ float BlockSum(float v, float (&red)[W]) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // red may still be read from a previous call
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
#pragma unroll
  for (int w = 0; w < W; ++w) t += red[w];
  return t;
}

// Whether the current device takes programmatic dependent launches (sm_90 or newer, cached per device) and
// ONNXFUSE_PDL allows them.
bool PdlOn();

// Whether a launch on `stream` now is a programmatic dependent (LaunchDependent's test; kernels launched through
// cudaLaunchKernelEx with attributes of their own add the programmatic stream serialization attribute where it holds).
inline bool PdlLaunchHere(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  return PdlOn() && cudaStreamIsCapturing(stream, &capture) == cudaSuccess &&
         (capture == cudaStreamCaptureStatusNone || onnxfuse_cuda_pdl_in_graph());
}

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent of the kernel before it where PdlOn(),
// into a stream being captured too unless ONNXFUSE_PDL_GRAPH=0 (the graph then holds a programmatic edge). What it
// saves is the gap between kernels: a dependent requests what the kernel before it does not write (constant weights)
// while that kernel's last blocks run. In genai's CUDA graph: its int4 7B-shape model (the one-row int4 GEMV) decoded
// 1.915 ms/token against 2.126 with the edges plain (batch 1, H200), its fp16 one 4.207 against 4.267
// (benchmarks/results/h200-2026-11-30/int4/genai-int4-row*.json, generate/genai-L32-pdlgraph*.json); the int4 kernels
// before the one-row GEMV (fixed-size blocks in waves) measured 0.98x with the edges captured on an H100
// (benchmarks/results/h100-2026-11-27/int4/pdl-ab.txt), when this was off by default.
template <typename... P, typename... A>
int LaunchDependent(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  if (!PdlLaunchHere(stream)) {
    kernel<<<grid, block, smem, stream>>>(static_cast<A&&>(args)...);
    return int(cudaGetLastError());
  }
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return int(cudaLaunchKernelEx(&cfg, kernel, static_cast<A&&>(args)...));
}

// Grid-stride elementwise launch over `count` elements: body(i) for each i.
template <typename Body>
__global__ void ElementwiseKernel(int64_t count, Body body) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    body(i);
}
template <typename Body>
int LaunchElementwise(int64_t count, Body body, cudaStream_t stream) {
  if (count <= 0) return 0;
  const int threads = 256;
  const int64_t blocks = (count + threads - 1) / threads;
  ElementwiseKernel<<<unsigned(blocks < 8192 ? blocks : 8192), threads, 0, stream>>>(count, body);
  return int(cudaGetLastError());
}

}  // namespace onnxfuse::cuda_kernels
