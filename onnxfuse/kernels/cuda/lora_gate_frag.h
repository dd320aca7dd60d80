// The pieces of the CUDA lora_gate pass (cuda/lora_gate_pass.h) that its probes share (scripts/lora_gate_mma.cu,
// scripts/lora_gate_ldm.cu): a block's geometry and its tiles' swizzled offsets, packing two fp32 values into the
// 32-bit word of a 16-bit pair and back, cp.async and ldmatrix, T's mma A fragment from phase 1's fp32 partials, and
// the down sum's atomics. Compiled by nvcc only; needs
// no generated header, so a probe builds from it alone.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace onnxfuse::cuda_kernels::gate_pass {

constexpr int kRank = 16;  // the rank-r tiles' width: ranks to 16 (T's fragment, the partials' and down sum's rows)
// a block's warps and rows, a chunk's columns and its 16-byte pieces a row
constexpr int kWarps = 4, kRows = 16 * kWarps, kChunk = 64, kCpr = kChunk / 8;
// a stage: g, u (64 rows x 128 B), bg, bu (16 x 128 B), the down adapter's A rows (64 x 32 B)
constexpr int kTileBytes = kRows * kChunk * 2, kBBytes = kRank * kChunk * 2, kABytes = kChunk * kRank * 2;
constexpr int kStageBytes = 2 * kTileBytes + 2 * kBBytes + kABytes;

// byte offset of 16-byte piece c of row r: g, u, bg, bu tiles (kChunk columns a row, piece c ^ (r % 8)) and the A
// rows' tile (32-byte rows, piece c ^ (r / 4 % 2): rows r and r + 4 in other banks)
__device__ __forceinline__ int Wide(int r, int c) { return r * (kChunk * 2) + ((c ^ (r & 7)) << 4); }
__device__ __forceinline__ int Narrow(int r, int c) { return r * 32 + ((c ^ ((r >> 2) & 1)) << 4); }

// (a, b) rounded to T, as one 32-bit register of an mma operand
template <typename T>
__device__ __forceinline__ uint32_t Two(float a, float b) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}
template <typename T>
__device__ __forceinline__ float2 Unpack(uint32_t w) {
  if constexpr (std::is_same_v<T, __half>)
    return __half22float2(*reinterpret_cast<__half2*>(&w));
  else
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&w));
}
__device__ __forceinline__ uint32_t SmemAddr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
// 16 bytes from src, or zeros where `valid` is false (src then only has to be a mapped address)
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void Ldm4(uint32_t addr, uint32_t (&d)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(addr));
}
__device__ __forceinline__ void Ldm4T(uint32_t addr, uint32_t (&d)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(addr));
}
// T's A fragment (rank 16) for the warp's rows r0 (lane row g) and r1 (g + 8): the `split` partials [split, m, 16]
// summed, scaled and rounded to T, as the Triton kernels round it.
template <typename T>
__device__ __forceinline__ void RankFragment(const float* __restrict__ tp, int split, int64_t m, int64_t r0, int64_t r1,
                                             int t, float scale, uint32_t (&a)[4]) {
  float v[8] = {};
  for (int s = 0; s < split; ++s) {
    const float* p = tp + int64_t(s) * m * kRank;
    const float2 x0 = *reinterpret_cast<const float2*>(p + r0 * kRank + 2 * t);
    const float2 x1 = *reinterpret_cast<const float2*>(p + r1 * kRank + 2 * t);
    const float2 x2 = *reinterpret_cast<const float2*>(p + r0 * kRank + 2 * t + 8);
    const float2 x3 = *reinterpret_cast<const float2*>(p + r1 * kRank + 2 * t + 8);
    v[0] += x0.x, v[1] += x0.y, v[2] += x1.x, v[3] += x1.y, v[4] += x2.x, v[5] += x2.y, v[6] += x3.x, v[7] += x3.y;
  }
  for (int i = 0; i < 4; ++i) a[i] = Two<T>(scale * v[2 * i], scale * v[2 * i + 1]);
}

// The warp's down sum (the C fragments dsum[rank block][4] of y @ A_down, rows row0 + g and row0 + g + 8) added to
// td [m, 16] fp32 with atomics, ranks past rd and rows past m left out.
__device__ __forceinline__ void AddDownSum(float* __restrict__ td, const float (&dsum)[2][4], int64_t row0, int g,
                                           int t, int64_t m, int rd) {
  for (int nb = 0; nb < 2; ++nb)
    for (int h = 0; h < 2; ++h) {
      const int64_t row = row0 + g + 8 * h;
      const int rank = nb * 8 + 2 * t;
      if (row >= m) continue;
      if (rank < rd) atomicAdd(td + row * kRank + rank, dsum[nb][2 * h]);
      if (rank + 1 < rd) atomicAdd(td + row * kRank + rank + 1, dsum[nb][2 * h + 1]);
    }
}

}  // namespace onnxfuse::cuda_kernels::gate_pass
