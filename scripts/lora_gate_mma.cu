// Issue 30, the gated LoRA MLP at 2048 tokens: a CUDA form of the Triton `lora_gate` pass (triton/swiglu.py) with every
// tile kept in the mma fragments' registers. Nsight Compute had the Triton pass at 82 us against a plain act(g) * u
// pass's 42 on a 2048 x 11008 tile set (rank 16; benchmarks/results/h100-2026-11-27/lora/ncu-lora-gate-2048-*.txt), its
// L1/TEX pipe 90 % busy with the rank-r dots' layout conversions through shared memory. Here nothing is converted:
//
//   y = act(g + (sg * tg) @ bg) * (u + (su * tu) @ bu)     (tg, tu: phase 1's fp32 partials [S, M, 16], summed here)
//   td[rows, :rd] += y @ ad[cols, :rd]                      (the down adapter's X @ A, fp32 atomics; rd 0: none)
//
// A warp owns 16 rows; a block of 4 warps 64 rows and `nb` chunks of 64 columns. A lane (g, t) = (lane / 4, lane % 4)
// loads 16 contiguous bytes of g and of u per row (rows g and g + 8 of its warp's 16) and half (two 32-column halves,
// 8t .. 8t + 7 of each): the mma's 8-column blocks are columns of that chunk permuted, so an accumulator's values are
// the loaded ones and no value moves between lanes. Block j's local column 2t + q is the chunk's column
// 32 (j / 4) + 8t + 2 (j % 4) + q; the B tiles (bg, bu) and the down adapter's A rows are staged in shared memory in
// that order, packed as the B fragments' 32-bit words. T (the scaled rank-r row tile, rounded to the input type as the
// library's kernels round it) is one A fragment a warp, built once per block. The down adapter's sum takes y, rounded
// to the type as it is stored, as the A operand straight from the accumulators (blocks 2k and 2k + 1 are k-step k's
// fragment). A probe, not the library: fp16 and bf16, silu, rank 16 (r_pad 16), N a multiple of 64; rows past M
// masked. Built with nvcc -shared and run from scripts/lora_gate_mma_probe.py through ctypes.
//
// Status (2026-11-27): not kept. Its first form, which staged each chunk's B and A fragments with 2-byte loads between
// two barriers a chunk, was right (y 2.5e-4 from PyTorch, the Triton pass 4.9e-4) and slow: 101 us against the Triton
// pass's 64 and the plain pass's 47 in a CUDA graph on an H100 (benchmarks/results/h100-2026-11-27/lora/
// lora-gate-mma-probe-first-form.txt). This form stages every chunk's fragments once a block with 16-byte loads and
// one barrier, and loads the next chunk's g and u before the current one's math: 76.5 us at 4 chunks a block against
// the Triton pass's 75.1 and the plain pass's 46.3 on another H100 (2, 1 and 8 chunks 82.8, 108.8, 88.6;
// lora-gate-mma-probe-second-form.txt). `skip` (timing only, the probe's --skips) leaves parts out: with none of the
// adapters' work (no partials, staging, rank mmas, down sum) it still takes 59.7 us, 13 more than the plain pass, so
// this tiling of g and u (a warp's load 8 rows x 64 bytes) is itself slower than a flat pass; the B/A staging costs
// about 12 us, the partials 4, the atomics 3, the mmas nothing measurable (lora-gate-mma-probe-parts-*.txt).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../onnxfuse/kernels/cuda/mma.h"
#include "../onnxfuse/kernels/cuda/lora_gate_frag.h"

namespace ock = onnxfuse::cuda_kernels;
using onnxfuse::cuda_kernels::gate_pass::AddDownSum, onnxfuse::cuda_kernels::gate_pass::RankFragment,
    onnxfuse::cuda_kernels::gate_pass::Two, onnxfuse::cuda_kernels::gate_pass::Unpack;

namespace {

using onnxfuse::cuda_kernels::gate_pass::kRank;
constexpr int kWarps = 4, kRows = 16 * kWarps, kChunk = 64;

// ColOf(j, t, q) = 32 (j / 4) + 8t + 2 (j % 4) + q: the chunk's column of mma block j's local column 2t + q.

// Stage the chunk's [16, 64] tiles of bg and bu (rows: rank, row-major, ld n) as B fragments: word [j][half][g][t] =
// (b[2t + 8 half][col], b[2t + 1 + 8 half][col]), col = ColOf(j, g >> 1, g & 1). One task a thread: a row pair and
// 8 columns of one of the two (16-byte loads), 8 words.
template <typename T>
__device__ __forceinline__ void StageB2(const T* __restrict__ bg, const T* __restrict__ bu, int64_t n, int64_t c0,
                                        uint32_t* sg, uint32_t* su) {
  for (int task = threadIdx.x; task < 2 * 64; task += blockDim.x) {
    const int which = task >> 6, kp = (task >> 3) & 7, cg = task & 7;
    const T* b = which ? bu : bg;
    uint32_t* s = which ? su : sg;
    const uint4 v0 = *reinterpret_cast<const uint4*>(b + int64_t(2 * kp) * n + c0 + 8 * cg);
    const uint4 v1 = *reinterpret_cast<const uint4*>(b + int64_t(2 * kp + 1) * n + c0 + 8 * cg);
    const uint32_t* w0 = reinterpret_cast<const uint32_t*>(&v0);
    const uint32_t* w1 = reinterpret_cast<const uint32_t*>(&v1);
    const int t = kp & 3, half = kp >> 2;
    for (int e = 0; e < 8; ++e) {
      const int j = 4 * (cg >> 2) + (e >> 1), g = 2 * (cg & 3) + (e & 1);
      const float2 lo = Unpack<T>(w0[e >> 1]), hi = Unpack<T>(w1[e >> 1]);
      s[((j * 2 + half) * 8 + g) * 4 + t] = Two<T>((e & 1) ? lo.y : lo.x, (e & 1) ? hi.y : hi.x);
    }
  }
}

// Stage the down adapter's A rows of the chunk ([64 chunk columns, 16 ranks], ad row-major [N, 16]) as the B fragments
// of y @ ad: k-step kk (blocks 2kk, 2kk + 1), rank block nb: word [kk][nb][half][g][t] = (ad[c][nb 8 + g],
// ad[c + 1][nb 8 + g]), c = ColOf(2kk + half, t, 0) (even; c + 1 is q = 1). One task a thread: a column pair.
template <typename T>
__device__ __forceinline__ void StageA(const T* __restrict__ ad, int64_t c0, uint32_t* s) {
  for (int p = threadIdx.x; p < 32; p += blockDim.x) {
    const int c = 2 * p;
    const uint4* r0 = reinterpret_cast<const uint4*>(ad + (c0 + c) * kRank);
    const uint4* r1 = reinterpret_cast<const uint4*>(ad + (c0 + c + 1) * kRank);
    const uint4 v[4] = {r0[0], r0[1], r1[0], r1[1]};
    const T* a0 = reinterpret_cast<const T*>(v);      // ranks 0..15 of column c
    const T* a1 = reinterpret_cast<const T*>(v + 2);  // of column c + 1
    const int j = 4 * (c >> 5) + ((c & 7) >> 1), t = (c & 31) >> 3, kk = j >> 1, half = j & 1;
    for (int rank = 0; rank < kRank; ++rank) {
      const int nb = rank >> 3, g = rank & 7;
      s[(((kk * 2 + nb) * 2 + half) * 8 + g) * 4 + t] = Two<T>(float(a0[rank]), float(a1[rank]));
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    LoRAGateMma(const T* __restrict__ gp, const T* __restrict__ up, const float* __restrict__ tg,
                const float* __restrict__ tu, int s_count, const T* __restrict__ bg, const T* __restrict__ bu, float sg,
                float su, const T* __restrict__ ad, float* __restrict__ td, int rd, T* __restrict__ y, int64_t m,
                int64_t n, int nb_chunks, int skip) {
  extern __shared__ uint32_t smem[];  // per chunk: bg's, bu's and ad's fragments, 512 words each
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t row0 = int64_t(blockIdx.y) * kRows + warp * 16;
  const int64_t r0 = row0 + g < m ? row0 + g : m - 1, r1 = row0 + g + 8 < m ? row0 + g + 8 : m - 1;
  const int64_t first = int64_t(blockIdx.x) * nb_chunks * kChunk;
  const int chunks = int((n - first) / kChunk < nb_chunks ? (n - first) / kChunk : nb_chunks);
  // this lane's 16-byte pieces of g and u of a chunk: rows r0, r1 x halves 0, 1 (columns c0 + 32 half + 8t .. + 7)
  uint4 gv[2][2], uv[2][2], gn[2][2], un[2][2];
  auto load = [&](int64_t c0, uint4(&gd)[2][2], uint4(&ud)[2][2]) {
    for (int rr = 0; rr < 2; ++rr)
      for (int h = 0; h < 2; ++h) {
        const int64_t off = (rr ? r1 : r0) * n + c0 + 32 * h + 8 * t;
        gd[rr][h] = *reinterpret_cast<const uint4*>(gp + off);
        ud[rr][h] = *reinterpret_cast<const uint4*>(up + off);
      }
  };
  load(first, gv, uv);
  if (!(skip & 2))
    for (int c = 0; c < chunks; ++c) {
      uint32_t* s = smem + c * 1536;
      StageB2<T>(bg, bu, n, first + int64_t(c) * kChunk, s, s + 512);
      if (rd > 0) StageA<T>(ad, first + int64_t(c) * kChunk, s + 1024);
    }
  uint32_t ag[4] = {}, au[4] = {};
  if (!(skip & 1)) {
    RankFragment<T>(tg, s_count, m, r0, r1, t, sg, ag);
    RankFragment<T>(tu, s_count, m, r0, r1, t, su, au);
  }
  __syncthreads();
  float dsum[2][4] = {};
  for (int c = 0; c < chunks; ++c) {
    const int64_t c0 = first + int64_t(c) * kChunk;
    if (c + 1 < chunks) load(c0 + kChunk, gn, un);
    const uint32_t *sbg = smem + c * 1536, *sbu = sbg + 512, *sad = sbg + 1024;
    uint32_t hw[2][2][4];  // y rounded, as stored: [row][half][word]: the 8 values of the lane's 16 bytes
    for (int j = 0; j < 8; ++j) {
      float dg[4] = {}, du[4] = {};
      if (!(skip & 8)) {
        ock::MmaSync<T>(dg, ag, sbg[(j * 2 + 0) * 32 + lane], sbg[(j * 2 + 1) * 32 + lane]);
        ock::MmaSync<T>(du, au, sbu[(j * 2 + 0) * 32 + lane], sbu[(j * 2 + 1) * 32 + lane]);
      }
      const int h = j >> 2, word = j & 3;  // block j's pair (2t, 2t + 1) is word j % 4 of half j / 4
      for (int rr = 0; rr < 2; ++rr) {
        const float2 gg = Unpack<T>(reinterpret_cast<const uint32_t*>(&gv[rr][h])[word]);
        const float2 uu = Unpack<T>(reinterpret_cast<const uint32_t*>(&uv[rr][h])[word]);
        const float g0 = gg.x + dg[2 * rr], g1 = gg.y + dg[2 * rr + 1];
        const float u0 = uu.x + du[2 * rr], u1 = uu.y + du[2 * rr + 1];
        hw[rr][h][word] = Two<T>(g0 / (1.f + __expf(-g0)) * u0, g1 / (1.f + __expf(-g1)) * u1);
      }
    }
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t row = row0 + g + 8 * rr;
      if (row < m)
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<uint4*>(y + row * n + c0 + 32 * h + 8 * t) = *reinterpret_cast<const uint4*>(hw[rr][h]);
    }
    if (rd > 0 && !(skip & 16))
      for (int kk = 0; kk < 4; ++kk) {
        // A fragment of k-step kk: blocks 2kk (k 0..7) and 2kk + 1 (k 8..15); rows g (a0, a2) and g + 8 (a1, a3)
        const int j0 = 2 * kk, j1 = 2 * kk + 1;
        const uint32_t a[4] = {hw[0][j0 >> 2][j0 & 3], hw[1][j0 >> 2][j0 & 3], hw[0][j1 >> 2][j1 & 3],
                               hw[1][j1 >> 2][j1 & 3]};
        for (int nb = 0; nb < 2; ++nb)
          ock::MmaSync<T>(dsum[nb], a, sad[((kk * 2 + nb) * 2 + 0) * 32 + lane],
                          sad[((kk * 2 + nb) * 2 + 1) * 32 + lane]);
      }
    if (c + 1 < chunks)
      for (int rr = 0; rr < 2; ++rr)
        for (int h = 0; h < 2; ++h) gv[rr][h] = gn[rr][h], uv[rr][h] = un[rr][h];
  }
  if (rd > 0 && !(skip & 4)) AddDownSum(td, dsum, row0, g, t, m, rd);
}

}  // namespace

// dtype 1 fp16, 2 bf16. tg, tu: [s_count, m, 16] fp32; bg, bu: [16, n]; ad: [n, rd]; td: [m, 16] fp32 (added to).
// n a multiple of 64 and the pointers 16-byte aligned; returns a cudaError_t.
extern "C" int lora_gate_mma(int dtype, const void* g, const void* u, const float* tg, const float* tu, int s_count,
                             const void* bg, const void* bu, float sg, float su, const void* ad, float* td, int rd,
                             void* y, int64_t m, int64_t n, int nb_chunks, void* stream, int skip) {
  if (n % kChunk != 0 || m <= 0 || (rd != 0 && rd != kRank) || nb_chunks < 1 || nb_chunks > 8)
    return int(cudaErrorInvalidValue);
  const size_t smem = size_t(nb_chunks) * 1536 * sizeof(uint32_t);
  const dim3 grid(unsigned((n / kChunk + nb_chunks - 1) / nb_chunks), unsigned((m + kRows - 1) / kRows));
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == 1)
    LoRAGateMma<__half><<<grid, kWarps * 32, smem, s>>>(
        static_cast<const __half*>(g), static_cast<const __half*>(u), tg, tu, s_count, static_cast<const __half*>(bg),
        static_cast<const __half*>(bu), sg, su, static_cast<const __half*>(ad), td, rd, static_cast<__half*>(y), m, n,
        nb_chunks, skip);
  else
    LoRAGateMma<__nv_bfloat16><<<grid, kWarps * 32, smem, s>>>(
        static_cast<const __nv_bfloat16*>(g), static_cast<const __nv_bfloat16*>(u), tg, tu, s_count,
        static_cast<const __nv_bfloat16*>(bg), static_cast<const __nv_bfloat16*>(bu), sg, su,
        static_cast<const __nv_bfloat16*>(ad), td, rd, static_cast<__nv_bfloat16*>(y), m, n, nb_chunks, skip);
  return int(cudaGetLastError());
}
