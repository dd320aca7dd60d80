// LoRASwiGLU's gate pass in CUDA on its cuBLASLt path (cuda/swiglu.cu's Triton launcher, from triton/table.py
// LORA_SWIGLU_CUBLAS's rows and K; fp16/bf16, ranks to 16, N a multiple of 64), in place of Triton's lora_gate:
//
//   y = act(g + (sg Tg) @ Bg) * (u + (su Tu) @ Bu)   g, u: the base GEMMs' products [m, n]; Tg, Tu: phase 1's fp32
//                                                     partials [split, m, 16], summed, scaled and rounded to T here
//   td[rows, :rd] += y @ A_down[cols, :rd]            the down adapter's X @ A (LoRAGatedMLP; rd 0: none), fp32 adds
//
// Triton's lora_gate took 73 us at 2048 x 11008 (rank 16, H100) against a plain act(g) * u pass's 47: its rank-r dots'
// layout conversions. Here g and u go through shared memory as a GEMM's operands do: cp.async in whole rows (a
// 2-stage pipeline of 64-column chunks), ldmatrix into the mma fragments (16-byte chunks XOR-swizzled by row,
// conflict-free), so the rank-r products add to them in registers; y is written back over g's tile and stored from
// there in whole rows, and is the down sum's A operand as it is. The activation is a template argument in Triton's
// fast forms (common/gate_act.h GateActFast): the pass is bound by its instructions' latency, and a run-time switch
// over the accurate forms cost it more than it saved (9e303a6). Included by swiglu.cu (nvcc half) and by the probe
// scripts/lora_gate_lib.cu, which times this kernel beside Triton's (scripts/lora_gate_mma_probe.py). H100, 2048 x
// 11008, rank 16, 4 partials: 57.6 us against Triton's 73.6 and a plain act(g) * u pass's 46.8; the 2048-token LoRA
// MLP 18-30 us faster through onnxruntime (benchmarks/results/h100-2026-11-27/lora/ab-libs-gate-fast-summary.txt).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/gate_act.h"
#include "cuda/launch.h"
#include "lora_gate_frag.h"
#include "mma.h"

namespace onnxfuse::cuda_kernels::gate_pass {

constexpr int kStages = 2;  // the library's ring of chunks (lora_gate_frag.h: a block's geometry, a stage's bytes)

struct Args {
  const void* g;    // the gate product [m, n] (may be y itself)
  const void* u;    // the up product [m, n]
  const float* tg;  // partials [split, m, 16]
  const float* tu;
  const void* bg;  // [rg, n]
  const void* bu;  // [ru, n]
  const void* ad;  // the down adapter's A [n, rd] (rd 0: none)
  float* td;       // its fp32 sum [m, 16], added to
  void* y;         // [m, n]
  int64_t m, n;
  int split, rg, ru, rd;
  float sg, su;
};

// One chunk's loads into a stage: 4 + 4 pieces of g and u a thread, 1 + 1 of bg and bu (zeros past the ranks), 1 of
// the A rows (zeros past rd).
template <typename T>
__device__ __forceinline__ void Issue(char* stage, const Args& p, int64_t row0, int64_t c0) {
  const uint32_t base = SmemAddr(stage);
  const T* g = static_cast<const T*>(p.g);
  const T* u = static_cast<const T*>(p.u);
  for (int i = 0; i < kRows * kCpr / 128; ++i) {
    const int q = threadIdx.x + i * 128, r = q / kCpr, c = q % kCpr;
    const int64_t row = row0 + r < p.m ? row0 + r : p.m - 1;  // rows past m: loaded, never stored
    const int64_t off = row * p.n + c0 + 8 * c;
    CpAsync16(base + Wide(r, c), g + off);
    CpAsync16(base + kTileBytes + Wide(r, c), u + off);
  }
  for (int i = 0; i < kRank * kCpr / 128; ++i) {
    const int q = threadIdx.x + i * 128, r = q / kCpr, c = q % kCpr;
    const T* bg = static_cast<const T*>(p.bg);
    const T* bu = static_cast<const T*>(p.bu);
    CpAsync16(base + 2 * kTileBytes + Wide(r, c), r < p.rg ? bg + int64_t(r) * p.n + c0 + 8 * c : bg, r < p.rg);
    CpAsync16(base + 2 * kTileBytes + kBBytes + Wide(r, c), r < p.ru ? bu + int64_t(r) * p.n + c0 + 8 * c : bu,
              r < p.ru);
  }
  if (p.rd > 0)
    for (int i = 0; i < kChunk * 2 / 128; ++i) {
      const int q = threadIdx.x + i * 128, ra = q >> 1, ca = q & 1;
      const T* ad = static_cast<const T*>(p.ad);
      const bool ok = 8 * ca < p.rd;
      CpAsync16(base + 2 * kTileBytes + 2 * kBBytes + Narrow(ra, ca), ok ? ad + (c0 + ra) * p.rd + 8 * ca : ad, ok);
    }
}

// A block: 4 warps, 64 rows (a warp 16) and a range of 64-column chunks (grid.x splits the columns). A warp takes its
// 16 rows of a chunk 16 columns (two mma n-blocks) at a time: ldmatrix of g and u gives their values in the
// accumulators' layout, ldmatrix.trans of bg and bu the B fragments, T is one A fragment a warp.
// S: the ring's stages (S - 1 chunks in flight while one is computed; the library's kStages, the probe's others).
template <typename T, int A, int S>
__global__ void __launch_bounds__(kWarps * 32) LoRAGatePass(const Args p) {
  extern __shared__ __align__(128) char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.y) * kRows, wrow = row0 + warp * 16;
  const int64_t r0 = wrow + g < p.m ? wrow + g : p.m - 1, r1 = wrow + g + 8 < p.m ? wrow + g + 8 : p.m - 1;
  const int total = int(p.n / kChunk);
  const int first = int(int64_t(blockIdx.x) * total / gridDim.x);
  const int count = int(int64_t(blockIdx.x + 1) * total / gridDim.x) - first;
  if (count <= 0) return;
  for (int j = 0; j < S - 1; ++j) {  // chunks 0 .. S - 2, a group each (empty past count)
    if (j < count) Issue<T>(smem + j * kStageBytes, p, row0, int64_t(first + j) * kChunk);
    asm volatile("cp.async.commit_group;\n" ::);
  }
  uint32_t ag[4], au[4];
  RankFragment<T>(p.tg, p.split, p.m, r0, r1, t, p.sg, ag);
  RankFragment<T>(p.tu, p.split, p.m, r0, r1, t, p.su, au);
  float dsum[2][4] = {};
  const int mi = lane >> 3, mr = lane & 7;  // this lane's ldmatrix row: matrix lane / 8, its row lane % 8
  T* y = static_cast<T*>(p.y);
  for (int i = 0; i < count; ++i) {
    char* stage = smem + (i % S) * kStageBytes;
    const uint32_t gs = SmemAddr(stage), us = gs + kTileBytes, bgs = gs + 2 * kTileBytes, bus = bgs + kBBytes,
                   ads = bus + kBBytes;
    asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 2) : "memory");  // chunk i has landed ...
    __syncthreads();  // ... for every thread, and chunk i - 1's stage has been stored from
    if (i + S - 1 < count)
      Issue<T>(smem + ((i + S - 1) % S) * kStageBytes, p, row0, int64_t(first + i + S - 1) * kChunk);
    asm volatile("cp.async.commit_group;\n" ::);
    for (int q2 = 0; q2 < kChunk / 16; ++q2) {  // 16 columns: mma n-blocks 2 q2 and 2 q2 + 1
      uint32_t gd[4], ud[4], bgf[4], buf[4];
      const int tr = warp * 16 + (mi & 1) * 8 + mr, tc = 2 * q2 + (mi >> 1);
      Ldm4(gs + Wide(tr, tc), gd);  // the accumulators' layout: n-block, rows g / g + 8
      Ldm4(us + Wide(tr, tc), ud);
      const int br = (mi & 1) * 8 + mr;  // B fragments: ranks 0-7 / 8-15, n-block by mi / 2
      Ldm4T(bgs + Wide(br, tc), bgf);
      Ldm4T(bus + Wide(br, tc), buf);
      uint32_t yw[2][2];
      for (int q = 0; q < 2; ++q) {
        float dg[4] = {}, du[4] = {};
        MmaSync<T>(dg, ag, bgf[2 * q], bgf[2 * q + 1]);
        MmaSync<T>(du, au, buf[2 * q], buf[2 * q + 1]);
        for (int h = 0; h < 2; ++h) {  // rows g, g + 8
          const float2 gg = Unpack<T>(gd[2 * q + h]), uu = Unpack<T>(ud[2 * q + h]);
          const float g0 = gg.x + dg[2 * h], g1 = gg.y + dg[2 * h + 1];
          const float u0 = uu.x + du[2 * h], u1 = uu.y + du[2 * h + 1];
          yw[q][h] = Two<T>(GateActFast<A>(g0) * u0, GateActFast<A>(g1) * u1);
          const int r = warp * 16 + g + 8 * h;  // y over g's tile: row r, piece 2 q2 + q, bytes 4t
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(gs + Wide(r, 2 * q2 + q) + 4 * t), "r"(yw[q][h]));
        }
      }
      if (p.rd > 0) {  // k-step q2 of y @ A_down: A = y's two n-blocks as they are
        const uint32_t a[4] = {yw[0][0], yw[0][1], yw[1][0], yw[1][1]};
        uint32_t af[4];
        Ldm4T(ads + Narrow(16 * q2 + (mi & 1) * 8 + mr, mi >> 1), af);
        MmaSync<T>(dsum[0], a, af[0], af[1]);
        MmaSync<T>(dsum[1], a, af[2], af[3]);
      }
    }
    __syncthreads();
    const int64_t c0 = int64_t(first + i) * kChunk;
    for (int k = 0; k < kRows * kCpr / 128; ++k) {  // y's tile out in whole rows
      const int q = threadIdx.x + k * 128, r = q / kCpr, c = q % kCpr;
      if (row0 + r < p.m)
        *reinterpret_cast<uint4*>(y + (row0 + r) * p.n + c0 + 8 * c) =
            *reinterpret_cast<const uint4*>(stage + Wide(r, c));
    }
  }
  if (p.rd > 0) AddDownSum(p.td, dsum, wrow, g, t, p.m, p.rd);
}

// Whether the pass takes a dtype (onnxfuse_ops.h codes), N and the largest of the ranks.
inline bool Takes(int dtype, int64_t n, int64_t r) {
  return (dtype == ONNXFUSE_FP16 || dtype == ONNXFUSE_BF16) && r >= 0 && r <= kRank && n > 0 && n % kChunk == 0;
}

template <typename T, int A, int S>
int Launch(const Args& p, int64_t splits, cudaStream_t s) {
  // past 48 KB of dynamic shared memory, opted in per launch (as Int4Gemv and the embedding interaction do)
  constexpr int smem = S * kStageBytes;
  if (cudaError_t e = cudaFuncSetAttribute(LoRAGatePass<T, A, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem))
    return int(e);
  LoRAGatePass<T, A, S><<<dim3(unsigned(splits), unsigned((p.m + kRows - 1) / kRows)), kWarps * 32, smem, s>>>(p);
  return int(cudaGetLastError());
}

template <typename T, int S>
int LaunchAct(int act, const Args& p, int64_t splits, cudaStream_t s) {
  switch (act) {
    case ONNXFUSE_GATE_SILU:
      return Launch<T, ONNXFUSE_GATE_SILU, S>(p, splits, s);
    case ONNXFUSE_GATE_GELU:
      return Launch<T, ONNXFUSE_GATE_GELU, S>(p, splits, s);
    case ONNXFUSE_GATE_GELU_TANH:
      return Launch<T, ONNXFUSE_GATE_GELU_TANH, S>(p, splits, s);
    case ONNXFUSE_GATE_QUICK_GELU:
      return Launch<T, ONNXFUSE_GATE_QUICK_GELU, S>(p, splits, s);
    case ONNXFUSE_GATE_RELU:
      return Launch<T, ONNXFUSE_GATE_RELU, S>(p, splits, s);
    case ONNXFUSE_GATE_SIGMOID:
      return Launch<T, ONNXFUSE_GATE_SIGMOID, S>(p, splits, s);
    default:
      return ONNXFUSE_ERR_BAD_ARGUMENT;
  }
}

// The pass on `s` (dtype: ONNXFUSE_FP16 or _BF16; Takes() holds, buffers 16-byte aligned, split >= 1). Blocks: 64-row
// tiles x `splits` column ranges; 0 picks floor(4 SMs / row tiles), about 4 blocks an SM (`sms`; 5 fit by registers
// and shared memory, so one wave): at 2048 x 11008 (rank 16, 4 partials, H200) 16 ranges and 512 blocks took 42.6 us
// against 47.1 for the 11 of the rule before (2.5 blocks an SM), 44.1-48.4 for 12-15, 17 and 18, 43.7 for 20, and a
// ring of 3 or 4 stages, which leaves room for 3 or 2 blocks an SM, 52.6-90.4 (benchmarks/results/h200-2026-12-01/
// lora/gate-pass-splits.txt: the pass is bound by its instructions' latency, so the warps an SM count, not the bytes
// in flight). An H100 had 10 ranges at 55.0 us against 56.5 for 16 with lora_gate_ldm's form of the kernel.
template <int S = kStages>
int Run(int dtype, int act, const Args& p, int sms, int64_t splits, cudaStream_t s) {
  if (!Takes(dtype, p.n, std::max({p.rg, p.ru, p.rd})) || p.m <= 0 || p.split < 1 || splits < 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int64_t row_tiles = (p.m + kRows - 1) / kRows, chunks = p.n / kChunk;
  if (splits == 0) splits = 4 * int64_t(std::max(sms, 1)) / row_tiles;
  splits = std::max<int64_t>(1, std::min(chunks, splits));
  return dtype == ONNXFUSE_FP16 ? LaunchAct<__half, S>(act, p, splits, s)
                                : LaunchAct<__nv_bfloat16, S>(act, p, splits, s);
}

}  // namespace onnxfuse::cuda_kernels::gate_pass
