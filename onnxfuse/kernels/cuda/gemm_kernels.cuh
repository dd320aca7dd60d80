// Hand-written CUDA GEMM kernels with fused epilogues, shared by linear_act.cu, swiglu.cu and lora_linear.cu.
//
// Two kernel families:
//  * SmallMKernel — the decode path (M <= 16) for every dtype, and the fp32 path for any M (fp32 is kept exact
//    here: no TF32). One block owns BN output columns and all (up to 16) rows of its row block; its 256 threads
//    split K, each lane streaming 16-byte vectors of weight rows, so the weights are read from memory exactly once
//    at M <= 16; partial sums are reduced with warp shuffles and once through shared memory.
//  * TensorCoreKernel — fp16/bf16 with M > 16: a 128 x 128 (64 for SwiGLU's two weights) x 32 tile on mma.sync
//    tensor cores (nvcuda::wmma, HMMA in SASS), cp.async double buffering when pointers and K, N allow 16-byte
//    copies, plain bounded loads otherwise. The epilogue (bias, relu / sigmoid, act(gate) * up, the LoRA term) runs
//    on the fp32 accumulators before the one store of Y.
// LoRA needs no scratch memory: each block computes its rows of T = X @ A in the same K loop (the X tile is shared),
// then adds (scale * T) @ B for its columns. Both families index with 64-bit offsets.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "common/gate_act.h"
#include "launch.h"

namespace onnxfuse::cuda_kernels {

enum Epilogue { kEpiAct = 1, kEpiSwiglu = 2, kEpiLora = 3 };

template <typename T>
struct GemmParams {
  const T* x;
  const T* w0;    // W, or W_gate for SwiGLU
  const T* w1;    // W_up (SwiGLU only)
  const T* la;    // LoRA A [K, R]
  const T* lb;    // LoRA B [R, N]
  const T* bias;  // [N] (not used by SwiGLU)
  T* y;
  int64_t m, k, n;
  int r;
  int act;  // ONNXFUSE_ACT_RELU / ONNXFUSE_ACT_SIGMOID for kEpiAct; 1 = relu for kEpiLora; onnxfuse_gate_act for kEpiSwiglu
  float scale;
};

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

__device__ __forceinline__ float sigmoid_f32(float z) { return 1.f / (1.f + __expf(-z)); }

// acc0: X@W (or X@W_gate), acc1: X@W_up; for LoRA the (scale*T)@B term is already in acc0.
template <int EPI>
__device__ __forceinline__ float apply_epilogue(float acc0, float acc1, float bias, int act) {
  if (EPI == kEpiSwiglu) return onnxfuse::GateActivation(act, acc0) * acc1;
  const float z = acc0 + bias;
  if (EPI == kEpiAct && act == ONNXFUSE_ACT_SIGMOID) return sigmoid_f32(z);
  if (EPI == kEpiLora && act == 0) return z;
  return z > 0.f ? z : (z != z ? z : 0.f);  // relu; NaN stays NaN, like torch.relu
}

// Loads VEC consecutive elements as fp32: one vector load when `vec` (aligned, fully in bounds), else bounded.
template <typename T, int VEC>
__device__ __forceinline__ void load_row_vec(const T* __restrict__ p, int64_t col, int64_t n, bool vec, float* out) {
  if (vec) {
    if (col < n) {
      if constexpr (sizeof(T) * VEC == 16) {
        uint4 raw = __ldg(reinterpret_cast<const uint4*>(p + col));
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int v = 0; v < VEC; ++v) out[v] = to_f(e[v]);
      } else if constexpr (sizeof(T) * VEC == 8) {
        uint2 raw = __ldg(reinterpret_cast<const uint2*>(p + col));
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int v = 0; v < VEC; ++v) out[v] = to_f(e[v]);
      } else {
#pragma unroll
        for (int v = 0; v < VEC; ++v) out[v] = to_f(p[col + v]);
      }
    } else {
#pragma unroll
      for (int v = 0; v < VEC; ++v) out[v] = 0.f;
    }
  } else {
#pragma unroll
    for (int v = 0; v < VEC; ++v) out[v] = (col + v < n) ? to_f(p[col + v]) : 0.f;
  }
}

// ------------------------------------------------------------------------------------------------------------------
// Small-M / fp32 kernel. Grid: x = column blocks of BN, y = row blocks of MT.
// LN lanes share one weight row segment of BN = LN * VEC columns; G = 256 / LN lane groups split K.
// ------------------------------------------------------------------------------------------------------------------
constexpr int kSmallThreads = 256;
constexpr int kSmallKChunk = 128;

template <typename T, int NB, int LN>
struct SmallShape {
  static constexpr int kVec = 16 / int(sizeof(T)) / NB;
  static constexpr int kBN = LN * kVec;
  static constexpr int kGroups = kSmallThreads / LN;
};

template <typename T, int MT, int NB, int LN, int EPI>
__global__ void __launch_bounds__(kSmallThreads) SmallMKernel(GemmParams<T> p, bool vec_ok) {
  using S = SmallShape<T, NB, LN>;
  constexpr int VEC = S::kVec, BN = S::kBN, G = S::kGroups, KC = kSmallKChunk;
  constexpr int kWarps = kSmallThreads / 32;
  constexpr int kRedMain = kWarps * NB * MT * BN;
  constexpr int kRedLora = (EPI == kEpiLora) ? kSmallThreads * MT : 0;  // (256 / RP) groups * MT * RP
  constexpr int kRed = kRedMain > kRedLora ? kRedMain : kRedLora;
  __shared__ float xs[MT][KC];
  __shared__ float red[kRed];
  __shared__ float ts[(EPI == kEpiLora) ? MT : 1][(EPI == kEpiLora) ? ONNXFUSE_MAX_LORA_RANK : 1];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int lane_n = tid % LN, g = tid / LN;
  const int64_t M = p.m, K = p.k, N = p.n;
  const int64_t row0 = int64_t(blockIdx.y) * MT;
  const int64_t col = int64_t(blockIdx.x) * BN + int64_t(lane_n) * VEC;
  const T* wp[NB];
  wp[0] = p.w0;
  if constexpr (NB == 2) wp[1] = p.w1;

  float acc[NB][MT][VEC];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[b][m][v] = 0.f;

  // LoRA: thread (tr, tg) accumulates T[:, tr] over k = tg, tg + TG, ...
  const int RP = (EPI == kEpiLora && p.r > 16) ? ((p.r + 15) / 16) * 16 : 16;
  const int tr = tid % RP, tg = tid / RP, TG = kSmallThreads / RP;
  float tacc[(EPI == kEpiLora) ? MT : 1];
#pragma unroll
  for (int m = 0; m < ((EPI == kEpiLora) ? MT : 1); ++m) tacc[m] = 0.f;

  for (int64_t kc0 = 0; kc0 < K; kc0 += KC) {
    const int kc = int(K - kc0 < KC ? K - kc0 : KC);
    __syncthreads();
    for (int i = tid; i < MT * KC; i += kSmallThreads) {
      const int mm = i / KC, kk = i % KC;
      xs[mm][kk] = (row0 + mm < M && kk < kc) ? to_f(p.x[(row0 + mm) * K + kc0 + kk]) : 0.f;
    }
    __syncthreads();
#pragma unroll 4
    for (int kk = g; kk < kc; kk += G) {
      float wv[NB][VEC];
#pragma unroll
      for (int b = 0; b < NB; ++b) load_row_vec<T, VEC>(wp[b] + (kc0 + kk) * N, col, N, vec_ok, wv[b]);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        const float xv = xs[m][kk];
#pragma unroll
        for (int b = 0; b < NB; ++b)
#pragma unroll
          for (int v = 0; v < VEC; ++v) acc[b][m][v] = fmaf(xv, wv[b][v], acc[b][m][v]);
      }
    }
    if constexpr (EPI == kEpiLora) {
      if (tr < p.r) {
        for (int kk = tg; kk < kc; kk += TG) {
          const float av = to_f(p.la[(kc0 + kk) * p.r + tr]);
#pragma unroll
          for (int m = 0; m < MT; ++m) tacc[m] = fmaf(xs[m][kk], av, tacc[m]);
        }
      }
    }
  }

  if constexpr (EPI == kEpiLora) {  // T = sum over the TG groups, scaled, into ts
    __syncthreads();
#pragma unroll
    for (int m = 0; m < MT; ++m) red[(tg * MT + m) * RP + tr] = tacc[m];
    __syncthreads();
    for (int i = tid; i < MT * RP; i += kSmallThreads) {
      const int m = i / RP, r = i % RP;
      float s = 0.f;
      for (int q = 0; q < TG; ++q) s += red[(q * MT + m) * RP + r];
      ts[m][r] = s * p.scale;
    }
  }

  // Reduce the lane groups of a warp (lanes equal modulo LN hold the same columns), then the warps.
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int v = 0; v < VEC; ++v)
#pragma unroll
        for (int off = LN; off < 32; off <<= 1) acc[b][m][v] += __shfl_xor_sync(0xffffffffu, acc[b][m][v], off);
  __syncthreads();
  if (lane < LN) {
#pragma unroll
    for (int b = 0; b < NB; ++b)
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int v = 0; v < VEC; ++v) red[((warp * NB + b) * MT + m) * BN + lane * VEC + v] = acc[b][m][v];
  }
  __syncthreads();
  for (int i = tid; i < MT * BN; i += kSmallThreads) {
    const int m = i / BN, c = i % BN;
    const int64_t row = row0 + m, cc = int64_t(blockIdx.x) * BN + c;
    if (row >= M || cc >= N) continue;
    float s[NB];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      s[b] = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s[b] += red[((w * NB + b) * MT + m) * BN + c];
    }
    if constexpr (EPI == kEpiLora) {
      for (int r = 0; r < p.r; ++r) s[0] = fmaf(ts[m][r], to_f(p.lb[int64_t(r) * N + cc]), s[0]);
    }
    const float bias = (EPI == kEpiSwiglu) ? 0.f : to_f(p.bias[cc]);
    p.y[row * N + cc] = from_f<T>(apply_epilogue<EPI>(s[0], NB == 2 ? s[NB - 1] : 0.f, bias, p.act));
  }
}

// ------------------------------------------------------------------------------------------------------------------
// Tensor-core kernel (fp16 / bf16). 256 threads = 8 warps as 4 (M) x 2 (N); warp tile 32 x BN/2.
// ------------------------------------------------------------------------------------------------------------------
constexpr int kTcThreads = 256;
constexpr int kTcBM = 128, kTcBK = 32, kTcPad = 8, kTcGroupM = 8;

template <typename T, int NB, int RP>
struct TcShape {
  static constexpr int kBN = NB == 1 ? 128 : 64;
  static constexpr int kLdA = kTcBK + kTcPad;      // X tile row stride (elements)
  static constexpr int kLdB = kBN + kTcPad;        // weight tile row stride
  static constexpr int kLdL = (RP > 0 ? RP : 16) + kTcPad;  // LoRA A tile row stride
  static constexpr int kABytes = 2 * kTcBM * kLdA * 2;
  static constexpr int kBBytes = 2 * NB * kTcBK * kLdB * 2;
  static constexpr int kLBytes = RP > 0 ? 2 * kTcBK * kLdL * 2 : 0;
  static constexpr int kPipeBytes = kABytes + kBBytes + kLBytes;
  // LoRA tail: Ts [BM][RP+8] (T), Bl [RP][BN+8] (T), per-warp fp32 staging 16x16.
  static constexpr int kTsBytes = RP > 0 ? kTcBM * kLdL * 2 : 0;
  static constexpr int kBlBytes = RP > 0 ? RP * kLdB * 2 : 0;
  static constexpr int kTailBytes = kTsBytes + kBlBytes + 8 * 256 * 4;
  static constexpr int kEpiBytes = 8 * NB * 256 * 4;
  static constexpr int kSmem = kPipeBytes > kTailBytes ? (kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes)
                                                       : (kTailBytes > kEpiBytes ? kTailBytes : kEpiBytes);
  static_assert(kSmem <= 48 * 1024, "tile needs more than the static 48 KB of shared memory");
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int bytes = valid ? 16 : 0;  // 0: nothing is read, the 16 bytes are zero-filled
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

template <typename T, int NB, int EPI, bool ALIGNED, int RP>
__global__ void __launch_bounds__(kTcThreads) TensorCoreKernel(GemmParams<T> p) {
  using namespace nvcuda;
  using S = TcShape<T, NB, RP>;
  constexpr int BM = kTcBM, BN = S::kBN, BK = kTcBK;
  constexpr int WN = BN / 2, FM = 2, FN = WN / 16;
  constexpr int TFN = RP > 0 ? (RP / 16 + 1) / 2 : 1;  // T column fragments per warp (split across the 2 N warps)
  __shared__ __align__(128) unsigned char smem[S::kSmem];
  T* As = reinterpret_cast<T*>(smem);                                 // [2][BM][kLdA]
  T* Bs = reinterpret_cast<T*>(smem + S::kABytes);                    // [2][NB][BK][kLdB]
  T* Ls = reinterpret_cast<T*>(smem + S::kABytes + S::kBBytes);       // [2][BK][kLdL]

  const int64_t M = p.m, K = p.k, N = p.n;
  // Grouped tile order so kTcGroupM row tiles reuse each weight column tile from L2.
  const int64_t tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
  const int64_t pid = blockIdx.x, per_group = kTcGroupM * tiles_n;
  const int64_t first_m = (pid / per_group) * kTcGroupM;
  const int64_t group_rows = tiles_m - first_m < kTcGroupM ? tiles_m - first_m : kTcGroupM;
  const int64_t m0 = (first_m + (pid % per_group) % group_rows) * BM;
  const int64_t n0 = ((pid % per_group) / group_rows) * BN;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp >> 1, wn = warp & 1;
  const T* wp[NB];
  wp[0] = p.w0;
  if constexpr (NB == 2) wp[1] = p.w1;
  const bool lora_vec = ALIGNED && (p.r % 8 == 0);

  auto load_stage = [&](int stage, int64_t k0) {
    T* as = As + stage * BM * S::kLdA;
    for (int c = tid; c < BM * BK / 8; c += kTcThreads) {  // X tile, 8-element chunks
      const int row = c / (BK / 8), kc = (c % (BK / 8)) * 8;
      const int64_t gr = m0 + row, gk = k0 + kc;
      T* dst = as + row * S::kLdA + kc;
      if constexpr (ALIGNED) {
        const bool ok = gr < M && gk < K;
        cp_async16(dst, ok ? p.x + gr * K + gk : p.x, ok);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e)
          dst[e] = (gr < M && gk + e < K) ? p.x[gr * K + gk + e] : from_f<T>(0.f);
      }
    }
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      T* bs = Bs + (stage * NB + b) * BK * S::kLdB;
      for (int c = tid; c < BK * BN / 8; c += kTcThreads) {
        const int kr = c / (BN / 8), nc = (c % (BN / 8)) * 8;
        const int64_t gk = k0 + kr, gn = n0 + nc;
        T* dst = bs + kr * S::kLdB + nc;
        if constexpr (ALIGNED) {
          const bool ok = gk < K && gn < N;
          cp_async16(dst, ok ? wp[b] + gk * N + gn : wp[b], ok);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            dst[e] = (gk < K && gn + e < N) ? wp[b][gk * N + gn + e] : from_f<T>(0.f);
        }
      }
    }
    if constexpr (RP > 0) {
      T* ls = Ls + stage * BK * S::kLdL;
      for (int c = tid; c < BK * RP / 8; c += kTcThreads) {
        const int kr = c / (RP / 8), rc = (c % (RP / 8)) * 8;
        const int64_t gk = k0 + kr;
        T* dst = ls + kr * S::kLdL + rc;
        if (lora_vec) {
          const bool ok = gk < K && rc < p.r;
          cp_async16(dst, ok ? p.la + gk * p.r + rc : p.la, ok);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e)
            dst[e] = (gk < K && rc + e < p.r) ? p.la[gk * p.r + rc + e] : from_f<T>(0.f);
        }
      }
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[NB][FM][FN];
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> tacc[FM][TFN];
#pragma unroll
  for (int b = 0; b < NB; ++b)
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[b][i][j], 0.f);
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < TFN; ++j) wmma::fill_fragment(tacc[i][j], 0.f);

  const int64_t nk = (K + BK - 1) / BK;
  if (nk > 0) {
    load_stage(0, 0);
    cp_async_commit();
  }
  for (int64_t kt = 0; kt < nk; ++kt) {
    const int stage = int(kt & 1);
    if (kt + 1 < nk) {
      load_stage(stage ^ 1, (kt + 1) * BK);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const T* as = As + stage * BM * S::kLdA;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af[FM];
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(af[i], as + (wm * 32 + i * 16) * S::kLdA + kk, S::kLdA);
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const T* bs = Bs + (stage * NB + b) * BK * S::kLdB;
#pragma unroll
        for (int j = 0; j < FN; ++j) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bf;
          wmma::load_matrix_sync(bf, bs + kk * S::kLdB + wn * WN + j * 16, S::kLdB);
#pragma unroll
          for (int i = 0; i < FM; ++i) wmma::mma_sync(acc[b][i][j], af[i], bf, acc[b][i][j]);
        }
      }
      if constexpr (RP > 0) {
        const T* ls = Ls + stage * BK * S::kLdL;
#pragma unroll
        for (int j = 0; j < TFN; ++j) {
          const int tj = wn + 2 * j;
          if (tj < RP / 16) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> lf;
            wmma::load_matrix_sync(lf, ls + kk * S::kLdL + tj * 16, S::kLdL);
#pragma unroll
            for (int i = 0; i < FM; ++i) wmma::mma_sync(tacc[i][j], af[i], lf, tacc[i][j]);
          }
        }
      }
    }
    __syncthreads();
  }

  if constexpr (RP > 0) {
    // (scale * T) rounded to T into Ts, B's column tile into Bl; then acc += Ts @ Bl on the tensor cores.
    T* Ts = reinterpret_cast<T*>(smem);
    T* Bl = reinterpret_cast<T*>(smem + S::kTsBytes);
    float* stage_f = reinterpret_cast<float*>(smem + S::kTsBytes + S::kBlBytes) + warp * 256;
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
      for (int j = 0; j < TFN; ++j) {
        const int tj = wn + 2 * j;
        if (tj < RP / 16) {
          wmma::store_matrix_sync(stage_f, tacc[i][j], 16, wmma::mem_row_major);
          __syncwarp();
          for (int e = lane; e < 256; e += 32)
            Ts[(wm * 32 + i * 16 + e / 16) * S::kLdL + tj * 16 + e % 16] = from_f<T>(stage_f[e] * p.scale);
          __syncwarp();
        }
      }
    for (int e = tid; e < RP * BN; e += kTcThreads) {
      const int r = e / BN, c = e % BN;
      const int64_t gn = n0 + c;
      Bl[r * S::kLdB + c] = (r < p.r && gn < N) ? p.lb[int64_t(r) * N + gn] : from_f<T>(0.f);
    }
    __syncthreads();
#pragma unroll
    for (int kr = 0; kr < RP; kr += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af[FM];
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(af[i], Ts + (wm * 32 + i * 16) * S::kLdL + kr, S::kLdL);
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bf;
        wmma::load_matrix_sync(bf, Bl + kr * S::kLdB + wn * WN + j * 16, S::kLdB);
#pragma unroll
        for (int i = 0; i < FM; ++i) wmma::mma_sync(acc[0][i][j], af[i], bf, acc[0][i][j]);
      }
    }
    __syncthreads();
  }

  // Epilogue: each warp stages one 16x16 accumulator fragment (per weight) in shared memory, then applies the
  // fused math and stores Y with bounds checks.
  float* stage_w = reinterpret_cast<float*>(smem) + warp * NB * 256;
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
#pragma unroll
      for (int b = 0; b < NB; ++b) wmma::store_matrix_sync(stage_w + b * 256, acc[b][i][j], 16, wmma::mem_row_major);
      __syncwarp();
      const int r = lane >> 1, c0 = (lane & 1) * 8;
      const int64_t row = m0 + wm * 32 + i * 16 + r;
      if (row < M) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const int64_t col = n0 + wn * WN + j * 16 + c0 + e;
          if (col < N) {
            const float a0 = stage_w[r * 16 + c0 + e];
            const float a1 = NB == 2 ? stage_w[(NB - 1) * 256 + r * 16 + c0 + e] : 0.f;
            const float bias = (EPI == kEpiSwiglu) ? 0.f : to_f(p.bias[col]);
            p.y[row * N + col] = from_f<T>(apply_epilogue<EPI>(a0, a1, bias, p.act));
          }
        }
      }
      __syncwarp();
    }
}

// ------------------------------------------------------------------------------------------------------------------
// Host-side dispatch.
// ------------------------------------------------------------------------------------------------------------------
inline bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

// Largest row count per SmallMKernel launch: gridDim.y <= 65535.
template <typename T, int MT, int NB, int EPI>
int LaunchSmallMRows(GemmParams<T> p, cudaStream_t stream) {
  constexpr int LN = (EPI == kEpiLora) ? 8 : 4;  // LoRA: wider column blocks amortise recomputing T per block
  using S = SmallShape<T, NB, LN>;
  const bool vec_ok = aligned16(p.w0) && (NB == 1 || aligned16(p.w1)) && p.n % S::kVec == 0;
  const int64_t col_blocks = (p.n + S::kBN - 1) / S::kBN;
  if (col_blocks > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  const int64_t rows_per_launch = int64_t(65535) * MT;
  for (int64_t r0 = 0; r0 < p.m; r0 += rows_per_launch) {
    GemmParams<T> q = p;
    q.m = (p.m - r0 < rows_per_launch) ? p.m - r0 : rows_per_launch;
    q.x = p.x + r0 * p.k;
    q.y = p.y + r0 * p.n;
    const dim3 grid(unsigned(col_blocks), unsigned((q.m + MT - 1) / MT));
    SmallMKernel<T, MT, NB, LN, EPI><<<grid, kSmallThreads, 0, stream>>>(q, vec_ok);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return int(e);
  }
  return 0;
}

template <typename T, int NB, int EPI>
int LaunchSmallM(const GemmParams<T>& p, cudaStream_t stream) {
  if (p.m <= 1) return LaunchSmallMRows<T, 1, NB, EPI>(p, stream);
  if (p.m <= 4) return LaunchSmallMRows<T, 4, NB, EPI>(p, stream);
  if (p.m <= 8) return LaunchSmallMRows<T, 8, NB, EPI>(p, stream);
  return LaunchSmallMRows<T, 16, NB, EPI>(p, stream);
}

template <typename T, int NB, int EPI, int RP>
int LaunchTensorCore(const GemmParams<T>& p, cudaStream_t stream) {
  using S = TcShape<T, NB, RP>;
  const int64_t tiles = ((p.m + kTcBM - 1) / kTcBM) * ((p.n + S::kBN - 1) / S::kBN);
  if (tiles > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  const bool aligned = aligned16(p.x) && aligned16(p.w0) && (NB == 1 || aligned16(p.w1)) &&
                       (RP == 0 || aligned16(p.la)) && p.k % 8 == 0 && p.n % 8 == 0;
  if (aligned)
    TensorCoreKernel<T, NB, EPI, true, RP><<<unsigned(tiles), kTcThreads, 0, stream>>>(p);
  else
    TensorCoreKernel<T, NB, EPI, false, RP><<<unsigned(tiles), kTcThreads, 0, stream>>>(p);
  return int(cudaGetLastError());
}

// fp32 and M <= 16 take the SmallM kernel; fp16 / bf16 with M > 16 the tensor-core kernel.
template <typename T, int NB, int EPI, int RP>
int LaunchGemm(const GemmParams<T>& p, cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return 0;
  if (std::is_same<T, float>::value || p.m <= 16) return LaunchSmallM<T, NB, EPI>(p, stream);
  if constexpr (!std::is_same<T, float>::value) return LaunchTensorCore<T, NB, EPI, RP>(p, stream);
  return 0;
}

inline bool check_common(int dtype, const void* x, const void* y, int64_t m, int64_t k, int64_t n) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || k < 0 || n < 0) return false;
  if (m > 0 && n > 0 && (y == nullptr || (k > 0 && x == nullptr))) return false;
  return true;
}

}  // namespace onnxfuse::cuda_kernels
