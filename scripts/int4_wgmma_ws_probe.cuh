// Issue 28 probe (not the library's): the int4 rows path on sm_90a warpgroup MMAs, warp-specialised. A producer
// warpgroup copies each step's packed weights and X into a cp.async ring, dequantizes the weights ((q - 8) * s rounded
// once, in the wgmma's K order) into one of two A tiles in shared memory (128-byte swizzle), and signals the two
// consumer warpgroups by named barriers; they run both operands from shared memory (wgmma SS), a step's MMAs in flight
// while the next step's weights are dequantized. Included by scripts/int4_gemm_rows_probe.cu after
// cuda/sm90a/int4_rows_wgmma.cu's helpers are visible (WgmmaFence, WgmmaCommit, WgmmaWait, WgmmaDescSw128). sm_90a.
#pragma once

namespace ws_probe {

__device__ __forceinline__ void BarSync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void BarArrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

#define WS_D8(b)                                                                                              \
  "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3]), "+f"(d[b + 4]), "+f"(d[b + 5]), "+f"(d[b + 6]), \
      "+f"(d[b + 7])
#define WS_D48 WS_D8(0), WS_D8(8), WS_D8(16), WS_D8(24), WS_D8(32), WS_D8(40)
#define WS_D64 WS_D48, WS_D8(48), WS_D8(56)
template <int N>
__device__ __forceinline__ void WgmmaSS(float (&d)[N / 2], uint64_t da, uint64_t db);
template <>
__device__ __forceinline__ void WgmmaSS<96>(float (&d)[48], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, "
      "%14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1, 0, 0;\n}\n"
      : WS_D48
      : "l"(da), "l"(db), "r"(1));
}
template <>
__device__ __forceinline__ void WgmmaSS<128>(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
      "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
      "%57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : WS_D64
      : "l"(da), "l"(db), "r"(1));
}

// fp16, blocks of 32 (two scales a step). 384 threads: warpgroup 0 produces, 1 and 2 consume (64 columns each).
// Named barriers: 1 + b "A tile b full" (producer arrives, consumers sync), 3 + b "A tile b empty" (consumers arrive,
// producer syncs), 5 the producer's own.
template <int BM, int STAGES, bool SPLIT>
__global__ void __launch_bounds__(384)
    Int4WgmmaWs(const __half* __restrict__ x, const uint8_t* __restrict__ wq, const __half* __restrict__ scales,
                __half* __restrict__ y, float* __restrict__ part, int ldy, int m, int K, int N, int nb, int row_bytes,
                int per) {
  constexpr int X_BYTES = BM * 128, W_BYTES = 128 * 32, STAGE = X_BYTES + W_BYTES, A_BYTES = 128 * 128;
  extern __shared__ uint4 ws_smem_raw[];
  const uint32_t sraw = uint32_t(__cvta_generic_to_shared(ws_smem_raw));
  const uint32_t sbase = (sraw + 1023u) & ~1023u;
  char* sgen = reinterpret_cast<char*>(ws_smem_raw) + (sbase - sraw);
  const uint32_t abase = sbase + STAGES * STAGE;  // the two A tiles after the ring
  const int tid = threadIdx.x, wg = tid >> 7, t128 = tid & 127;
  const int n0 = blockIdx.x * 128, m0 = blockIdx.y * BM;
  const int s_begin = blockIdx.z * per, s_end = min(K >> 6, s_begin + per);
  if (wg == 0) {  // the producer
    const int col = n0 + t128, colc = min(col, N - 1);
    auto issue = [&](int step) {
      if (step < s_end) {
        const uint32_t st = sbase + (step % STAGES) * STAGE;
        const bool ok = col < N;
        ock::CpAsync16(st + X_BYTES + t128 * 32, wq + int64_t(ok ? col : 0) * row_bytes + step * 32, ok);
        ock::CpAsync16(st + X_BYTES + t128 * 32 + 16, wq + int64_t(ok ? col : 0) * row_bytes + step * 32 + 16, ok);
        for (int id = t128; id < BM * 8; id += 128) {
          const int r = id >> 3, q = id & 7, row = m0 + r;
          const bool rok = row < m;
          ock::CpAsync16(st + r * 128 + 16 * (q ^ (r & 7)), x + int64_t(rok ? row : 0) * K + step * 64 + 8 * q, rok);
        }
      }
      ock::CpAsyncCommit();
    };
    for (int i = 0; i < STAGES - 2; ++i) issue(s_begin + i);
    const __half* srow = scales + int64_t(colc) * nb;
    uint32_t sc = s_begin < s_end ? __ldg(reinterpret_cast<const uint32_t*>(srow + 2 * s_begin)) : 0u;
    for (int step = s_begin; step < s_end; ++step) {
      const int b = step & 1;
      ock::CpAsyncWait<STAGES - 3>();
      BarSync(5, 128);  // every producer thread's copies of the step landed
      const uint32_t sn = step + 1 < s_end ? __ldg(reinterpret_cast<const uint32_t*>(srow + 2 * (step + 1))) : 0u;
      if (step - 2 >= s_begin) BarSync(3 + b, 384);  // the consumers are done with step - 2 (tile b, its stage)
      issue(step + STAGES - 2);                      // into step - 2's stage
      const char* st = sgen + (step % STAGES) * STAGE + X_BYTES;
      const uint4 w0 = *reinterpret_cast<const uint4*>(st + t128 * 32);
      const uint4 w1 = *reinterpret_cast<const uint4*>(st + t128 * 32 + 16);
      const uint32_t words[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
      const __half2 s0 = __half2half2(reinterpret_cast<const __half*>(&sc)[0]),
                    s1 = __half2half2(reinterpret_cast<const __half*>(&sc)[1]);
      char* at = sgen + (abase - sbase) + b * A_BYTES + t128 * 128;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        __half2 h[4];
        CentredHalf2(words[j], h, 8);  // (k0, k4), (k1, k5), (k2, k6), (k3, k7), exactly
        const __half2 s2 = j < 4 ? s0 : s1;
        uint32_t d[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const __half2 v = __hmul2(h[i], s2);
          d[i] = *reinterpret_cast<const uint32_t*>(&v);
        }
        *reinterpret_cast<uint4*>(at + 16 * (j ^ (t128 & 7))) =
            make_uint4(__byte_perm(d[0], d[1], 0x5410), __byte_perm(d[2], d[3], 0x5410),
                       __byte_perm(d[0], d[1], 0x7632), __byte_perm(d[2], d[3], 0x7632));
      }
      FenceProxyAsync();
      BarArrive(1 + b, 384);
      sc = sn;
    }
    for (int step = max(s_begin, s_end - 2); step < s_end; ++step) BarSync(3 + (step & 1), 384);  // the last two
    ock::CpAsyncWait<0>();
    return;
  }
  // the consumers: warpgroup c = wg - 1 takes the tile's columns 64 c .. 64 c + 63
  const int c = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
  float acc[BM / 2];
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) acc[i] = 0.f;
  for (int step = s_begin; step < s_end; ++step) {
    const int b = step & 1;
    BarSync(1 + b, 384);
    const uint32_t xs = sbase + (step % STAGES) * STAGE, as = abase + b * A_BYTES + c * 64 * 128;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) WgmmaSS<BM>(acc, WgmmaDescSw128(as + 32 * kk), WgmmaDescSw128(xs + 32 * kk));
    WgmmaCommit();
    WgmmaWait<1>();
    if (step > s_begin) BarArrive(3 + ((step - 1) & 1), 384);  // step - 1's MMAs are done
  }
  WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < BM / 2; ++i) FenceOperand(acc[i]);
  if (s_end > s_begin) BarArrive(3 + ((s_end - 1) & 1), 384);
  StoreAcc<__half, BM, SPLIT>(acc, y, part, ldy, m, N, n0 + 64 * c + 16 * warp + g, m0, t);
}
#undef WS_D64
#undef WS_D48
#undef WS_D8

}  // namespace ws_probe
