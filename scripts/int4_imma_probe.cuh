// Issue 28, a probe form (not in the library): int4 decode at 2-8 rows for a node of accuracy_level 4 on the int8
// tensor cores. X rounded to int8 once per call (QuantizeXI8: per row and 32-value unit, sx = max |x| / 127, as
// Int4RowGemvI8 rounds it), laid out so that lane t of a quad reads its 8 values of each unit of a 128-value step as
// two words (the even values' bytes, the odd values'), with (sx, 8 sum(q) sx) a unit; then Int4MmaFast's tiles, ring
// and K order, each unit one mma.m16n8k32 of the raw nibbles (u8, 0..15: the even values' low nibbles and the odd
// values' high nibbles, two lop3 and a shift a word pair) against the int8 X (s8), the int32 sums taken to fp32 as
// s (acc sx - 8 sum(q) sx). Included by scripts/int4_decode_probe.cu after cuda/int4_linear.cu.
#pragma once

// xq: words [m][steps][4 lanes][8]: lane t's words 2i, 2i + 1 the even and odd values' bytes of its 8 values
// (8t .. 8t + 7) of unit i of the step; xs [m][units]: (sx, 8 sum(q) sx). A thread a (row, unit).
__global__ void QuantizeXI8(const __half* __restrict__ x, int m, int K, uint32_t* __restrict__ xq,
                            float2* __restrict__ xs) {
  const int units = K / 32;
  const int id = blockIdx.x * blockDim.x + threadIdx.x;
  if (id >= m * units) return;
  const int row = id / units, u = id - row * units;
  const uint4* src = reinterpret_cast<const uint4*>(x + int64_t(row) * K + 32 * u);
  uint4 v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = __ldg(src + j);
  uint32_t mb = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    mb = __vmaxu2(mb, v[j].x & 0x7FFF7FFFu);
    mb = __vmaxu2(mb, v[j].y & 0x7FFF7FFFu);
    mb = __vmaxu2(mb, v[j].z & 0x7FFF7FFFu);
    mb = __vmaxu2(mb, v[j].w & 0x7FFF7FFFu);
  }
  const float mx = __half2float(__ushort_as_half(uint16_t(max(mb & 0xFFFFu, mb >> 16))));
  const float inv = mx > 0.f ? 127.f / mx : 0.f;
  const int step = u >> 2, i = u & 3;
  uint32_t* dst = xq + ((int64_t(row) * (K / 128) + step) * 4) * 8;
  int sum = 0;
#pragma unroll
  for (int t = 0; t < 4; ++t) {  // lane t's 8 values: v[t] (values 8t .. 8t + 7)
    const __half2* p = reinterpret_cast<const __half2*>(&v[t]);
    uint32_t e = 0, o = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 f = __half22float2(p[k]);
      const int a = __float2int_rn(f.x * inv), b = __float2int_rn(f.y * inv);
      sum += a + b;
      e |= uint32_t(a & 0xFF) << (8 * k);
      o |= uint32_t(b & 0xFF) << (8 * k);
    }
    dst[t * 8 + 2 * i] = e;
    dst[t * 8 + 2 * i + 1] = o;
  }
  const float sx = mx / 127.f;
  xs[int64_t(row) * units + u] = make_float2(sx, 8.f * float(sum) * sx);
}

__device__ __forceinline__ void MmaU8S8(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

constexpr int kMagic = 0x4B400000;

// m <= 8; K a multiple of 128, blocks of 32 or more (SPS as Int4MmaFast's), no zero points, fp16.
template <int WARPS, bool GATED, int STAGES, int SPS>
__global__ void __launch_bounds__(WARPS * 32, 32 / WARPS)
    Int4ImmaProbe(const uint32_t* __restrict__ xq, const float2* __restrict__ xsc, const uint8_t* __restrict__ wq,
                  const __half* __restrict__ scales, const uint8_t* __restrict__ wq_up,
                  const __half* __restrict__ scales_up, int act, __half* __restrict__ y, int m, int K, int N, int nb,
                  int lb) {
  extern __shared__ uint4 mma_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int sstride = MmaScaleStride(nb, 2);
  __half* ssm = reinterpret_cast<__half*>(mma_smem + WARPS * STAGES * 64);
  const int n0 = blockIdx.x * (GATED ? 8 : 16);
  auto col_of = [&](int r) {
    const int col = GATED ? n0 + (r & 7) : n0 + r;
    return col < N ? col : N - 1;
  };
  const int row_bytes = K >> 1, units = K >> 5;
  for (int r = warp; r < 16; r += WARPS) {
    const __half* src = (GATED && r >= 8 ? scales_up : scales) + int64_t(col_of(r)) * nb;
    __half* dst = ssm + r * sstride;
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
    if (issued < s_end) {
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
  CpAsyncWait<STAGES - 1>();
  __syncthreads();
  ock::PdlWait();
  ock::PdlTrigger();
  const bool live = g < m;  // this lane's X row (the B fragment's column)
  const uint4* xp = reinterpret_cast<const uint4*>(xq + ((int64_t(live ? g : 0) * steps + s_begin) * 4 + t) * 8);
  const int r0 = min(2 * t, m - 1), r1 = min(2 * t + 1, m - 1);  // the C fragment's X rows (past m: never stored)
  const float4* sc0 = reinterpret_cast<const float4*>(xsc + int64_t(r0) * units + 4 * s_begin);
  const float4* sc1 = reinterpret_cast<const float4*>(xsc + int64_t(r1) * units + 4 * s_begin);
  const __half* sp0 = ssm + g * sstride;
  const __half* sp1 = ssm + (g + 8) * sstride;
  float acc[1][4] = {};
  uint32_t rst = 0;
  for (int step = s_begin; step < s_end; ++step) {
    CpAsyncWait<STAGES - 2>();
    uint32_t w[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) w[j][i] = LdShared32(rbase + rst + 512 * j + roff[i]);
    rst = rst + 1024 == STAGES * 1024 ? 0 : rst + 1024;
    issue();
    uint4 b[2];
    b[0] = live ? __ldg(xp) : make_uint4(0u, 0u, 0u, 0u);
    b[1] = live ? __ldg(xp + 1) : make_uint4(0u, 0u, 0u, 0u);
    xp += 8;  // the next step: 4 lanes x 8 words on
    const uint32_t bw[8] = {b[0].x, b[0].y, b[0].z, b[0].w, b[1].x, b[1].y, b[1].z, b[1].w};
    float4 q0[2], q1[2];  // units 0-1, 2-3 of X rows r0 and r1: (sx, c) pairs
    q0[0] = __ldg(sc0), q0[1] = __ldg(sc0 + 1), q1[0] = __ldg(sc1), q1[1] = __ldg(sc1 + 1);
    sc0 += 2;
    sc1 += 2;
    const float px0[4] = {q0[0].x, q0[0].z, q0[1].x, q0[1].z}, cx0[4] = {q0[0].y, q0[0].w, q0[1].y, q0[1].w};
    const float px1[4] = {q1[0].x, q1[0].z, q1[1].x, q1[1].z}, cx1[4] = {q1[0].y, q1[0].w, q1[1].y, q1[1].w};
    __half s[2][SPS];
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
      const uint32_t a[4] = {w[0][i] & 0x0F0F0F0Fu, w[1][i] & 0x0F0F0F0Fu, (w[0][i] >> 4) & 0x0F0F0F0Fu,
                             (w[1][i] >> 4) & 0x0F0F0F0Fu};
      // the sums start at 0x4B400000, the float 2^23 + 2^22: the int32 sum (|sum| < 2^22) lands in the mantissa, so
      // the float is one subtraction away (no I2F: sm_90 converts at a quarter of the FMA rate)
      int d[4] = {kMagic, kMagic, kMagic, kMagic};
      MmaU8S8(d, a, bw[2 * i], bw[2 * i + 1]);
      const float s0 = __half2float(s[0][si]), s1 = __half2float(s[1][si]);
      float f[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) f[e] = __int_as_float(d[e]) - 12582912.f;
      acc[0][0] = fmaf(s0, fmaf(f[0], px0[i], -cx0[i]), acc[0][0]);
      acc[0][1] = fmaf(s0, fmaf(f[1], px1[i], -cx1[i]), acc[0][1]);
      acc[0][2] = fmaf(s1, fmaf(f[2], px0[i], -cx0[i]), acc[0][2]);
      acc[0][3] = fmaf(s1, fmaf(f[3], px1[i], -cx1[i]), acc[0][3]);
    }
  }
  CpAsyncWait<0>();
  MmaStoreTile<__half, WARPS, GATED, 1, STAGES>(mma_smem, acc, act, y, m, N, n0);
}

// The probe's launch: QuantizeXI8 (unless `quantized`: X's int8 form for (x, m, K) made on an earlier call), then
// Int4ImmaProbe with Int4MmaFast's warps a block.
inline int LaunchImmaProbe(const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n,
                           cudaStream_t s, bool quantize_each_call) {
  struct Slot {
    const void* x = nullptr;
    int64_t m = 0, k = 0;
    uint32_t* xq = nullptr;
    float2* xs = nullptr;
  };
  static Slot slots[16];
  Slot* slot = nullptr;
  for (auto& sl : slots)
    if (sl.x == x && sl.m == m && sl.k == k) slot = &sl;
  bool fresh = false;
  if (slot == nullptr) {
    for (auto& sl : slots)
      if (sl.x == nullptr) {
        slot = &sl;
        break;
      }
    if (slot == nullptr) slot = &slots[0];
    if (slot->xq == nullptr) {
      cudaMalloc(&slot->xq, 16 * 16384);
      cudaMalloc(&slot->xs, 16 * 512 * sizeof(float2));
    }
    slot->x = x, slot->m = m, slot->k = k;
    fresh = true;
  }
  if (fresh || quantize_each_call) {
    const int threads = int(m * (k / 32));
    QuantizeXI8<<<(threads + 127) / 128, 128, 0, s>>>(static_cast<const __half*>(x), int(m), int(k), slot->xq,
                                                      slot->xs);
  }
  const bool gated = wt.wq_up != nullptr;
  const unsigned blocks = unsigned((n + (gated ? 8 : 16) - 1) / (gated ? 8 : 16));
  const int warps = MmaWarps(blocks, m, 0);
  auto go = [&](auto kernel, int bw) {
    return LaunchMmaKernel(kernel, blocks, bw, MmaSmem<__half, false>(wt, bw), s, slot->xq, slot->xs, wt.wq,
                           static_cast<const __half*>(wt.scales), wt.wq_up, static_cast<const __half*>(wt.scales_up), 0,
                           static_cast<__half*>(y), int(m), int(k), int(n), int(wt.nb), wt.lb);
  };
  auto by = [&](auto wtag) {
    constexpr int W = decltype(wtag)::value;
    if (gated) {
      if (wt.lb == 5) return go(Int4ImmaProbe<W, true, kMmaStages, 4>, W);
      if (wt.lb == 6) return go(Int4ImmaProbe<W, true, kMmaStages, 2>, W);
      return go(Int4ImmaProbe<W, true, kMmaStages, 1>, W);
    }
    if (wt.lb == 5) return go(Int4ImmaProbe<W, false, kMmaStages, 4>, W);
    if (wt.lb == 6) return go(Int4ImmaProbe<W, false, kMmaStages, 2>, W);
    return go(Int4ImmaProbe<W, false, kMmaStages, 1>, W);
  };
  if (warps == 16) return by(std::integral_constant<int, 16>{});
  if (warps == 4) return by(std::integral_constant<int, 4>{});
  return by(std::integral_constant<int, 8>{});
}

// The same with X's int8 words and its (sx, 8 sum(q) sx) pairs streamed into the weights' ring by cp.async (each a
// step's: 8 rows x 128 bytes and 8 rows x 32 bytes after the weights' 1 KB), the X part requested only after the
// programmatic wait; two stages; MINB blocks an SM (the registers a thread: 64 K / (32 WARPS MINB)).
constexpr int kImmaStage = 2304;
template <int WARPS, bool GATED, int SPS, int MINB>
__global__ void __launch_bounds__(WARPS * 32, MINB)
    Int4ImmaRing(const uint32_t* __restrict__ xq, const float2* __restrict__ xsc, const uint8_t* __restrict__ wq,
                 const __half* __restrict__ scales, const uint8_t* __restrict__ wq_up,
                 const __half* __restrict__ scales_up, int act, __half* __restrict__ y, int m, int K, int N, int nb,
                 int lb) {
  constexpr int STAGES = 2;
  extern __shared__ uint4 mma_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int sstride = MmaScaleStride(nb, 2);
  __half* ssm = reinterpret_cast<__half*>(reinterpret_cast<char*>(mma_smem) + WARPS * STAGES * kImmaStage);
  const int n0 = blockIdx.x * (GATED ? 8 : 16);
  auto col_of = [&](int r) {
    const int col = GATED ? n0 + (r & 7) : n0 + r;
    return col < N ? col : N - 1;
  };
  const int row_bytes = K >> 1, units = K >> 5;
  for (int r = warp; r < 16; r += WARPS) {
    const __half* src = (GATED && r >= 8 ? scales_up : scales) + int64_t(col_of(r)) * nb;
    __half* dst = ssm + r * sstride;
    for (int e = lane; e < nb / 8; e += 32) CpAsync16(dst + 8 * e, src + 8 * e, true);
  }
  CpAsyncCommit();
  const int steps = K >> 7, per = (steps + WARPS - 1) / WARPS;
  const int s_begin = min(steps, warp * per), s_end = min(steps, s_begin + per);
  const int swz = g >> 1;
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(mma_smem)) + warp * STAGES * kImmaStage;
  const uint32_t wslot = ring + 16 * (4 * g + ((t + swz) & 3)), rbase = ring + 64 * g + 4 * t;
  uint32_t roff[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) roff[i] = 16 * ((i + swz) & 3);
  const uint8_t* src0 = wq + int64_t(col_of(g)) * row_bytes + 64 * s_begin + 16 * t;
  const uint8_t* src1 = (GATED ? wq_up : wq) + int64_t(col_of(8 + g)) * row_bytes + 64 * s_begin + 16 * t;
  // this lane's X copies: chunks lane and lane + 32 of a step's 64 (row c / 8, 16 bytes c % 8), and (lanes 0-15)
  // chunk lane of the pairs' 16 (row lane / 2, half lane % 2)
  const int xr0 = lane >> 3, xr1 = 4 + (lane >> 3), sr = lane >> 1;
  const uint32_t* xs0 = xq + (int64_t(min(xr0, m - 1)) * steps + s_begin) * 32 + (lane & 7) * 4;
  const uint32_t* xs1 = xq + (int64_t(min(xr1, m - 1)) * steps + s_begin) * 32 + (lane & 7) * 4;
  const float2* ps = xsc + int64_t(min(sr, m - 1)) * units + 4 * s_begin + 2 * (lane & 1);
  const bool xl0 = xr0 < m, xl1 = xr1 < m, sl = lane < 16 && sr < m;
  const uint32_t xd0 = 1024 + xr0 * 128 + (lane & 7) * 16, xd1 = 1024 + xr1 * 128 + (lane & 7) * 16;
  const uint32_t sd = 2048 + (sr & 7) * 32 + (lane & 1) * 16;
  int wi = s_begin, xi = s_begin;  // the next step whose weights, whose X, to request
  auto issue_w = [&](uint32_t st) {
    if (wi < s_end) {
      CpAsync16(wslot + st, src0, true);
      CpAsync16(wslot + st + 512, src1, true);
    }
    src0 += 64;
    src1 += 64;
    ++wi;
  };
  auto issue_x = [&](uint32_t st) {
    if (xi < s_end) {
      CpAsync16(ring + st + xd0, xs0, xl0);
      CpAsync16(ring + st + xd1, xs1, xl1);
      if (lane < 16) CpAsync16(ring + st + sd, ps, sl);
    }
    xs0 += 32;
    xs1 += 32;
    ps += 4;
    ++xi;
  };
  issue_w(0);
  CpAsyncCommit();
  CpAsyncWait<1>();  // the scales
  __syncthreads();
  ock::PdlWait();
  ock::PdlTrigger();
  issue_x(0);
  CpAsyncCommit();
  const __half* sp0 = ssm + g * sstride;
  const __half* sp1 = ssm + (g + 8) * sstride;
  float acc[1][4] = {};
  uint32_t rst = 0;
  for (int step = s_begin; step < s_end; ++step) {
    CpAsyncWait<0>();
    uint32_t w[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) w[j][i] = LdShared32(rbase + rst + 512 * j + roff[i]);
    uint32_t bw[8];
    float4 q0[2], q1[2];
    {
      const uint32_t xa = ring + rst + 1024 + g * 128 + t * 32;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(bw[0]), "=r"(bw[1]), "=r"(bw[2]), "=r"(bw[3])
                   : "r"(xa));
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(bw[4]), "=r"(bw[5]), "=r"(bw[6]), "=r"(bw[7])
                   : "r"(xa + 16));
      const uint32_t sa = ring + rst + 2048 + (2 * t) * 32;
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(q0[0].x), "=f"(q0[0].y), "=f"(q0[0].z), "=f"(q0[0].w)
                   : "r"(sa));
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(q0[1].x), "=f"(q0[1].y), "=f"(q0[1].z), "=f"(q0[1].w)
                   : "r"(sa + 16));
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(q1[0].x), "=f"(q1[0].y), "=f"(q1[0].z), "=f"(q1[0].w)
                   : "r"(sa + 32));
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(q1[1].x), "=f"(q1[1].y), "=f"(q1[1].z), "=f"(q1[1].w)
                   : "r"(sa + 48));
    }
    const uint32_t nst = rst + kImmaStage == STAGES * kImmaStage ? 0 : rst + kImmaStage;
    issue_w(nst);
    issue_x(nst);
    CpAsyncCommit();
    rst = nst;
    const float px0[4] = {q0[0].x, q0[0].z, q0[1].x, q0[1].z}, cx0[4] = {q0[0].y, q0[0].w, q0[1].y, q0[1].w};
    const float px1[4] = {q1[0].x, q1[0].z, q1[1].x, q1[1].z}, cx1[4] = {q1[0].y, q1[0].w, q1[1].y, q1[1].w};
    __half s[2][SPS];
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
      const uint32_t a[4] = {w[0][i] & 0x0F0F0F0Fu, w[1][i] & 0x0F0F0F0Fu, (w[0][i] >> 4) & 0x0F0F0F0Fu,
                             (w[1][i] >> 4) & 0x0F0F0F0Fu};
      int d[4] = {kMagic, kMagic, kMagic, kMagic};
      MmaU8S8(d, a, bw[2 * i], bw[2 * i + 1]);
      const float s0 = __half2float(s[0][si]), s1 = __half2float(s[1][si]);
      float f[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) f[e] = __int_as_float(d[e]) - 12582912.f;
      acc[0][0] = fmaf(s0, fmaf(f[0], px0[i], -cx0[i]), acc[0][0]);
      acc[0][1] = fmaf(s0, fmaf(f[1], px1[i], -cx1[i]), acc[0][1]);
      acc[0][2] = fmaf(s1, fmaf(f[2], px0[i], -cx0[i]), acc[0][2]);
      acc[0][3] = fmaf(s1, fmaf(f[3], px1[i], -cx1[i]), acc[0][3]);
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // MmaStoreTile's partial slots are laid out for 1 KB stages: every warp out of its ring first
  MmaStoreTile<__half, WARPS, GATED, 1, STAGES>(mma_smem, acc, act, y, m, N, n0);
}

template <int MINB_SCALE>
inline int LaunchImmaRing(const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n,
                          cudaStream_t s) {
  struct Slot {
    const void* x = nullptr;
    int64_t m = 0, k = 0;
    uint32_t* xq = nullptr;
    float2* xs = nullptr;
  };
  static Slot slots[16];
  Slot* slot = nullptr;
  for (auto& sl : slots)
    if (sl.x == x && sl.m == m && sl.k == k) slot = &sl;
  if (slot == nullptr) {
    for (auto& sl : slots)
      if (sl.x == nullptr) {
        slot = &sl;
        break;
      }
    if (slot == nullptr) slot = &slots[0];
    if (slot->xq == nullptr) {
      cudaMalloc(&slot->xq, 16 * 16384);
      cudaMalloc(&slot->xs, 16 * 512 * sizeof(float2));
    }
    slot->x = x, slot->m = m, slot->k = k;
    const int threads = int(m * (k / 32));
    QuantizeXI8<<<(threads + 127) / 128, 128, 0, s>>>(static_cast<const __half*>(x), int(m), int(k), slot->xq,
                                                      slot->xs);
  }
  const bool gated = wt.wq_up != nullptr;
  const unsigned blocks = unsigned((n + (gated ? 8 : 16) - 1) / (gated ? 8 : 16));
  const int warps = MmaWarps(blocks, m, 0);
  auto go = [&](auto kernel, int bw) {
    const size_t smem = size_t(bw) * 2 * kImmaStage + 16 * size_t(MmaScaleStride(int(wt.nb), 2)) * 2;
    return LaunchMmaKernel(kernel, blocks, bw, smem, s, slot->xq, slot->xs, wt.wq,
                           static_cast<const __half*>(wt.scales), wt.wq_up, static_cast<const __half*>(wt.scales_up), 0,
                           static_cast<__half*>(y), int(m), int(k), int(n), int(wt.nb), wt.lb);
  };
  auto by = [&](auto wtag) {
    constexpr int W = decltype(wtag)::value, MB = 32 / W / MINB_SCALE > 0 ? 32 / W / MINB_SCALE : 1;
    if (gated) {
      if (wt.lb == 5) return go(Int4ImmaRing<W, true, 4, MB>, W);
      if (wt.lb == 6) return go(Int4ImmaRing<W, true, 2, MB>, W);
      return go(Int4ImmaRing<W, true, 1, MB>, W);
    }
    if (wt.lb == 5) return go(Int4ImmaRing<W, false, 4, MB>, W);
    if (wt.lb == 6) return go(Int4ImmaRing<W, false, 2, MB>, W);
    return go(Int4ImmaRing<W, false, 1, MB>, W);
  };
  if (warps == 16) return by(std::integral_constant<int, 16>{});
  if (warps == 4) return by(std::integral_constant<int, 4>{});
  return by(std::integral_constant<int, 8>{});
}
