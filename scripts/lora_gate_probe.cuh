// What the CUDA lora_gate probes (scripts/lora_gate_mma.cu, scripts/lora_gate_ldm.cu) share: packing two fp32 values
// into the 32-bit word of a 16-bit pair and back, T's mma A fragment from phase 1's fp32 partials, and the down sum's
// atomics.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace lora_gate_probe {

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

// T's A fragment (rank 16) for the warp's rows r0 (lane row g) and r1 (g + 8): the s_count partials [S, M, 16] summed,
// scaled and rounded to T, as the library's kernels round it.
template <typename T>
__device__ __forceinline__ void RankFragment(const float* __restrict__ tp, int s_count, int64_t m, int64_t r0,
                                             int64_t r1, int t, float scale, uint32_t (&a)[4]) {
  constexpr int kRank = 16;
  float v[8] = {};
  for (int s = 0; s < s_count; ++s) {
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
      if (rank < rd) atomicAdd(td + row * 16 + rank, dsum[nb][2 * h]);
      if (rank + 1 < rd) atomicAdd(td + row * 16 + rank + 1, dsum[nb][2 * h + 1]);
    }
}

}  // namespace lora_gate_probe
