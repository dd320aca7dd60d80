// Int4Linear's and Int4SwiGLU's rows path on sm_90a warpgroup MMAs (issue 28): the wgmma form of Int4MmaGemm
// (cuda/int4_linear.cu), which calls it through onnxfuse_sm90a_int4_rows_gemm where RowsPlanFor picks it. Built for
// sm_90a alone (cuda/cuda.cmake: wgmma has no PTX for other GPUs). The weights are the wgmma's A operand from
// registers, dequantized in them as (q - 8) * s rounded once to the type, as the reference's dequantized W holds them;
// X is its B operand from shared memory. H200, a Llama-2-7B layer's five projections (blocks of 32), kernels alone
// (scripts/int4_gemm_rows_probe.cu `variants`, benchmarks/results/h200-2026-12-01/int4/gemm-rows-probe-wgmma.txt,
// -wgmma-rows.txt): 177.6 us at 96 rows against Int4MmaGemm's 224.1; 145.3 against 144.6 at 64 and slower below
// (110.5 against 98.5 at 17), so it runs from 65 rows; to 192 rows (265.6 against the dequantization + cuBLAS GEMM's
// 335.7 us; past it two 128-row tiles gained 2-3 %, 325.5 against 334.8 at 224, and lost from 256 rows on).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/cp_async.h"
#include "cuda/gemm.h"
#include "cuda/sm90a/int4_rows_tiles.h"

namespace ock = onnxfuse::cuda_kernels;

namespace {

template <typename T, int N>
__device__ __forceinline__ void WgmmaRS(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc);
// wgmma.mma_async m64nNk16, fp32 accumulators d (the "+f" operands, eight a macro), A {a} from registers, B by its
// descriptor; scale-d on (the accumulators added to), no negation, B K-major.
#define ONNXFUSE_D8(b)                                                                                        \
  "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), "+f"(d[b + 6]), \
      "+f"(d[b + 7])
#define ONNXFUSE_D48 ONNXFUSE_D8(0), ONNXFUSE_D8(8), ONNXFUSE_D8(16), ONNXFUSE_D8(24), ONNXFUSE_D8(32), ONNXFUSE_D8(40)
#define ONNXFUSE_D64 ONNXFUSE_D48, ONNXFUSE_D8(48), ONNXFUSE_D8(56)
#define ONNXFUSE_D80 ONNXFUSE_D64, ONNXFUSE_D8(64), ONNXFUSE_D8(72)
#define ONNXFUSE_D96 ONNXFUSE_D80, ONNXFUSE_D8(80), ONNXFUSE_D8(88)
#define ONNXFUSE_D128 ONNXFUSE_D96, ONNXFUSE_D8(96), ONNXFUSE_D8(104), ONNXFUSE_D8(112), ONNXFUSE_D8(120)
#define ONNXFUSE_R48                                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "  \
  "%42, %43, %44, %45, %46, %47}"
#define ONNXFUSE_R64                                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "  \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "  \
  "%62, %63}"
#define ONNXFUSE_R80                                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "  \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "  \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79}"
#define ONNXFUSE_R96                                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "  \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "  \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "  \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define ONNXFUSE_R128                                                                                      \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "  \
  "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "   \
  "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "   \
  "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "   \
  "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, " \
  "%102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, " \
  "%119, %120, %121, %122, %123, %124, %125, %126, %127}"
#define ONNXFUSE_WGMMA_RS(T, PTX, N, REGS, DOPS, A0, A1, A2, A3, DESC, ONE)                                          \
  template <>                                                                                                        \
  __device__ __forceinline__ void WgmmaRS<T, N>(float(&d)[N / 2], const uint32_t(&a)[4], uint64_t desc) {            \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ONE ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." PTX \
                 "." PTX " " REGS ", {" A0 ", " A1 ", " A2 ", " A3 "}, " DESC ", p, 1, 1, 0;\n}\n"                   \
                 : DOPS                                                                                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1));                                   \
  }
ONNXFUSE_WGMMA_RS(__half, "f16", 96, ONNXFUSE_R48, ONNXFUSE_D48, "%48", "%49", "%50", "%51", "%52", "%53")
ONNXFUSE_WGMMA_RS(__half, "f16", 128, ONNXFUSE_R64, ONNXFUSE_D64, "%64", "%65", "%66", "%67", "%68", "%69")
ONNXFUSE_WGMMA_RS(__nv_bfloat16, "bf16", 96, ONNXFUSE_R48, ONNXFUSE_D48, "%48", "%49", "%50", "%51", "%52", "%53")
ONNXFUSE_WGMMA_RS(__nv_bfloat16, "bf16", 128, ONNXFUSE_R64, ONNXFUSE_D64, "%64", "%65", "%66", "%67", "%68", "%69")
ONNXFUSE_WGMMA_RS(__half, "f16", 160, ONNXFUSE_R80, ONNXFUSE_D80, "%80", "%81", "%82", "%83", "%84", "%85")
ONNXFUSE_WGMMA_RS(__nv_bfloat16, "bf16", 160, ONNXFUSE_R80, ONNXFUSE_D80, "%80", "%81", "%82", "%83", "%84", "%85")
ONNXFUSE_WGMMA_RS(__half, "f16", 192, ONNXFUSE_R96, ONNXFUSE_D96, "%96", "%97", "%98", "%99", "%100", "%101")
ONNXFUSE_WGMMA_RS(__nv_bfloat16, "bf16", 192, ONNXFUSE_R96, ONNXFUSE_D96, "%96", "%97", "%98", "%99", "%100", "%101")
#if defined(WG_PROBE) || defined(WS_PROBE)  // a 256-row tile: scripts/int4_gemm_rows_probe.cu's variants only
ONNXFUSE_WGMMA_RS(__half, "f16", 256, ONNXFUSE_R128, ONNXFUSE_D128, "%128", "%129", "%130", "%131", "%132", "%133")
ONNXFUSE_WGMMA_RS(__nv_bfloat16, "bf16", 256, ONNXFUSE_R128, ONNXFUSE_D128, "%128", "%129", "%130", "%131", "%132",
                  "%133")
#endif
#undef ONNXFUSE_WGMMA_RS
#undef ONNXFUSE_R128
#undef ONNXFUSE_R96
#undef ONNXFUSE_R80
#undef ONNXFUSE_R64
#undef ONNXFUSE_R48
#undef ONNXFUSE_D128
#undef ONNXFUSE_D96
#undef ONNXFUSE_D80
#undef ONNXFUSE_D64
#undef ONNXFUSE_D48
#undef ONNXFUSE_D8

__device__ __forceinline__ void WgmmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void WgmmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void FenceOperand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// cp.async writes shared memory through the generic proxy and wgmma reads it through the async proxy: each thread
// fences its own landed copies before the barrier that publishes them (PTX ISA, wgmma's async proxy).
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// K-major, 128-byte swizzle: rows of 128 bytes, 8-row groups 1024 bytes apart (SBO); LBO unused (1)
__device__ __forceinline__ uint64_t WgmmaDescSw128(uint32_t saddr) {
  return uint64_t((saddr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// The weights' k16 slice for a lane in the wgmma's natural K order (X left as it is): lane t takes byte t of the
// slice's two words of its column (values 2t, 2t+1 and 2t+8, 2t+9), each pair (q - 8) * s rounded once (fp16:
// 1024 + q and 1024 + 16 q from the magic, the second scaled by 1/16 in the same exact FMA).
template <typename T>
struct NatDequant;
template <>
struct NatDequant<__half> {
  __device__ static void Get(uint32_t w0, uint32_t w1, uint32_t sel, __half2 s2, uint32_t& lo, uint32_t& hi) {
    const uint32_t v = __byte_perm(w0, w1, sel);  // [b0, b1, b0, b1]
    const uint32_t v0 = ock::AndOr(v, 0x00F0000Fu, 0x64006400u), v1 = ock::AndOr(v >> 8, 0x00F0000Fu, 0x64006400u);
    const __half2 mul = __halves2half2(__float2half(1.f), __float2half(0.0625f)),
                  add = __halves2half2(__float2half(-1032.f), __float2half(-72.f));
    const __half2 r0 = __hmul2(__hfma2(*reinterpret_cast<const __half2*>(&v0), mul, add), s2);
    const __half2 r1 = __hmul2(__hfma2(*reinterpret_cast<const __half2*>(&v1), mul, add), s2);
    lo = *reinterpret_cast<const uint32_t*>(&r0);
    hi = *reinterpret_cast<const uint32_t*>(&r1);
  }
};
template <>
struct NatDequant<__nv_bfloat16> {
  __device__ static void Get(uint32_t w0, uint32_t w1, uint32_t sel, __nv_bfloat162 s2, uint32_t& lo, uint32_t& hi) {
    const uint32_t v = __byte_perm(w0, w1, sel);  // [b0, b1, b0, b1]
    // bf16 takes a nibble in bits 0-3 of each half only (0x4300 | q is 128 + q)
    const uint32_t a0 = (v & 0xFu) | (((v >> 4) & 0xFu) << 16) | 0x43004300u;
    const uint32_t a1 = ((v >> 8) & 0xFu) | (((v >> 12) & 0xFu) << 16) | 0x43004300u;
    const __nv_bfloat162 bias = __float2bfloat162_rn(136.f);
    const __nv_bfloat162 r0 = __hmul2(__hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a0), bias), s2);
    const __nv_bfloat162 r1 = __hmul2(__hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a1), bias), s2);
    lo = *reinterpret_cast<const uint32_t*>(&r0);
    hi = *reinterpret_cast<const uint32_t*>(&r1);
  }
};

// A warp's accumulators (mma.sync's C layout: its rows the columns col0 and col0 + 8, its columns the rows of X, 8 a
// tile from m0, lane t's 2t and 2t + 1) to Y [m, ldy] rounded to T, or (SPLIT) to split blockIdx.z's fp32 partials.
template <typename T, int BM, bool SPLIT>
__device__ __forceinline__ void StoreAcc(const float (&acc)[BM / 2], T* __restrict__ y, float* __restrict__ part,
                                         int ldy, int m, int N, int col0, int m0, int t) {
#pragma unroll
  for (int i = 0; i < BM / 8; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = col0 + 8 * (e >> 1), row = m0 + 8 * i + 2 * t + (e & 1);
      if (col < N && row < m) {
        if constexpr (SPLIT)
          part[(int64_t(blockIdx.z) * m + row) * N + col] = acc[4 * i + e];
        else
          y[int64_t(row) * ldy + col] = ock::from_f<T>(acc[4 * i + e]);
      }
    }
}

// Y = X @ W^T on the rows path's sm_90a form: symmetric int4 weights in blocks of 32 (a step's two scales in one
// 4-byte load), K a multiple of 64; BN = 128 columns a block (two warpgroups, 64 each: the wgmma's M), BM rows of X
// (its N), steps of 64 values of K through a cp.async ring of STAGES. X goes into shared memory as it is, in the
// 128-byte swizzle the descriptor reads; each lane dequantizes its column's bytes t of each k16 slice (NatDequant), so
// the weights' K order is the wgmma's own. SPLIT: fp32 partials [gridDim.z][m][n] of steps [z * per, (z + 1) * per).
template <typename T, int BM, int STAGES, bool SPLIT, int MINB = 1>
__global__ void __launch_bounds__(256, MINB)
    Int4WgmmaGemm(const T* __restrict__ x, const uint8_t* __restrict__ wq, const T* __restrict__ scales,
                  T* __restrict__ y, float* __restrict__ part, int ldy, int m, int K, int N, int nb, int row_bytes,
                  int per) {
  constexpr int BN = 128, X_BYTES = BM * 128, STAGE = X_BYTES + BN * 32;
  static_assert(BM % 32 == 0 && BM <= 256, "the wgmma's N");
  using T2 = typename std::conditional<std::is_same_v<T, __half>, __half2, __nv_bfloat162>::type;
  extern __shared__ uint4 wg_smem_raw[];
  const uint32_t sraw = uint32_t(__cvta_generic_to_shared(wg_smem_raw));
  const uint32_t sbase = (sraw + 1023u) & ~1023u;  // the swizzle's 1024-byte atoms
  const char* sgen = reinterpret_cast<const char*>(wg_smem_raw) + (sbase - sraw);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
  const int s_begin = blockIdx.z * per, s_end = min(K >> 6, s_begin + per);
  auto issue = [&](int step, int stage) {
    if (step < s_end) {
      const uint32_t st = sbase + stage * STAGE;
      {  // the weights: 128 columns x 32 bytes, a 16-byte chunk a thread, the halves swapped where (column / 4) is odd
        const int r = tid >> 1, c = tid & 1, col = n0 + r;
        const bool ok = col < N;
        ock::CpAsync16(st + X_BYTES + r * 32 + 16 * (c ^ ((r >> 2) & 1)),
                       wq + int64_t(ok ? col : 0) * row_bytes + step * 32 + 16 * c, ok);
      }
      for (int id = tid; id < BM * 8; id += 256) {  // X: row r's 16-byte chunk q at q ^ (r % 8)
        const int r = id >> 3, q = id & 7, row = m0 + r;
        const bool ok = row < m;
        ock::CpAsync16(st + r * 128 + 16 * (q ^ (r & 7)), x + int64_t(ok ? row : 0) * K + step * 64 + 8 * q, ok);
      }
    }
    ock::CpAsyncCommit();
  };
  const int wrow = 64 * (warp >> 2) + 16 * (warp & 3) + g;  // the lane's columns in the tile: wrow and wrow + 8
  const int wsw = 16 * ((g >> 2) & 1);
  int soff[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) soff[j] = min(n0 + wrow + 8 * j, N - 1) * nb;
  auto load_scales = [&](int step, T(&s)[2][2]) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t v = __ldg(reinterpret_cast<const uint32_t*>(scales + soff[j] + 2 * step));
      s[j][0] = reinterpret_cast<const T*>(&v)[0];
      s[j][1] = reinterpret_cast<const T*>(&v)[1];
    }
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) issue(s_begin + i, i);
  T sv[2][2], sn[2][2];
  if (s_begin < s_end) load_scales(s_begin, sv);
  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.f;
  const uint32_t sel = uint32_t(t) | uint32_t(4 + t) << 4 | uint32_t(t) << 8 | uint32_t(4 + t) << 12;
  int stage = 0;
  for (int step = s_begin; step < s_end; ++step) {
    ock::CpAsyncWait<STAGES - 2>();
    FenceProxyAsync();
    __syncthreads();
    issue(step + STAGES - 1, stage == 0 ? STAGES - 1 : stage - 1);
    if (step + 1 < s_end) load_scales(step + 1, sn);
    const char* st = sgen + stage * STAGE + X_BYTES;
    uint32_t a[4][4];  // a k16 slice's A registers: rows wrow, wrow + 8 at k 2t, 2t + 1, then at 2t + 8, 2t + 9
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint4 q = *reinterpret_cast<const uint4*>(st + (wrow + 8 * j) * 32 + ((16 * h) ^ wsw));
        T2 s2;
        s2.x = sv[j][h], s2.y = sv[j][h];
        NatDequant<T>::Get(q.x, q.y, sel, s2, a[2 * h][j], a[2 * h][2 + j]);  // slice 2h: words x, y
        NatDequant<T>::Get(q.z, q.w, sel, s2, a[2 * h + 1][j], a[2 * h + 1][2 + j]);
      }
    const uint32_t xs = sbase + stage * STAGE;
    WgmmaFence();
#pragma unroll
    for (int c = 0; c < 4; ++c) WgmmaRS<T, BM>(acc, a[c], WgmmaDescSw128(xs + 32 * c));
    WgmmaCommit();
    WgmmaWait<0>();
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) FenceOperand(acc[i]);
#pragma unroll
    for (int j = 0; j < 2; ++j) sv[j][0] = sn[j][0], sv[j][1] = sn[j][1];
    stage = stage + 1 == STAGES ? 0 : stage + 1;
  }
  ock::CpAsyncWait<0>();
  StoreAcc<T, BM, SPLIT>(acc, y, part, ldy, m, N, n0 + wrow, m0, t);
}

// The kernel at BM rows, a ring of STAGES, MINB blocks an SM by its launch bounds, on `splits` shares of `per` steps:
// its shared memory from them (the ring's X and weight steps, and 1 KB to align the swizzled X). The library launches
// int4_rows_tiles.h's tiles (Launch); scripts/int4_gemm_rows_probe.cu (-DWG_PROBE) others.
template <typename T, int BM, int STAGES, int MINB>
int LaunchWgmma(const void* x, const uint8_t* wq, const void* scales, void* y, float* part, int64_t ldy, int64_t m,
                int64_t k, int64_t n, int64_t nb, int64_t row_bytes, int splits, int per, cudaStream_t s) {
  constexpr int smem = STAGES * (BM * 128 + 128 * 32) + 1024;
  const dim3 grid(unsigned((n + 127) / 128), unsigned((m + BM - 1) / BM), unsigned(splits));
  auto launch = [&](auto kernel) {
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem)) return int(e);
    kernel<<<grid, 256, smem, s>>>(static_cast<const T*>(x), wq, static_cast<const T*>(scales), static_cast<T*>(y),
                                   part, int(ldy), int(m), int(k), int(n), int(nb), int(row_bytes), per);
    return int(cudaGetLastError());
  };
  return splits > 1 ? launch(Int4WgmmaGemm<T, BM, STAGES, true, MINB>)
                    : launch(Int4WgmmaGemm<T, BM, STAGES, false, MINB>);
}

// Tile I of int4_rows_tiles.h's table.
template <typename T, int I>
int LaunchTile(const void* x, const uint8_t* wq, const void* scales, void* y, float* part, int64_t ldy, int64_t m,
               int64_t k, int64_t n, int64_t nb, int64_t row_bytes, int splits, int per, cudaStream_t s) {
  constexpr ock::int4_rows::WgmmaTile tile = ock::int4_rows::kWgmmaTiles[I];
  return LaunchWgmma<T, tile.rows, tile.stages, tile.minb>(x, wq, scales, y, part, ldy, m, k, n, nb, row_bytes, splits,
                                                           per, s);
}

template <typename T>
int Launch(const void* x, const uint8_t* wq, const void* scales, void* y, float* part, int64_t ldy, int64_t m,
           int64_t k, int64_t n, int64_t nb, int64_t row_bytes, int bm, int splits, int per, cudaStream_t s) {
  static_assert(ock::int4_rows::kWgmmaTileCount == 4, "a tile per case below");
  const int i = ock::int4_rows::WgmmaTileFor(bm);
  if (ock::int4_rows::kWgmmaTiles[i].rows != bm) return ONNXFUSE_ERR_BAD_ARGUMENT;
  switch (i) {
    case 0:
      return LaunchTile<T, 0>(x, wq, scales, y, part, ldy, m, k, n, nb, row_bytes, splits, per, s);
    case 1:
      return LaunchTile<T, 1>(x, wq, scales, y, part, ldy, m, k, n, nb, row_bytes, splits, per, s);
    case 2:
      return LaunchTile<T, 2>(x, wq, scales, y, part, ldy, m, k, n, nb, row_bytes, splits, per, s);
    default:
      return LaunchTile<T, 3>(x, wq, scales, y, part, ldy, m, k, n, nb, row_bytes, splits, per, s);
  }
}

}  // namespace

// Y [m, ldy] (splits 1) or the fp32 partials part [splits][m][n] (splits > 1; the caller sums them) = X @ W^T for
// dtype fp16/bf16 X [m, k], packed symmetric weights [n, k / 2] in blocks of 32 with scales [n, nb]; bm 96, 128, 160
// or 192, K split in `splits` shares of `per` steps of 64. 0 or the CUDA error.
extern "C" int onnxfuse_sm90a_int4_rows_gemm(int dtype, const void* x, const uint8_t* wq, const void* scales, void* y,
                                             float* part, int64_t ldy, int64_t m, int64_t k, int64_t n, int64_t nb,
                                             int64_t row_bytes, int bm, int splits, int per, cudaStream_t s) {
  if (dtype == ONNXFUSE_FP16)
    return Launch<__half>(x, wq, scales, y, part, ldy, m, k, n, nb, row_bytes, bm, splits, per, s);
  if (dtype == ONNXFUSE_BF16)
    return Launch<__nv_bfloat16>(x, wq, scales, y, part, ldy, m, k, n, nb, row_bytes, bm, splits, per, s);
  return ONNXFUSE_ERR_BAD_ARGUMENT;
}
