// Int4Linear and Int4SwiGLU on the CUDA execution provider, in one file: the launchers' C declarations below, then the
// nvcc half (the CUDA kernels) and the host half (the CUDA EP glue and the Triton launcher); cuda/cuda.cmake says how
// it is built.
#include "cuda/launch.h"

extern "C" {
// Int4Linear: Y [m, n] = X [m, k] @ W^T, W[j, kk] = (nibble(wq, j, kk) - zp) * scales[j, kk / block]; wq uint8
// [n, ceil(k / block), block / 2], scales [n, ceil(k / block)] of X's type, zp the block's 4-bit zero point from
// zero_points uint8 [n, ceil(nb / 2)] (two a byte, the even block in the low nibble), 8 where zero_points is null.
// One fp16 row with symmetric weights in blocks of 32 or more dividing K: the one-row GEMV (Int4RowGemv below). Up to
// ONNXFUSE_INT4_GEMV_MAX_M rows: a
// GEMV that streams the packed weights once and dequantizes them in registers (Int4Gemv below; fp16 and bf16 on
// tensor cores instead: Int4Mma from kMmaMinRows rows (bf16: one), its common form Int4MmaFast from one); past them to
// 128 rows with symmetric weights, K a multiple of 64 (RowsPath below): a GEMM that dequantizes each weight word in
// registers once a block (Int4MmaGemm; on a 9.0 device from 65 rows in blocks of 32 its wgmma form,
// cuda/sm90a/int4_rows_wgmma.cu); past them on an sm_90 GPU, without zero points, with a block of 64 or more dividing
// K, fp16 or bf16 and N a multiple of 8 (MixedPath below): CUTLASS's mixed-input GEMM, which dequantizes the weight
// tiles in registers inside its main loop (cuda/cutlass/int4_mixed_gemm.cu; the scales transposed into scratch first);
// otherwise the weights dequantized into scratch as W^T [n, k], then one cuBLASLt GEMM that transposes them. `aligned`:
// X, Wq, the scales, the zero points and Y all 16-byte aligned; `zero_points`: the node has them (both decide whether
// the sm_90 path below runs).
int64_t onnxfuse_cuda_int4_linear_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t block, int aligned,
                                                int zero_points);
// Whether the CUDA backend runs these sizes on the sm_90 mixed-input GEMM (both ops; backend=auto then takes it).
int onnxfuse_cuda_int4_mixed_path(int dtype, int64_t m, int64_t k, int64_t n, int64_t block, int aligned,
                                  int zero_points);
// accuracy_level: the node's (MatMulNBits'); 4 lets the one-row fp16 GEMV round X to int8 (Int4RowGemvI8 below).
int onnxfuse_cuda_int4_linear(int dtype, const void* x, const uint8_t* wq, const void* scales,
                              const uint8_t* zero_points, void* y, int64_t m, int64_t k, int64_t n, int64_t block,
                              int accuracy_level, void* scratch, int64_t scratch_bytes, void* stream);
// The Triton launcher (the host half, Triton builds only): one GEMM whose K loop dequantizes the weight tile.
int onnxfuse_triton_int4_linear(int dtype, const void* x, const uint8_t* wq, const void* scales,
                                const uint8_t* zero_points, void* y, int64_t m, int64_t k, int64_t n, int64_t block,
                                void* stream);
// Int4SwiGLU: Y [m, n] = act(X @ W_gate^T) * (X @ W_up^T), both W as Int4Linear's (zp_gate and zp_up both given or
// both null), act an onnxfuse_gate_act code
// (common/gate_act.h). Up to ONNXFUSE_INT4_GEMV_MAX_M rows: the GEMV with a warp per output column reading its gate
// and up rows together (fp16 and bf16 on tensor cores as Int4Linear: Int4Mma with a column's gate and up rows in one A
// operand), act(g) * u in its epilogue; more rows: both projections into [m, 2n] scratch (Int4Linear's sm_90 GEMM
// once each, or both weights dequantized into scratch as [2n, k] and one cuBLASLt GEMM), then one elementwise pass.
int64_t onnxfuse_cuda_int4_swiglu_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t block, int aligned,
                                                int zero_points);
int onnxfuse_cuda_int4_swiglu(int dtype, int act, const void* x, const uint8_t* wq_gate, const void* scales_gate,
                              const uint8_t* zp_gate, const uint8_t* wq_up, const void* scales_up, const uint8_t* zp_up,
                              void* y, int64_t m, int64_t k, int64_t n, int64_t block, int accuracy_level,
                              void* scratch, int64_t scratch_bytes, void* stream);
int onnxfuse_triton_int4_swiglu(int dtype, int act, const void* x, const uint8_t* wq_gate, const void* scales_gate,
                                const uint8_t* zp_gate, const uint8_t* wq_up, const void* scales_up,
                                const uint8_t* zp_up, void* y, int64_t m, int64_t k, int64_t n, int64_t block,
                                void* stream);
// SkipRMSNormInt4Linear and SkipRMSNormInt4SwiGLU: sum [m, k] = X + skip (rounded to the type), Xn = the RMS norm of
// sum times gamma [k] (rounded), then Int4Linear's or Int4SwiGLU's Y of Xn (wq_up null: Int4Linear; act unused then).
// The norm kernel (onnxfuse_cuda_int4_skip_norm_rows) into Xn in scratch, a programmatic dependent that lets the
// projection after it start at once (its first weights requested while the norm runs), then the projection's own path
// on Xn.
int64_t onnxfuse_cuda_skip_norm_int4_scratch_bytes(int dtype, int gated, int64_t m, int64_t k, int64_t n, int64_t block,
                                                   int aligned, int zero_points);
int onnxfuse_cuda_skip_norm_int4(int dtype, int act, const void* x, const void* skip, const void* gamma, float eps,
                                 const uint8_t* wq, const void* scales, const uint8_t* zp, const uint8_t* wq_up,
                                 const void* scales_up, const uint8_t* zp_up, void* y, void* sum, int64_t m, int64_t k,
                                 int64_t n, int64_t block, int accuracy_level, void* scratch, int64_t scratch_bytes,
                                 void* stream);
// The norm alone: sum = X + skip, xn = its RMS norm times gamma, a block a row (the Triton backend's first step).
int onnxfuse_cuda_int4_skip_norm_rows(int dtype, const void* x, const void* skip, const void* gamma, float eps,
                                      void* sum, void* xn, int64_t m, int64_t k, void* stream);
#ifdef ONNXFUSE_WITH_CUTLASS
// CUTLASS's sm_90a mixed-input GEMM (cuda/cutlass/int4_mixed_gemm.cu, in builds that found CUTLASS's headers):
// whether it may run on the current device (compute capability 9.0, ONNXFUSE_INT4_CUTLASS not "0") and for these
// sizes; the scales transposed with their zeros (s^T, z^T = -8 * s^T, [n_blocks, n]: symmetric weights); then
// Y [m, ldy] = X @ W^T. Its workspace: onnxfuse_cutlass_int4_workspace_bytes.
int onnxfuse_cutlass_int4_ready(void);
int onnxfuse_cutlass_int4_shape_ok(int dtype, int64_t m, int64_t k, int64_t n, int64_t block);
int64_t onnxfuse_cutlass_int4_workspace_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t block);
int onnxfuse_cutlass_int4_scales_zeros(int dtype, const void* scales, void* st, void* zt, int64_t n, int64_t nb,
                                       void* stream);
int onnxfuse_cutlass_int4_gemm(int dtype, const void* x, const uint8_t* wq, const void* st, const void* zt, void* y,
                               int64_t ldy, int64_t m, int64_t k, int64_t n, int64_t block, void* ws, int64_t ws_bytes,
                               void* stream);
#endif
}

// The rows up to which the CUDA backend runs the GEMV; past them, the dequantized weights and one cuBLASLt GEMM.
// (Which backend backend=auto runs per M: triton/table.py AUTO_CUDA.)
#define ONNXFUSE_INT4_GEMV_MAX_M 16

// The block sizes every launcher takes (Wq's rows are whole 8-byte groups): a power of two in [16, 256].
static inline bool Int4BlockOk(int64_t block) { return block >= 16 && block <= 256 && (block & (block - 1)) == 0; }

#ifdef __CUDACC__
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "common/gate_act.h"
#include "gemm.h"
#include "cp_async.h"
#include "mma.h"
#include "sm90a/int4_rows_tiles.h"

namespace ock = onnxfuse::cuda_kernels;

namespace {

using ock::AndOr;
using ock::CpAsync16;
using ock::CpAsync8;
using ock::CpAsyncCommit;
using ock::CpAsyncWait;
using ock::LdShared32;

constexpr int kWarps = 8;  // warps per block of the GEMV

// (v - z) for a 4-bit v and zero point z, exactly: 0x4B000000 | v is the float 2^23 + v, `bias` is 2^23 + z
// (ZBias; the default: z = 8).
__device__ __forceinline__ float Centred(uint32_t word, int nibble, float bias = 8388616.0f) {
  return __uint_as_float(0x4B000000u | ((word >> (4 * nibble)) & 15u)) - bias;
}
__device__ __forceinline__ float ZBias(int z) { return 8388608.0f + float(z); }

// Block b's zero point of a column's packed zero points (two a byte, the even block in the low nibble).
// (ZeroNibble: block b's of the byte holding it, wherever it was read.)
__device__ __forceinline__ int ZeroNibble(uint8_t pair, int b) { return (pair >> (4 * (b & 1))) & 15; }
__device__ __forceinline__ int ZeroPoint(const uint8_t* __restrict__ zrow, int b) {
  return ZeroNibble(__ldg(zrow + (b >> 1)), b);
}

// The GEMV: one warp per kCols output columns (GATED, Int4SwiGLU: per output column, its gate and up rows as the
// two columns, act(g) * u written once), each lane a 16-value group (8 packed bytes and one scale per column)
// at a time: lane l takes groups l, l + 32, ..., kUnroll of them in flight, so a warp's loads of a packed row (256
// bytes) are contiguous, and each X group serves the kCols columns. X is staged in shared memory once per block
// (STAGED: up to kStageBytes; fp16 already permuted into the pairs the nibble order needs). fp16: the scaled
// weights' products are summed in half2 over a lane's kUnroll groups, then in fp32 (ORT's GEMV sums in fp16
// throughout); fp32 and bf16: every product in fp32. X is zero past K (the last block's padding).
constexpr int kUnroll = 4;
constexpr int kCols = 2;

// The 8 nibbles of a word as half2 (q - z) pairs (q_i, q_{i+4}), exactly, with one shift: FasterTransformer's trick
// (0x6400 | q is the half 1024 + q; a nibble in bits 4-7 gives 1024 + 16 q, scaled back by an fma with 1/16). z the
// zero point (8: symmetric), exact in fp16 as 1024 + z and 64 + z.
__device__ __forceinline__ void CentredHalf2(uint32_t word, __half2 d[4], int z) {
  const uint32_t top = word >> 8;
  const uint32_t h0 = AndOr(word, 0x000F000Fu, 0x64006400u), h1 = AndOr(word, 0x00F000F0u, 0x64006400u);
  const uint32_t h2 = AndOr(top, 0x000F000Fu, 0x64006400u), h3 = AndOr(top, 0x00F000F0u, 0x64006400u);
  const __half2 bias = __float2half2_rn(1024.f + float(z)), sixteenth = __float2half2_rn(0.0625f),
                bias16 = __float2half2_rn(-64.f - float(z));
  d[0] = __hsub2(*reinterpret_cast<const __half2*>(&h0), bias);
  d[1] = __hfma2(*reinterpret_cast<const __half2*>(&h1), sixteenth, bias16);
  d[2] = __hsub2(*reinterpret_cast<const __half2*>(&h2), bias);
  d[3] = __hfma2(*reinterpret_cast<const __half2*>(&h3), sixteenth, bias16);
}

// One row's X over a 16-value group as the pairs the nibble order needs: xp[4w + i] = (x_{8w+i}, x_{8w+i+4}).
__device__ __forceinline__ void LoadGroup(const __half* __restrict__ row, int64_t k0, int64_t K, bool xvec,
                                          __half2 xp[8]) {
  __half2 xs[8];
  if (xvec && k0 + 16 <= K) {
    const uint4* p = reinterpret_cast<const uint4*>(row + k0);
    *reinterpret_cast<uint4*>(&xs[0]) = __ldg(p);
    *reinterpret_cast<uint4*>(&xs[4]) = __ldg(p + 1);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const __half a = k0 + 2 * j < K ? row[k0 + 2 * j] : __float2half(0.f);
      const __half b = k0 + 2 * j + 1 < K ? row[k0 + 2 * j + 1] : __float2half(0.f);
      xs[j] = __halves2half2(a, b);
    }
  }
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    const __half2 h0 = xs[4 * w], h1 = xs[4 * w + 1], h2 = xs[4 * w + 2], h3 = xs[4 * w + 3];
    xp[4 * w] = __lows2half2(h0, h2);
    xp[4 * w + 1] = __highs2half2(h0, h2);
    xp[4 * w + 2] = __lows2half2(h1, h3);
    xp[4 * w + 3] = __highs2half2(h1, h3);
  }
}

template <typename T>
__device__ __forceinline__ void LoadGroup(const T* __restrict__ row, int64_t k0, int64_t K, bool xvec, float xs[16]) {
  if (xvec && k0 + 16 <= K) {
    constexpr int kPer = 16 / sizeof(T);
    const uint4* p = reinterpret_cast<const uint4*>(row + k0);
#pragma unroll
    for (int v = 0; v < 16 / kPer; ++v) {
      const uint4 u = __ldg(p + v);
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < kPer; ++j) xs[v * kPer + j] = ock::to_f(e[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) xs[j] = k0 + j < K ? ock::to_f(row[k0 + j]) : 0.f;
  }
}

__device__ __forceinline__ float GroupDot(const float (&xs)[16], uint2 q, int z) {
  const float bias = ZBias(z);
  float p = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    p = fmaf(xs[i], Centred(q.x, i, bias), p);
    p = fmaf(xs[8 + i], Centred(q.y, i, bias), p);
  }
  return p;
}

template <typename T>
struct XGroup {  // one row's X over a group, in the form GroupDot takes
  using type = float[16];
};
template <>
struct XGroup<__half> {
  using type = __half2[8];
};

// fp16, one row: at most 64 registers (4 blocks of 8 warps per SM), which the staged kernel fits without spilling
// (ptxas -v); at 66 registers (3 blocks) it measured 82 against 58 us for a Llama-2-7B layer on an H100. Two rows: 3
// blocks (78 registers, no spill); more rows keep what they need (four rows spill at 80). With zero points (their
// nibbles and the column's pointer) one block fewer each: one row spilled 48 bytes at 64 registers, two 32 at 80.
// Bytes of shared memory the GEMV stages X in (every row's groups, in the form GroupDot takes), up to which it does:
// 48 KB for one or two rows (any K to 12288 at two), 96 KB (opted in per launch) for more (four rows of K = 11008).
constexpr int kStageBytes = 48 * 1024, kStageBytesRows = 96 * 1024;

// A group's weights of one column as half2 pairs, dequantized and scaled: (q - z) * s.
__device__ __forceinline__ void ScaledGroup(uint2 q, __half s, int z, __half2 d[8]) {
  CentredHalf2(q.x, d, z);
  CentredHalf2(q.y, d + 4, z);
  const __half2 s2 = __half2half2(s);
#pragma unroll
  for (int j = 0; j < 8; ++j) d[j] = __hmul2(d[j], s2);
}

// Row r's X over group g in the form GroupDot takes: staged in shared memory, or loaded into `local`.
template <bool STAGED, typename XG, typename T>
__device__ __forceinline__ const XG& RowGroup(const XG* xs, const T* __restrict__ x, int r, int groups, int g, int K,
                                              bool xvec, XG& local) {
  if constexpr (STAGED) {
    return xs[r * groups + g];
  } else {
    LoadGroup(x + int64_t(r) * K, int64_t(g) * 16, K, xvec, local);
    return local;
  }
}

// A lane's kUnroll x kCols packed groups and their scales (ZP: and their zero points, a nibble each of z): one step
// of the GEMV's loop.
template <typename T>
struct Step {
  uint2 q[kUnroll][kCols];
  T s[kUnroll][kCols];
  uint32_t z;  // ZP: group (u, c)'s zero point in bits 4 (u kCols + c) .. + 3
};

template <bool ZP>
__device__ __forceinline__ int StepZero(uint32_t z, int u, int c) {
  if constexpr (ZP) return int((z >> (4 * (u * kCols + c))) & 15u);
  return 8;
}

template <bool ZP, typename T>
__device__ __forceinline__ void LoadStep(Step<T>& st, const uint2* const (&wc)[kCols], const T* const (&sc)[kCols],
                                         const uint8_t* const (&zc)[kCols], int g0, int groups, int lb) {
  st.z = 0u;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int g = g0 + 32 * u;
      const bool ok = g < groups;
      st.q[u][c] = ok ? __ldg(wc[c] + g) : make_uint2(0u, 0u);
      st.s[u][c] = ok ? sc[c][(g * 16) >> lb] : T{};
      if constexpr (ZP) st.z |= uint32_t(ok ? ZeroPoint(zc[c], (g * 16) >> lb) : 8) << (4 * (u * kCols + c));
    }
}

// The GEMV's two column sources: one matrix's consecutive columns (wq, scales: Int4Linear), or the gate's (wq,
// scales) and the up matrix's (wq_up, scales_up) same column (GATED: Int4SwiGLU, with its activation code); ZP: with
// their zero points (zp, zp_up; zb bytes a column). (Separate pointer parameters: in a struct, their __restrict__ was
// lost and the one-row kernel spilled.)
template <typename T, int MR, bool STAGED, bool GATED, bool ZP>
__global__ void __launch_bounds__(kWarps * 32,
                                  !std::is_same_v<T, __half> ? 1 : (MR == 1 ? 4 - ZP : (MR == 2 ? 3 - ZP : 1)))
    Int4Gemv(const T* __restrict__ x, const uint2* __restrict__ wq, const T* __restrict__ scales,
             const uint2* __restrict__ wq_up, const T* __restrict__ scales_up, const uint8_t* __restrict__ zp,
             const uint8_t* __restrict__ zp_up, int zb, int act, T* __restrict__ y, int m, int K, int N, int nb, int lb,
             int row_groups, bool xvec) {
  using XG = typename XGroup<T>::type;
  extern __shared__ uint4 staged_x[];  // STAGED: [m][groups] XG
  XG* xs = reinterpret_cast<XG*>(staged_x);
  const int lane = threadIdx.x & 31;
  const int warp_col = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int col0 = GATED ? warp_col : warp_col * kCols;
  const int groups = (K + 15) / 16;  // groups holding a k < K (the rest is the last block's padding)
  const bool active = col0 < N;
  const int ncols = !active ? 0 : (GATED || N - col0 >= kCols ? kCols : N - col0);
  const uint2* wc[kCols];
  const T* sc_row[kCols];
  const uint8_t* zc[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    if constexpr (GATED) {
      const int col = active ? col0 : 0;
      wc[c] = (c == 0 ? wq : wq_up) + int64_t(col) * row_groups;
      sc_row[c] = (c == 0 ? scales : scales_up) + int64_t(col) * nb;
      zc[c] = ZP ? (c == 0 ? zp : zp_up) + int64_t(col) * zb : nullptr;
    } else {
      const int col = c < ncols ? col0 + c : (active ? col0 : 0);
      wc[c] = wq + int64_t(col) * row_groups;
      sc_row[c] = scales + int64_t(col) * nb;
      zc[c] = ZP ? zp + int64_t(col) * zb : nullptr;
    }
  }
  // The first step's weights are requested before X is staged, so both are in flight together; launched as a
  // programmatic dependent (LaunchGemv), before the kernel that writes X has finished (the weights are constants).
  Step<T> next;
  if (active) LoadStep<ZP>(next, wc, sc_row, zc, lane, groups, lb);
  ock::PdlWait();
  ock::PdlTrigger();
  if constexpr (STAGED) {
    for (int i = threadIdx.x; i < m * groups; i += blockDim.x) {
      const int r = i / groups, g = i - r * groups;
      LoadGroup(x + int64_t(r) * K, int64_t(g) * 16, K, xvec, xs[i]);
    }
    __syncthreads();
  }
  if (!active) return;
  float acc[MR][kCols];
#pragma unroll
  for (int r = 0; r < MR; ++r)
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0.f;
  for (int g0 = lane; g0 < groups; g0 += 32 * kUnroll) {
    const Step<T> cur = next;
    if (g0 + 32 * kUnroll < groups) LoadStep<ZP>(next, wc, sc_row, zc, g0 + 32 * kUnroll, groups, lb);
    [[maybe_unused]] __half2 t[MR][kCols];
    if constexpr (std::is_same_v<T, __half>) {
#pragma unroll
      for (int r = 0; r < MR; ++r)
#pragma unroll
        for (int c = 0; c < kCols; ++c) t[r][c] = __float2half2_rn(0.f);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int g = g0 + 32 * u;
      if (g >= groups) break;
      if constexpr (std::is_same_v<T, __half>) {
        // every column's weights of the group dequantized and scaled once, then each row's X fetched once for them
        __half2 d[kCols][8];
#pragma unroll
        for (int c = 0; c < kCols; ++c) ScaledGroup(cur.q[u][c], cur.s[u][c], StepZero<ZP>(cur.z, u, c), d[c]);
#pragma unroll
        for (int r = 0; r < MR; ++r) {
          if (r >= m) break;
          XG local;
          const XG& xg = RowGroup<STAGED>(xs, x, r, groups, g, K, xvec, local);
#pragma unroll
          for (int c = 0; c < kCols; ++c)
#pragma unroll
            for (int j = 0; j < 8; ++j) t[r][c] = __hfma2(xg[j], d[c][j], t[r][c]);
        }
      } else {
#pragma unroll
        for (int r = 0; r < MR; ++r) {
          if (r >= m) break;
          XG local;
          const XG& xg = RowGroup<STAGED>(xs, x, r, groups, g, K, xvec, local);
#pragma unroll
          for (int c = 0; c < kCols; ++c)
            acc[r][c] = fmaf(ock::to_f(cur.s[u][c]), GroupDot(xg, cur.q[u][c], StepZero<ZP>(cur.z, u, c)), acc[r][c]);
        }
      }
    }
    if constexpr (std::is_same_v<T, __half>) {
#pragma unroll
      for (int r = 0; r < MR; ++r)
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const float2 f = __half22float2(t[r][c]);
          acc[r][c] += f.x + f.y;
        }
    }
  }
  if constexpr (GATED) {
#pragma unroll
    for (int r = 0; r < MR; ++r) {
      float g = acc[r][0], u = acc[r][1];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        g += __shfl_xor_sync(0xffffffffu, g, o);
        u += __shfl_xor_sync(0xffffffffu, u, o);
      }
      if (lane == 0 && r < m) y[int64_t(r) * N + col0] = ock::from_f<T>(onnxfuse::GateActivation(act, g) * u);
    }
  } else {
#pragma unroll
    for (int r = 0; r < MR; ++r)
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        float v = acc[r][c];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && r < m && c < ncols) y[int64_t(r) * N + col0 + c] = ock::from_f<T>(v);
      }
  }
}

// The one-row GEMV (fp16, symmetric weights, a block of 32 or more values dividing K: a 7B model's decode at batch 1),
// Int4RowGemv below. A column's packed row is cut into 16-byte units (32 values, one scale); a block's warps split K,
// lane l of warp w taking unit 32 w + l of every column, its 32 X values held in registers (loaded once a block). A
// block's output columns are one contiguous share of N and the grid is what the GPU holds at once, so every SM streams
// the same bytes whatever N is (the GEMV above runs fixed 16-column blocks in waves: a 7B model's qkv, 768 of them
// over 528 slots). A step is C 16-byte loads a lane (C columns, or C / 2 columns' gate and up rows), the next step's
// requested before this one's sums; a step's C partials are summed across the warp by halves (C - 1 + log2(32 / C)
// shuffles, not 5 C), then across the warps through shared memory (one barrier a step). A unit's partial is summed in
// half2 over the raw nibbles (q - 8) and scaled once in fp32, not weight by weight: to keep that sum in range a lane's
// X is scaled by a power of two into [0, 4) where its largest finite value is 4 or more (exact), the power put back
// with the scale. A scale whose dequantized weights could leave fp16's range (|s| > 4094, Inf, NaN) takes the unit's
// weights dequantized one by one as the reference does, so Inf * 0 is NaN here as there.
constexpr int kRowMaxWarps = 16;  // K up to 16384 (1024 values a warp)

__device__ __forceinline__ uint4 LoadStream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Lane's unit u of X as four 16-byte words (zeros where !valid): RowUnitX's and RowUnitXI8's loads.
__device__ __forceinline__ void RowUnitLoad(const __half* __restrict__ x, int u, bool valid, uint4 (&v)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
    v[j] = valid ? __ldg(reinterpret_cast<const uint4*>(x) + 4 * u + j) : make_uint4(0u, 0u, 0u, 0u);
}

// Lane's unit u of X (values 32 u .. + 31; v[j]: the 8 of weight word j) as the pairs CentredHalf2 gives the weights in
// (xp[4 j + i] = (x_{8j+i}, x_{8j+i+4})), scaled into [0, 4) by a power of two where its largest finite |x| is 4 or
// more; returns the power's inverse (1 otherwise). Zeros where !valid.
__device__ __forceinline__ float RowUnitX(const __half* __restrict__ x, int u, bool valid, __half2 (&xp)[16]) {
  uint4 v[4];
  RowUnitLoad(x, u, valid, v);
  uint32_t m = 0;  // the largest finite |x| as fp16 bits (Inf and NaN taken as the largest finite)
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    m = __vmaxu2(m, __vminu2(v[j].x & 0x7FFF7FFFu, 0x7BFF7BFFu));
    m = __vmaxu2(m, __vminu2(v[j].y & 0x7FFF7FFFu, 0x7BFF7BFFu));
    m = __vmaxu2(m, __vminu2(v[j].z & 0x7FFF7FFFu, 0x7BFF7BFFu));
    m = __vmaxu2(m, __vminu2(v[j].w & 0x7FFF7FFFu, 0x7BFF7BFFu));
  }
  const int e = int(max(m & 0xFFFFu, m >> 16) >> 10);  // the largest's biased exponent: |x| < 2^(e - 14)
  float back = 1.f;
  __half2 f = __float2half2_rn(1.f);
  if (e >= 17) {  // |x| >= 4: times 2^(16 - e), a normal fp16 power of two for e <= 30
    const uint32_t h = uint32_t(31 - e) << 10, hh = h | (h << 16);
    f = *reinterpret_cast<const __half2*>(&hh);
    back = __uint_as_float(uint32_t(e - 16 + 127) << 23);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __half2* p = reinterpret_cast<const __half2*>(&v[j]);  // (x0, x1) (x2, x3) (x4, x5) (x6, x7)
    xp[4 * j] = __hmul2(__lows2half2(p[0], p[2]), f);
    xp[4 * j + 1] = __hmul2(__highs2half2(p[0], p[2]), f);
    xp[4 * j + 2] = __hmul2(__lows2half2(p[1], p[3]), f);
    xp[4 * j + 3] = __hmul2(__highs2half2(p[1], p[3]), f);
  }
  return back;
}

// A unit's sum of x (q - 8) s with the weights rounded one by one as dequantized (RowStepDots' path for a scale past
// 4094, Inf or NaN; out of line: it keeps the loop's registers for the usual path).
__device__ __noinline__ float RowUnitDotExact(const __half2* xp, uint4 q, __half s) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    __half2 d[4];
    CentredHalf2(w[j], d, 8);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 xv = __half22float2(xp[4 * j + i]), dv = __half22float2(__hmul2(d[i], __half2half2(s)));
      acc = fmaf(xv.x, dv.x, fmaf(xv.y, dv.y, acc));
    }
  }
  return acc;
}

// A unit's sum of x (q - 8), x as RowUnitX left it: 16 half2 fmas, two chains.
__device__ __forceinline__ float RowUnitSum(const __half2 (&xp)[16], uint4 q) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  __half2 t0 = __float2half2_rn(0.f), t1 = t0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    __half2 d[4];
    CentredHalf2(w[j], d, 8);
    t0 = __hfma2(xp[4 * j], d[0], t0);
    t1 = __hfma2(xp[4 * j + 1], d[1], t1);
    t0 = __hfma2(xp[4 * j + 2], d[2], t0);
    t1 = __hfma2(xp[4 * j + 3], d[3], t1);
  }
  const float2 a = __half22float2(__hadd2(t0, t1));
  return a.x + a.y;
}

// A step's C partials x (q - 8) s (times `back`): every column's sum first, straight-line so that the columns'
// instructions interleave, then the exact form where a scale is past 4094 (fp16 0x6BFF), Inf or NaN (rare: one test of
// the step's largest scale bits).
template <int C>
__device__ __forceinline__ void RowStepDots(const __half2 (&xp)[16], const uint4 (&q)[C], const __half (&s)[C],
                                            float back, float (&p)[C]) {
  uint32_t big = 0;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    p[c] = RowUnitSum(xp, q[c]) * (__half2float(s[c]) * back);
    big = max(big, uint32_t(__half_as_ushort(s[c])) & 0x7FFFu);
  }
  if (big > 0x6BFFu) {
#pragma unroll
    for (int c = 0; c < C; ++c)
      if ((__half_as_ushort(s[c]) & 0x7FFFu) > 0x6BFFu) p[c] = RowUnitDotExact(xp, q[c], s[c]) * back;
  }
}

// p[0 .. C) of every lane summed over the warp by halves: lane l ends with column l / (32 / C)'s sum in p[0].
template <int C>
__device__ __forceinline__ float WarpSumColumns(float (&p)[C], int lane) {
#pragma unroll
  for (int h = C / 2, off = 16; h >= 1; h /= 2, off /= 2) {
    const bool upper = (lane & off) != 0;
#pragma unroll
    for (int i = 0; i < h; ++i) {
      const float send = upper ? p[i] : p[i + h], keep = upper ? p[i + h] : p[i];
      p[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
    }
  }
#pragma unroll
  for (int off = 16 / C; off >= 1; off /= 2) p[0] += __shfl_xor_sync(0xffffffffu, p[0], off);
  return p[0];
}

// The one-row GEMV with X rounded to int8 (Int4RowGemvI8: a node whose accuracy_level is 4, MatMulNBits' "input A
// may be quantized to int8", as onnxruntime's CPU kernel does at that level): each lane's unit of 32 X values is
// rounded once a block to int8 with its own scale (sx = max |x| / 127, x / sx rounded to nearest even), and a unit's
// sum with a packed word is two dp4a (the even values' low nibbles, the odd values' high nibbles in place: 16 q) and
// two lop3, exact in int32, in place of the fp16 dequantization's 9 instructions and 4 half2 fmas a word; the unit's
// sum times s sx in fp32. A block whose X has an Inf or NaN, and a unit whose scale is past 4094, Inf or NaN, take the
// exact sums (X reloaded; as the fp16 GEMV's exact path, so NaN and Inf land where the reference puts them). H200, a
// Llama-2-7B layer at one row (scripts/int4_decode_probe.cu, benchmarks/results/h200-2026-12-01/int4/
// decode-probe-int8x.txt): 36.2 against the fp16 GEMV's 39.5 us (34.4 against 38.3 replayed from a CUDA graph),
// lm_head 26.6 against 28.9 (96 % of the read rate); largest error against fp32 sums 2.3e-3 of the largest output
// (8.7e-4 in fp16).
struct RowXI8 {
  uint32_t e[4], o[4];  // e[j]: the int8 bytes of values 8j + 0, 2, 4, 6; o[j]: of 8j + 1, 3, 5, 7 (a word's nibbles)
  int c8;               // -8 times the unit's sum of int8 values (the symmetric zero point's term)
  float sx;             // the unit's scale
};

// dp4a with unsigned bytes in a (the high nibbles in place, 16 q) and signed bytes in b, summed onto c
__device__ __forceinline__ int Dp4aUnsignedSigned(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Lane's unit u of X rounded to int8 (zeros where !valid); returns whether a value is Inf or NaN (the unit then holds
// zeros: the block takes the exact sums).
__device__ __forceinline__ bool RowUnitXI8(const __half* __restrict__ x, int u, bool valid, RowXI8& xi) {
  uint4 v[4];
  RowUnitLoad(x, u, valid, v);
  uint32_t m = 0, nonfinite = 0;  // the largest |x| as fp16 bits; any exponent all ones
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t a[4] = {v[j].x & 0x7FFF7FFFu, v[j].y & 0x7FFF7FFFu, v[j].z & 0x7FFF7FFFu, v[j].w & 0x7FFF7FFFu};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      m = __vmaxu2(m, a[i]);
      nonfinite |= __vcmpgeu2(a[i], 0x7C007C00u);
    }
  }
  const float mx = __half2float(__ushort_as_half(uint16_t(max(m & 0xFFFFu, m >> 16))));
  const float inv = mx > 0.f && nonfinite == 0 ? 127.f / mx : 0.f;
  int sum = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __half2* p = reinterpret_cast<const __half2*>(&v[j]);  // (x0, x1) (x2, x3) (x4, x5) (x6, x7)
    uint32_t e = 0, o = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(p[i]);
      const int a = __float2int_rn(f.x * inv), b = __float2int_rn(f.y * inv);
      sum += a + b;
      e |= uint32_t(a & 0xFF) << (8 * i);
      o |= uint32_t(b & 0xFF) << (8 * i);
    }
    xi.e[j] = e;
    xi.o[j] = o;
  }
  xi.c8 = -8 * sum;
  xi.sx = mx / 127.f;
  return nonfinite != 0;
}

// A unit's sum of x (q - 8) over the int8 X, exact in int32.
__device__ __forceinline__ int RowUnitSumI8(const RowXI8& xi, uint4 q) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  int lo = xi.c8, hi = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    lo = __dp4a(int(w[j] & 0x0F0F0F0Fu), int(xi.e[j]), lo);
    hi = Dp4aUnsignedSigned(w[j] & 0xF0F0F0F0u, xi.o[j], hi);
  }
  return lo + (hi >> 4);
}

// A unit's exact sum for the int8 path's exceptions (X reloaded in fp16 pairs; rare, out of line).
__device__ __noinline__ float RowUnitDotReload(const __half* __restrict__ x, int u, bool valid, uint4 q, __half s) {
  __half2 xp[16];
  const float back = RowUnitX(x, u, valid, xp);
  return RowUnitDotExact(xp, q, s) * back;
}

// RowStepDots over the int8 X (`exact`: the block's X has an Inf or NaN).
template <int C>
__device__ __forceinline__ void RowStepDotsI8(const RowXI8& xi, bool exact, const __half* __restrict__ x, int u,
                                              bool valid, const uint4 (&q)[C], const __half (&s)[C], float (&p)[C]) {
  uint32_t big = 0;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    p[c] = float(RowUnitSumI8(xi, q[c])) * (__half2float(s[c]) * xi.sx);
    big = max(big, uint32_t(__half_as_ushort(s[c])) & 0x7FFFu);
  }
  if (big > 0x6BFFu || exact) {
#pragma unroll
    for (int c = 0; c < C; ++c)
      if (exact || (__half_as_ushort(s[c]) & 0x7FFFu) > 0x6BFFu) p[c] = RowUnitDotReload(x, u, valid, q[c], s[c]);
  }
}

constexpr int kRowChunk = 128;  // output columns a block sums across its warps at once (two barriers a chunk)

// units: 16-byte units a column (K / 32); nb, lb: blocks a column and log2 of the block. blockDim.x: 32 ceil(units /
// 32) (every lane of a warp but the last's holds a unit). A step's loads are C 16-byte units at a fixed stride from
// one pointer (the step's first column; Int4SwiGLU: the gate's and the up matrix's), the steps double-buffered in two
// register sets used in turn (no copies); only a block's last step, partial, tests its columns.
// I8: X rounded to int8 (Int4RowGemvI8 above); the two kernels below share this body.
template <int C, bool GATED, int MAXW, bool I8>
__device__ __forceinline__ void RowGemvBody(const __half* __restrict__ x, const uint4* __restrict__ wq,
                                            const __half* __restrict__ scales, const uint4* __restrict__ wq_up,
                                            const __half* __restrict__ scales_up, int act, __half* __restrict__ y,
                                            int N, int units, int nb, int lb) {
  static_assert(C == 4 || C == 8, "C: 4 or 8 loads a step");
  constexpr int OUT = GATED ? C / 2 : C;  // output columns a step
  constexpr int kChunkSteps = kRowChunk / OUT;
  __shared__ float part[MAXW][GATED ? 2 : 1][kRowChunk];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int u = warp * 32 + lane;
  const bool valid = u < units;
  const int n0 = int(int64_t(N) * blockIdx.x / gridDim.x), n1 = int(int64_t(N) * (blockIdx.x + 1) / gridDim.x);
  const int steps = (n1 - n0 + OUT - 1) / OUT;
  // lane's unit of column n0 (and its scale); a column further: + units (+ nb)
  const uint4* pw = wq + int64_t(n0) * units + (valid ? u : 0);
  const uint4* pu = GATED ? wq_up + int64_t(n0) * units + (valid ? u : 0) : nullptr;
  const int sb = valid ? (u * 32) >> lb : 0;
  const __half* ps = scales + int64_t(n0) * nb + sb;
  const __half* psu = GATED ? scales_up + int64_t(n0) * nb + sb : nullptr;
  auto load = [&](int j, uint4(&q)[C], __half(&s)[C]) {
    const int col = j * OUT, live = n1 - n0 - col;  // the step's first column from n0, columns left from it
    const bool full = live >= OUT;
    // one pointer a matrix walked a column at a time (a 64-bit add a load, no multiply)
    const uint4* w = pw + col * units;
    const __half* sc = ps + col * nb;
    [[maybe_unused]] const uint4* wu = GATED ? pu + col * units : nullptr;
    [[maybe_unused]] const __half* scu = GATED ? psu + col * nb : nullptr;
#pragma unroll
    for (int c = 0; c < OUT; ++c) {
      const bool ok = valid && (full || c < live);
      q[c] = ok ? LoadStream(w) : make_uint4(0u, 0u, 0u, 0u);
      s[c] = ok ? __ldg(sc) : __float2half(0.f);
      if constexpr (GATED) {
        q[c + OUT] = ok ? LoadStream(wu) : make_uint4(0u, 0u, 0u, 0u);
        s[c + OUT] = ok ? __ldg(scu) : __float2half(0.f);
        wu += units;
        scu += nb;
      }
      w += units;
      sc += nb;
    }
  };
  // lane l ends a step's warp sum holding step column l / (32 / C): where it goes in the chunk
  const int ci = lane / (32 / C);
  const bool writer = (lane & (32 / C - 1)) == 0;
  float* const mine = &part[warp][GATED && ci >= OUT][GATED ? ci % OUT : ci];
  __half2 xp[I8 ? 1 : 16];  // fp16: X's pairs (RowUnitX)
  float back = 1.f;
  RowXI8 xi;  // int8: X's bytes (RowUnitXI8)
  bool exact = false;
  auto step = [&](int j, const uint4(&q)[C], const __half(&s)[C]) {
    float p[C];
    if constexpr (I8)
      RowStepDotsI8<C>(xi, exact, x, u, valid, q, s, p);
    else
      RowStepDots<C>(xp, q, s, back, p);
    const float v = WarpSumColumns<C>(p, lane);
    const int at = (j % kChunkSteps) * OUT;  // the step's first column in the chunk
    if (writer && n0 + j * OUT + (GATED ? ci % OUT : ci) < n1) mine[at] = v;
    if (j % kChunkSteps == kChunkSteps - 1 || j == steps - 1) {  // the chunk's columns summed over the warps
      __syncthreads();
      const int c0 = n0 + (j / kChunkSteps) * kRowChunk, cols = min(kRowChunk, n1 - c0);
      for (int t = threadIdx.x; t < cols; t += blockDim.x) {
        float a = 0.f, b = 0.f;
        for (int w = 0; w < warps; ++w) {
          a += part[w][0][t];
          if constexpr (GATED) b += part[w][GATED][t];
        }
        y[c0 + t] = __float2half(GATED ? onnxfuse::GateActivation(act, a) * b : a);
      }
      __syncthreads();
    }
  };
  uint4 qa[C], qb[C];
  __half sa[C], sb2[C];
  // the first step's weights are requested before X is read (launched as a programmatic dependent: the kernel
  // writing X may still run; the weights are constants)
  if (steps > 0) load(0, qa, sa);
  ock::PdlWait();
  ock::PdlTrigger();
  if constexpr (I8)
    exact = __syncthreads_or(RowUnitXI8(x, u, valid, xi)) != 0;
  else
    back = RowUnitX(x, u, valid, xp);
  for (int j = 0; j < steps; j += 2) {
    if (j + 1 < steps) load(j + 1, qb, sb2);
    step(j, qa, sa);
    if (j + 1 >= steps) break;
    if (j + 2 < steps) load(j + 2, qa, sa);
    step(j + 1, qb, sb2);
  }
}

template <int C, bool GATED, int MAXW, int MINB>
__global__ void __launch_bounds__(MAXW * 32, MINB)
    Int4RowGemv(const __half* __restrict__ x, const uint4* __restrict__ wq, const __half* __restrict__ scales,
                const uint4* __restrict__ wq_up, const __half* __restrict__ scales_up, int act, __half* __restrict__ y,
                int N, int units, int nb, int lb) {
  RowGemvBody<C, GATED, MAXW, false>(x, wq, scales, wq_up, scales_up, act, y, N, units, nb, lb);
}

template <int C, bool GATED, int MAXW, int MINB>
__global__ void __launch_bounds__(MAXW * 32, MINB)
    Int4RowGemvI8(const __half* __restrict__ x, const uint4* __restrict__ wq, const __half* __restrict__ scales,
                  const uint4* __restrict__ wq_up, const __half* __restrict__ scales_up, int act,
                  __half* __restrict__ y, int N, int units, int nb, int lb) {
  RowGemvBody<C, GATED, MAXW, true>(x, wq, scales, wq_up, scales_up, act, y, N, units, nb, lb);
}

// The tensor-core path from kMmaMinRows (its common form from one) to 16 rows (fp16, bf16; fp32 stays on the GEMV):
// mma.sync m16n8k16 with the dequantized weights as the A operand (its 16 rows: columns g and g + 8 of W for lane (g,
// t) = (lane / 4, lane % 4); Int4SwiGLU: column g's gate and up rows) and X as B (its 8 columns: X's rows; 9-16 rows
// take a second mma on the same A). K is permuted: the sum does not care in which order its terms come, so an mma's 16
// "k" need not be 16 consecutive ones. A step is 64 packed bytes (128 values) of each of a warp's 16 weight rows; lane
// t copies the step's 16 bytes at 16 t of its two rows (cp.async) and reads back word t of each 16-byte unit i, i.e.
// values 128 step + 32 i + 8 t .. + 7 of its rows for its word i, and X's same 8 values of its row(s) in one 16-byte
// load, so a warp's load of X reads 64 contiguous bytes of each row (the form before, lane t taking 32 consecutive
// values, read 16 of every 64 bytes a load: Nsight Compute showed L1 72 % busy at 28 % of DRAM's rate). A packed word's
// 8 nibbles dequantize (FasterTransformer's trick) into the pairs (q_i, q_{i+4}), i = 0..3, pairs 0 and 1 one mma's A
// fragment (its k = 2t, 2t + 1 and 2t + 8, 2t + 9 standing for nibbles 0, 4 and 1, 5), pairs 2 and 3 the next one's,
// and X's 8 values of the word are byte-permuted into the same pairs: no shuffles, every weight byte loaded once. The
// weights stream through shared memory, each lane's copies kMmaStages - 1 steps ahead (no registers held for them, no
// barrier), a lane's unit placed by (t + g / 2) % 4 so that the warp's 4-byte reads fall in 32 banks; the block's
// scales (and zero points) are copied into shared memory once, before its first step. A block's warps split K and sum
// their tiles through shared memory. H200, a Llama-2-7B layer (block 32) against the kernel before (its scales a step
// ahead in registers from global, X loaded word by word behind a branch each; with this form's choice of warps): 56.2
// against 69.1 us at 8 rows, 58.3-58.9 against 64.7-67.3 at 3-6, 85.8-87.0 against 99.8-106.6 at 12-16; lm_head 47.2
// against 55.6 at 8 rows, 67.2 against 95.4 at 16, 49.6-50.0 against 51.5-53.1 at 3-6 (scripts/int4_decode_probe.cu,
// benchmarks/results/h200-2026-11-30/int4/decode-probe-kept.txt; the forms on the way in decode-probe-*.txt). (Before
// it, X as A with 8 columns an mma and each lane shuffling the bytes of its B fragment out of its quad's loads: a
// Llama-2-7B layer 159 against 73 us at 8 rows on an H100, 98 (the GEMV) against 68 at 4; the weights double-buffered
// in registers instead of shared memory: 92 at 8 rows; benchmarks/results/h100-2026-11-27/int4/decode-probe.txt. X for
// the next step loaded a step ahead: 67.2 against 68.5 us at 8 rows, decode-probe-stages-x-ahead.txt.)
constexpr int kMmaMinRows = 3;  // Int4Mma's in fp16: below, the GEMV measured faster (7B layer: 56 and 64 against 75
                                // and 77 us); Int4MmaFast, and Int4Mma in bf16, run from one row (GemvPath)
constexpr int kMmaStages = 2;   // 3 measured slower (the layer at 8 rows on an H200: 58.8 against 57.0 us)

template <typename T>
struct MmaDequant;

template <>
struct MmaDequant<__half> {
  // (q_i - z, q_{i+4} - z) * s for i = 0..3, each pair rounded once as the dequantized weights are
  __device__ static void Dequant(uint32_t word, __half s, int z, uint32_t (&d)[4]) {
    __half2 h[4];
    CentredHalf2(word, h, z);
    const __half2 s2 = __half2half2(s);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __half2 v = __hmul2(h[j], s2);
      d[j] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
};

template <>
struct MmaDequant<__nv_bfloat16> {
  // 0x4300 | q is the bfloat16 128 + q, exact (a nibble must sit in bits 0-3: bits 4-7 would reach the exponent)
  __device__ static void Dequant(uint32_t word, __nv_bfloat16 s, int z, uint32_t (&d)[4]) {
    const __nv_bfloat162 bias = __float2bfloat162_rn(128.f + float(z)), s2 = __bfloat162bfloat162(s);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t h = ((word >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
      const __nv_bfloat162 v = __hmul2(__hsub2(*reinterpret_cast<const __nv_bfloat162*>(&h), bias), s2);
      d[j] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
};

// X[row][k .. k + 8) (zeros past K) as the pairs (x_i, x_{i+4}), i = 0..3: the order Dequant gives the weights in.
template <typename T>
__device__ __forceinline__ void XPairs(const T* __restrict__ row, int k, int K, bool xvec, uint32_t (&p)[4]) {
  uint4 u;
  if (xvec && k + 8 <= K) {
    u = __ldg(reinterpret_cast<const uint4*>(row + k));
  } else {
    T v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = k + j < K ? row[k + j] : ock::from_f<T>(0.f);
    u = *reinterpret_cast<const uint4*>(v);
  }
  p[0] = __byte_perm(u.x, u.z, 0x5410);
  p[1] = __byte_perm(u.x, u.z, 0x7632);
  p[2] = __byte_perm(u.y, u.w, 0x5410);
  p[3] = __byte_perm(u.y, u.w, 0x7632);
}

// A step's X for one row, lane t's four words: word i holds values k0 + 32 i .. + 7 (k0 = 128 step + 8 t; `at` is the
// row's value k0), as the pairs XPairs gives. Where the row allows 16-byte loads of the whole step (the usual case) the
// four loads issue together, without a branch between them: each load of the warp reads 64 contiguous bytes of each
// row.
template <typename T>
__device__ __forceinline__ void StepX(const T* __restrict__ at, int k0, int K, bool full, bool xvec, bool live,
                                      uint32_t (&p)[4][4]) {
  if (live && full && xvec) {
    uint4 u[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) u[i] = __ldg(reinterpret_cast<const uint4*>(at + 32 * i));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p[i][0] = __byte_perm(u[i].x, u[i].z, 0x5410);
      p[i][1] = __byte_perm(u[i].x, u[i].z, 0x7632);
      p[i][2] = __byte_perm(u[i].y, u[i].w, 0x5410);
      p[i][3] = __byte_perm(u[i].y, u[i].w, 0x7632);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      p[i][0] = p[i][1] = p[i][2] = p[i][3] = 0u;
      if (live) XPairs(at - k0, k0 + 32 * i, K, xvec, p[i]);
    }
  }
}

// The block's scales (and zero points) in shared memory: 16 A rows, each padded to a multiple of 128 bytes plus 16,
// so the rows of a load start in different banks.
__host__ __device__ inline int MmaScaleStride(int nb, int elem) { return (((nb * elem + 127) & ~127) + 16) / elem; }

// The tensor-core kernels' end (Int4Mma, Int4MmaFast): warp w's partial tiles in its own slots (another warp may still
// be reading its own), then their sum over the block's warps, one output a thread: c fragment e of lane l is A row
// (l >> 2) + 8 (e >= 2), X row 2 (l & 3) + (e & 1) (+ 8 in row set 1); GATED: fragments e and e + 2 are one column's
// gate and up.
template <typename T, int WARPS, bool GATED, int RS, int STAGES>
__device__ __forceinline__ void MmaStoreTile(uint4* smem, const float (&acc)[RS][4], int act, T* __restrict__ y, int m,
                                             int N, int n0) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  auto partial = [&](int w, int r, int e) {
    return reinterpret_cast<float*>(smem + w * STAGES * 64) + (r * 4 + e) * 32;
  };
#pragma unroll
  for (int r = 0; r < RS; ++r)
#pragma unroll
    for (int e = 0; e < 4; ++e) partial(warp, r, e)[lane] = acc[r][e];
  __syncthreads();
  for (int o = threadIdx.x; o < RS * (GATED ? 64 : 128); o += WARPS * 32) {
    const int r = GATED ? o >> 6 : o >> 7, e = GATED ? (o >> 5) & 1 : (o >> 5) & 3, l = o & 31;
    const int row = 8 * r + 2 * (l & 3) + (e & 1), col = n0 + (l >> 2) + (!GATED && e >= 2 ? 8 : 0);
    if (row >= m || col >= N) continue;
    float v = 0.f, u = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      v += partial(w, r, e)[l];
      if (GATED) u += partial(w, r, e + 2)[l];
    }
    y[int64_t(row) * N + col] = ock::from_f<T>(GATED ? onnxfuse::GateActivation(act, v) * u : v);
  }
}

// wide: 16-byte weight copies (the packed rows 16-byte aligned), else two 8-byte ones; svec: 16-byte scale copies
// (the scales 16-byte aligned, blocks a column a multiple of 8). STAGES: the weights' ring, STAGES - 1 steps in flight.
template <typename T, int WARPS, bool GATED, bool ZP, bool ROWS16, int STAGES>
__global__ void __launch_bounds__(WARPS * 32, (ROWS16 ? 16 : 32) / WARPS)  // 32 warps an SM (16 with 16 rows)
    Int4Mma(const T* __restrict__ x, const uint8_t* __restrict__ wq, const T* __restrict__ scales,
            const uint8_t* __restrict__ wq_up, const T* __restrict__ scales_up, const uint8_t* __restrict__ zp,
            const uint8_t* __restrict__ zp_up, int zb, int act, T* __restrict__ y, int m, int K, int N, int nb, int lb,
            int row_bytes, bool xvec, bool wide, bool svec) {
  static_assert(STAGES >= 2 && STAGES * 64 * sizeof(uint4) >= 2 * 4 * 32 * sizeof(float),
                "a warp's partial tiles fit its slots");
  constexpr int RS = ROWS16 ? 2 : 1;  // X's row sets of 8
  // per warp [STAGES][2][32] chunks (its partial tiles [RS][4][32] at the end), then the scales [16][sstride] and the
  // zero points [16][zstride]
  extern __shared__ uint4 mma_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  uint4* buf = mma_smem + warp * STAGES * 64;
  const int sstride = MmaScaleStride(nb, int(sizeof(T))), zstride = MmaScaleStride(zb, 1);
  T* ssm = reinterpret_cast<T*>(mma_smem + WARPS * STAGES * 64);
  uint8_t* zsm = reinterpret_cast<uint8_t*>(ssm + 16 * sstride);
  const int n0 = blockIdx.x * (GATED ? 8 : 16);
  auto col_of = [&](int r) {  // A row r's column (r >= 8 of Int4SwiGLU: the up matrix's), past N the last
    const int col = GATED ? n0 + (r & 7) : n0 + r;
    return col < N ? col : N - 1;  // a column past N computes what is never stored
  };
  // A rows g (j = 0) and g + 8 (j = 1): lane t's 16 bytes of a step (unit t of the row's 64) go to unit
  // (t + g / 2) % 4 of the row's four, so that the 32 lanes' 4-byte reads of word t of unit i fall in 32 banks
  const uint8_t* wrow[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) wrow[j] = (GATED && j == 1 ? wq_up : wq) + int64_t(col_of(8 * j + g)) * row_bytes;
  const int swz = g >> 1;
  // the block's scales and zero points, once: a warp a row, 16-byte copies where svec
  for (int r = warp; r < 16; r += WARPS) {
    const T* src = (GATED && r >= 8 ? scales_up : scales) + int64_t(col_of(r)) * nb;
    T* dst = ssm + r * sstride;
    if (svec) {
      for (int e = lane; e < nb / 8; e += 32) CpAsync16(dst + 8 * e, src + 8 * e, true);
    } else {
      for (int e = lane; e < nb; e += 32) dst[e] = src[e];
    }
    if (lane < 8) dst[nb + lane] = ock::from_f<T>(0.f);  // a step's blocks past the row's: zero (its X is zero too)
    if constexpr (ZP) {
      const uint8_t* zsrc = (GATED && r >= 8 ? zp_up : zp) + int64_t(col_of(r)) * zb;
      for (int e = lane; e < zb; e += 32) zsm[r * zstride + e] = zsrc[e];
      if (lane < 8) zsm[r * zstride + zb + lane] = 0x88;  // past the row's: 8
    }
  }
  CpAsyncCommit();
  const int steps = (row_bytes + 63) / 64;  // a step: 64 bytes (128 values) of a column, 16 a lane
  const int per = (steps + WARPS - 1) / WARPS;
  const int s_begin = warp * per, s_end = min(steps, s_begin + per);
  // Shared-memory addresses, once: this lane's copy slot and its reads in stage 0 (a stage 1024 bytes on, row g + 8's
  // 512 on), word t of unit i at roff[i].
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(buf));
  const uint32_t wslot = ring + 16 * (4 * g + ((t + swz) & 3)), rbase = ring + 64 * g + 4 * t;
  uint32_t roff[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) roff[i] = 16 * ((i + swz) & 3);
  int byte = 64 * s_begin + 16 * t;  // this lane's first byte of the next step to request
  int wstage = 0;
  auto issue = [&](int step) {  // this lane's chunks of `step` into its slot (zeros past the warp's steps or the row)
    const bool lo = step < s_end && byte < row_bytes, hi = lo && byte + 8 < row_bytes;
    const uint32_t slot = wslot + 1024 * wstage;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint8_t* src = wrow[j] + (lo ? byte : 0);
      if (wide) {
        CpAsync16(slot + 512 * j, src, lo);
      } else {
        CpAsync8(slot + 512 * j, src, lo);
        CpAsync8(slot + 512 * j + 8, hi ? src + 8 : wrow[j], hi);
      }
    }
    byte += 64;
    wstage = wstage + 1 == STAGES ? 0 : wstage + 1;
    CpAsyncCommit();
  };
  // the first weights are requested before X may be read (a programmatic dependent: the weights are constants)
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) issue(s_begin + i);
  CpAsyncWait<STAGES - 1>();  // this lane's scale copies (the oldest group) have landed
  __syncthreads();            // and every lane's
  ock::PdlWait();
  ock::PdlTrigger();
  const bool row0 = g < m, row1 = ROWS16 && g + 8 < m;
  const T* x0 = x + int64_t(row0 ? g : 0) * K;
  const T* x1 = x + int64_t(row1 ? g + 8 : 0) * K;
  const T* srow[2] = {ssm + g * sstride, ssm + (g + 8) * sstride};
  const uint8_t* zrow[2] = {zsm + g * zstride, zsm + (g + 8) * zstride};
  float acc[RS][4] = {};
  int rstage = 0;
  for (int step = s_begin; step < s_end; ++step) {  // s_end is the warp's: every lane takes the same steps
    CpAsyncWait<STAGES - 2>();                      // this lane's copies of `step` have landed
    const uint32_t rd = rbase + 1024 * rstage;
    uint32_t w[2][4];  // word t of each unit i of rows g and g + 8: values k0 + 32 i .. + 7
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) w[j][i] = LdShared32(rd + 512 * j + roff[i]);
    rstage = rstage + 1 == STAGES ? 0 : rstage + 1;
    issue(step + STAGES - 1);  // into the slot this lane read STAGES - 1 steps before
    const int k0 = 128 * step + 8 * t;
    uint32_t xs[RS][4][4];
    const bool full = k0 - 8 * t + 128 <= K;
    StepX(x0 + k0, k0, K, full, xvec, row0, xs[0]);
    if constexpr (ROWS16) StepX(x1 + k0, k0, K, full, xvec, row1, xs[RS - 1]);
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // word i: values k0 + 32 i .. + 7, one block's (zero scales past the row's)
      const int b = (k0 + 32 * i) >> lb;
      uint32_t d[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        int zz = 8;
        if constexpr (ZP) zz = ZeroNibble(zrow[j][b >> 1], b);  // shared memory: not ZeroPoint's __ldg
        MmaDequant<T>::Dequant(w[j][i], srow[j][b], zz, d[j]);
      }
#pragma unroll
      for (int r = 0; r < RS; ++r) {
        ock::MmaSync<T>(acc[r], {d[0][0], d[1][0], d[0][1], d[1][1]}, xs[r][i][0], xs[r][i][1]);
        ock::MmaSync<T>(acc[r], {d[0][2], d[1][2], d[0][3], d[1][3]}, xs[r][i][2], xs[r][i][3]);
      }
    }
  }
  CpAsyncWait<0>();  // the copies past the warp's steps (zero-fills) land before their slots are reused
  MmaStoreTile<T, WARPS, GATED, RS, STAGES>(mma_smem, acc, act, y, m, N, n0);
}

// The tensor-core kernel's common form (Int4MmaFast): no zero points, blocks of 32 or more, K a multiple of 128, the
// packed rows, X and the scales 16-byte aligned, blocks a column a multiple of 8. Int4Mma's tiles and K order, with
// fewer instructions a step (Int4Mma's loop measured about 290 a warp a step of 1 KB, most of them addresses and
// bounds, so at 8 rows it issued on 64 % of the cycles at 45 % of the read rate): the addresses are pointers advanced
// by a constant a step, a step's scales one shared-memory load a row, and a word's mma products are of the centred
// nibbles (q - 8), exact, and scaled once in fp32 after the two mma of the word (a 32-value block's), not weight by
// weight in the type. That is the reference's sum of x (q - 8) s without the rounding of each (q - 8) s to the type,
// so a block whose weights the reference would round past the type's range, or scale by Inf or NaN, would differ: a
// block with a scale past kBig (Centred4: fp16 4094, bf16 about 2^124; Inf, NaN) runs the loop with the weights scaled
// before the mma, as Int4Mma does (one test a block, after its scales are in shared memory). H200, a Llama-2-7B layer
// (block 32): 50.6 against Int4Mma's 56.1 us at 8 rows (49.7 against 54.5 replayed from a CUDA graph), 48.4-48.8
// against 58.1-58.6 at 3-4, 68.6-72.2 against 86.2-87.3 at 12-16; lm_head 40.8 against 47.3 at 8 rows
// (scripts/int4_decode_probe.cu, benchmarks/results/h200-2026-11-30/int4/decode-probe-mma-fast.txt; 16, 8 or 4 warps a
// block throughout and a ring of 3: decode-probe-mma-fast-forms.txt; Int4Mma's instruction count:
// ncu-int4mma-8-before-fast.txt, this form's: ncu-int4mmafast-8.txt; contiguous shares of tiles instead of a block a
// tile, slower: decode-probe-share-not-kept.txt).
template <typename T>
struct Centred4;
template <>
struct Centred4<__half> {
  __device__ static void Get(uint32_t word, uint32_t (&d)[4]) {
    __half2 h[4];
    CentredHalf2(word, h, 8);
#pragma unroll
    for (int j = 0; j < 4; ++j) d[j] = *reinterpret_cast<const uint32_t*>(&h[j]);
  }
  static constexpr uint32_t kBig = 0x6BFFu;  // |s| > 4094: 8 |s| may pass fp16's largest
};
template <>
struct Centred4<__nv_bfloat16> {
  __device__ static void Get(uint32_t word, uint32_t (&d)[4]) {
    const __nv_bfloat162 bias = __float2bfloat162_rn(136.f);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t h = ((word >> (4 * j)) & 0x000F000Fu) | 0x43004300u;
      const __nv_bfloat162 v = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&h), bias);
      d[j] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
  static constexpr uint32_t kBig = 0x7D7Fu;  // |s| >= 2^124
};

// SPS: scales a step of 128 values (4: blocks of 32, 2: blocks of 64, 1: 128 or more).
template <typename T, int WARPS, bool GATED, bool ROWS16, int STAGES, int SPS>
__global__ void __launch_bounds__(WARPS * 32, (ROWS16 ? 16 : 32) / WARPS)
    Int4MmaFast(const T* __restrict__ x, const uint8_t* __restrict__ wq, const T* __restrict__ scales,
                const uint8_t* __restrict__ wq_up, const T* __restrict__ scales_up, int act, T* __restrict__ y, int m,
                int K, int N, int nb, int lb) {
  static_assert(STAGES >= 2 && STAGES * 64 * sizeof(uint4) >= 2 * 4 * 32 * sizeof(float), "partials fit the slots");
  constexpr int RS = ROWS16 ? 2 : 1;
  extern __shared__ uint4 mma_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int sstride = MmaScaleStride(nb, int(sizeof(T)));
  T* ssm = reinterpret_cast<T*>(mma_smem + WARPS * STAGES * 64);
  const int n0 = blockIdx.x * (GATED ? 8 : 16);
  auto col_of = [&](int r) {
    const int col = GATED ? n0 + (r & 7) : n0 + r;
    return col < N ? col : N - 1;
  };
  const int row_bytes = K >> 1;
  for (int r = warp; r < 16; r += WARPS) {  // the block's scales, once
    const T* src = (GATED && r >= 8 ? scales_up : scales) + int64_t(col_of(r)) * nb;
    T* dst = ssm + r * sstride;
    for (int e = lane; e < nb / 8; e += 32) CpAsync16(dst + 8 * e, src + 8 * e, true);
  }
  CpAsyncCommit();
  const int steps = K >> 7, per = (steps + WARPS - 1) / WARPS;
  const int s_begin = min(steps, warp * per), s_end = min(steps, s_begin + per);
  const int swz = g >> 1;
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(mma_smem + warp * STAGES * 64));
  const uint32_t wslot = ring + 16 * (4 * g + ((t + swz) & 3)), rbase = ring + 64 * g + 4 * t;
  uint32_t roff[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) roff[i] = 16 * ((i + swz) & 3);
  const uint8_t* src0 = wq + int64_t(col_of(g)) * row_bytes + 64 * s_begin + 16 * t;
  const uint8_t* src1 = (GATED ? wq_up : wq) + int64_t(col_of(8 + g)) * row_bytes + 64 * s_begin + 16 * t;
  int issued = s_begin;
  uint32_t wst = 0;
  auto issue = [&] {
    if (issued < s_end) {  // the warp's own steps (uniform)
      CpAsync16(wslot + wst, src0, true);
      CpAsync16(wslot + wst + 512, src1, true);
    }
    src0 += 64;
    src1 += 64;
    ++issued;
    wst = wst + 1024 == STAGES * 1024 ? 0 : wst + 1024;
    CpAsyncCommit();
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) issue();
  CpAsyncWait<STAGES - 1>();  // the scales
  __syncthreads();
  bool big = false;  // a scale of the block past kBig (or Inf, NaN)
  const int vecs = nb / 8;
  for (int e = threadIdx.x; e < 16 * vecs; e += WARPS * 32) {
    const int r = e / vecs, c = e - r * vecs;
    const uint4 v = *reinterpret_cast<const uint4*>(ssm + r * sstride + 8 * c);
    const uint32_t mx =
        __vmaxu2(__vmaxu2(v.x & 0x7FFF7FFFu, v.y & 0x7FFF7FFFu), __vmaxu2(v.z & 0x7FFF7FFFu, v.w & 0x7FFF7FFFu));
    big |= max(mx & 0xFFFFu, mx >> 16) > Centred4<T>::kBig;
  }
  const bool exact = __syncthreads_or(big);
  ock::PdlWait();
  ock::PdlTrigger();
  const bool row0 = g < m, row1 = ROWS16 && g + 8 < m;
  const T* xp0 = x + int64_t(row0 ? g : 0) * K + 128 * s_begin + 8 * t;
  const T* xp1 = x + int64_t(row1 ? g + 8 : 0) * K + 128 * s_begin + 8 * t;
  const T* sp0 = ssm + g * sstride;
  const T* sp1 = ssm + (g + 8) * sstride;
  float acc[RS][4] = {};
  uint32_t rst = 0;
  auto loop = [&](auto exact_tag) {
    constexpr bool EXACT = decltype(exact_tag)::value;
    for (int step = s_begin; step < s_end; ++step) {
      CpAsyncWait<STAGES - 2>();
      uint32_t w[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) w[j][i] = LdShared32(rbase + rst + 512 * j + roff[i]);
      rst = rst + 1024 == STAGES * 1024 ? 0 : rst + 1024;
      issue();
      uint32_t xs[RS][4][4];
#pragma unroll
      for (int r = 0; r < RS; ++r) {
        const T* xp = r == 0 ? xp0 : xp1;
        const bool live = r == 0 ? row0 : row1;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint4 u = live ? __ldg(reinterpret_cast<const uint4*>(xp + 32 * i)) : make_uint4(0u, 0u, 0u, 0u);
          xs[r][i][0] = __byte_perm(u.x, u.z, 0x5410);
          xs[r][i][1] = __byte_perm(u.x, u.z, 0x7632);
          xs[r][i][2] = __byte_perm(u.y, u.w, 0x5410);
          xs[r][i][3] = __byte_perm(u.y, u.w, 0x7632);
        }
      }
      xp0 += 128;
      if constexpr (ROWS16) xp1 += 128;
      T s[2][SPS];  // the step's scales of A rows g and g + 8
      if constexpr (SPS == 4) {
        *reinterpret_cast<uint2*>(s[0]) = *reinterpret_cast<const uint2*>(sp0 + 4 * step);
        *reinterpret_cast<uint2*>(s[1]) = *reinterpret_cast<const uint2*>(sp1 + 4 * step);
      } else if constexpr (SPS == 2) {
        *reinterpret_cast<uint32_t*>(s[0]) = *reinterpret_cast<const uint32_t*>(sp0 + 2 * step);
        *reinterpret_cast<uint32_t*>(s[1]) = *reinterpret_cast<const uint32_t*>(sp1 + 2 * step);
      } else {
        s[0][0] = sp0[(128 * step) >> lb];
        s[1][0] = sp1[(128 * step) >> lb];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int si = SPS == 4 ? i : SPS == 2 ? i >> 1 : 0;
        uint32_t d[2][4];
        if constexpr (EXACT) {
#pragma unroll
          for (int j = 0; j < 2; ++j) MmaDequant<T>::Dequant(w[j][i], s[j][si], 8, d[j]);
#pragma unroll
          for (int r = 0; r < RS; ++r) {
            ock::MmaSync<T>(acc[r], {d[0][0], d[1][0], d[0][1], d[1][1]}, xs[r][i][0], xs[r][i][1]);
            ock::MmaSync<T>(acc[r], {d[0][2], d[1][2], d[0][3], d[1][3]}, xs[r][i][2], xs[r][i][3]);
          }
        } else {
#pragma unroll
          for (int j = 0; j < 2; ++j) Centred4<T>::Get(w[j][i], d[j]);
          const float s0 = ock::to_f(s[0][si]), s1 = ock::to_f(s[1][si]);
#pragma unroll
          for (int r = 0; r < RS; ++r) {
            float p[4] = {0.f, 0.f, 0.f, 0.f};
            ock::MmaSync<T>(p, {d[0][0], d[1][0], d[0][1], d[1][1]}, xs[r][i][0], xs[r][i][1]);
            ock::MmaSync<T>(p, {d[0][2], d[1][2], d[0][3], d[1][3]}, xs[r][i][2], xs[r][i][3]);
            acc[r][0] = fmaf(s0, p[0], acc[r][0]);
            acc[r][1] = fmaf(s0, p[1], acc[r][1]);
            acc[r][2] = fmaf(s1, p[2], acc[r][2]);
            acc[r][3] = fmaf(s1, p[3], acc[r][3]);
          }
        }
      }
    }
  };
  if (exact)
    loop(std::true_type{});
  else
    loop(std::false_type{});
  CpAsyncWait<0>();
  MmaStoreTile<T, WARPS, GATED, RS, STAGES>(mma_smem, acc, act, y, m, N, n0);
}

// The tensor-core GEMM past the decode kernels' rows (Int4MmaGemm: symmetric weights in blocks of 32 or more, K a
// multiple of 64, fp16 or bf16). sm_80-class mma.sync with the weights dequantized in registers: a block of 4 warps
// computes BN output columns x BM rows of X (WN warps along N, each BN / WN columns as m16 tiles, the weights as the
// mma's A operand; 4 / WN along M, each its rows as n8 tiles, X as B), a step of 64 values of K: the step's packed
// weights (BN x 32 bytes) and X (BM x 128 bytes) cp.async into a ring of STAGES, each weight word dequantized once a
// warp as (q - 8) * s rounded to the type (MmaDequant: what the reference's dequantized W holds, so Inf, NaN and
// overflow come out as the reference's) and used by every n8 tile of the warp's rows. K is permuted within each
// 32-value chunk as Int4Mma permutes it (a word's nibbles give the pairs (k_i, k_i+4), X's 16 bytes a lane are
// byte-permuted to match). The scales of a step are read from global memory a step ahead (a column's two blocks of
// 32 in one 4-byte load, SPB 2; one scale otherwise). SPLIT: the block sums steps [z * per, (z + 1) * per) into fp32
// partials [gridDim.z][m][N], summed by Int4SplitSum. Shared memory is swizzled so that the fragment loads are
// conflict-free: a weight row's two 16-byte chunks swap where (row / 4) is odd, an X row's chunk index flips bit 2
// where the row is odd. The fragments are plain loads and the mma a non-volatile asm, so that the compiler may issue
// a chunk's loads while the chunk before it multiplies.
template <typename T, int BM, int BN, int WN, int STAGES, int SPB, bool SPLIT>
__global__ void __launch_bounds__(128)
    Int4MmaGemm(const T* __restrict__ x, const uint8_t* __restrict__ wq, const T* __restrict__ scales,
                T* __restrict__ y, float* __restrict__ part, int ldy, int m, int K, int N, int nb, int lb,
                int row_bytes, int per) {
  constexpr int WM = 4 / WN, WCOLS = BN / WN, WROWS = BM / WM, MT = WCOLS / 16, NT = WROWS / 8;
  constexpr int W_BYTES = BN * 32, STAGE = W_BYTES + BM * 128;
  static_assert(WCOLS % 16 == 0 && WROWS % 8 == 0, "whole m16 and n8 tiles a warp");
  extern __shared__ uint4 gemm_smem[];
  const uint32_t sbase = uint32_t(__cvta_generic_to_shared(gemm_smem));
  const char* sgen = reinterpret_cast<const char*>(gemm_smem);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wn = warp % WN, wm = warp / WN;
  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
  const int s_begin = blockIdx.z * per, s_end = min(K >> 6, s_begin + per);
  auto issue = [&](int step, int stage) {
    if (step < s_end) {
      const uint32_t st = sbase + stage * STAGE;
#pragma unroll
      for (int i = 0; i < BN * 2 / 128; ++i) {
        const int id = tid + 128 * i, r = id >> 1, c = id & 1, col = n0 + r;
        const bool ok = col < N;
        CpAsync16(st + r * 32 + 16 * (c ^ ((r >> 2) & 1)), wq + int64_t(ok ? col : 0) * row_bytes + step * 32 + 16 * c,
                  ok);
      }
#pragma unroll
      for (int i = 0; i < BM * 8 / 128; ++i) {
        const int id = tid + 128 * i, r = id >> 3, q = id & 7, row = m0 + r;
        const bool ok = row < m;
        CpAsync16(st + W_BYTES + r * 128 + 16 * (q ^ ((r & 1) << 2)), x + int64_t(ok ? row : 0) * K + step * 64 + 8 * q,
                  ok);
      }
    }
    CpAsyncCommit();
  };
  int soff[MT][2];  // the lane's columns' scale rows: columns g and g + 8 of each m16 tile
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < 2; ++j) soff[mt][j] = min(n0 + wn * WCOLS + mt * 16 + 8 * j + g, N - 1) * nb;
  auto load_scales = [&](int step, T(&s)[MT][2][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if constexpr (SPB == 2) {
          const uint32_t v = __ldg(reinterpret_cast<const uint32_t*>(scales + soff[mt][j] + 2 * step));
          s[mt][j][0] = *reinterpret_cast<const T*>(&v);
          s[mt][j][1] = reinterpret_cast<const T*>(&v)[1];
        } else {
          s[mt][j][0] = s[mt][j][1] = scales[soff[mt][j] + ((step << 6) >> lb)];
        }
      }
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) issue(s_begin + i, i);
  T sv[MT][2][2], sn[MT][2][2];
  if (s_begin < s_end) load_scales(s_begin, sv);
  float acc[MT][NT][4] = {};
  int stage = 0;
  const int wsw = 16 * ((g >> 2) & 1), xsw = (g & 1) << 2;
  for (int step = s_begin; step < s_end; ++step) {
    CpAsyncWait<STAGES - 2>();
    __syncthreads();
    issue(step + STAGES - 1, stage == 0 ? STAGES - 1 : stage - 1);
    if (step + 1 < s_end) load_scales(step + 1, sn);
    const char* st = sgen + stage * STAGE;
    uint32_t wv[2][MT][2];
    uint4 xv[2][NT];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < 2; ++j)
          wv[h][mt][j] = *reinterpret_cast<const uint32_t*>(st + (wn * WCOLS + mt * 16 + 8 * j + g) * 32 +
                                                            ((16 * h) ^ wsw) + 4 * t);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        xv[h][nt] =
            *reinterpret_cast<const uint4*>(st + W_BYTES + (wm * WROWS + nt * 8 + g) * 128 + 16 * ((4 * h + t) ^ xsw));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t a[MT][2][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        uint32_t d0[4], d1[4];
        MmaDequant<T>::Dequant(wv[h][mt][0], sv[mt][0][h], 8, d0);
        MmaDequant<T>::Dequant(wv[h][mt][1], sv[mt][1][h], 8, d1);
        a[mt][0][0] = d0[0], a[mt][0][1] = d1[0], a[mt][0][2] = d0[1], a[mt][0][3] = d1[1];
        a[mt][1][0] = d0[2], a[mt][1][1] = d1[2], a[mt][1][2] = d0[3], a[mt][1][3] = d1[3];
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4 u = xv[h][nt];
        const uint32_t x0 = __byte_perm(u.x, u.z, 0x5410), x1 = __byte_perm(u.x, u.z, 0x7632),
                       x2 = __byte_perm(u.y, u.w, 0x5410), x3 = __byte_perm(u.y, u.w, 0x7632);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          ock::MmaSyncSched<T>(acc[mt][nt], a[mt][0], x0, x1);
          ock::MmaSyncSched<T>(acc[mt][nt], a[mt][1], x2, x3);
        }
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 2; ++j) sv[mt][j][0] = sn[mt][j][0], sv[mt][j][1] = sn[mt][j][1];
    stage = stage + 1 == STAGES ? 0 : stage + 1;
  }
  CpAsyncWait<0>();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = n0 + wn * WCOLS + mt * 16 + g + 8 * (e >> 1), row = m0 + wm * WROWS + nt * 8 + 2 * t + (e & 1);
        if (col < N && row < m) {
          if constexpr (SPLIT)
            part[(int64_t(blockIdx.z) * m + row) * N + col] = acc[mt][nt][e];
          else
            y[int64_t(row) * ldy + col] = ock::from_f<T>(acc[mt][nt][e]);
        }
      }
}

// Y [m, ldy] = the sum of Int4MmaGemm's `splits` fp32 partials [splits][m][n], rounded once to T.
template <typename T>
__global__ void Int4SplitSum(const float* __restrict__ part, T* __restrict__ y, int ldy, int m, int n, int splits) {
  const int64_t total = int64_t(m) * n;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    float v = 0.f;
    for (int z = 0; z < splits; ++z) v += part[z * total + i];
    const int64_t row = i / n;
    y[row * ldy + (i - row * n)] = ock::from_f<T>(v);
  }
}

// The norm ops' first kernel: sum = T(X + skip), xn = T(sum * inv * gamma), a block a row. A programmatic
// dependent that lets its own dependent start at once: the projection after it may request its weights meanwhile.
// Any K and alignment: element by element (sum read back by the thread that wrote it).
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    Int4SkipNormRows(const T* __restrict__ x, const T* __restrict__ skip, const T* __restrict__ gamma,
                     T* __restrict__ sum, T* __restrict__ xn, int64_t K, float eps) {
  __shared__ float red[kWarps];
  ock::PdlWait();
  ock::PdlTrigger();
  const int64_t row = int64_t(blockIdx.x) * K;
  float q = 0.f;
  for (int64_t c = threadIdx.x; c < K; c += kWarps * 32) {
    const T v = ock::from_f<T>(ock::to_f(x[row + c]) + ock::to_f(skip[row + c]));
    sum[row + c] = v;
    q += ock::to_f(v) * ock::to_f(v);
  }
  const float inv = 1.f / sqrtf(ock::BlockSum(q, red) / float(K) + eps);
  for (int64_t c = threadIdx.x; c < K; c += kWarps * 32)
    xn[row + c] = ock::from_f<T>(ock::to_f(sum[row + c]) * inv * ock::to_f(gamma[c]));
}

// K a multiple of 16 bytes' values, at most kWarps * 32 * V vectors, every pointer 16-byte aligned: a thread's V
// vectors of X, skip and gamma requested at once and held in registers between the two passes.
template <typename T, int V>
__global__ void __launch_bounds__(kWarps * 32)
    Int4SkipNormRowsVec(const T* __restrict__ x, const T* __restrict__ skip, const T* __restrict__ gamma,
                        T* __restrict__ sum, T* __restrict__ xn, int64_t K, float eps) {
  constexpr int kPer = 16 / int(sizeof(T));
  __shared__ float red[kWarps];
  uint4 g[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {  // gamma is a constant: requested before the wait
    const int64_t c = (int64_t(v) * kWarps * 32 + threadIdx.x) * kPer;
    if (c < K) g[v] = __ldg(reinterpret_cast<const uint4*>(gamma + c));
  }
  ock::PdlWait();
  ock::PdlTrigger();
  const int64_t row = int64_t(blockIdx.x) * K;
  uint4 a[V], b[V];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int64_t c = (int64_t(v) * kWarps * 32 + threadIdx.x) * kPer;
    if (c < K) {
      a[v] = __ldg(reinterpret_cast<const uint4*>(x + row + c));
      b[v] = __ldg(reinterpret_cast<const uint4*>(skip + row + c));
    }
  }
  float q = 0.f;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int64_t c = (int64_t(v) * kWarps * 32 + threadIdx.x) * kPer;
    if (c < K) {
      const T* av = reinterpret_cast<const T*>(&a[v]);
      const T* bv = reinterpret_cast<const T*>(&b[v]);
      alignas(16) T sv[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        sv[j] = ock::from_f<T>(ock::to_f(av[j]) + ock::to_f(bv[j]));
        q += ock::to_f(sv[j]) * ock::to_f(sv[j]);
      }
      a[v] = *reinterpret_cast<const uint4*>(sv);
      *reinterpret_cast<uint4*>(sum + row + c) = a[v];
    }
  }
  const float inv = 1.f / sqrtf(ock::BlockSum(q, red) / float(K) + eps);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int64_t c = (int64_t(v) * kWarps * 32 + threadIdx.x) * kPer;
    if (c < K) {
      const T* sv = reinterpret_cast<const T*>(&a[v]);
      const T* gv = reinterpret_cast<const T*>(&g[v]);
      alignas(16) T out[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) out[j] = ock::from_f<T>(ock::to_f(sv[j]) * inv * ock::to_f(gv[j]));
      *reinterpret_cast<uint4*>(xn + row + c) = *reinterpret_cast<const uint4*>(out);
    }
  }
}

// Packed weights not 8-byte aligned (a view into a larger buffer): one thread per output, byte loads (wq_up non-null:
// Int4SwiGLU, act(gate) * up; zp non-null: zero points, zb bytes a column).
template <typename T>
__device__ float NaiveDot(const T* __restrict__ xr, const uint8_t* __restrict__ q, const T* __restrict__ s,
                          const uint8_t* __restrict__ z, int64_t K, int lb) {
  float acc = 0.f;
  for (int64_t k = 0; k < K; ++k) {
    const float bias = z == nullptr ? ZBias(8) : ZBias(ZeroPoint(z, int(k >> lb)));
    acc = fmaf(ock::to_f(xr[k]), Centred(q[k >> 1], int(k & 1), bias) * ock::to_f(s[k >> lb]), acc);
  }
  return acc;
}

template <typename T>
__global__ void Int4Naive(const T* __restrict__ x, const uint8_t* __restrict__ wq, const T* __restrict__ scales,
                          const uint8_t* __restrict__ wq_up, const T* __restrict__ scales_up,
                          const uint8_t* __restrict__ zp, const uint8_t* __restrict__ zp_up, int64_t zb, int act,
                          T* __restrict__ y, int64_t M, int64_t K, int64_t N, int64_t nb, int lb, int64_t row_bytes) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < M * N; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / N, col = i - r * N;
    const float g = NaiveDot(x + r * K, wq + col * row_bytes, scales + col * nb, zp ? zp + col * zb : nullptr, K, lb);
    y[i] = ock::from_f<T>(wq_up == nullptr ? g
                                           : onnxfuse::GateActivation(act, g) *
                                                 NaiveDot(x + r * K, wq_up + col * row_bytes, scales_up + col * nb,
                                                          zp_up ? zp_up + col * zb : nullptr, K, lb));
  }
}

// Int4SwiGLU above the GEMV's rows: z [M, 2N] holds X @ [W_gate; W_up]^T; y [M, N] = act(z[:, :N]) * z[:, N:]. Rows
// by blockIdx.y, VEC values a thread (16-byte loads and stores where the rows allow), so no index is divided. (A thread
// per value with the row and column divided out of a flat index ran at 1.1 TB/s on an H100: the 7B MLP's pass at
// 2048 rows took 128 us; this one 48, at 2.8 TB/s. benchmarks/results/h100-2026-11-27/int4/int4-probe-halves.json.)
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Pack {
  T v[VEC];
};
template <typename T, int VEC>
__global__ void GateHalves(const T* __restrict__ z, T* __restrict__ y, int64_t M, int64_t N, int act) {
  using V = Pack<T, VEC>;
  const int64_t nv = N / VEC;
  for (int64_t r = blockIdx.y; r < M; r += gridDim.y) {
    const V* gate = reinterpret_cast<const V*>(z + r * 2 * N);
    const V* up = reinterpret_cast<const V*>(z + r * 2 * N + N);
    V* out = reinterpret_cast<V*>(y + r * N);
    for (int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; c < nv; c += int64_t(gridDim.x) * blockDim.x) {
      V g = gate[c];
      const V u = up[c];
#pragma unroll
      for (int e = 0; e < VEC; ++e)
        g.v[e] = ock::from_f<T>(onnxfuse::GateActivation(act, ock::to_f(g.v[e])) * ock::to_f(u.v[e]));
      out[c] = g;
    }
  }
}

// W^T [N, K] (the packed rows' own order; the GEMM transposes it): blocks walk the columns (blockIdx.y), a thread
// takes 8 values (4 packed bytes, their block's scale) of its column, so a warp loads 128 contiguous bytes and stores
// 512 contiguously (VEC: 4-byte loads and 16-byte stores, rows of a multiple of 8 values); 32-bit index math within a
// column. ZP and VEC are template parameters, so the symmetric kernel's zero point is a constant. (The form before, 16
// values a thread with both as run-time flags: a 7B layer's four projections and lm_head 3.5-4.5 % slower on an H100,
// scripts/int4_dequant_probe.cu, benchmarks/results/h100-2026-11-27/int4/dequant-probe.txt.)
template <typename T, bool ZP, bool VEC>
__global__ void Int4Dequantize(const uint8_t* __restrict__ wq, const T* __restrict__ scales,
                               const uint8_t* __restrict__ zp, T* __restrict__ w, int K, int N, int nb, int lb,
                               int row_bytes, int zb) {
  const int words = (K + 7) / 8;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= words) return;
  const int k0 = i * 8;
  for (int col = blockIdx.y; col < N; col += gridDim.y) {
    const uint8_t* q = wq + int64_t(col) * row_bytes + i * 4;
    const uint32_t word = VEC ? __ldg(reinterpret_cast<const uint32_t*>(q))
                              : uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24;
    const float sc = ock::to_f(scales[int64_t(col) * nb + (k0 >> lb)]);
    const float bias = ZP ? ZBias(ZeroPoint(zp + int64_t(col) * zb, k0 >> lb)) : ZBias(8);
    T vals[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) vals[j] = ock::from_f<T>(Centred(word, j, bias) * sc);
    T* out = w + int64_t(col) * K + k0;
    if (VEC && k0 + 8 <= K) {
#pragma unroll
      for (int v = 0; v < int(sizeof(T)) / 2; ++v)
        reinterpret_cast<uint4*>(out)[v] = reinterpret_cast<const uint4*>(vals)[v];
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (k0 + j < K) out[j] = vals[j];
    }
  }
}

int64_t Blocks(int64_t work, int threads) {
  int64_t b = (work + threads - 1) / threads;
  return b < 1 ? 1 : (b > 65536 ? 65536 : b);
}

using onnxfuse::cuda_kernels::Aligned16;

int Log2(int64_t v) {
  int l = 0;
  while ((int64_t(1) << l) < v) ++l;
  return l;
}

// A launch's weights: the packed weights, scales and zero points (null: symmetric) of one matrix, or of the gate's and
// the up matrix's (wq_up null: Int4Linear), with their geometry.
struct Int4Weights {
  const uint8_t* wq;
  const void* scales;
  const uint8_t* zp;
  const uint8_t* wq_up;
  const void* scales_up;
  const uint8_t* zp_up;
  int64_t nb, row_bytes, zb;  // blocks, packed bytes and zero-point bytes a column
  int lb;                     // log2 of the block size
  bool int8_x = false;        // the node's accuracy_level is 4: the one-row GEMV may round X to int8 (Int4RowGemvI8)
};

// Whether the one-row GEMV (Int4RowGemv) takes this call: fp16, one row, symmetric, blocks of 32 or more dividing K, K
// up to kRowMaxWarps warps of 1024 values, X and the packed rows 16-byte aligned.
bool RowGemvOk(int dtype, const void* x, const Int4Weights& wt, int64_t m, int64_t k, int64_t n) {
  return dtype == ONNXFUSE_FP16 && m == 1 && wt.zp == nullptr && wt.lb >= 5 && k % (int64_t(1) << wt.lb) == 0 &&
         k <= int64_t(kRowMaxWarps) * 1024 && n * (k / 32) < (int64_t(1) << 31) && n * wt.nb < (int64_t(1) << 31) &&
         Aligned16(x) && Aligned16(wt.wq) && (wt.wq_up == nullptr || Aligned16(wt.wq_up));
}

// Blocks of up to MAXW warps, MINB of them an SM (the registers a thread may take: 64 K / (32 MAXW MINB)).
template <int C, bool GATED, int MAXW, int MINB, bool I8>
int LaunchRowGemvAs(const void* x, const Int4Weights& wt, int act, void* y, int64_t k, int64_t n, cudaStream_t s) {
  const int units = int(k / 32), warps = (units + 31) / 32;
  auto kernel = I8 ? Int4RowGemvI8<C, GATED, MAXW, MINB> : Int4RowGemv<C, GATED, MAXW, MINB>;
  static std::atomic<int> blocks_per_sm[MAXW + 1];  // by warps a block, found on first use
  int occ = blocks_per_sm[warps].load(std::memory_order_relaxed);
  if (occ == 0) {
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, warps * 32, 0) != cudaSuccess || occ < 1) occ = 1;
    blocks_per_sm[warps].store(occ, std::memory_order_relaxed);
  }
  int device = 0;
  const int sms = onnxfuse_cuda_sm_count(cudaGetDevice(&device) == cudaSuccess ? device : 0);
  const int64_t grid = std::min<int64_t>(n, int64_t(occ) * (sms > 0 ? sms : 1));
  return ock::LaunchDependent(kernel, dim3(unsigned(grid)), dim3(unsigned(warps * 32)), 0, s,
                              static_cast<const __half*>(x), reinterpret_cast<const uint4*>(wt.wq),
                              static_cast<const __half*>(wt.scales), reinterpret_cast<const uint4*>(wt.wq_up),
                              static_cast<const __half*>(wt.scales_up), act, static_cast<__half*>(y), int(n), units,
                              int(wt.nb), wt.lb);
}

// WARPS_SM: the warps an SM the register budget aims at (0: one block of up to 16 warps, 128 registers a thread).
// (I8: Int4RowGemvI8 where wt.int8_x; the same forms measured best for it: decode-probe-int8x-forms.txt, more warps an
// SM slower: decode-probe-int8x-occupancy-not-kept.txt.)
template <int C, bool GATED, int WARPS_SM = 0>
int LaunchRowGemv(const void* x, const Int4Weights& wt, int act, void* y, int64_t k, int64_t n, cudaStream_t s) {
  const int warps = int((k / 32 + 31) / 32);
  auto as = [&](auto maxw, auto minb) {
    constexpr int MAXW = decltype(maxw)::value, MINB = decltype(minb)::value;
    return wt.int8_x ? LaunchRowGemvAs<C, GATED, MAXW, MINB, true>(x, wt, act, y, k, n, s)
                     : LaunchRowGemvAs<C, GATED, MAXW, MINB, false>(x, wt, act, y, k, n, s);
  };
  using std::integral_constant;
  if constexpr (WARPS_SM == 0) {
    return as(integral_constant<int, kRowMaxWarps>{}, integral_constant<int, 1>{});
  } else {
    if (warps <= 4) return as(integral_constant<int, 4>{}, integral_constant<int, WARPS_SM / 4>{});
    if (warps <= 8) return as(integral_constant<int, 8>{}, integral_constant<int, WARPS_SM / 8>{});
    if (warps <= 12) return as(integral_constant<int, 12>{}, integral_constant<int, WARPS_SM / 12>{});
    return as(integral_constant<int, kRowMaxWarps>{},
              integral_constant<int, (WARPS_SM / 16 > 0 ? WARPS_SM / 16 : 1)>{});
  }
}
// The one-row GEMV's form by shape, from scripts/int4_decode_probe.cu on an H200 (a Llama-2-7B layer, block 32,
// benchmarks/results/h200-2026-11-30/int4/row-gemv-probe-*.txt): K up to 4096 (a warp of 1024 values, blocks of up to
// 4 warps) in blocks of 128 registers a thread, 8 loads a step for Int4Linear (qkv 9.6 us, lm_head 29.0 against 10.0
// and 30.1 with 4), 4 for Int4SwiGLU (gate and up 15.8 against 16.5); a larger K (down's 11008: 11 warps a block) in
// blocks of 80 registers, two an SM, 4 loads a step (10.0 against 10.5 us at 128 registers, one block an SM; 8 loads
// spill at 80).
int RowGemv(const void* x, const Int4Weights& wt, int act, void* y, int64_t k, int64_t n, cudaStream_t s) {
  const bool gated = wt.wq_up != nullptr;
  if (k > 4096)
    return gated ? LaunchRowGemv<4, true, 24>(x, wt, act, y, k, n, s)
                 : LaunchRowGemv<4, false, 24>(x, wt, act, y, k, n, s);
  return gated ? LaunchRowGemv<4, true>(x, wt, act, y, k, n, s) : LaunchRowGemv<8, false>(x, wt, act, y, k, n, s);
}

template <typename T, int MR, bool GATED, bool ZP>
int LaunchGemv(const void* x, const Int4Weights& wt, int act, void* y, int64_t m, int64_t k, int64_t n,
               cudaStream_t s) {
  const int64_t nb = wt.nb, row_bytes = wt.row_bytes;
  const int lb = wt.lb, zb = int(wt.zb);
  const uint8_t *zp = wt.zp, *zp_up = wt.zp_up;
  const bool xvec = Aligned16(x) && (k * int64_t(sizeof(T))) % 16 == 0;
  const int64_t cols_per_block = GATED ? kWarps : kWarps * kCols;
  const int64_t blocks = (n + cols_per_block - 1) / cols_per_block;
  const int64_t staged = m * ((k + 15) / 16) * int64_t(sizeof(typename XGroup<T>::type));
  const T* xt = static_cast<const T*>(x);
  const uint2 *w = reinterpret_cast<const uint2*>(wt.wq), *wu = reinterpret_cast<const uint2*>(wt.wq_up);
  const T *st = static_cast<const T*>(wt.scales), *su = static_cast<const T*>(wt.scales_up);
  T* yt = static_cast<T*>(y);
  if (staged <= (MR <= 2 ? kStageBytes : kStageBytesRows)) {
    if (staged > kStageBytes) {
      if (cudaError_t e = cudaFuncSetAttribute(Int4Gemv<T, MR, true, GATED, ZP>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, kStageBytesRows))
        return int(e);
    }
    return ock::LaunchDependent(Int4Gemv<T, MR, true, GATED, ZP>, dim3(unsigned(blocks)), dim3(kWarps * 32),
                                size_t(staged), s, xt, w, st, wu, su, zp, zp_up, zb, act, yt, int(m), int(k), int(n),
                                int(nb), lb, int(row_bytes / 8), xvec);
  }
  return ock::LaunchDependent(Int4Gemv<T, MR, false, GATED, ZP>, dim3(unsigned(blocks)), dim3(kWarps * 32), 0, s, xt, w,
                              st, wu, su, zp, zp_up, zb, act, yt, int(m), int(k), int(n), int(nb), lb,
                              int(row_bytes / 8), xvec);
}

// WARPS: 16 a block where the grid is at most kMmaWideGrid blocks and m <= 8 (a 7B model's o and down projections, 256
// blocks: 6.2 and 14.2 against 7.1 and 16.0 us with 8 at 8 rows on an H100), 4 from kMmaNarrowGrid blocks (lm_head,
// 3072 blocks: 46.8 against 50.4 us at 8 rows, 66.6 against 76.3 at 16 on an H200), else 8 (qkv, gate and up; and o
// and down past 8 rows, whose 16-warp blocks of up to 128 registers fit one an SM: 7.7 and 16.0 against 9.7 and 20.7 us
// at 16 rows). benchmarks/results/h200-2026-11-30/int4/decode-probe-warps.txt.
constexpr unsigned kMmaWideGrid = 512, kMmaNarrowGrid = 2048;
// Shared memory a block of the tensor-core kernel may take (sm_90's opt-in limit); a K whose scales would not fit
// (over 6,000 blocks a column) stays on the GEMV.
constexpr size_t kMmaMaxSmem = 227 * 1024;
template <typename T, bool ZP, int STAGES = kMmaStages>
size_t MmaSmem(const Int4Weights& wt, int block_warps) {
  return size_t(block_warps) * STAGES * 64 * sizeof(uint4) +
         16 * size_t(MmaScaleStride(int(wt.nb), int(sizeof(T)))) * sizeof(T) +
         (ZP ? 16 * size_t(MmaScaleStride(int(wt.zb), 1)) : 0);
}

// The tensor-core kernels' grid (a block per 16 output columns, Int4SwiGLU's per 8 columns' gate and up rows), their
// warps a block (`warps`, or 0: the rule above) and one launch: its shared memory checked against sm_90's opt-in limit
// and allowed past 48 KB.
template <bool GATED>
unsigned MmaBlocks(int64_t n) {
  return unsigned((n + (GATED ? 8 : 16) - 1) / (GATED ? 8 : 16));
}
inline int MmaWarps(unsigned blocks, int64_t m, int warps) {
  return warps != 0 ? warps : blocks >= kMmaNarrowGrid ? 4 : blocks <= kMmaWideGrid && m <= 8 ? 16 : 8;
}
template <typename Kernel, typename... A>
int LaunchMmaKernel(Kernel kernel, unsigned blocks, int warps, size_t smem, cudaStream_t s, A&&... args) {
  if (smem > kMmaMaxSmem) return int(ONNXFUSE_ERR_TOO_LARGE);
  if (smem > 48 * 1024)
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)))
      return int(e);
  return ock::LaunchDependent(kernel, dim3(blocks), dim3(warps * 32), smem, s, std::forward<A>(args)...);
}

template <typename T, bool GATED, bool ZP, int STAGES = kMmaStages>
int LaunchMma(const void* x, const Int4Weights& wt, int act, void* y, int64_t m, int64_t k, int64_t n, cudaStream_t s,
              int warps = 0) {  // 4, 8 or 16 (scripts/int4_decode_probe.cu); 0: by the grid
  const bool xvec = Aligned16(x) && k % 8 == 0;
  const bool wide = Aligned16(wt.wq) && (!GATED || Aligned16(wt.wq_up)) && wt.row_bytes % 16 == 0;
  const bool svec = Aligned16(wt.scales) && (!GATED || Aligned16(wt.scales_up)) && wt.nb % 8 == 0;
  const unsigned blocks = MmaBlocks<GATED>(n);
  auto launch = [&](auto kernel, int block_warps) {
    return LaunchMmaKernel(kernel, blocks, block_warps, MmaSmem<T, ZP, STAGES>(wt, block_warps), s,
                           static_cast<const T*>(x), wt.wq, static_cast<const T*>(wt.scales), wt.wq_up,
                           static_cast<const T*>(wt.scales_up), wt.zp, wt.zp_up, int(wt.zb), act, static_cast<T*>(y),
                           int(m), int(k), int(n), int(wt.nb), wt.lb, int(wt.row_bytes), xvec, wide, svec);
  };
  warps = MmaWarps(blocks, m, warps);
  if (warps == 16)
    return m > 8 ? launch(Int4Mma<T, 16, GATED, ZP, true, STAGES>, 16)
                 : launch(Int4Mma<T, 16, GATED, ZP, false, STAGES>, 16);
  if (warps == 4)
    return m > 8 ? launch(Int4Mma<T, 4, GATED, ZP, true, STAGES>, 4)
                 : launch(Int4Mma<T, 4, GATED, ZP, false, STAGES>, 4);
  return m > 8 ? launch(Int4Mma<T, 8, GATED, ZP, true, STAGES>, 8) : launch(Int4Mma<T, 8, GATED, ZP, false, STAGES>, 8);
}

// Whether the tensor-core kernel's common form (Int4MmaFast) takes the call.
bool MmaFastOk(const void* x, const Int4Weights& wt, int64_t k) {
  const bool gated = wt.wq_up != nullptr;
  return wt.zp == nullptr && wt.lb >= 5 && k % 128 == 0 && wt.nb % 8 == 0 && Aligned16(x) && Aligned16(wt.wq) &&
         Aligned16(wt.scales) && (!gated || (Aligned16(wt.wq_up) && Aligned16(wt.scales_up)));
}

template <typename T, bool GATED, int STAGES = kMmaStages>
int LaunchMmaFast(const void* x, const Int4Weights& wt, int act, void* y, int64_t m, int64_t k, int64_t n,
                  cudaStream_t s, int warps = 0) {  // warps: as LaunchMma's
  const unsigned blocks = MmaBlocks<GATED>(n);
  auto launch = [&](auto kernel, int block_warps) {
    return LaunchMmaKernel(kernel, blocks, block_warps, MmaSmem<T, false, STAGES>(wt, block_warps), s,
                           static_cast<const T*>(x), wt.wq, static_cast<const T*>(wt.scales), wt.wq_up,
                           static_cast<const T*>(wt.scales_up), act, static_cast<T*>(y), int(m), int(k), int(n),
                           int(wt.nb), wt.lb);
  };
  warps = MmaWarps(blocks, m, warps);
  auto by_block = [&](auto wtag) {
    constexpr int W = decltype(wtag)::value;
    if (wt.lb == 5)
      return m > 8 ? launch(Int4MmaFast<T, W, GATED, true, STAGES, 4>, W)
                   : launch(Int4MmaFast<T, W, GATED, false, STAGES, 4>, W);
    if (wt.lb == 6)
      return m > 8 ? launch(Int4MmaFast<T, W, GATED, true, STAGES, 2>, W)
                   : launch(Int4MmaFast<T, W, GATED, false, STAGES, 2>, W);
    return m > 8 ? launch(Int4MmaFast<T, W, GATED, true, STAGES, 1>, W)
                 : launch(Int4MmaFast<T, W, GATED, false, STAGES, 1>, W);
  };
  if (warps == 16) return by_block(std::integral_constant<int, 16>{});
  if (warps == 4) return by_block(std::integral_constant<int, 4>{});
  return by_block(std::integral_constant<int, 8>{});
}

#ifdef ONNXFUSE_WITH_SM90A
extern "C" int onnxfuse_sm90a_int4_rows_gemm(int dtype, const void* x, const uint8_t* wq, const void* scales, void* y,
                                             float* part, int64_t ldy, int64_t m, int64_t k, int64_t n, int64_t nb,
                                             int64_t row_bytes, int bm, int splits, int per, cudaStream_t s);
#endif

// Int4MmaGemm's launch: bm rows a block (32, 64 or 96) on 4 warps along N, K split `splits` ways (fp32 partials in
// `part`, [splits][m][n], then Int4SplitSum; 1: Y written directly). Symmetric weights, K a multiple of 64, blocks of
// 32 or more (RowsPath). wgmma: the sm_90a form instead (cuda/sm90a/int4_rows_wgmma.cu: blocks of 32, bm 96, 128, 160
// or 192).
constexpr int kGemmBN = 128, kGemmStages = 4;
template <typename T>
int LaunchMmaGemm(const T* x, const Int4Weights& wt, T* y, int64_t ldy, int64_t m, int64_t k, int64_t n, float* part,
                  int bm, int splits, bool wgmma, cudaStream_t s) {
  const int steps = int(k / 64);
  if (steps < 1 || splits < 1 || bm < 1) return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int per = (steps + splits - 1) / splits;
  splits = (steps + per - 1) / per;
  if (splits > 1 && part == nullptr) return ONNXFUSE_ERR_BAD_ARGUMENT;
  auto sum = [&](int err) {
    if (err || splits == 1) return err;
    const int64_t sum_blocks = Blocks(m * n, 256);
    Int4SplitSum<T>
        <<<unsigned(sum_blocks < 1024 ? sum_blocks : 1024), 256, 0, s>>>(part, y, int(ldy), int(m), int(n), splits);
    return int(cudaGetLastError());
  };
  if (wgmma) {
#ifdef ONNXFUSE_WITH_SM90A
    if (wt.lb != 5) return ONNXFUSE_ERR_BAD_ARGUMENT;
    return sum(onnxfuse_sm90a_int4_rows_gemm(std::is_same_v<T, __half> ? ONNXFUSE_FP16 : ONNXFUSE_BF16, x, wt.wq,
                                             wt.scales, y, part, ldy, m, k, n, wt.nb, wt.row_bytes, bm, splits, per,
                                             s));
#else
    return ONNXFUSE_ERR_BAD_ARGUMENT;
#endif
  }
  const dim3 grid(unsigned((n + kGemmBN - 1) / kGemmBN), unsigned((m + bm - 1) / bm), unsigned(splits));
  auto launch = [&](auto kernel, int bmv) {
    const size_t smem = size_t(kGemmStages) * (kGemmBN * 32 + bmv * 128);
    if (smem > 48 * 1024)
      if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)))
        return int(e);
    kernel<<<grid, 128, smem, s>>>(x, wt.wq, static_cast<const T*>(wt.scales), y, part, int(ldy), int(m), int(k),
                                   int(n), int(wt.nb), wt.lb, int(wt.row_bytes), per);
    return int(cudaGetLastError());
  };
  auto by_tile = [&](auto spb, auto split) {
    constexpr int SPB = decltype(spb)::value;
    constexpr bool SPLIT = decltype(split)::value;
    switch (bm) {
      case 32:
        return launch(Int4MmaGemm<T, 32, kGemmBN, 4, kGemmStages, SPB, SPLIT>, 32);
      case 64:
        return launch(Int4MmaGemm<T, 64, kGemmBN, 4, kGemmStages, SPB, SPLIT>, 64);
      case 96:
        return launch(Int4MmaGemm<T, 96, kGemmBN, 4, kGemmStages, SPB, SPLIT>, 96);
      default:
        return int(ONNXFUSE_ERR_BAD_ARGUMENT);
    }
  };
  auto by_split = [&](auto spb) {
    return splits > 1 ? by_tile(spb, std::true_type{}) : by_tile(spb, std::false_type{});
  };
  return sum(wt.lb == 5 ? by_split(std::integral_constant<int, 2>{}) : by_split(std::integral_constant<int, 1>{}));
}

// Up to ONNXFUSE_INT4_GEMV_MAX_M rows, both ops: the GEMV by rows, or the byte-loading kernel for packed weights that
// are not 8-byte aligned (wq_up null: Int4Linear); each with the zero points where wt has them.
int GemvPath(int dtype, int act, const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n,
             cudaStream_t s) {
  if (k > 0x7fffffffLL - 16 || n > 0x7fffffffLL - 16) return ONNXFUSE_ERR_TOO_LARGE;  // the GEMV's 32-bit indices
  const bool gated = wt.wq_up != nullptr, zp = wt.zp != nullptr;
  return ock::ByDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if ((reinterpret_cast<uintptr_t>(wt.wq) & 7u) != 0 ||
        (gated && (reinterpret_cast<uintptr_t>(wt.wq_up) & 7u) != 0)) {
      // rows are whole 8-byte groups (block >= 16): only a misaligned base needs this
      Int4Naive<T><<<unsigned(Blocks(m * n, 256)), 256, 0, s>>>(
          static_cast<const T*>(x), wt.wq, static_cast<const T*>(wt.scales), wt.wq_up,
          static_cast<const T*>(wt.scales_up), wt.zp, wt.zp_up, wt.zb, act, static_cast<T*>(y), m, k, n, wt.nb, wt.lb,
          wt.row_bytes);
      return int(cudaGetLastError());
    }
    // (One column a warp instead of a pair, so that a 7B model's o and down projections, 256 blocks of pairs, fill
    // every resident slot, measured twice as slow on the H100: 127 against 58 us for a layer's projections.)
    auto launch = [&](auto rows) {
      constexpr int MR = decltype(rows)::value;
      if (gated)
        return zp ? LaunchGemv<T, MR, true, true>(x, wt, act, y, m, k, n, s)
                  : LaunchGemv<T, MR, true, false>(x, wt, act, y, m, k, n, s);
      return zp ? LaunchGemv<T, MR, false, true>(x, wt, act, y, m, k, n, s)
                : LaunchGemv<T, MR, false, false>(x, wt, act, y, m, k, n, s);
    };
    static_assert(kMmaMinRows == 3, "the GEMV serves fp16's general form at 1 and 2 rows");
    if (RowGemvOk(dtype, x, wt, m, k, n)) return RowGemv(x, wt, act, y, k, n, s);
    // fp16 and bf16 on the tensor cores where the block's scales fit its shared memory: the common form from one row
    // (where the one-row GEMV does not take the call: fp16 from 2 rows, bf16 from 1), the general form from
    // kMmaMinRows in fp16 and from one row in bf16; else (fp32 too) the GEMV. H200, a Llama-2-7B layer
    // (scripts/int4_decode_probe.cu, benchmarks/results/h200-2026-11-30/int4/decode-probe-2rows.txt,
    // decode-probe-zp.txt): fp16 at 2 rows 48.1 against the GEMV's 60.9 us (46.7 against 59.2 replayed from a CUDA
    // graph), bf16 53.9 against 79.8 at 1 row and 54.4 against 140.4 at 2; fp16 at 1 row the one-row GEMV's 39.8
    // against 47.5. With zero points (the general form): bf16 77.6 against the GEMV's 88.1 at 1 row and 78.1 against
    // 146.4 at 2; fp16 the GEMV's 59.3 against 71.6 at 1 row, 71.5 against 72.1 at 2.
    if constexpr (!std::is_same_v<T, float>) {
      if ((zp ? MmaSmem<T, true>(wt, 16) : MmaSmem<T, false>(wt, 16)) <= kMmaMaxSmem) {
        if (MmaFastOk(x, wt, k))
          return gated ? LaunchMmaFast<T, true>(x, wt, act, y, m, k, n, s)
                       : LaunchMmaFast<T, false>(x, wt, act, y, m, k, n, s);
        if (!std::is_same_v<T, __half> || m >= kMmaMinRows) {  // fp16 below kMmaMinRows: the GEMV below
          if (gated)
            return zp ? LaunchMma<T, true, true>(x, wt, act, y, m, k, n, s)
                      : LaunchMma<T, true, false>(x, wt, act, y, m, k, n, s);
          return zp ? LaunchMma<T, false, true>(x, wt, act, y, m, k, n, s)
                    : LaunchMma<T, false, false>(x, wt, act, y, m, k, n, s);
        }
      }
    }
    if (m == 1) return launch(std::integral_constant<int, 1>{});
    if (m == 2) return launch(std::integral_constant<int, 2>{});
    if (m <= 4) return launch(std::integral_constant<int, 4>{});
    if (m <= 8) return launch(std::integral_constant<int, 8>{});
    return launch(std::integral_constant<int, 16>{});
  });
}

// W^T [n, k] of packed weights (with their zero points, or null) into `w` (the GEMM path's first step).
int Dequantize(int dtype, const uint8_t* wq, const void* scales, const uint8_t* zp, void* w, int64_t k, int64_t n,
               const Int4Weights& wt, cudaStream_t s) {
  return ock::ByDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const dim3 grid(unsigned(((k + 7) / 8 + 255) / 256), unsigned(n < 65535 ? n : 65535));
    const bool vec = (reinterpret_cast<uintptr_t>(wq) & 3u) == 0 && Aligned16(w) && k % 8 == 0;
    auto launch = [&](auto kernel) {
      kernel<<<grid, 256, 0, s>>>(wq, static_cast<const T*>(scales), zp, static_cast<T*>(w), int(k), int(n), int(wt.nb),
                                  wt.lb, int(wt.row_bytes), int(wt.zb));
      return int(cudaGetLastError());
    };
    if (zp != nullptr) return vec ? launch(Int4Dequantize<T, true, true>) : launch(Int4Dequantize<T, true, false>);
    return vec ? launch(Int4Dequantize<T, false, true>) : launch(Int4Dequantize<T, false, false>);
  });
}

// MatMulNBits' accuracy_level at which X may be rounded to int8 ("input A may be quantized to int8").
constexpr int kAccuracyLevelInt8X = 4;

Int4Weights Geometry(const uint8_t* wq, const void* scales, const uint8_t* zp, const uint8_t* wq_up,
                     const void* scales_up, const uint8_t* zp_up, int64_t k, int64_t block, int accuracy_level = 0) {
  Int4Weights wt{wq, scales, zp, wq_up, scales_up, zp_up, 0, 0, 0, 0};
  wt.nb = (k + block - 1) / block;
  wt.row_bytes = wt.nb * block / 2;
  wt.zb = (wt.nb + 1) / 2;
  wt.lb = Log2(block);
  wt.int8_x = accuracy_level == kAccuracyLevelInt8X;
  return wt;
}

// The rows from which the mixed-input GEMM runs: every row count past the GEMV's. Its main loop dequantizes every
// weight once per row tile, so up to 128 rows (one tile) it costs about what it costs at 128, on the tiles
// TileFor picks there (cuda/cutlass/int4_mixed_gemm.cu): a Llama-2-7B layer's five projections in about 200 us from
// 17 to 128 rows on an H200 (block 128; scripts/int4_prefill_gemm_probe.py, benchmarks/results/h200-2026-11-29/int4/
// int4-prefill-gemm-probe-small-rows.json), against 283-296 for the dequantization + cuBLAS GEMM. (With the wide tile
// alone at those rows it lost: 356 against 284 us at 17 rows, 313 against 283 at 64.)
constexpr int64_t kMixedMinRows = ONNXFUSE_INT4_GEMV_MAX_M + 1;

// The sm_90 mixed-input path: whether it runs these sizes on this device (kMixedMinRows rows or more, `aligned`
// pointers, no zero points: CUTLASS computes q * s + z with z = -zp * s rounded, and with the multiply and add fused a
// weight with q == zp comes out as that rounding's residue instead of 0, so Inf in X gave Inf where the reference has
// Inf * 0 = NaN; z = -8 * s is exact, and then q * s + z is (q - 8) * s rounded once, as the reference rounds it),
// and its scratch: s^T and z^T of one weight matrix (Int4SwiGLU's two GEMMs take them in turn), then CUTLASS's
// workspace.
bool MixedPath(int dtype, int64_t m, int64_t k, int64_t n, int64_t block, int aligned, bool zero_points) {
#ifdef ONNXFUSE_WITH_CUTLASS
  return aligned && !zero_points && m >= kMixedMinRows && onnxfuse_cutlass_int4_shape_ok(dtype, m, k, n, block) &&
         onnxfuse_cutlass_int4_ready();
#else
  return false;
#endif
}

int64_t MixedScalesBytes(int dtype, int64_t k, int64_t n, int64_t block) {
  return ock::Align256((k / block) * n * ock::ElemBytes(dtype));
}

int64_t MixedScratch(int dtype, int64_t m, int64_t k, int64_t n, int64_t block) {
#ifdef ONNXFUSE_WITH_CUTLASS
  const int64_t ws = onnxfuse_cutlass_int4_workspace_bytes(dtype, m, k, n, block);
  return 2 * MixedScalesBytes(dtype, k, n, block) + ock::Align256(ws < 0 ? 0 : ws);
#else
  return 0;
#endif
}

// Y [m, ldy] = X @ W^T on the mixed-input path (symmetric weights): the transposed scales and zeros into `scratch`,
// then the GEMM with the rest of it as CUTLASS's workspace.
int MixedGemm(int dtype, const void* x, const uint8_t* wq, const void* scales, void* y, int64_t ldy, int64_t m,
              int64_t k, int64_t n, int64_t block, char* scratch, int64_t scratch_bytes, cudaStream_t s) {
#ifdef ONNXFUSE_WITH_CUTLASS
  const int64_t sb = MixedScalesBytes(dtype, k, n, block);
  if (scratch_bytes < 2 * sb) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (int err = onnxfuse_cutlass_int4_scales_zeros(dtype, scales, scratch, scratch + sb, n, k / block, s)) return err;
  return onnxfuse_cutlass_int4_gemm(dtype, x, wq, scratch, scratch + sb, y, ldy, m, k, n, block, scratch + 2 * sb,
                                    scratch_bytes - 2 * sb, s);
#else
  return ONNXFUSE_ERR_BAD_ARGUMENT;
#endif
}

// Where Int4MmaGemm runs (the rows path, "rows" in what follows): from kMixedMinRows to kRowsMaxRows rows (its sm_90a
// form to kWgmmaMaxRows: WgmmaRows), fp16 and bf16, symmetric weights in blocks of 32 or more, K a multiple of 64,
// `aligned` pointers; where the sm_90 mixed-input GEMM also takes the call (blocks of 64 or more), only to
// kRowsOverMixedRows rows. ONNXFUSE_INT4_ROWS=0 turns it off. H200, a Llama-2-7B layer's five projections on
// RowsPlanFor's tiles, kernels alone (scripts/int4_gemm_rows_probe.cu, us, benchmarks/results/h200-2026-12-01/int4/
// gemm-rows-probe-r2.txt): blocks of 32 at 17 / 32 / 64 / 96 rows 102.6 / 106.8 / 153.9 / 224.0 against the
// dequantization + cuBLAS GEMM's 291.0 / 291.4 / 291.4 / 301.7 (cuBLAS alone on the dequantized weights, the fp16
// model's GEMMs: 125.0 / 125.4 / 124.2 / 137.6); at 128 rows 264.8 against 301.9 and at 160 364.0 against 322.8
// (gemm-rows-probe.txt), so it stops at 128. Blocks of 128: 98.6 / 104.7 / 159.3 at 17 / 32 / 64 rows, where the
// mixed-input GEMM took 222.9 / 206.5 / 194.5 (h200-2026-11-29/int4/int4-probe-block128-tile128-on.json), and 258.4
// at 128, where it took 196.9.
constexpr int64_t kRowsMaxRows = 128, kRowsOverMixedRows = 64,
                  kWgmmaMaxRows = ock::int4_rows::kWgmmaTiles[ock::int4_rows::kWgmmaTileCount - 1].rows;
bool WgmmaRows(int64_t m, int64_t block);

bool RowsPath(int dtype, int64_t m, int64_t k, int64_t n, int64_t block, int aligned, bool zero_points) {
  static const bool off = [] {
    const char* v = std::getenv("ONNXFUSE_INT4_ROWS");
    return v != nullptr && v[0] == '0' && v[1] == '\0';
  }();
  if (off || (dtype != ONNXFUSE_FP16 && dtype != ONNXFUSE_BF16) || !aligned || zero_points || m < kMixedMinRows ||
      m > kWgmmaMaxRows || block < 32 || block > 256 || k < 64 || k % 64 != 0 || k > 0x7fffffffLL || n < 1 ||
      n * (k / block) > 0x7fffffffLL || m * n > 0x7fffffffLL)
    return false;
  if (m > kRowsMaxRows && !WgmmaRows(m, block)) return false;  // past 128 rows the sm_90a form alone
  return m <= kRowsOverMixedRows || !MixedPath(dtype, m, k, n, block, aligned, zero_points);
}

// The rows path's tile and K split: to 96 rows one row tile of the rows rounded up to 32 (32, 64 or 96 rows a block;
// 4 warps along N, each two m16 tiles of columns and all the block's rows), since the kernel's time follows the rows
// it multiplies (a 7B layer 201.9 us at 96 rows on 96-row tiles against 252.4 on two of 64,
// gemm-rows-probe-variants.txt), past 96 two or more of 64 (at 112 and 128 rows 259.0 and 264.8 us, one tile of 128
// 271.0 and 278.9: gemm-rows-probe.txt, -r2.txt); K split so that the grid is about three blocks an SM (the kernel
// holds two to four an SM), the split count one of 1, 2, 3, 4, 6, 8, 12, 16 (5 measured slow: a 7B gate at 64 rows
// 39.2 us against 34.6 at 4) and at least 4 steps of 64 a split. On a 9.0 device with the sm_90a form built, blocks
// of 32 from 65 rows take that form instead (WgmmaRows), to kWgmmaMaxRows (192) rows where it beats the dequantization
// + cuBLAS GEMM that runs past Int4MmaGemm's 128: one row tile of 96, 128, 160 or 192 rows (sm90a/int4_rows_tiles.h),
// the split the largest (to 8) whose grid stays within one wave: two blocks an SM on 96- to 160-row tiles, one on 192
// (a 7B layer's best splits on 96-row tiles: qkv's 96 column tiles 2-4, gate's 86 3, o's and down's 32 8, where a grid
// past the wave measured up to 1.3x slower: gemm-rows-probe-wgmma.txt). The 7B layer on this plan
// (gemm-rows-probe-wgmma-rows.txt, -tile160-rule.txt, us): 180.6 / 191.0 / 231.9 / 263.6 at 96 / 128 / 160 / 192 rows
// against the dequantization + cuBLAS GEMM's 299.8 / 302.6 / 323.9 / 338.9.
struct RowsPlan {
  int bm, splits;
  bool wgmma;
};

// Whether the current device (a 9.0 one: the cached arch of onnxfuse_cuda_current_arch) runs m rows in blocks of
// `block` on the sm_90a form.
bool WgmmaRows(int64_t m, int64_t block) {
#ifdef ONNXFUSE_WITH_SM90A
  int device = 0;
  return m > 64 && m <= kWgmmaMaxRows && block == 32 && onnxfuse_cuda_current_arch(&device) == 90;
#else
  (void)m, (void)block;
  return false;
#endif
}

RowsPlan RowsPlanFor(int64_t m, int64_t k, int64_t n, int64_t block) {
  int device = 0;
  if (onnxfuse_cuda_current_arch(&device) < 0) device = 0;
  const int64_t sms0 = onnxfuse_cuda_sm_count(device), sms = sms0 > 0 ? sms0 : 132;
  const int64_t most = std::max<int64_t>(1, k / 256);
  const int64_t col_tiles = (n + kGemmBN - 1) / kGemmBN;
  if (WgmmaRows(m, block)) {
    const ock::int4_rows::WgmmaTile& tile = ock::int4_rows::kWgmmaTiles[ock::int4_rows::WgmmaTileFor(m)];
    const int64_t slots = int64_t(tile.per_sm) * sms;
    int64_t splits = 1;
    for (int64_t c : {2, 3, 4, 6, 8})
      if (c <= most && col_tiles * c <= slots) splits = c;
    return {tile.rows, int(splits), true};
  }
  const int64_t bm = m <= 96 ? (m + 31) / 32 * 32 : 64;
  const int64_t tiles = col_tiles * ((m + bm - 1) / bm);
  const double ideal = 3.0 * double(sms) / double(tiles);
  int64_t splits = 1;
  for (int64_t c : {1, 2, 3, 4, 6, 8, 12, 16})
    if (c <= most && std::abs(double(c) - ideal) < std::abs(double(splits) - ideal)) splits = c;
  return {int(bm), int(splits), false};
}

// The partials of a plan's K split.
int64_t PlanScratch(const RowsPlan& p, int64_t m, int64_t n) {
  return p.splits > 1 ? ock::Align256(int64_t(p.splits) * m * n * 4) : 0;
}
int64_t RowsScratch(int64_t m, int64_t k, int64_t n, int64_t block) {
  return PlanScratch(RowsPlanFor(m, k, n, block), m, n);
}

// Y [m, ldy] = X @ W^T on the rows path, its K split's partials in `scratch`.
int RowsGemm(int dtype, const void* x, const Int4Weights& wt, void* y, int64_t ldy, int64_t m, int64_t k, int64_t n,
             void* scratch, int64_t scratch_bytes, cudaStream_t s) {
  const int64_t block = int64_t(1) << wt.lb;
  const RowsPlan p = RowsPlanFor(m, k, n, block);
  if (p.splits > 1 && (scratch == nullptr || scratch_bytes < PlanScratch(p, m, n))) return ONNXFUSE_ERR_BAD_ARGUMENT;
  float* part = static_cast<float*>(scratch);
  if (dtype == ONNXFUSE_FP16)
    return LaunchMmaGemm<__half>(static_cast<const __half*>(x), wt, static_cast<__half*>(y), ldy, m, k, n, part, p.bm,
                                 p.splits, p.wgmma, s);
  return LaunchMmaGemm<__nv_bfloat16>(static_cast<const __nv_bfloat16*>(x), wt, static_cast<__nv_bfloat16*>(y), ldy, m,
                                      k, n, part, p.bm, p.splits, p.wgmma, s);
}

}  // namespace

extern "C" int onnxfuse_cuda_int4_mixed_path(int dtype, int64_t m, int64_t k, int64_t n, int64_t block, int aligned,
                                             int zero_points) {
  return RowsPath(dtype, m, k, n, block, aligned, zero_points != 0) ||
         MixedPath(dtype, m, k, n, block, aligned, zero_points != 0);
}

extern "C" int64_t onnxfuse_cuda_int4_linear_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t block,
                                                           int aligned, int zero_points) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || k < 0 || n < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m <= ONNXFUSE_INT4_GEMV_MAX_M) return 0;
  if (RowsPath(dtype, m, k, n, block, aligned, zero_points != 0)) return RowsScratch(m, k, n, block);
  if (MixedPath(dtype, m, k, n, block, aligned, zero_points != 0)) return MixedScratch(dtype, m, k, n, block);
  return ock::Align256(k * n * ock::ElemBytes(dtype)) + ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
}

extern "C" int onnxfuse_cuda_int4_linear(int dtype, const void* x, const uint8_t* wq, const void* scales,
                                         const uint8_t* zero_points, void* y, int64_t m, int64_t k, int64_t n,
                                         int64_t block, int accuracy_level, void* scratch, int64_t scratch_bytes,
                                         void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || !Int4BlockOk(block)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || n == 0) return 0;
  if (wq == nullptr || scales == nullptr) return ONNXFUSE_ERR_BAD_ARGUMENT;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Int4Weights wt = Geometry(wq, scales, zero_points, nullptr, nullptr, nullptr, k, block, accuracy_level);
  if (k == 0) return int(cudaMemsetAsync(y, 0, size_t(m * n * ock::ElemBytes(dtype)), s));
  if (m <= ONNXFUSE_INT4_GEMV_MAX_M) return GemvPath(dtype, 0, x, wt, y, m, k, n, s);
  const int aligned = Aligned16(x) && Aligned16(wq) && Aligned16(scales) && Aligned16(y) &&
                      (zero_points == nullptr || Aligned16(zero_points));
  if (RowsPath(dtype, m, k, n, block, aligned, zero_points != nullptr))
    return RowsGemm(dtype, x, wt, y, n, m, k, n, scratch, scratch_bytes, s);
  if (MixedPath(dtype, m, k, n, block, aligned, zero_points != nullptr))
    return MixedGemm(dtype, x, wq, scales, y, n, m, k, n, block, static_cast<char*>(scratch), scratch_bytes, s);
  if (k > 0x7fffffffLL - 16 || n > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;  // the dequantization's indices
  const int64_t w_bytes = ock::Align256(k * n * ock::ElemBytes(dtype));
  if (scratch == nullptr || scratch_bytes < w_bytes) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (int err = Dequantize(dtype, wq, scales, zero_points, scratch, k, n, wt, s)) return err;
  ock::GemmArgs g;
  g.dtype = dtype, g.x = x, g.w = scratch, g.y = y, g.m = m, g.k = k, g.n = n;
  g.trans_w = true;
  return ock::Gemm(g, static_cast<char*>(scratch) + w_bytes, scratch_bytes - w_bytes, s);
}

// Scratch past the GEMV's rows: z [m, 2n], then either the mixed-input path's (s^T and z^T, CUTLASS's workspace) or
// [W_gate; W_up]^T [2n, k] and the cuBLASLt workspace.
extern "C" int64_t onnxfuse_cuda_int4_swiglu_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t block,
                                                           int aligned, int zero_points) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || k < 0 || n < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m <= ONNXFUSE_INT4_GEMV_MAX_M) return 0;
  const int64_t z = ock::Align256(2 * m * n * ock::ElemBytes(dtype));
  if (RowsPath(dtype, m, k, n, block, aligned, zero_points != 0)) return z + RowsScratch(m, k, n, block);
  if (MixedPath(dtype, m, k, n, block, aligned, zero_points != 0)) return z + MixedScratch(dtype, m, k, n, block);
  return z + ock::Align256(2 * k * n * ock::ElemBytes(dtype)) + ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
}

extern "C" int onnxfuse_cuda_int4_swiglu(int dtype, int act, const void* x, const uint8_t* wq_gate,
                                         const void* scales_gate, const uint8_t* zp_gate, const uint8_t* wq_up,
                                         const void* scales_up, const uint8_t* zp_up, void* y, int64_t m, int64_t k,
                                         int64_t n, int64_t block, int accuracy_level, void* scratch,
                                         int64_t scratch_bytes, void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || !Int4BlockOk(block) || !onnxfuse::ValidGateActivation(act))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || n == 0) return 0;
  if (wq_gate == nullptr || scales_gate == nullptr || wq_up == nullptr || scales_up == nullptr ||
      (zp_gate == nullptr) != (zp_up == nullptr))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const Int4Weights wt = Geometry(wq_gate, scales_gate, zp_gate, wq_up, scales_up, zp_up, k, block, accuracy_level);
  if (k == 0) return int(cudaMemsetAsync(y, 0, size_t(m * n * ock::ElemBytes(dtype)), s));  // act(0) * 0
  if (m <= ONNXFUSE_INT4_GEMV_MAX_M) return GemvPath(dtype, act, x, wt, y, m, k, n, s);
  if (k > 0x7fffffffLL - 16 || 2 * n > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  const int aligned = Aligned16(x) && Aligned16(wq_gate) && Aligned16(scales_gate) && Aligned16(wq_up) &&
                      Aligned16(scales_up) && Aligned16(y) &&
                      (zp_gate == nullptr || (Aligned16(zp_gate) && Aligned16(zp_up)));
  const int64_t e = ock::ElemBytes(dtype), z_bytes = ock::Align256(2 * m * n * e);
  const bool zp = zp_gate != nullptr;
  if (scratch == nullptr || scratch_bytes < onnxfuse_cuda_int4_swiglu_scratch_bytes(dtype, m, k, n, block, aligned, zp))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  char* z = static_cast<char*>(scratch);
  char* rest = z + z_bytes;
  const int64_t rest_bytes = scratch_bytes - z_bytes;
  if (RowsPath(dtype, m, k, n, block, aligned, zp)) {
    // gate into z's first n columns, up into the last n (rows 2n apart), each on the rows path
    Int4Weights up = wt;
    up.wq = wq_up, up.scales = scales_up;
    if (int err = RowsGemm(dtype, x, wt, z, 2 * n, m, k, n, rest, rest_bytes, s)) return err;
    if (int err = RowsGemm(dtype, x, up, z + n * e, 2 * n, m, k, n, rest, rest_bytes, s)) return err;
  } else if (MixedPath(dtype, m, k, n, block, aligned, zp)) {
    // gate into z's first n columns, up into the last n (rows 2n apart), each with its own transposed scales
    if (int err = MixedGemm(dtype, x, wq_gate, scales_gate, z, 2 * n, m, k, n, block, rest, rest_bytes, s)) return err;
    if (int err = MixedGemm(dtype, x, wq_up, scales_up, z + n * e, 2 * n, m, k, n, block, rest, rest_bytes, s))
      return err;
  } else {
    const int64_t w_bytes = ock::Align256(2 * k * n * e);
    char* w = rest;
    if (int err = Dequantize(dtype, wq_gate, scales_gate, zp_gate, w, k, n, wt, s)) return err;
    if (int err = Dequantize(dtype, wq_up, scales_up, zp_up, w + k * n * e, k, n, wt, s)) return err;
    ock::GemmArgs g;
    g.dtype = dtype, g.x = x, g.w = w, g.y = z, g.m = m, g.k = k, g.n = 2 * n;
    g.trans_w = true;
    if (int err = ock::Gemm(g, w + w_bytes, ONNXFUSE_CUBLASLT_WORKSPACE_BYTES, s)) return err;
  }
  return ock::ByDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const bool vec = n % kVec == 0 && Aligned16(z) && Aligned16(y);
    const int64_t per_row = vec ? n / kVec : n;
    const dim3 grid(unsigned(Blocks(per_row, 256)), unsigned(m < 65535 ? m : 65535));
    if (vec)
      GateHalves<T, kVec><<<grid, 256, 0, s>>>(reinterpret_cast<const T*>(z), static_cast<T*>(y), m, n, act);
    else
      GateHalves<T, 1><<<grid, 256, 0, s>>>(reinterpret_cast<const T*>(z), static_cast<T*>(y), m, n, act);
    return int(cudaGetLastError());
  });
}

extern "C" int onnxfuse_cuda_int4_skip_norm_rows(int dtype, const void* x, const void* skip, const void* gamma,
                                                 float eps, void* sum, void* xn, int64_t m, int64_t k, void* stream) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || k < 0 || m > 0x7fffffffLL)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || k == 0) return 0;
  if (x == nullptr || skip == nullptr || gamma == nullptr || sum == nullptr || xn == nullptr)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  return ock::ByDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int64_t kPer = 16 / int64_t(sizeof(T));
    const int64_t vectors = (k / kPer + kWarps * 32 - 1) / (kWarps * 32);  // a thread's
    const bool vec = k % kPer == 0 && Aligned16(x) && Aligned16(skip) && Aligned16(gamma) && Aligned16(sum) &&
                     Aligned16(xn) && vectors <= 4;
    auto launch = [&](auto kernel) {
      return ock::LaunchDependent(kernel, dim3(unsigned(m)), dim3(kWarps * 32), 0, static_cast<cudaStream_t>(stream),
                                  static_cast<const T*>(x), static_cast<const T*>(skip), static_cast<const T*>(gamma),
                                  static_cast<T*>(sum), static_cast<T*>(xn), k, eps);
    };
    if (!vec) return launch(Int4SkipNormRows<T>);
    if (vectors == 1) return launch(Int4SkipNormRowsVec<T, 1>);
    if (vectors == 2) return launch(Int4SkipNormRowsVec<T, 2>);
    return launch(Int4SkipNormRowsVec<T, 4>);
  });
}

// The norm ops' scratch: Xn [m, k], then the projection's.
extern "C" int64_t onnxfuse_cuda_skip_norm_int4_scratch_bytes(int dtype, int gated, int64_t m, int64_t k, int64_t n,
                                                              int64_t block, int aligned, int zero_points) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || k < 0 || n < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int64_t rest = gated ? onnxfuse_cuda_int4_swiglu_scratch_bytes(dtype, m, k, n, block, aligned, zero_points)
                             : onnxfuse_cuda_int4_linear_scratch_bytes(dtype, m, k, n, block, aligned, zero_points);
  return rest < 0 ? rest : ock::Align256(m * k * ock::ElemBytes(dtype)) + rest;
}

// The norm kernel into Xn (scratch), then Int4Linear's or Int4SwiGLU's launcher on it with the rest of the scratch.
// (One kernel at one and two rows, every block of the GEMV computing the row's norm while it staged X, measured
// slower in genai's int4 7B model in each of three forms: the block's extra round trips and barriers before its main
// loop cost more than the launch they save; benchmarks/results/h200-2026-11-30/int4/genai-int4-skipnorm-*-not-kept.*.
// The norm in Int4RowGemv (every block loading X, skip and gamma for its lanes' units, one block reduction, block 0
// writing sum): the 7B layer with its two norms 42.5 against 41.9 us in a CUDA graph, every block reading three times
// X's bytes from L2; with X and the norm staged once a block of four GEMV groups, 44.0, the groups themselves costing
// more than the fold saves: row-gemv-probe-{norm-folded,groups}-not-kept.txt.)
extern "C" int onnxfuse_cuda_skip_norm_int4(int dtype, int act, const void* x, const void* skip, const void* gamma,
                                            float eps, const uint8_t* wq, const void* scales, const uint8_t* zp,
                                            const uint8_t* wq_up, const void* scales_up, const uint8_t* zp_up, void* y,
                                            void* sum, int64_t m, int64_t k, int64_t n, int64_t block,
                                            int accuracy_level, void* scratch, int64_t scratch_bytes, void* stream) {
  const bool gated = wq_up != nullptr;
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || !Int4BlockOk(block) || skip == nullptr || gamma == nullptr ||
      sum == nullptr || (gated && !onnxfuse::ValidGateActivation(act)))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0) return 0;
  const int64_t xn_bytes = ock::Align256(m * k * ock::ElemBytes(dtype));
  if (xn_bytes > 0 && (scratch == nullptr || scratch_bytes < xn_bytes)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (int err = onnxfuse_cuda_int4_skip_norm_rows(dtype, x, skip, gamma, eps, sum, scratch, m, k, stream)) return err;
  if (n == 0) return 0;
  char* rest = static_cast<char*>(scratch) + xn_bytes;
  const int64_t rest_bytes = scratch_bytes - xn_bytes;
  if (gated)
    return onnxfuse_cuda_int4_swiglu(dtype, act, scratch, wq, scales, zp, wq_up, scales_up, zp_up, y, m, k, n, block,
                                     accuracy_level, rest_bytes > 0 ? rest : nullptr, rest_bytes, stream);
  return onnxfuse_cuda_int4_linear(dtype, scratch, wq, scales, zp, y, m, k, n, block, accuracy_level,
                                   rest_bytes > 0 ? rest : nullptr, rest_bytes, stream);
}

#else  // the host half: the CUDA EP glue and the Triton launcher
// Int4Linear on the CUDA EP: the kernel struct calling the nvcc half's launcher or the Triton one (at the end of
// this file) through Dispatch (cuda/ops_cuda.h), and its registration. backend=auto follows triton/table.py's
// AUTO_CUDA rules for the int4_linear kernel, and runs the CUDA backend for every M with zero points (the Triton
// build with them measured 1.2-1.5x slower at 16 rows on an H100: int4-probe-zp.json) and wherever the CUDA backend
// runs the sm_90 mixed-input GEMM (onnxfuse_cuda_int4_mixed_path).
#include <optional>

#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

// The node's accuracy_level (MatMulNBits', carried by the rule; absent: 0).
int ReadAccuracyLevel(const OrtApi* api, const OrtKernelInfo* info) {
  return int(ReadIntAttr(api, info, schema::attr::kAccuracyLevel, schema::attr::kAccuracyLevelDefault));
}

// A pointer's 16-byte alignment (the scratch functions' `aligned` argument; null counts as aligned).
bool Int4Aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Whether backend=auto runs an int4 op's CUDA backend (gated: Int4SwiGLU's table row, else Int4Linear's): the table's
// rule, zero points (the Triton build with them measured slower), or the sm_90 mixed-input GEMM taking these sizes.
bool Int4PrefersCuda(bool gated, int dt, const LinearDims& d, int aligned, bool zero_points) {
  return (gated ? AutoPrefersCuda(triton::kInt4Swiglu, d.M, d.K)
                : AutoPrefersCuda(triton::kInt4Linear, d.M, d.K, d.N)) ||
         zero_points || onnxfuse_cuda_int4_mixed_path(dt, d.M, d.K, d.N, d.r, aligned, 0);
}

template <typename T>
struct Int4LinearCuda {
  using Op = schema::Int4Linear;
  static constexpr const char* kName = Op::kName;
  Int4LinearCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)), accuracy(ReadAccuracyLevel(api, info)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<uint8_t>& Wq,
                      const Ort::Custom::Tensor<T>& Scales, std::optional<const Ort::Custom::Tensor<uint8_t>*> Zp,
                      Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = Int4LinearDims(kName, X.Shape(), Wq.Shape(), Scales.Shape());
      const uint8_t* zp = Int4ZeroPoints(kName, "zero_points", Zp, Wq.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *scales = Scales.Data();
      const uint8_t* wq = Wq.Data();
      const int aligned = Int4Aligned(x) && Int4Aligned(wq) && Int4Aligned(scales) && Int4Aligned(y) &&
                          (zp == nullptr || Int4Aligned(zp));
      Dispatch(
          kName, attrs,
          [&] {
            const int64_t need =
                onnxfuse_cuda_int4_linear_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N, d.r, aligned, zp != nullptr);
            return WithScratch(ctx, Op::kX, need, [&](void* sp, int64_t bytes) {
              return onnxfuse_cuda_int4_linear(DtypeCode<T>(), x, wq, scales, zp, y, d.M, d.K, d.N, d.r, accuracy, sp,
                                               bytes, stream);
            });
          },
          [&] { return onnxfuse_triton_int4_linear(DtypeCode<T>(), x, wq, scales, zp, y, d.M, d.K, d.N, d.r, stream); },
          Int4PrefersCuda(false, DtypeCode<T>(), d, aligned, zp != nullptr));
    });
  }
  OpAttrs attrs;
  int accuracy;  // the node's accuracy_level
};

template <typename T>
struct Int4SwiGLUCuda {
  using Op = schema::Int4SwiGLU;
  static constexpr const char* kName = Op::kName;
  Int4SwiGLUCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)),
        act(ReadGateActivation(api, info, kName)),
        accuracy(ReadAccuracyLevel(api, info)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<uint8_t>& Wg,
                      const Ort::Custom::Tensor<T>& Sg, const Ort::Custom::Tensor<uint8_t>& Wu,
                      const Ort::Custom::Tensor<T>& Su, std::optional<const Ort::Custom::Tensor<uint8_t>*> Zg,
                      std::optional<const Ort::Custom::Tensor<uint8_t>*> Zu, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = Int4SwiGLUDims(kName, X.Shape(), Wg.Shape(), Sg.Shape(), Wu.Shape(), Su.Shape());
      const auto zp = Int4ZeroPointPair(kName, Zg, Zu, Wg.Shape(), Wu.Shape());
      const uint8_t *zg = zp.first, *zu = zp.second;  // (named: the lambdas below take them)
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *sg = Sg.Data(), *su = Su.Data();
      const uint8_t *wg = Wg.Data(), *wu = Wu.Data();
      const int aligned = Int4Aligned(x) && Int4Aligned(wg) && Int4Aligned(sg) && Int4Aligned(wu) && Int4Aligned(su) &&
                          Int4Aligned(y) && (zg == nullptr || (Int4Aligned(zg) && Int4Aligned(zu)));
      Dispatch(
          kName, attrs,
          [&] {
            const int64_t need =
                onnxfuse_cuda_int4_swiglu_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N, d.r, aligned, zg != nullptr);
            return WithScratch(ctx, Op::kX, need, [&](void* sp, int64_t bytes) {
              return onnxfuse_cuda_int4_swiglu(DtypeCode<T>(), act, x, wg, sg, zg, wu, su, zu, y, d.M, d.K, d.N, d.r,
                                               accuracy, sp, bytes, stream);
            });
          },
          [&] {
            return onnxfuse_triton_int4_swiglu(DtypeCode<T>(), act, x, wg, sg, zg, wu, su, zu, y, d.M, d.K, d.N, d.r,
                                               stream);
          },
          Int4PrefersCuda(true, DtypeCode<T>(), d, aligned, zg != nullptr));
    });
  }
  OpAttrs attrs;
  int act;       // onnxfuse_gate_act of the node's activation attribute
  int accuracy;  // the node's accuracy_level
};

// The norm ops: the CUDA backend runs the norm kernel, then the projection's CUDA path on Xn; triton the norm kernel,
// then the projection's Triton kernel on Xn; auto picks as the projection's own op does.
template <typename T, bool GATED>
Ort::Status SkipNormInt4Compute(OrtKernelContext* ctx, const char* name, const OpAttrs& attrs, int act, float eps,
                                int accuracy, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Skip,
                                const Ort::Custom::Tensor<T>& Gamma, const Ort::Custom::Tensor<uint8_t>& Wq,
                                const Ort::Custom::Tensor<T>& Scales, const Ort::Custom::Tensor<uint8_t>* Wu,
                                const Ort::Custom::Tensor<T>* Su, std::optional<const Ort::Custom::Tensor<uint8_t>*> Zg,
                                std::optional<const Ort::Custom::Tensor<uint8_t>*> Zu, Ort::Custom::Tensor<T>& Y,
                                Ort::Custom::Tensor<T>& Sum) {
  return GuardCompute([&] {
    Int4SkipNormCheck(name, X.Shape(), Skip.Shape(), Gamma.Shape());
    const LinearDims d = GATED ? Int4SwiGLUDims(name, X.Shape(), Wq.Shape(), Scales.Shape(), Wu->Shape(), Su->Shape())
                               : Int4LinearDims(name, X.Shape(), Wq.Shape(), Scales.Shape());
    const auto zp =
        GATED ? Int4ZeroPointPair(name, Zg, Zu, Wq.Shape(), Wu->Shape())
              : std::pair<const uint8_t*, const uint8_t*>(Int4ZeroPoints(name, "zero_points", Zg, Wq.Shape()), nullptr);
    const uint8_t *zg = zp.first, *zu = zp.second;  // (named: the lambdas below take them)
    T* y = Y.Allocate(d.out_shape);
    T* sum = Sum.Allocate(X.Shape());
    if (d.M == 0) return;
    void* stream = StreamOf(ctx);
    const void *x = X.Data(), *skip = Skip.Data(), *gamma = Gamma.Data(), *scales = Scales.Data();
    const uint8_t* wq = Wq.Data();
    const uint8_t* wu = GATED ? Wu->Data() : nullptr;
    const void* su = GATED ? static_cast<const void*>(Su->Data()) : nullptr;
    const int dt = DtypeCode<T>();
    const int64_t xn_bytes = (d.M * d.K * int64_t(sizeof(T)) + 255) / 256 * 256;
    // the projection's pointers (its X is Xn in scratch: aligned)
    const int aligned = Int4Aligned(wq) && Int4Aligned(scales) && Int4Aligned(y) &&
                        (!GATED || (Int4Aligned(wu) && Int4Aligned(su))) &&
                        (zg == nullptr || (Int4Aligned(zg) && (!GATED || Int4Aligned(zu))));
    Dispatch(
        name, attrs,
        [&] {
          const int64_t need =
              onnxfuse_cuda_skip_norm_int4_scratch_bytes(dt, GATED, d.M, d.K, d.N, d.r, aligned, zg != nullptr);
          return WithScratch(ctx, 0, need, [&](void* sp, int64_t bytes) {
            return onnxfuse_cuda_skip_norm_int4(dt, act, x, skip, gamma, eps, wq, scales, zg, wu, su, zu, y, sum, d.M,
                                                d.K, d.N, d.r, accuracy, sp, bytes, stream);
          });
        },
        [&] {
          return WithScratch(ctx, 0, xn_bytes, [&](void* xn, int64_t) {
            const int e = onnxfuse_cuda_int4_skip_norm_rows(dt, x, skip, gamma, eps, sum, xn, d.M, d.K, stream);
            if (e != 0 || d.N == 0) return e;
            return GATED ? onnxfuse_triton_int4_swiglu(dt, act, xn, wq, scales, zg, wu, su, zu, y, d.M, d.K, d.N, d.r,
                                                       stream)
                         : onnxfuse_triton_int4_linear(dt, xn, wq, scales, zg, y, d.M, d.K, d.N, d.r, stream);
          });
        },
        Int4PrefersCuda(GATED, dt, d, aligned, zg != nullptr));  // as the projection's own op picks, on Xn
  });
}

template <typename T>
struct SkipRMSNormInt4LinearCuda {
  using Op = schema::SkipRMSNormInt4Linear;
  static constexpr const char* kName = Op::kName;
  SkipRMSNormInt4LinearCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)),
        eps(ReadEpsilon(api, info, kName)),
        accuracy(ReadAccuracyLevel(api, info)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Skip,
                      const Ort::Custom::Tensor<T>& Gamma, const Ort::Custom::Tensor<uint8_t>& Wq,
                      const Ort::Custom::Tensor<T>& Scales, std::optional<const Ort::Custom::Tensor<uint8_t>*> Zp,
                      Ort::Custom::Tensor<T>& Y, Ort::Custom::Tensor<T>& Sum) {
    return SkipNormInt4Compute<T, false>(ctx, kName, attrs, 0, eps, accuracy, X, Skip, Gamma, Wq, Scales, nullptr,
                                         nullptr, Zp, std::nullopt, Y, Sum);
  }
  OpAttrs attrs;
  float eps;
  int accuracy;
};

template <typename T>
struct SkipRMSNormInt4SwiGLUCuda {
  using Op = schema::SkipRMSNormInt4SwiGLU;
  static constexpr const char* kName = Op::kName;
  SkipRMSNormInt4SwiGLUCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)),
        act(ReadGateActivation(api, info, kName)),
        eps(ReadEpsilon(api, info, kName)),
        accuracy(ReadAccuracyLevel(api, info)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Skip,
                      const Ort::Custom::Tensor<T>& Gamma, const Ort::Custom::Tensor<uint8_t>& Wg,
                      const Ort::Custom::Tensor<T>& Sg, const Ort::Custom::Tensor<uint8_t>& Wu,
                      const Ort::Custom::Tensor<T>& Su, std::optional<const Ort::Custom::Tensor<uint8_t>*> Zg,
                      std::optional<const Ort::Custom::Tensor<uint8_t>*> Zu, Ort::Custom::Tensor<T>& Y,
                      Ort::Custom::Tensor<T>& Sum) {
    return SkipNormInt4Compute<T, true>(ctx, kName, attrs, act, eps, accuracy, X, Skip, Gamma, Wg, Sg, &Wu, &Su, Zg, Zu,
                                        Y, Sum);
  }
  OpAttrs attrs;
  int act;
  float eps;
  int accuracy;
};

}  // namespace

void RegisterInt4LinearCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<Int4LinearCuda>(domain, schema::Int4Linear::kName, kCudaEp);
  AddOpAllTypes<Int4SwiGLUCuda>(domain, schema::Int4SwiGLU::kName, kCudaEp);
  AddOpAllTypes<SkipRMSNormInt4LinearCuda>(domain, schema::SkipRMSNormInt4Linear::kName, kCudaEp);
  AddOpAllTypes<SkipRMSNormInt4SwiGLUCuda>(domain, schema::SkipRMSNormInt4SwiGLU::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launchers of Int4Linear and Int4SwiGLU (triton/int4_linear.py).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

namespace {
// What both Triton launchers check and pass: the shapes in the kernels' 32-bit offsets, n_blocks and a packed row's
// bytes, and whether the aligned build serves (`aligned` the pointers' own 16-byte alignment).
struct Int4Geometry {
  int error = 0;       // an ONNXFUSE_ERR_* code, or 0
  bool empty = false;  // nothing to compute
  int32_t M = 0, N = 0, K = 0, RB = 0, NB = 0, BS = 0;
  bool aligned = false;
};

Int4Geometry Int4Args(int dtype, int64_t m, int64_t k, int64_t n, int64_t block, bool aligned) {
  Int4Geometry g;
  if (BadCommon(dtype, m, k, n) || !Int4BlockOk(block)) {
    g.error = ONNXFUSE_ERR_BAD_ARGUMENT;
    return g;
  }
  if (TooLarge(m, k, n)) {
    g.error = ONNXFUSE_ERR_TOO_LARGE;
    return g;
  }
  g.empty = m == 0 || n == 0;
  const int64_t nb = (k + block - 1) / block, row_bytes = nb * block / 2;
  if (!g.empty && row_bytes * n > 0x7fffffffLL) {
    g.error = ONNXFUSE_ERR_TOO_LARGE;
    return g;
  }
  g.M = int32_t(m), g.N = int32_t(n), g.K = int32_t(k), g.RB = int32_t(row_bytes), g.NB = int32_t(nb);
  g.BS = int32_t(block);
  g.aligned = aligned && k % 16 == 0 && n % 16 == 0 && row_bytes % 16 == 0;
  return g;
}
}  // namespace

// The zero points select the build (Launch's r_pad slot: 1 with zero points, compiled with the ZP constexpr; 0
// without, whose kernels never read the pointer).
extern "C" int onnxfuse_triton_int4_linear(int dtype, const void* x, const uint8_t* wq, const void* scales,
                                           const uint8_t* zero_points, void* y, int64_t m, int64_t k, int64_t n,
                                           int64_t block, void* stream) {
  Int4Geometry g = Int4Args(dtype, m, k, n, block,
                            Aligned16(x) && Aligned16(wq) && Aligned16(scales) && Aligned16(y) &&
                                (zero_points == nullptr || Aligned16(zero_points)));
  if (g.error || g.empty) return g.error;
  const int zp_build = zero_points != nullptr;
  const uint8_t* zp = zp_build ? zero_points : wq;  // any valid pointer: the build without ZP never reads it
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &wq, &scales, &zp, &y, &g.M, &g.N, &g.K, &g.RB, &g.NB, &g.BS, &scratch_global, &scratch_profile};
  return Launch(ids::kInt4Linear, dtype, m, n, g.aligned, zp_build, args, stream);
}

extern "C" int onnxfuse_triton_int4_swiglu(int dtype, int act, const void* x, const uint8_t* wq_gate,
                                           const void* scales_gate, const uint8_t* zp_gate, const uint8_t* wq_up,
                                           const void* scales_up, const uint8_t* zp_up, void* y, int64_t m, int64_t k,
                                           int64_t n, int64_t block, void* stream) {
  if (act < 0 || act >= ONNXFUSE_NUM_GATE_ACTIVATIONS) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if ((zp_gate == nullptr) != (zp_up == nullptr)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  Int4Geometry g = Int4Args(dtype, m, k, n, block,
                            Aligned16(x) && Aligned16(wq_gate) && Aligned16(scales_gate) && Aligned16(wq_up) &&
                                Aligned16(scales_up) && Aligned16(y) &&
                                (zp_gate == nullptr || (Aligned16(zp_gate) && Aligned16(zp_up))));
  if (g.error || g.empty) return g.error;
  int32_t ACT = act;
  const int zp_build = zp_gate != nullptr;
  const uint8_t* zg = zp_build ? zp_gate : wq_gate;  // any valid pointer: the build without ZP never reads it
  const uint8_t* zu = zp_build ? zp_up : wq_up;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x,    &wq_gate, &scales_gate, &zg,  &wq_up,          &scales_up,      &zu, &y, &g.M, &g.N, &g.K,
                  &g.RB, &g.NB,    &g.BS,        &ACT, &scratch_global, &scratch_profile};
  return Launch(ids::kInt4Swiglu, dtype, m, n, g.aligned, zp_build, args, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
