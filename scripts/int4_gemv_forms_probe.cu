// Issue 28, int4 decode at one row: forms of the fp16 GEMV against the library's (cuda/int4_linear.cu Int4Gemv), on
// the four projections of genai's int4 Llama-2-7B layer (qkv 4096 -> 12288, o 4096 -> 4096, gate and up 4096 ->
// 11008 as Int4SwiGLU, down 11008 -> 4096; block 32, symmetric), each over 16 layers of distinct weights (every call
// reads DRAM), the calls of a projection captured back to back into one CUDA graph. Beside them: a plain read of the
// same bytes (16-byte loads, the floor a kernel of that size reaches). Forms:
//   ks2, ks4: K split over a cluster of 2 or 4 blocks (each stages and reads its share of K; the partial sums meet in
//             the first block's shared memory through the cluster), for grids too small to fill the GPU (o, down);
//   wide16:   the library's form with 16-byte weight loads (two groups a load, one scale where a block spans both);
//   persist:  as many blocks as fit at once, each warp taking column pairs in turn with the next pair's first loads in
//             flight while it finishes the current one (no last partial wave: qkv is 1.45 waves of 528 blocks).
// Build and run on the GPU machine (from the repository root):
//   python -m onnxfuse.kernels.ops_header > /tmp/onnxfuse_ops.h
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -I onnxfuse/kernels -I onnxfuse/kernels/cuda -I /tmp \
//        scripts/int4_gemv_forms_probe.cu onnxfuse/kernels/cuda/gemm.cu -o /tmp/int4_gemv_forms_probe -ldl
//   /tmp/int4_gemv_forms_probe
#include <cooperative_groups.h>

#include "cuda/int4_linear.cu"
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "int4_probe_fill.cuh"

namespace cg = cooperative_groups;

__global__ void ReadBytes(const uint4* __restrict__ p, int64_t n, const uint4* __restrict__ p2, int64_t n2,
                          uint32_t* out) {
  uint32_t a = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 v0 = __ldg(p + i), v1 = __ldg(p + i + stride), v2 = __ldg(p + i + 2 * stride),
                v3 = __ldg(p + i + 3 * stride);
    a ^= v0.x ^ v1.y ^ v2.z ^ v3.w;
  }
  for (; i < n; i += stride) a ^= __ldg(p + i).x;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < n2; j += stride) a ^= __ldg(p2 + j).y;
  if (a == 0x12345678u) *out = a;
}

// A lane's step: kUnroll groups of kCols columns (groups g0, g0 + 32, ... below `end`).
__device__ __forceinline__ void LoadStepTo(Step<__half>& st, const uint2* const (&wc)[kCols],
                                           const __half* const (&sc)[kCols], int g0, int end, int lb) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int g = g0 + 32 * u;
      const bool ok = g < end;
      st.q[u][c] = ok ? __ldg(wc[c] + g) : make_uint2(0u, 0u);
      st.s[u][c] = ok ? sc[c][(g * 16) >> lb] : __half{};
    }
  st.z = 0u;
}

__device__ __forceinline__ void StepDot(const Step<__half>& cur, const __half2 (*xs)[8], int g0, int end,
                                        float (&acc)[kCols]) {
  __half2 t[kCols];
#pragma unroll
  for (int c = 0; c < kCols; ++c) t[c] = __float2half2_rn(0.f);
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int g = g0 + 32 * u;
    if (g >= end) break;
    __half2 d[kCols][8];
#pragma unroll
    for (int c = 0; c < kCols; ++c) ScaledGroup(cur.q[u][c], cur.s[u][c], 8, d[c]);
    const __half2* xg = xs[g];
#pragma unroll
    for (int c = 0; c < kCols; ++c)
#pragma unroll
      for (int j = 0; j < 8; ++j) t[c] = __hfma2(xg[j], d[c][j], t[c]);
  }
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const float2 f = __half22float2(t[c]);
    acc[c] += f.x + f.y;
  }
}

// The column sources of warp column `wcol`: Int4Linear's consecutive pair, or (GATED) the gate's and up's same column.
template <bool GATED>
__device__ __forceinline__ int Columns(int wcol, int N, const uint2* wq, const __half* scales, const uint2* wq_up,
                                       const __half* scales_up, int nb, int row_groups, const uint2* (&wc)[kCols],
                                       const __half* (&sc)[kCols]) {
  const int col0 = GATED ? wcol : wcol * kCols;
  const bool active = col0 < N;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    if constexpr (GATED) {
      const int col = active ? col0 : 0;
      wc[c] = (c == 0 ? wq : wq_up) + int64_t(col) * row_groups;
      sc[c] = (c == 0 ? scales : scales_up) + int64_t(col) * nb;
    } else {
      const int col = active && col0 + c < N ? col0 + c : (active ? col0 : 0);
      wc[c] = wq + int64_t(col) * row_groups;
      sc[c] = scales + int64_t(col) * nb;
    }
  }
  return col0;
}

template <bool GATED>
__device__ __forceinline__ void Store(float (&acc)[kCols], int lane, int col0, int N, __half* y) {
#pragma unroll
  for (int c = 0; c < kCols; ++c)
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], o);
  if (lane != 0 || col0 >= N) return;
  if constexpr (GATED) {
    y[col0] = __float2half(onnxfuse::GateActivation(0, acc[0]) * acc[1]);
  } else {
#pragma unroll
    for (int c = 0; c < kCols; ++c)
      if (col0 + c < N) y[col0 + c] = __float2half(acc[c]);
  }
}

// K split over a cluster of KS blocks (consecutive blockIdx.x), each with the library's 8 warps of column pairs.
template <int KS, bool GATED>
__global__ void __launch_bounds__(kWarps * 32, 4)
    GemvKS(const __half* __restrict__ x, const uint2* __restrict__ wq, const __half* __restrict__ scales,
           const uint2* __restrict__ wq_up, const __half* __restrict__ scales_up, __half* __restrict__ y, int K, int N,
           int nb, int lb, int row_groups) {
  extern __shared__ uint4 ks_smem[];
  __half2(*xs)[8] = reinterpret_cast<__half2(*)[8]>(ks_smem);
  const int rank = KS > 1 ? int(cg::this_cluster().block_rank()) : 0;
  const int groups = (K + 15) / 16, per = (groups + KS - 1) / KS;
  const int g_begin = rank * per, g_end = min(groups, g_begin + per);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wcol = (blockIdx.x / KS) * kWarps + warp;
  const uint2* wc[kCols];
  const __half* sc[kCols];
  const int col0 = Columns<GATED>(wcol, N, wq, scales, wq_up, scales_up, nb, row_groups, wc, sc);
  const bool active = col0 < N;
  Step<__half> next;
  if (active) LoadStepTo(next, wc, sc, g_begin + lane, g_end, lb);
  // X's groups of this block's share, staged at their own index less g_begin
  for (int g = g_begin + int(threadIdx.x); g < g_end; g += blockDim.x)
    LoadGroup(x, int64_t(g) * 16, K, true, xs[g - g_begin]);
  __syncthreads();
  float acc[kCols] = {};
  if (active) {
    for (int g0 = g_begin + lane; g0 < g_end; g0 += 32 * kUnroll) {
      const Step<__half> cur = next;
      if (g0 + 32 * kUnroll < g_end) LoadStepTo(next, wc, sc, g0 + 32 * kUnroll, g_end, lb);
      StepDot(cur, xs - g_begin, g0, g_end, acc);
    }
  }
  if constexpr (KS == 1) {
    Store<GATED>(acc, lane, col0, N, y);
  } else {
#pragma unroll
    for (int c = 0; c < kCols; ++c)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], o);
    cg::cluster_group cluster = cg::this_cluster();
    float* part = reinterpret_cast<float*>(ks_smem + per * 2);  // [KS][kWarps][kCols], in rank 0's memory
    float* dst = cluster.map_shared_rank(part, 0);
    if (lane == 0)
#pragma unroll
      for (int c = 0; c < kCols; ++c) dst[(rank * kWarps + warp) * kCols + c] = acc[c];
    cluster.sync();
    if (rank == 0 && lane == 0 && active) {
      float s[kCols] = {};
      for (int r = 0; r < KS; ++r)
#pragma unroll
        for (int c = 0; c < kCols; ++c) s[c] += part[(r * kWarps + warp) * kCols + c];
      if constexpr (GATED) {
        y[col0] = __float2half(onnxfuse::GateActivation(0, s[0]) * s[1]);
      } else {
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          if (col0 + c < N) y[col0 + c] = __float2half(s[c]);
      }
    }
  }
}

// As many blocks as fit at once; warp w of the grid takes warp columns w, w + W, ... (W the grid's warps), its loads
// one step ahead across a column's end, X staged once per block.
template <bool GATED>
__global__ void __launch_bounds__(kWarps * 32, 3)
    GemvPersist(const __half* __restrict__ x, const uint2* __restrict__ wq, const __half* __restrict__ scales,
                const uint2* __restrict__ wq_up, const __half* __restrict__ scales_up, __half* __restrict__ y, int K,
                int N, int nb, int lb, int row_groups) {
  extern __shared__ uint4 p_smem[];
  __half2(*xs)[8] = reinterpret_cast<__half2(*)[8]>(p_smem);
  const int groups = (K + 15) / 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int W = gridDim.x * kWarps, wcols = GATED ? N : (N + kCols - 1) / kCols;
  const int spc = (groups + 32 * kUnroll - 1) / (32 * kUnroll);  // steps a column
  int wcol = blockIdx.x * kWarps + warp;
  const uint2* wc[kCols];
  const __half* sc[kCols];
  int col0 = Columns<GATED>(wcol, N, wq, scales, wq_up, scales_up, nb, row_groups, wc, sc);
  Step<__half> next;
  if (wcol < wcols) LoadStepTo(next, wc, sc, lane, groups, lb);
  for (int g = threadIdx.x; g < groups; g += blockDim.x) LoadGroup(x, int64_t(g) * 16, K, true, xs[g]);
  __syncthreads();
  float acc[kCols] = {};
  int step = 0;
  while (wcol < wcols) {
    const Step<__half> cur = next;
    const int g0 = lane + step * 32 * kUnroll;
    const uint2* nwc[kCols];
    const __half* nsc[kCols];
    int ncol0 = col0;
    if (step + 1 < spc) {
      LoadStepTo(next, wc, sc, g0 + 32 * kUnroll, groups, lb);
    } else if (wcol + W < wcols) {
      ncol0 = Columns<GATED>(wcol + W, N, wq, scales, wq_up, scales_up, nb, row_groups, nwc, nsc);
      LoadStepTo(next, nwc, nsc, lane, groups, lb);
    }
    StepDot(cur, xs, g0, groups, acc);
    if (++step == spc) {
      Store<GATED>(acc, lane, col0, N, y);
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] = 0.f;
      step = 0;
      wcol += W;
      if (wcol < wcols) {
        col0 = ncol0;
#pragma unroll
        for (int c = 0; c < kCols; ++c) wc[c] = nwc[c], sc[c] = nsc[c];
      }
    }
  }
}

// The library's form with 16-byte loads: lane l takes group pairs (2p, 2p + 1), p = l, l + 32, ..., two pairs a step
// (the same 4 groups a step as the library's), one scale load a pair where a block spans both groups.
struct Step16 {
  uint4 q[2][kCols];
  __half s[2][kCols][2];
};

__device__ __forceinline__ void LoadStep16(Step16& st, const uint2* const (&wc)[kCols],
                                           const __half* const (&sc)[kCols], int p0, int groups, int lb) {
#pragma unroll
  for (int u = 0; u < 2; ++u)
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int g = 2 * (p0 + 32 * u);
      const bool ok = g < groups;
      st.q[u][c] = ok ? __ldg(reinterpret_cast<const uint4*>(wc[c]) + (p0 + 32 * u)) : make_uint4(0u, 0u, 0u, 0u);
      const int b0 = (g * 16) >> lb, b1 = ((g + 1) * 16) >> lb;
      st.s[u][c][0] = ok ? sc[c][b0] : __half{};
      st.s[u][c][1] = ok && g + 1 < groups ? (b1 == b0 ? st.s[u][c][0] : sc[c][b1]) : __half{};
    }
}

template <bool GATED>
__global__ void __launch_bounds__(kWarps * 32, 4)
    GemvW16(const __half* __restrict__ x, const uint2* __restrict__ wq, const __half* __restrict__ scales,
            const uint2* __restrict__ wq_up, const __half* __restrict__ scales_up, __half* __restrict__ y, int K, int N,
            int nb, int lb, int row_groups) {
  extern __shared__ uint4 w_smem[];
  __half2(*xs)[8] = reinterpret_cast<__half2(*)[8]>(w_smem);
  const int groups = (K + 15) / 16;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint2* wc[kCols];
  const __half* sc[kCols];
  const int col0 = Columns<GATED>(blockIdx.x * kWarps + warp, N, wq, scales, wq_up, scales_up, nb, row_groups, wc, sc);
  const bool active = col0 < N;
  Step16 next;
  if (active) LoadStep16(next, wc, sc, lane, groups, lb);
  for (int g = threadIdx.x; g < groups; g += blockDim.x) LoadGroup(x, int64_t(g) * 16, K, true, xs[g]);
  __syncthreads();
  float acc[kCols] = {};
  if (active) {
    for (int p0 = lane; 2 * p0 < groups; p0 += 64) {
      const Step16 cur = next;
      if (2 * (p0 + 64) < groups) LoadStep16(next, wc, sc, p0 + 64, groups, lb);
      __half2 t[kCols];
#pragma unroll
      for (int c = 0; c < kCols; ++c) t[c] = __float2half2_rn(0.f);
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int g = 2 * (p0 + 32 * u) + h;
          if (g >= groups) continue;
          __half2 d[kCols][8];
#pragma unroll
          for (int c = 0; c < kCols; ++c) {
            const uint4 q = cur.q[u][c];
            ScaledGroup(h ? make_uint2(q.z, q.w) : make_uint2(q.x, q.y), cur.s[u][c][h], 8, d[c]);
          }
          const __half2* xg = xs[g];
#pragma unroll
          for (int c = 0; c < kCols; ++c)
#pragma unroll
            for (int j = 0; j < 8; ++j) t[c] = __hfma2(xg[j], d[c][j], t[c]);
        }
#pragma unroll
      for (int c = 0; c < kCols; ++c) {
        const float2 f = __half22float2(t[c]);
        acc[c] += f.x + f.y;
      }
    }
  }
  Store<GATED>(acc, lane, col0, N, y);
}

template <typename T>
__global__ void FillT(T* p, int64_t n, float scale, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = ock::from_f<T>(scale * (float(((i * 2654435761u + seed) >> 9) & 1023) / 512.f - 1.f));
}

struct Proj {
  int K, N;
  bool gated;
  uint8_t* wq[2] = {};
  __half* s[2] = {};
  Int4Weights wt;
  Proj(int K_, int N_, bool gated_, uint32_t seed) : K(K_), N(N_), gated(gated_) {
    Int4Weights g = Geometry(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, K, 32);
    for (int i = 0; i < (gated ? 2 : 1); ++i) {
      cudaMalloc(&wq[i], int64_t(N) * g.row_bytes);
      cudaMalloc(&s[i], int64_t(N) * g.nb * sizeof(__half));
      Fill<<<1024, 256>>>(wq[i], int64_t(N) * g.row_bytes, seed + 7 * i);
      FillT<__half><<<1024, 256>>>(s[i], int64_t(N) * g.nb, 0.02f, seed + 7 * i + 1);
    }
    wt = Geometry(wq[0], s[0], nullptr, wq[1], s[1], nullptr, K, 32);
  }
  double bytes() const { return (gated ? 2.0 : 1.0) * (double(N) * wt.row_bytes + double(N) * wt.nb * 2); }
};

int main() {
  const int L = 16;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const int sms = prop.multiProcessorCount;
  uint32_t* sink;
  cudaMalloc(&sink, 4);
  // the read rate: 2 GiB, median of 7
  double tbs;
  {
    const int64_t n = (int64_t(2) << 30) / 16;
    uint4* buf;
    cudaMalloc(&buf, n * 16);
    cudaMemset(buf, 1, n * 16);
    std::vector<float> t;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(e0, s);
      ReadBytes<<<sms * 8, 512, 0, s>>>(buf, n, nullptr, 0, sink);
      cudaEventRecord(e1, s);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    cudaFree(buf);
    tbs = n * 16 / (t[3] * 1e-3) / 1e12;
  }
  printf("device %s, %d SMs; read rate %.3f TB/s (2 GiB, median of 7)\n", prop.name, sms, tbs);
  struct Shape {
    const char* name;
    int K, N;
    bool gated;
  } shapes[4] = {{"qkv", 4096, 12288, false},
                 {"o", 4096, 4096, false},
                 {"gate+up", 4096, 11008, true},
                 {"down", 11008, 4096, false}};
  __half *x, *y, *ref;
  cudaMalloc(&x, 11008 * sizeof(__half));
  cudaMalloc(&y, 16 * 12288 * sizeof(__half));
  cudaMalloc(&ref, 12288 * sizeof(__half));
  FillT<__half><<<64, 256>>>(x, 11008, 1.f, 5);
  const char* forms[6] = {"read floor", "library", "ks2", "ks4", "persist", "wide16"};
  printf(
      "us a call, cold (16 layers' distinct weights, a CUDA graph of the 16 calls; median of 7 rounds of 20), %% of "
      "the bytes' read time; largest |err| / largest |ref| against the library\n");
  for (auto& sh : shapes) {
    std::vector<Proj*> ps;
    for (int l = 0; l < L; ++l) ps.push_back(new Proj(sh.K, sh.N, sh.gated, 100 * l + 7));
    cudaDeviceSynchronize();
    const int groups = (sh.K + 15) / 16, wcols = sh.gated ? sh.N : (sh.N + 1) / 2;
    const int row_groups = int(ps[0]->wt.row_bytes / 8), nb = int(ps[0]->wt.nb), lb = ps[0]->wt.lb;
    auto launch = [&](int form, Proj* p, __half* out) {
      const uint2* w = reinterpret_cast<const uint2*>(p->wq[0]);
      const uint2* wu = reinterpret_cast<const uint2*>(p->wq[1]);
      if (form == 0) {
        ReadBytes<<<sms * 4, 256, 0, s>>>(reinterpret_cast<const uint4*>(p->wq[0]),
                                          int64_t(p->N) * p->wt.row_bytes / 16, reinterpret_cast<const uint4*>(p->s[0]),
                                          int64_t(p->N) * nb * 2 / 16, sink);
        if (p->gated)
          ReadBytes<<<sms * 4, 256, 0, s>>>(reinterpret_cast<const uint4*>(p->wq[1]),
                                            int64_t(p->N) * p->wt.row_bytes / 16,
                                            reinterpret_cast<const uint4*>(p->s[1]), int64_t(p->N) * nb * 2 / 16, sink);
        return;
      }
      if (form == 1) {
        GemvPath(ONNXFUSE_FP16, 0, x, p->wt, out, 1, p->K, p->N, s);
        return;
      }
      if (form == 5) {
        auto k = sh.gated ? GemvW16<true> : GemvW16<false>;
        k<<<unsigned((wcols + kWarps - 1) / kWarps), kWarps * 32, size_t(groups) * 32, s>>>(
            x, w, p->s[0], wu, p->s[1], out, p->K, p->N, nb, lb, row_groups);
        return;
      }
      if (form == 4) {
        const unsigned blocks = unsigned(std::min((wcols + kWarps - 1) / kWarps, sms * 3));
        const size_t smem = size_t(groups) * 32;
        auto k = sh.gated ? GemvPersist<true> : GemvPersist<false>;
        k<<<blocks, kWarps * 32, smem, s>>>(x, w, p->s[0], wu, p->s[1], out, p->K, p->N, nb, lb, row_groups);
        return;
      }
      const int KS = form == 2 ? 2 : 4;
      const int per = (groups + KS - 1) / KS;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(unsigned(((wcols + kWarps - 1) / kWarps) * KS));
      cfg.blockDim = dim3(kWarps * 32);
      cfg.dynamicSmemBytes = size_t(per) * 32 + size_t(KS) * kWarps * kCols * 4;
      cfg.stream = s;
      cudaLaunchAttribute attr = {};
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = KS;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      cudaError_t e;
      if (KS == 2)
        e = sh.gated ? cudaLaunchKernelEx(&cfg, GemvKS<2, true>, (const __half*)x, w, (const __half*)p->s[0], wu,
                                          (const __half*)p->s[1], out, p->K, p->N, nb, lb, row_groups)
                     : cudaLaunchKernelEx(&cfg, GemvKS<2, false>, (const __half*)x, w, (const __half*)p->s[0], wu,
                                          (const __half*)p->s[1], out, p->K, p->N, nb, lb, row_groups);
      else
        e = sh.gated ? cudaLaunchKernelEx(&cfg, GemvKS<4, true>, (const __half*)x, w, (const __half*)p->s[0], wu,
                                          (const __half*)p->s[1], out, p->K, p->N, nb, lb, row_groups)
                     : cudaLaunchKernelEx(&cfg, GemvKS<4, false>, (const __half*)x, w, (const __half*)p->s[0], wu,
                                          (const __half*)p->s[1], out, p->K, p->N, nb, lb, row_groups);
      if (e) printf("launch %s: %s\n", forms[form], cudaGetErrorString(e));
    };
    // numerics: every form against the library on layer 0
    double err[6] = {0, 0, 0, 0, 0, 0};
    launch(1, ps[0], ref);
    cudaStreamSynchronize(s);
    std::vector<__half> hr(sh.N), hy(sh.N);
    cudaMemcpy(hr.data(), ref, sh.N * 2, cudaMemcpyDeviceToHost);
    for (int f = 2; f < 6; ++f) {
      cudaMemsetAsync(y, 0xFF, sh.N * 2, s);
      launch(f, ps[0], y);
      cudaStreamSynchronize(s);
      cudaMemcpy(hy.data(), y, sh.N * 2, cudaMemcpyDeviceToHost);
      double num = 0, den = 0;
      for (int i = 0; i < sh.N; ++i) {
        const double r = __half2float(hr[i]), v = __half2float(hy[i]);
        num = std::max(num, std::isnan(v) ? 1e30 : std::fabs(v - r));
        den = std::max(den, std::fabs(r));
      }
      err[f] = num / den;
    }
    cudaGraphExec_t ge[6];
    for (int f = 0; f < 6; ++f) {
      cudaGraph_t g;
      cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
      for (int l = 0; l < L; ++l) launch(f, ps[l], y);
      cudaStreamEndCapture(s, &g);
      if (cudaGraphInstantiate(&ge[f], g, 0) != cudaSuccess) printf("instantiate %s failed\n", forms[f]);
      cudaGraphDestroy(g);
    }
    std::vector<double> t[6];
    for (int r = 0; r < 7; ++r)
      for (int f = 0; f < 6; ++f) {
        cudaGraphLaunch(ge[f], s);
        cudaEventRecord(e0, s);
        for (int i = 0; i < 20; ++i) cudaGraphLaunch(ge[f], s);
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        t[f].push_back(double(ms) * 1e3 / 20 / L);
      }
    const double lim = ps[0]->bytes() / (tbs * 1e12) * 1e6;
    printf("%-8s %5.1f MB, read time %5.1f us:", sh.name, ps[0]->bytes() / 1e6, lim);
    for (int f = 0; f < 6; ++f) {
      std::sort(t[f].begin(), t[f].end());
      printf("  %s %5.1f (%3.0f%%)", forms[f], t[f][3], 100 * lim / t[f][3]);
      if (f >= 2) printf(" err %.1e", err[f]);
    }
    printf("\n");
    for (auto* p : ps) {
      for (int i = 0; i < 2; ++i) cudaFree(p->wq[i]), cudaFree(p->s[i]);
      delete p;
    }
  }
  const cudaError_t e = cudaDeviceSynchronize();
  printf("%s\n", cudaGetErrorString(e));
  return e != cudaSuccess;
}
