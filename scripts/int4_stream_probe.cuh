// Issue 28, batch-8 int4 decode: a streaming form of the tensor-core decode kernel (Int4MmaFast's tiles, K order and
// arithmetic), probed by scripts/int4_stream_probe.cu. Included after cuda/int4_linear.cu.
//
// Int4MmaFast runs a block per 16-column tile with its warps splitting K: a 7B qkv projection at 8 warps a block is
// 4 steps of 1 KB a warp, and Nsight Compute put 31 % of its executed instructions in the once-a-block prologue
// (the tile's scales, the check for large scales) and end (the partial tiles' sum) (README, "The tensor-core decode
// kernel's common form"). A form that ran blocks across contiguous shares of tiles with a barrier a tile was slower
// (decode-probe-share-not-kept.txt). This one has no barrier until the end:
// - the grid is the resident blocks (32 warps an SM); block b takes `tpb` consecutive tiles, and each of its warps a
//   contiguous range of the block's (tile, step) pairs, so a warp's cp.async ring runs across tile boundaries;
// - a step's 16 rows of scales ride in the ring beside its weights (lanes 0-15 a copy each), and a warp checks them
//   for large values a step (a vote: the step runs Int4Mma's exact dequantization where one is past kBig);
// - where a warp's range leaves a tile it puts its partial tile in its own slot of shared memory (slot tile + warp:
//   the ranges are contiguous, so a tile's slots are distinct and in K order); after one barrier the block sums each
//   tile's slots in warp order and writes Y (act(gate) * up for Int4SwiGLU).
#pragma once

namespace stream_probe {

__device__ __forceinline__ void CpAsync4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ uint2 LdShared64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

constexpr int kStage = 1152;  // a warp's ring slot: 1024 bytes of weights (16 A rows x 64), 16 rows' scales (8 each)

// a lane's words past kBig (or Inf/NaN) in either half: (|v| + (0x7FFF - kBig)) reaches bit 15
template <typename T>
__device__ __forceinline__ uint32_t BigBits(uint32_t w) {
  constexpr uint32_t add = (0x7FFFu - Centred4<T>::kBig) * 0x10001u;
  return ((w & 0x7FFF7FFFu) + add) & 0x80008000u;
}

template <typename T, int W, bool GATED, bool ROWS16, int STAGES, int SPS>
__global__ void __launch_bounds__(W * 32, ((ROWS16 ? 16 : 32) / W) > 0 ? (ROWS16 ? 16 : 32) / W : 1)
    Int4MmaStream(const T* __restrict__ x, const uint8_t* __restrict__ wq, const T* __restrict__ scales,
                  const uint8_t* __restrict__ wq_up, const T* __restrict__ scales_up, int act, T* __restrict__ y, int m,
                  int K, int N, int nb, int lb, int tiles, int tpb) {
  constexpr int RS = ROWS16 ? 2 : 1, COLS = GATED ? 8 : 16, OUT = RS * (GATED ? 64 : 128);
  extern __shared__ uint4 stream_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile0 = blockIdx.x * tpb, nt = min(tpb, tiles - tile0);
  const int S = K >> 7, L = nt * S, per = (L + W - 1) / W;
  const int u_begin = min(L, warp * per), u_end = min(L, u_begin + per);
  const int row_bytes = K >> 1;
  const uint32_t base = uint32_t(__cvta_generic_to_shared(stream_smem));
  const uint32_t ring = base + warp * STAGES * kStage;
  float* slots = reinterpret_cast<float*>(reinterpret_cast<char*>(stream_smem) + W * STAGES * kStage);
  const int swz = g >> 1;
  const uint32_t wslot = ring + 16 * (4 * g + ((t + swz) & 3)), rbase = ring + 64 * g + 4 * t;
  uint32_t roff[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) roff[i] = 16 * ((i + swz) & 3);
  constexpr int SB = SPS == 4 ? 8 : 4;  // scale bytes a row a step in the slot
  const int srow = lane & 15;
  auto col_of = [&](int n0, int r) {
    const int col = GATED ? n0 + (r & 7) : n0 + r;
    return col < N ? col : N - 1;
  };
  // the copy side: linear step iu of the warp's range, tile it (of the block), step is of the tile
  int iu = u_begin, it = S > 0 ? u_begin / S : 0, is = u_begin - it * S;
  const uint8_t *src0 = wq, *src1 = wq;
  const T* ssrc = scales;
  auto set_tile = [&](int tl) {
    const int n0 = (tile0 + tl) * COLS;
    src0 = wq + int64_t(col_of(n0, g)) * row_bytes + 16 * t;
    src1 = (GATED ? wq_up : wq) + int64_t(col_of(n0, 8 + g)) * row_bytes + 16 * t;
    ssrc = (GATED && srow >= 8 ? scales_up : scales) + int64_t(col_of(n0, srow)) * nb;
  };
  if (u_begin < u_end) set_tile(it);
  uint32_t wst = 0;
  auto issue = [&] {
    if (iu < u_end) {  // uniform across the warp
      CpAsync16(wslot + wst, src0 + 64 * is, true);
      CpAsync16(wslot + wst + 512, src1 + 64 * is, true);
      if (lane < 16) {
        const uint32_t sdst = ring + wst + 1024 + SB * lane;
        if constexpr (SPS == 4) {
          CpAsync8(sdst, ssrc + 4 * is, true);
        } else if constexpr (SPS == 2) {
          CpAsync4(sdst, ssrc + 2 * is);
        } else {
          CpAsync4(sdst, ssrc + (((128 * is) >> lb) & ~1));
        }
      }
      ++iu;
      if (++is == S) {
        is = 0;
        ++it;
        if (iu < u_end) set_tile(it);
      }
    }
    wst = wst + kStage == STAGES * kStage ? 0 : wst + kStage;
    CpAsyncCommit();
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) issue();  // weights and scales are constants: before the wait
  ock::PdlWait();
  ock::PdlTrigger();
  const bool row0 = g < m, row1 = ROWS16 && g + 8 < m;
  const T* xr0 = x + int64_t(row0 ? g : 0) * K + 8 * t;
  const T* xr1 = x + int64_t(row1 ? g + 8 : 0) * K + 8 * t;
  float acc[RS][4] = {};
  uint32_t rst = 0;
  int ct = S > 0 ? u_begin / S : 0, cs = u_begin - ct * S;
  for (int u = u_begin; u < u_end; ++u) {
    uint32_t xs[RS][4][4];
#pragma unroll
    for (int r = 0; r < RS; ++r) {
      const T* xp = (r == 0 ? xr0 : xr1) + 128 * cs;
      const bool live = r == 0 ? row0 : row1;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint4 v = live ? __ldg(reinterpret_cast<const uint4*>(xp + 32 * i)) : make_uint4(0u, 0u, 0u, 0u);
        xs[r][i][0] = __byte_perm(v.x, v.z, 0x5410);
        xs[r][i][1] = __byte_perm(v.x, v.z, 0x7632);
        xs[r][i][2] = __byte_perm(v.y, v.w, 0x5410);
        xs[r][i][3] = __byte_perm(v.y, v.w, 0x7632);
      }
    }
    CpAsyncWait<STAGES - 2>();
    __syncwarp();
    uint32_t w[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) w[j][i] = LdShared32(rbase + rst + 512 * j + roff[i]);
    uint32_t sw[2][2];  // rows g and g + 8: SPS = 4 two words, else one (SPS 1: the pair holding the step's scale)
    if constexpr (SPS == 4) {
      const uint2 a = LdShared64(ring + rst + 1024 + 8 * g), b = LdShared64(ring + rst + 1024 + 8 * (g + 8));
      sw[0][0] = a.x, sw[0][1] = a.y, sw[1][0] = b.x, sw[1][1] = b.y;
    } else {
      sw[0][0] = LdShared32(ring + rst + 1024 + 4 * g), sw[1][0] = LdShared32(ring + rst + 1024 + 4 * (g + 8));
      sw[0][1] = sw[0][0], sw[1][1] = sw[1][0];
    }
    rst = rst + kStage == STAGES * kStage ? 0 : rst + kStage;
    __syncwarp();  // every lane's reads of the slot before any lane's copy into the slot read a step before
    issue();
    const bool exact = __any_sync(
        0xFFFFFFFFu, (BigBits<T>(sw[0][0]) | BigBits<T>(sw[0][1]) | BigBits<T>(sw[1][0]) | BigBits<T>(sw[1][1])) != 0u);
    const int half = SPS == 1 ? ((128 * cs) >> lb) & 1 : 0;
    auto scale = [&](int j, int i) -> T {  // row j's scale of word i
      const uint32_t v = SPS == 4 ? sw[j][i >> 1] : sw[j][0];
      const int h = SPS == 4 ? (i & 1) : SPS == 2 ? (i >> 1) : half;
      const uint16_t b = uint16_t(h ? v >> 16 : v & 0xFFFFu);
      return *reinterpret_cast<const T*>(&b);
    };
    if (exact) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t d[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j) MmaDequant<T>::Dequant(w[j][i], scale(j, i), 8, d[j]);
#pragma unroll
        for (int r = 0; r < RS; ++r) {
          ock::MmaSync<T>(acc[r], {d[0][0], d[1][0], d[0][1], d[1][1]}, xs[r][i][0], xs[r][i][1]);
          ock::MmaSync<T>(acc[r], {d[0][2], d[1][2], d[0][3], d[1][3]}, xs[r][i][2], xs[r][i][3]);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        uint32_t d[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j) Centred4<T>::Get(w[j][i], d[j]);
        const float s0 = ock::to_f(scale(0, i)), s1 = ock::to_f(scale(1, i));
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
    if (cs == S - 1 || u == u_end - 1) {  // the warp leaves tile ct: its partial into slot ct + warp
      float* slot = slots + (ct + warp) * (RS * 128);
#pragma unroll
      for (int r = 0; r < RS; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          slot[(r * 4 + e) * 32 + lane] = acc[r][e];
          acc[r][e] = 0.f;
        }
    }
    if (++cs == S) cs = 0, ++ct;
  }
  CpAsyncWait<0>();
  __syncthreads();
  // each tile's slots summed in warp order (K order), one output a thread; the fragment map as MmaStoreTile's
  for (int o = threadIdx.x; o < nt * OUT; o += W * 32) {
    const int tl = o / OUT, q = o - tl * OUT;
    const int r = GATED ? q >> 6 : q >> 7, e = GATED ? (q >> 5) & 1 : (q >> 5) & 3, l = q & 31;
    const int row = 8 * r + 2 * (l & 3) + (e & 1);
    const int col = (tile0 + tl) * COLS + (l >> 2) + (!GATED && e >= 2 ? 8 : 0);
    if (row >= m || col >= N) continue;
    const int wf = (tl * S) / per, wl = ((tl + 1) * S - 1) / per;
    float v = 0.f, uu = 0.f;
    for (int ww = wf; ww <= wl; ++ww) {
      const float* slot = slots + (tl + ww) * (RS * 128) + r * 128;
      v += slot[e * 32 + l];
      if (GATED) uu += slot[(e + 2) * 32 + l];
    }
    y[int64_t(row) * N + col] = ock::from_f<T>(GATED ? onnxfuse::GateActivation(act, v) * uu : v);
  }
}

// shared memory of a block: the warps' rings, then (tpb + W) partial tiles
template <bool ROWS16>
size_t StreamSmem(int w, int stages, int tpb) {
  return size_t(w) * stages * kStage + size_t(tpb + w) * (ROWS16 ? 2 : 1) * 128 * sizeof(float);
}

// The launch: blocks_per_sm blocks an SM (the kernel's W warps each), tiles split evenly into consecutive shares.
template <typename T, int W, bool GATED, int STAGES>
int LaunchStream(const void* x, const Int4Weights& wt, int act, void* y, int64_t m, int64_t k, int64_t n,
                 cudaStream_t s, int sms) {
  const int tiles = int((n + (GATED ? 8 : 16) - 1) / (GATED ? 8 : 16));
  auto run = [&](auto kernel, bool rows16) {
    const int bps = std::max(1, (rows16 ? 16 : 32) / W);
    const int tpb = (tiles + sms * bps - 1) / (sms * bps), grid = (tiles + tpb - 1) / tpb;
    const size_t smem = rows16 ? StreamSmem<true>(W, STAGES, tpb) : StreamSmem<false>(W, STAGES, tpb);
    return LaunchMmaKernel(kernel, unsigned(grid), W, smem, s, static_cast<const T*>(x), wt.wq,
                           static_cast<const T*>(wt.scales), wt.wq_up, static_cast<const T*>(wt.scales_up), act,
                           static_cast<T*>(y), int(m), int(k), int(n), int(wt.nb), wt.lb, tiles, tpb);
  };
  auto by_sps = [&](auto rows16) {
    constexpr bool R16 = decltype(rows16)::value;
    if (wt.lb == 5) return run(Int4MmaStream<T, W, GATED, R16, STAGES, 4>, R16);
    if (wt.lb == 6) return run(Int4MmaStream<T, W, GATED, R16, STAGES, 2>, R16);
    return run(Int4MmaStream<T, W, GATED, R16, STAGES, 1>, R16);
  };
  return m > 8 ? by_sps(std::true_type{}) : by_sps(std::false_type{});
}

// Int4MmaFast with TILES 16-column tiles a block (Int4SwiGLU: TILES x 8 columns' gate and up rows): each warp loads a
// step's X once and runs it against every tile's weights (TILES independent mma chains a step, X's loads and byte
// permutes a step shared by TILES KB of weights), the block's prologue and end shared by TILES tiles.
template <typename T, int WARPS, bool GATED, bool ROWS16, int STAGES, int SPS, int TILES>
__global__ void __launch_bounds__(WARPS * 32, (ROWS16 ? 16 : 32) / WARPS)
    Int4MmaFastT(const T* __restrict__ x, const uint8_t* __restrict__ wq, const T* __restrict__ scales,
                 const uint8_t* __restrict__ wq_up, const T* __restrict__ scales_up, int act, T* __restrict__ y, int m,
                 int K, int N, int nb, int lb) {
  constexpr int RS = ROWS16 ? 2 : 1, A = 16 * TILES;  // A rows of the block
  static_assert(STAGES * 1024 >= RS * 512, "partials fit the slots");
  extern __shared__ uint4 mma_smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int sstride = MmaScaleStride(nb, int(sizeof(T)));
  T* ssm = reinterpret_cast<T*>(mma_smem + WARPS * STAGES * TILES * 64);
  const int n0 = blockIdx.x * (GATED ? 8 : 16) * TILES;
  auto col_of = [&](int r) {  // A row r (tile r / 16): its column
    const int tt = r >> 4, rr = r & 15;
    const int col = GATED ? n0 + 8 * tt + (rr & 7) : n0 + r;
    return col < N ? col : N - 1;
  };
  auto is_up = [&](int r) { return GATED && (r & 15) >= 8; };
  const int row_bytes = K >> 1;
  for (int r = warp; r < A; r += WARPS) {
    const T* src = (is_up(r) ? scales_up : scales) + int64_t(col_of(r)) * nb;
    T* dst = ssm + r * sstride;
    for (int e = lane; e < nb / 8; e += 32) CpAsync16(dst + 8 * e, src + 8 * e, true);
  }
  CpAsyncCommit();
  const int steps = K >> 7, per = (steps + WARPS - 1) / WARPS;
  const int s_begin = min(steps, warp * per), s_end = min(steps, s_begin + per);
  const int swz = g >> 1;
  const uint32_t ring = uint32_t(__cvta_generic_to_shared(mma_smem + warp * STAGES * TILES * 64));
  const uint32_t wslot = ring + 16 * (4 * g + ((t + swz) & 3)), rbase = ring + 64 * g + 4 * t;
  uint32_t roff[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) roff[i] = 16 * ((i + swz) & 3);
  const uint8_t* src[TILES][2];
#pragma unroll
  for (int tt = 0; tt < TILES; ++tt) {
    src[tt][0] = wq + int64_t(col_of(16 * tt + g)) * row_bytes + 64 * s_begin + 16 * t;
    src[tt][1] = (GATED ? wq_up : wq) + int64_t(col_of(16 * tt + 8 + g)) * row_bytes + 64 * s_begin + 16 * t;
  }
  int issued = s_begin;
  uint32_t wst = 0;
  auto issue = [&] {
    if (issued < s_end) {
#pragma unroll
      for (int tt = 0; tt < TILES; ++tt) {
        CpAsync16(wslot + wst + 1024 * tt, src[tt][0], true);
        CpAsync16(wslot + wst + 1024 * tt + 512, src[tt][1], true);
      }
    }
#pragma unroll
    for (int tt = 0; tt < TILES; ++tt) src[tt][0] += 64, src[tt][1] += 64;
    ++issued;
    wst = wst + 1024 * TILES == STAGES * 1024 * TILES ? 0 : wst + 1024 * TILES;
    CpAsyncCommit();
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) issue();
  CpAsyncWait<STAGES - 1>();
  __syncthreads();
  bool big = false;
  const int vecs = nb / 8;
  for (int e = threadIdx.x; e < A * vecs; e += WARPS * 32) {
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
  float acc[TILES][RS][4] = {};
  uint32_t rst = 0;
  auto loop = [&](auto exact_tag) {
    constexpr bool EXACT = decltype(exact_tag)::value;
    for (int step = s_begin; step < s_end; ++step) {
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
      CpAsyncWait<STAGES - 2>();
      const uint32_t rd = rbase + rst;
      rst = rst + 1024 * TILES == STAGES * 1024 * TILES ? 0 : rst + 1024 * TILES;
      issue();  // into the slot read a step before
#pragma unroll
      for (int tt = 0; tt < TILES; ++tt) {
        uint32_t w[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int i = 0; i < 4; ++i) w[j][i] = LdShared32(rd + 1024 * tt + 512 * j + roff[i]);
        T s[2][SPS];
        const T* sp0 = ssm + (16 * tt + g) * sstride;
        const T* sp1 = ssm + (16 * tt + g + 8) * sstride;
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
              ock::MmaSync<T>(acc[tt][r], {d[0][0], d[1][0], d[0][1], d[1][1]}, xs[r][i][0], xs[r][i][1]);
              ock::MmaSync<T>(acc[tt][r], {d[0][2], d[1][2], d[0][3], d[1][3]}, xs[r][i][2], xs[r][i][3]);
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
              acc[tt][r][0] = fmaf(s0, p[0], acc[tt][r][0]);
              acc[tt][r][1] = fmaf(s0, p[1], acc[tt][r][1]);
              acc[tt][r][2] = fmaf(s1, p[2], acc[tt][r][2]);
              acc[tt][r][3] = fmaf(s1, p[3], acc[tt][r][3]);
            }
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
  // each tile as MmaStoreTile: the warps' partials in their own slots, then the sum, a tile at a time
#pragma unroll
  for (int tt = 0; tt < TILES; ++tt) {
    __syncthreads();  // every warp past its ring (the slots overlap other warps' rings), the last tile's sums read
    MmaStoreTile<T, WARPS, GATED, RS, STAGES>(mma_smem, acc[tt], act, y, m, N, n0 + tt * (GATED ? 8 : 16));
  }
}

template <typename T, int WARPS, bool GATED, int TILES, int STAGES = 2>
int LaunchFastT(const void* x, const Int4Weights& wt, int act, void* y, int64_t m, int64_t k, int64_t n,
                cudaStream_t s) {
  const int cols = (GATED ? 8 : 16) * TILES;
  const unsigned blocks = unsigned((n + cols - 1) / cols);
  const size_t smem = size_t(WARPS) * STAGES * TILES * 1024 +
                      16 * TILES * size_t(MmaScaleStride(int(wt.nb), int(sizeof(T)))) * sizeof(T);
  auto launch = [&](auto kernel) {
    return LaunchMmaKernel(kernel, blocks, WARPS, smem, s, static_cast<const T*>(x), wt.wq,
                           static_cast<const T*>(wt.scales), wt.wq_up, static_cast<const T*>(wt.scales_up), act,
                           static_cast<T*>(y), int(m), int(k), int(n), int(wt.nb), wt.lb);
  };
  auto by_sps = [&](auto rows16) {
    constexpr bool R16 = decltype(rows16)::value;
    if (wt.lb == 5) return launch(Int4MmaFastT<T, WARPS, GATED, R16, STAGES, 4, TILES>);
    if (wt.lb == 6) return launch(Int4MmaFastT<T, WARPS, GATED, R16, STAGES, 2, TILES>);
    return launch(Int4MmaFastT<T, WARPS, GATED, R16, STAGES, 1, TILES>);
  };
  return m > 8 ? by_sps(std::true_type{}) : by_sps(std::false_type{});
}

}  // namespace stream_probe
