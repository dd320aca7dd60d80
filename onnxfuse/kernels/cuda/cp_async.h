// Device helpers the int4 kernels share (cuda/int4_linear.cu and the sm_90a rows GEMM, cuda/sm90a/): cp.async
// copies into shared memory, their groups, and a lop3 and-or. Compiled by nvcc only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace onnxfuse::cuda_kernels {

// (a & mask) | magic in one instruction: lop3 with the look-up table (0xf0 & 0xcc) | 0xaa (the compiler's own form,
// an and then an or with two immediates, takes two)
__device__ __forceinline__ uint32_t AndOr(uint32_t a, uint32_t mask, uint32_t magic) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(r) : "r"(a), "r"(mask), "r"(magic));
  return r;
}

// cp.async: 16 (or 8) bytes from global into shared memory without passing through registers; pred false zero-fills.
// (dst: a shared-memory address, as __cvta_generic_to_shared gives it, or a generic pointer into shared memory)
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void CpAsync8(uint32_t dst, const void* src, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(pred ? 8 : 0));
}
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool pred) {
  CpAsync16(uint32_t(__cvta_generic_to_shared(dst)), src, pred);
}
__device__ __forceinline__ void CpAsync8(void* dst, const void* src, bool pred) {
  CpAsync8(uint32_t(__cvta_generic_to_shared(dst)), src, pred);
}
// A 4-byte shared-memory load that stays after the cp.async wait before it (both volatile asm).
__device__ __forceinline__ uint32_t LdShared32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace onnxfuse::cuda_kernels
