// Issue 30, the gated LoRA MLP at 2048 tokens: a third CUDA form of the `lora_gate` pass (triton/swiglu.py), after
// lora_gate_mma.cu, whose tiles lived in the mma fragments from global loads of 64 bytes a row: without any LoRA work
// that form still took 59.7 us against a flat act(g) * u pass's 46.7, while the plain pass on lora_gate's own 16 x 128
// tiles takes 46.8 (scripts/silu_mul_tile_probe.py). So here g and u (and the adapters' tiles) go through shared
// memory as a GEMM's operands do: cp.async in whole rows (coalesced, a 2-stage pipeline), ldmatrix into the
// fragments (16-byte chunks XOR-swizzled by row, conflict-free), y written back over g's tile and stored from there in
// whole rows.
//
//   y = act(g + (sg * tg) @ bg) * (u + (su * tu) @ bu)     (tg, tu: phase 1's fp32 partials [S, M, 16], summed here)
//   td[rows, :rd] += y @ ad[cols, :rd]                      (the down adapter's X @ A, fp32 atomics; rd 0: none)
//
// A block: 4 warps, 64 rows (a warp 16) and a range of 64-column chunks (grid.x splits the columns); per chunk stage:
// g and u [64, 64], bg and bu [16, 64], ad's rows [64, 16], 22 KB, STAGES stages. A warp takes its 16 rows of a
// chunk 16 columns (two mma n-blocks) at a time: ldmatrix of g and u gives their values in the accumulators' layout,
// ldmatrix.trans of bg and bu the B fragments, T (the scaled, rounded rank-r row tile) is one A fragment a warp; y
// (rounded as stored) is the down sum's A operand as it is, ad's rows its B fragments (ldmatrix.trans). A probe:
// fp16 and bf16, silu, rank 16 (r_pad 16), N a multiple of 64. Built with nvcc -shared, run from
// scripts/lora_gate_mma_probe.py --entry lora_gate_ldm (--chunks: column ranges; --skips: stages).
//
// Measured (H100, 2048 x 11008, rank 16, 4 partials; benchmarks/results/h100-2026-11-27/lora/lora-gate-ldm-probe.txt):
// with 128-column chunks (44 KB stages, 8 warps an SM) 72.3-78.0 us, bound by its instructions' latency; with 64-column
// chunks (up to 5 blocks an SM) 55.0 us at 10 column ranges (320 blocks) against Triton's lora_gate's 73.0 and the
// plain pass's 46.6 (+8.4 instead of +26.4), the down sum costing 0.7. The library's form: cuda/lora_gate_pass.h (its
// pieces in lora_gate_frag.h, which this probe includes).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../onnxfuse/kernels/cuda/mma.h"
#include "../onnxfuse/kernels/cuda/lora_gate_frag.h"

namespace ock = onnxfuse::cuda_kernels;
using onnxfuse::cuda_kernels::gate_pass::AddDownSum, onnxfuse::cuda_kernels::gate_pass::RankFragment,
    onnxfuse::cuda_kernels::gate_pass::Two, onnxfuse::cuda_kernels::gate_pass::Unpack;
using onnxfuse::cuda_kernels::gate_pass::CpAsync16, onnxfuse::cuda_kernels::gate_pass::Ldm4,
    onnxfuse::cuda_kernels::gate_pass::Ldm4T, onnxfuse::cuda_kernels::gate_pass::SmemAddr;
// the library pass's geometry (64-row blocks of 4 warps, 64-column chunks) and swizzled tile offsets
using onnxfuse::cuda_kernels::gate_pass::kABytes, onnxfuse::cuda_kernels::gate_pass::kBBytes,
    onnxfuse::cuda_kernels::gate_pass::kChunk, onnxfuse::cuda_kernels::gate_pass::kCpr,
    onnxfuse::cuda_kernels::gate_pass::kRank, onnxfuse::cuda_kernels::gate_pass::kRows,
    onnxfuse::cuda_kernels::gate_pass::kStageBytes, onnxfuse::cuda_kernels::gate_pass::kTileBytes,
    onnxfuse::cuda_kernels::gate_pass::kWarps, onnxfuse::cuda_kernels::gate_pass::Narrow,
    onnxfuse::cuda_kernels::gate_pass::Wide;

namespace {

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// One chunk's loads into a stage (every thread: 8 + 8 pieces of g and u, 2 + 2 of bg and bu, 2 of ad's rows).
template <typename T>
__device__ __forceinline__ void IssueChunk(char* stage, const T* __restrict__ gp, const T* __restrict__ up,
                                           const T* __restrict__ bg, const T* __restrict__ bu, const T* __restrict__ ad,
                                           int rd, int64_t row0, int64_t m, int64_t n, int64_t c0) {
  const uint32_t base = SmemAddr(stage);
  for (int i = 0; i < kRows * kCpr / 128; ++i) {
    const int p = threadIdx.x + i * 128, r = p / kCpr, c = p % kCpr;
    const int64_t row = row0 + r < m ? row0 + r : m - 1;
    const int64_t off = row * n + c0 + 8 * c;
    CpAsync16(base + Wide(r, c), gp + off);
    CpAsync16(base + kTileBytes + Wide(r, c), up + off);
  }
  for (int i = 0; i < kRank * kCpr / 128; ++i) {
    const int p = threadIdx.x + i * 128, r = p / kCpr, c = p % kCpr;
    const int64_t off = int64_t(r) * n + c0 + 8 * c;
    CpAsync16(base + 2 * kTileBytes + Wide(r, c), bg + off);
    CpAsync16(base + 2 * kTileBytes + kBBytes + Wide(r, c), bu + off);
  }
  if (rd > 0)
    for (int i = 0; i < kChunk * 2 / 128; ++i) {
      const int p = threadIdx.x + i * 128, ra = p >> 1, ca = p & 1;
      CpAsync16(base + 2 * kTileBytes + 2 * kBBytes + Narrow(ra, ca), ad + (c0 + ra) * kRank + 8 * ca);
    }
}

template <typename T, int STAGES>
__global__ void __launch_bounds__(kWarps * 32)
    LoRAGateLdm(const T* __restrict__ gp, const T* __restrict__ up, const float* __restrict__ tg,
                const float* __restrict__ tu, int s_count, const T* __restrict__ bg, const T* __restrict__ bu, float sg,
                float su, const T* __restrict__ ad, float* __restrict__ td, int rd, T* __restrict__ y, int64_t m,
                int64_t n) {
  extern __shared__ __align__(128) char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.y) * kRows;
  const int64_t wrow = row0 + warp * 16;
  const int64_t r0 = wrow + g < m ? wrow + g : m - 1, r1 = wrow + g + 8 < m ? wrow + g + 8 : m - 1;
  const int total = int(n / kChunk);
  const int first = int(int64_t(blockIdx.x) * total / gridDim.x);
  const int count = int(int64_t(blockIdx.x + 1) * total / gridDim.x) - first;
  if (count <= 0) return;
  for (int c = 0; c < STAGES - 1; ++c) {  // chunks 0 .. STAGES - 2 in flight
    if (c < count)
      IssueChunk<T>(smem + c * kStageBytes, gp, up, bg, bu, ad, rd, row0, m, n, int64_t(first + c) * kChunk);
    CpAsyncCommit();
  }
  uint32_t ag[4], au[4];
  RankFragment<T>(tg, s_count, m, r0, r1, t, sg, ag);
  RankFragment<T>(tu, s_count, m, r0, r1, t, su, au);
  float dsum[2][4] = {};
  // this lane's ldmatrix row: matrix lane / 8, its row lane % 8
  const int mi = lane >> 3, mr = lane & 7;
  for (int i = 0; i < count; ++i) {
    char* stage = smem + (i % STAGES) * kStageBytes;
    const uint32_t gs = SmemAddr(stage), us = gs + kTileBytes, bgs = gs + 2 * kTileBytes, bus = bgs + kBBytes,
                   ads = bus + kBBytes;
    CpAsyncWait<STAGES - 2>();  // chunk i has landed
    __syncthreads();            // ... for every thread, and chunk i - 1's stage has been stored from
    {
      const int next = i + STAGES - 1;  // into the stage chunk i - 1 used
      if (next < count)
        IssueChunk<T>(smem + (next % STAGES) * kStageBytes, gp, up, bg, bu, ad, rd, row0, m, n,
                      int64_t(first + next) * kChunk);
      CpAsyncCommit();
    }
    for (int p = 0; p < kChunk / 16; ++p) {  // 16 columns: mma n-blocks 2p and 2p + 1
      uint32_t gd[4], ud[4], bgf[4], buf[4];
      const int tr = warp * 16 + (mi & 1) * 8 + mr, tc = 2 * p + (mi >> 1);  // g/u: rows 0-7 / 8-15, n-block
      Ldm4(gs + Wide(tr, tc), gd);
      Ldm4(us + Wide(tr, tc), ud);
      const int br = (mi & 1) * 8 + mr;  // bg/bu: ranks 0-7 / 8-15 (b0 / b1), n-block by mi / 2
      Ldm4T(bgs + Wide(br, tc), bgf);
      Ldm4T(bus + Wide(br, tc), buf);
      uint32_t yw[2][2];
      for (int q = 0; q < 2; ++q) {
        float dg[4] = {}, du[4] = {};
        ock::MmaSync<T>(dg, ag, bgf[2 * q], bgf[2 * q + 1]);
        ock::MmaSync<T>(du, au, buf[2 * q], buf[2 * q + 1]);
        for (int h = 0; h < 2; ++h) {  // rows g, g + 8
          const float2 gg = Unpack<T>(gd[2 * q + h]), uu = Unpack<T>(ud[2 * q + h]);
          const float g0 = gg.x + dg[2 * h], g1 = gg.y + dg[2 * h + 1];
          const float u0 = uu.x + du[2 * h], u1 = uu.y + du[2 * h + 1];
          yw[q][h] = Two<T>(__fdividef(g0, 1.f + __expf(-g0)) * u0, __fdividef(g1, 1.f + __expf(-g1)) * u1);
          const int r = warp * 16 + g + 8 * h;  // y over g's tile: row r, chunk 2p + q, bytes 4t
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(gs + Wide(r, 2 * p + q) + 4 * t), "r"(yw[q][h]));
        }
      }
      if (rd > 0) {  // k-step p of y @ ad: A = y's two n-blocks as they are; B from ad's rows 16p ..
        const uint32_t a[4] = {yw[0][0], yw[0][1], yw[1][0], yw[1][1]};
        uint32_t af[4];
        Ldm4T(ads + Narrow(16 * p + (mi & 1) * 8 + mr, mi >> 1), af);
        ock::MmaSync<T>(dsum[0], a, af[0], af[1]);
        ock::MmaSync<T>(dsum[1], a, af[2], af[3]);
      }
    }
    __syncthreads();
    const int64_t c0 = int64_t(first + i) * kChunk;
    for (int k = 0; k < kRows * kCpr / 128; ++k) {  // y's tile out in whole rows
      const int pc = threadIdx.x + k * 128, r = pc / kCpr, c = pc % kCpr;
      if (row0 + r < m)
        *reinterpret_cast<uint4*>(y + (row0 + r) * n + c0 + 8 * c) =
            *reinterpret_cast<const uint4*>(stage + Wide(r, c));
    }
  }
  if (rd > 0) AddDownSum(td, dsum, wrow, g, t, m, rd);
}

template <typename T, int STAGES>
int Launch(const void* g, const void* u, const float* tg, const float* tu, int s_count, const void* bg, const void* bu,
           float sg, float su, const void* ad, float* td, int rd, void* y, int64_t m, int64_t n, int splits,
           cudaStream_t s) {
  const int smem = STAGES * kStageBytes;
  static bool sized = false;  // the attribute once (not again under a graph capture)
  if (!sized) cudaFuncSetAttribute(LoRAGateLdm<T, STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  sized = true;
  const dim3 grid(unsigned(splits), unsigned((m + kRows - 1) / kRows));
  LoRAGateLdm<T, STAGES><<<grid, kWarps * 32, smem, s>>>(
      static_cast<const T*>(g), static_cast<const T*>(u), tg, tu, s_count, static_cast<const T*>(bg),
      static_cast<const T*>(bu), sg, su, static_cast<const T*>(ad), td, rd, static_cast<T*>(y), m, n);
  return int(cudaGetLastError());
}

template <typename T>
int LaunchStages(int stages, const void* g, const void* u, const float* tg, const float* tu, int s_count,
                 const void* bg, const void* bu, float sg, float su, const void* ad, float* td, int rd, void* y,
                 int64_t m, int64_t n, int splits, cudaStream_t s) {
  switch (stages) {
    case 2:
      return Launch<T, 2>(g, u, tg, tu, s_count, bg, bu, sg, su, ad, td, rd, y, m, n, splits, s);
    case 3:
      return Launch<T, 3>(g, u, tg, tu, s_count, bg, bu, sg, su, ad, td, rd, y, m, n, splits, s);
    case 4:
      return Launch<T, 4>(g, u, tg, tu, s_count, bg, bu, sg, su, ad, td, rd, y, m, n, splits, s);
    default:
      return int(cudaErrorInvalidValue);
  }
}

}  // namespace

// dtype 1 fp16, 2 bf16. tg, tu: [s_count, m, 16] fp32; bg, bu: [16, n]; ad: [n, rd]; td: [m, 16] fp32 (added to).
// n a multiple of 64, the pointers 16-byte aligned; splits: blocks across the columns (1 .. n / 64); stages: the
// cp.async pipeline's depth (2, 3 or 4 stages of 22 KB; 0 means 2), passed as lora_gate_mma's `skip` argument so the
// probe calls both alike. Returns a cudaError_t.
extern "C" int lora_gate_ldm(int dtype, const void* g, const void* u, const float* tg, const float* tu, int s_count,
                             const void* bg, const void* bu, float sg, float su, const void* ad, float* td, int rd,
                             void* y, int64_t m, int64_t n, int splits, void* stream, int stages) {
  if (n % kChunk != 0 || m <= 0 || (rd != 0 && rd != kRank) || splits < 1 || splits > n / kChunk)
    return int(cudaErrorInvalidValue);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (stages == 0) stages = 2;
  return dtype == 1
             ? LaunchStages<__half>(stages, g, u, tg, tu, s_count, bg, bu, sg, su, ad, td, rd, y, m, n, splits, s)
             : LaunchStages<__nv_bfloat16>(stages, g, u, tg, tu, s_count, bg, bu, sg, su, ad, td, rd, y, m, n, splits,
                                           s);
}
