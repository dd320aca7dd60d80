// Issue 28, int4 decode: does prefetching the next projection's weights into L2 in a kernel's tail hide them behind
// the kernels onnxruntime runs between the projections (attention, norms, rotary: latency-bound, the DRAM mostly
// idle)? A decode step as genai's int4 7B model runs it, layer by layer over L layers of distinct weights (so every
// projection starts cold): norm, qkv (Int4Linear), rotary, attention, o (Int4Linear), norm, gate and up (Int4SwiGLU),
// down (Int4Linear), with onnxruntime's kernels stood in for by kernels that take as long (clock64 spins; the
// attention also reads its KV cache), captured into one CUDA graph. Variants: which projection's tail prefetches how
// much of the next one (cuda/int4_linear.cu Int4Prefetch: mode, the last `blocks` blocks). Reports the graph's time
// per layer (median of 7 rounds of 20 replays, variants round-robin), less the stand-ins' own time, against the
// weights' read time at the same run's read rate. Build and run on the GPU machine (from the repository root):
//   python -m onnxfuse.kernels.ops_header > /tmp/onnxfuse_ops.h
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -I onnxfuse/kernels -I onnxfuse/kernels/cuda -I /tmp \
//        scripts/int4_prefetch_probe.cu onnxfuse/kernels/cuda/gemm.cu -o /tmp/int4_prefetch_probe -ldl
//   LD_LIBRARY_PATH=<libcublasLt's folder> /tmp/int4_prefetch_probe [rows] [kv_bytes_per_layer]
#include "cuda/int4_linear.cu"
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "int4_probe_fill.cuh"

template <typename T>
__global__ void FillT(T* p, int64_t n, float scale, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = ock::from_f<T>(scale * (float(((i * 2654435761u + seed) >> 9) & 1023) / 512.f - 1.f));
}

__global__ void ReadAll(const uint4* __restrict__ p, int64_t n, uint32_t* out) {
  uint32_t a = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    a ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (a == 0x12345678u) *out = a;
}

// A stand-in for one of onnxruntime's kernels: reads n16 16-byte words (its inputs, e.g. the KV cache), then spins
// until `cycles` have passed since it started.
__global__ void StandIn(const uint4* __restrict__ p, int64_t n16, long long cycles, uint32_t* out) {
  const long long t0 = clock64();
  uint32_t a = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n16; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    a ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  while (clock64() - t0 < cycles) {
  }
  if (a == 0x12345678u) *out = a;
}

template <typename T>
struct Proj {
  int K, N;
  bool gated;
  uint8_t* wq[2] = {};
  T* s[2] = {};
  Int4Weights wt;
  Proj(int K_, int N_, bool gated_, uint32_t seed) : K(K_), N(N_), gated(gated_) {
    Int4Weights g = Geometry(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, K, 32);
    for (int i = 0; i < (gated ? 2 : 1); ++i) {
      cudaMalloc(&wq[i], int64_t(N) * g.row_bytes);
      cudaMalloc(&s[i], int64_t(N) * g.nb * sizeof(T));
      Fill<<<1024, 256>>>(wq[i], int64_t(N) * g.row_bytes, seed + 7 * i);
      FillT<T><<<1024, 256>>>(s[i], int64_t(N) * g.nb, 0.02f, seed + 7 * i + 1);
    }
    wt = Geometry(wq[0], s[0], nullptr, wq[1], s[1], nullptr, K, 32);
  }
  double bytes() const { return (gated ? 2.0 : 1.0) * (double(N) * wt.row_bytes + double(N) * wt.nb * sizeof(T)); }
  // the first `budget` bytes this projection's kernel reads (its first columns: weights and scales alike)
  Int4Prefetch Head(double budget, int blocks, int mode) const {
    Int4Prefetch pf{};
    const double f = std::min(1.0, budget / bytes());
    if (budget <= 0) return pf;
    for (int i = 0; i < (gated ? 2 : 1); ++i) {
      pf.p[2 * i] = wq[i];
      pf.bytes[2 * i] = int64_t(f * double(N) * wt.row_bytes);
      pf.p[2 * i + 1] = reinterpret_cast<const uint8_t*>(s[i]);
      pf.bytes[2 * i + 1] = int64_t(f * double(N) * wt.nb * sizeof(T));
    }
    pf.blocks = blocks;
    pf.mode = mode;
    return pf;
  }
};

struct Variant {
  std::string name;
  double o, gu, down, qkv;  // bytes of o prefetched by qkv's tail, of gate/up by o's, of down by gate/up's, of the
                            // next layer's qkv by down's
  int blocks, mode;
};

int main(int argc, char** argv) {
  const int rows = argc > 1 ? atoi(argv[1]) : 1;
  const int64_t kv_bytes = argc > 2 ? atoll(argv[2]) : 2 << 20;
  const int L = 16;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("device %s, %d SMs, L2 %d MB; rows %d, KV bytes a layer %lld, %d layers\n", prop.name,
         prop.multiProcessorCount, prop.l2CacheSize >> 20, rows, (long long)kv_bytes, L);
  uint32_t* sink;
  cudaMalloc(&sink, 4);
  auto read_rate = [&] {
    const int64_t n = (int64_t(2) << 30) / 16;
    uint4* buf;
    cudaMalloc(&buf, n * 16);
    cudaMemset(buf, 1, n * 16);
    std::vector<float> t;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(e0, s);
      ReadAll<<<prop.multiProcessorCount * 8, 512, 0, s>>>(buf, n, sink);
      cudaEventRecord(e1, s);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    cudaFree(buf);
    return n * 16 / (t[3] * 1e-3) / 1e12;
  };
  const double tbs = std::max(read_rate(), read_rate());
  using T = __half;
  std::vector<Proj<T>*> qkv, o, gu, down;
  for (int l = 0; l < L; ++l) {
    qkv.push_back(new Proj<T>(4096, 12288, false, 100 * l + 11));
    o.push_back(new Proj<T>(4096, 4096, false, 100 * l + 21));
    gu.push_back(new Proj<T>(4096, 11008, true, 100 * l + 31));
    down.push_back(new Proj<T>(11008, 4096, false, 100 * l + 41));
  }
  const double layer_bytes = qkv[0]->bytes() + o[0]->bytes() + gu[0]->bytes() + down[0]->bytes();
  printf("read rate %.3f TB/s; a layer's weights %.1f MB, %.1f us at that rate\n", tbs, layer_bytes / 1e6,
         layer_bytes / (tbs * 1e12) * 1e6);
  T *x, *yq, *ya, *yg, *yd;
  cudaMalloc(&x, 16 * 11008 * sizeof(T));
  cudaMalloc(&yq, 16 * 12288 * sizeof(T));
  cudaMalloc(&ya, 16 * 4096 * sizeof(T));
  cudaMalloc(&yg, 16 * 11008 * sizeof(T));
  cudaMalloc(&yd, 16 * 4096 * sizeof(T));
  FillT<T><<<256, 256>>>(x, 16 * 11008, 1.f, 5);
  std::vector<uint4*> kv(L);
  for (int l = 0; l < L; ++l) {
    cudaMalloc(&kv[l], kv_bytes + 16);
    cudaMemset(kv[l], 1, kv_bytes + 16);
  }
  cudaDeviceSynchronize();
  // the stand-ins' lengths, in cycles of the SM clock (calibrated below: their graph alone is timed too)
  const long long norm_c = 3800, rotary_c = 5200, attn_c = rows > 1 ? 30000 : 15000;
  auto stand_ins = [&](int l, int which) {  // 0 norm, 1 rotary, 2 attention
    if (which == 0) StandIn<<<1, 512, 0, s>>>(nullptr, 0, norm_c, sink);
    if (which == 1) StandIn<<<rows, 128, 0, s>>>(nullptr, 0, rotary_c, sink);
    if (which == 2) StandIn<<<32 * rows, 128, 0, s>>>(kv[l], kv_bytes / 16, attn_c, sink);
  };
  auto proj = [&](Proj<T>* p, const T* in, T* out, Int4Prefetch pf) {
    Int4Weights wt = p->wt;
    wt.pf = pf;
    const int rc = GemvPath(ONNXFUSE_FP16, 0, in, wt, out, rows, p->K, p->N, s);
    if (rc) printf("launch failed: %d\n", rc);
  };
  // what to run: 0 everything, 1 the stand-ins alone, 2 the projections alone
  auto step = [&](const Variant& v, int what) {
    for (int l = 0; l < L; ++l) {
      const int nl = (l + 1) % L;
      if (what != 2) stand_ins(l, 0);
      if (what != 1) proj(qkv[l], x, yq, o[l]->Head(v.o, v.blocks, v.mode));
      if (what != 2) stand_ins(l, 1), stand_ins(l, 2);
      if (what != 1) proj(o[l], x, ya, gu[l]->Head(v.gu, v.blocks, v.mode));
      if (what != 2) stand_ins(l, 0);
      if (what != 1) proj(gu[l], x, yg, down[l]->Head(v.down, v.blocks, v.mode));
      if (what != 1) proj(down[l], yg, yd, qkv[nl]->Head(v.qkv, v.blocks, v.mode));
    }
  };
  auto graph_of = [&](const Variant& v, int what) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    step(v, what);
    cudaStreamEndCapture(s, &g);
    if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) printf("instantiate failed\n");
    cudaGraphDestroy(g);
    return ge;
  };
  const double MB = 1e6;
  std::vector<Variant> vs = {
      {"none", 0, 0, 0, 0, 0, 1},
      {"o all (qkv's tail), line", 1e9, 0, 0, 0, 264, 1},
      {"o all, bulk", 1e9, 0, 0, 0, 264, 2},
      {"o all, line evict_last", 1e9, 0, 0, 0, 264, 3},
      {"o all, all blocks, line", 1e9, 0, 0, 0, 1 << 30, 1},
      {"o all + gu 8 + qkv 8, line", 1e9, 8 * MB, 0, 8 * MB, 264, 1},
      {"o all + gu 8 + qkv 8, bulk", 1e9, 8 * MB, 0, 8 * MB, 264, 2},
      {"o all + gu 16 + qkv 16, line", 1e9, 16 * MB, 0, 16 * MB, 264, 1},
      {"o all + gu 8 + qkv 8 + down 8, line", 1e9, 8 * MB, 8 * MB, 8 * MB, 264, 1},
      {"o 24 (o + gu's head) + gu 8 + qkv 8, line", 1e9, 8 * MB, 0, 8 * MB, 132, 1},
  };
  Variant none = vs[0];
  cudaGraphExec_t alone_ins = graph_of(none, 1), alone_proj = graph_of(none, 2);
  std::vector<cudaGraphExec_t> gs;
  for (auto& v : vs) gs.push_back(graph_of(v, 0));
  auto time_graph = [&](cudaGraphExec_t ge) {
    cudaGraphLaunch(ge, s);
    cudaEventRecord(e0, s);
    for (int i = 0; i < 20; ++i) cudaGraphLaunch(ge, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    return double(ms) * 1e3 / 20 / L;  // us a layer
  };
  std::vector<std::vector<double>> t(vs.size() + 2);
  for (int r = 0; r < 7; ++r) {
    t[0].push_back(time_graph(alone_ins));
    t[1].push_back(time_graph(alone_proj));
    for (size_t i = 0; i < vs.size(); ++i) t[i + 2].push_back(time_graph(gs[i]));
  }
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double ins = med(t[0]), projs = med(t[1]), lim = layer_bytes / (tbs * 1e12) * 1e6;
  printf("us a layer (median of 7 rounds of 20 graph replays):\n");
  printf("  %-46s %7.1f\n", "stand-ins alone (norm x2, rotary, attention)", ins);
  printf("  %-46s %7.1f  (%.0f %% of the weights' read time %.1f)\n", "projections alone, back to back", projs,
         100 * lim / projs, lim);
  for (size_t i = 0; i < vs.size(); ++i) {
    const double v = med(t[i + 2]);
    printf("  %-46s %7.1f  less the stand-ins %6.1f  (%3.0f %%)  vs none %.3fx\n", vs[i].name.c_str(), v, v - ins,
           100 * lim / (v - ins), med(t[2]) / v);
  }
  // Each projection alone, L calls back to back: of the L layers' distinct weights (cold: every call reads DRAM)
  // and of one layer's (warm where they fit in L2: o, down, qkv), and with a stand-in of the attention's length before
  // each call: whether a projection is bound by its bytes or by its length as a kernel.
  printf("each projection alone, us a call (median of 7 rounds of 20 replays of L calls):\n");
  const char* names[4] = {"qkv", "o", "gate+up", "down"};
  std::vector<Proj<T>*>* lists[4] = {&qkv, &o, &gu, &down};
  for (int pi = 0; pi < 4; ++pi) {
    cudaGraphExec_t g3[3];
    for (int form = 0; form < 3; ++form) {
      cudaGraph_t g;
      cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
      for (int l = 0; l < L; ++l) {
        if (form == 2) StandIn<<<32 * rows, 128, 0, s>>>(nullptr, 0, attn_c, sink);
        proj((*lists[pi])[form == 1 ? 0 : l], x, pi == 3 ? yd : yg, Int4Prefetch{});
      }
      cudaStreamEndCapture(s, &g);
      cudaGraphInstantiate(&g3[form], g, 0);
      cudaGraphDestroy(g);
    }
    cudaGraph_t g;
    cudaGraphExec_t gi;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    for (int l = 0; l < L; ++l) StandIn<<<32 * rows, 128, 0, s>>>(nullptr, 0, attn_c, sink);
    cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&gi, g, 0);
    cudaGraphDestroy(g);
    std::vector<double> tc, tw, ts, ti;
    for (int r = 0; r < 7; ++r) {
      tc.push_back(time_graph(g3[0]));
      tw.push_back(time_graph(g3[1]));
      ts.push_back(time_graph(g3[2]));
      ti.push_back(time_graph(gi));
    }
    const Proj<T>* p = (*lists[pi])[0];
    const double lim1 = p->bytes() / (tbs * 1e12) * 1e6;
    printf("  %-8s %5.1f MB, read time %5.1f: cold %5.1f (%3.0f %%)  warm %5.1f  cold after a stand-in %5.1f "
           "(stand-in alone %5.1f)\n",
           names[pi], p->bytes() / 1e6, lim1, med(tc), 100 * lim1 / med(tc), med(tw), med(ts) - med(ti), med(ti));
  }
  cudaError_t err = cudaDeviceSynchronize();
  printf("%s\n", cudaGetErrorString(err));
  return err != cudaSuccess;
}
