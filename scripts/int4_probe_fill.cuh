// Deterministic fills for the int4 probe programs (scripts/int4_prefill_chunks.cu, scripts/int4_dequant_probe.cu):
// packed 4-bit weights as arbitrary bytes, scales and activations as halves in [-scale, scale).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

__global__ void Fill(uint8_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = uint8_t((i * 2654435761u + seed) >> 13);
}
__global__ void FillHalf(__half* p, int64_t n, float scale, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __float2half(scale * (float(((i * 2654435761u + seed) >> 9) & 1023) / 512.f - 1.f));
}
