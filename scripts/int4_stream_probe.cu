// Issue 28, batch-8 int4 decode: the streaming form of the tensor-core decode kernel (scripts/int4_stream_probe.cuh,
// stream_probe::Int4MmaStream) against the library's path (Int4MmaFast from 2 rows), Int4MmaFast at every row count
// and plain reads of the same bytes, on a Llama-2-7B layer as genai's int4 model runs it (qkv, o and down Int4Linear,
// gate and up one Int4SwiGLU; block 32, fp16, symmetric) and on lm_head (4096 -> 49152): cudaEvent time per layer
// (median of 7 rounds of 20, the variants round-robin in each round) at 2, 4, 8, 12 and 16 rows against the limit
// (the packed weights' and scales' bytes at the read rate measured in the same run), each variant's largest error
// against Int4Naive (fp32 sums); the layer at 8 rows replayed from a CUDA graph; each projection alone at 8 rows;
// then numerics on the other forms (blocks of 64, 128 and 256, ragged N, K = 11008, bf16, a scale of 4500 and a
// scale Inf, X with Inf and NaN). Build from the repository root and run on the GPU machine:
//   python -m onnxfuse.kernels.ops_header > /tmp/onnxfuse_ops.h
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -I onnxfuse/kernels -I onnxfuse/kernels/cuda -I /tmp \
//        -I scripts scripts/int4_stream_probe.cu onnxfuse/kernels/cuda/gemm.cu -o /tmp/int4_stream_probe -ldl
//   LD_LIBRARY_PATH=<libcublasLt's folder> /tmp/int4_stream_probe
#define INT4_DECODE_PROBE_NO_MAIN
#include "int4_decode_probe.cu"
#include "int4_stream_probe.cuh"

static int g_sms = 132;

template <typename T, int W, int TILES>
Fn FastT() {  // Int4MmaFast with TILES tiles a block where Int4MmaFast would take the call, else the library's path
  return [](const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n, cudaStream_t s) {
    if (!MmaFastOk(x, wt, k) || m > 16)
      return GemvPath(std::is_same_v<T, __half> ? ONNXFUSE_FP16 : ONNXFUSE_BF16, 0, x, wt, y, m, k, n, s);
    return wt.wq_up != nullptr ? stream_probe::LaunchFastT<T, W, true, TILES>(x, wt, 0, y, m, k, n, s)
                               : stream_probe::LaunchFastT<T, W, false, TILES>(x, wt, 0, y, m, k, n, s);
  };
}

template <typename T, int W, int STAGES>
Fn Stream() {  // the streaming form where Int4MmaFast would take the call, else the library's path
  return [](const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n, cudaStream_t s) {
    if (!MmaFastOk(x, wt, k) || m > 16)
      return GemvPath(std::is_same_v<T, __half> ? ONNXFUSE_FP16 : ONNXFUSE_BF16, 0, x, wt, y, m, k, n, s);
    return wt.wq_up != nullptr ? stream_probe::LaunchStream<T, W, true, STAGES>(x, wt, 0, y, m, k, n, s, g_sms)
                               : stream_probe::LaunchStream<T, W, false, STAGES>(x, wt, 0, y, m, k, n, s, g_sms);
  };
}

int main() {
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  g_sms = prop.multiProcessorCount;
  printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  auto read_rate = [&] {
    const int64_t n = (int64_t(2) << 30) / 16;
    uint4* buf;
    uint32_t* out;
    cudaMalloc(&buf, n * 16);
    cudaMalloc(&out, 4);
    cudaMemset(buf, 1, n * 16);
    std::vector<float> t;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(e0, s);
      ReadAll<<<prop.multiProcessorCount * 8, 512, 0, s>>>(buf, n, out);
      cudaEventRecord(e1, s);
      cudaEventSynchronize(e1);
      float ms;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    cudaFree(buf);
    cudaFree(out);
    return n * 16 / (t[3] * 1e-3) / 1e12;
  };
  const double read_tbs = std::max(read_rate(), read_rate());
  printf("read rate %.3f TB/s (2 GiB, median of 7, the larger of two)\n", read_tbs);
  using T = __half;
  Proj<T> qkv(4096, 12288, false, 32, false, 11), o(4096, 4096, false, 32, false, 21),
      gu(4096, 11008, true, 32, false, 31), down(11008, 4096, false, 32, false, 41),
      lm(4096, 49152, false, 32, false, 51);
  std::vector<Proj<T>*> layer = {&qkv, &o, &gu, &down};
  T *x, *y, *ref;
  cudaMalloc(&x, 16 * 11008 * sizeof(T));
  cudaMalloc(&y, 16 * 49152 * sizeof(T));
  cudaMalloc(&ref, 16 * 49152 * sizeof(T));
  FillT<T><<<256, 256>>>(x, 16 * 11008, 1.f, 5);
  auto rounds = [&](const std::vector<std::function<void()>>& runs) {
    std::vector<std::vector<float>> t(runs.size());
    for (auto& run : runs)
      for (int i = 0; i < 3; ++i) run();
    for (int r = 0; r < 7; ++r)
      for (size_t v = 0; v < runs.size(); ++v) {
        cudaEventRecord(e0, s);
        for (int i = 0; i < 20; ++i) runs[v]();
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        t[v].push_back(ms * 1000.f / 20.f);
      }
    std::vector<float> med;
    for (auto& tv : t) {
      std::sort(tv.begin(), tv.end());
      med.push_back(tv[3]);
    }
    return med;
  };
  struct V {
    std::string name;
    Fn fn;
  };
  std::vector<V> vs = {{"library", Current<T>()},
                       {"stream w32 s3", Stream<T, 32, 3>()},
                       {"stream w16 s4", Stream<T, 16, 4>()},
                       {"fast 2 tiles w8", FastT<T, 8, 2>()},
                       {"fast 2 tiles w16", FastT<T, 16, 2>()},
                       {"fast 4 tiles w8", FastT<T, 8, 4>()},
                       {"fast 2 tiles w4", FastT<T, 4, 2>()},
                       {"read only, 4 blocks an SM, PDL", Read<true, 4>()}};
  auto is_read = [&](size_t v) { return vs[v].name.rfind("read only", 0) == 0; };
  double layer_bytes = 0;
  for (auto* p : layer) layer_bytes += p->bytes();
  printf("layer: %.1f MB, limit %.1f us; lm_head %.1f MB, limit %.1f us (at %.3f TB/s)\n", layer_bytes / 1e6,
         layer_bytes / read_tbs / 1e6, lm.bytes() / 1e6, lm.bytes() / read_tbs / 1e6, read_tbs);
  const int rows[] = {2, 4, 8, 12, 16};
  constexpr int kRows = int(sizeof(rows) / sizeof(rows[0]));
  for (const char* what : {"layer", "lm_head"}) {
    const bool is_layer = std::string(what) == "layer";
    std::vector<Proj<T>*> ps = is_layer ? layer : std::vector<Proj<T>*>{&lm};
    const double limit = (is_layer ? layer_bytes : lm.bytes()) / read_tbs / 1e6;
    printf("\n%s, us per call (median of 7 rounds of 20), %% of the limit, largest rel err against fp32 sums:\n", what);
    printf("%-34s", "rows");
    for (int m : rows) printf(" %16d", m);
    printf("\n");
    std::vector<std::vector<float>> res(vs.size(), std::vector<float>(kRows));
    std::vector<std::vector<double>> err(vs.size(), std::vector<double>(kRows));
    for (int ri = 0; ri < kRows; ++ri) {
      const int m = rows[ri];
      for (size_t v = 0; v < vs.size(); ++v) {
        if (is_read(v)) continue;
        double e = 0;
        for (auto* p : ps) e = std::max(e, CheckOne<T>(nullptr, vs[v].fn, *p, m, x, y, ref, s));
        err[v][ri] = e;
      }
      std::vector<std::function<void()>> runs;
      for (size_t v = 0; v < vs.size(); ++v)
        runs.push_back([&, v, m] {
          for (auto* p : ps) vs[v].fn(x, p->wt, y, m, p->K, p->N, s);
        });
      const std::vector<float> med = rounds(runs);
      for (size_t v = 0; v < vs.size(); ++v) res[v][ri] = med[v];
    }
    for (size_t v = 0; v < vs.size(); ++v) {
      printf("%-34s", vs[v].name.c_str());
      for (int ri = 0; ri < kRows; ++ri) printf(" %6.1f (%3.0f%%)   ", res[v][ri], 100 * limit / res[v][ri]);
      printf("\n%-34s", "  rel err");
      for (int ri = 0; ri < kRows; ++ri) printf(" %16.1e", err[v][ri]);
      printf("\n");
    }
  }
  for (int gm : {8, 16}) {
    printf("\nlayer at %d rows in a CUDA graph (20 layers a replay), us per layer (median of 7), %% of the limit:\n",
           gm);
    const double limit = layer_bytes / read_tbs / 1e6;
    for (size_t v = 0; v < vs.size(); ++v) {
      for (auto* p : layer) vs[v].fn(x, p->wt, y, gm, p->K, p->N, s);
      cudaStreamSynchronize(s);
      cudaGraph_t g;
      cudaGraphExec_t ge;
      cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
      for (int i = 0; i < 20; ++i)
        for (auto* p : layer) vs[v].fn(x, p->wt, y, gm, p->K, p->N, s);
      cudaStreamEndCapture(s, &g);
      if (cudaGraphInstantiate(&ge, g, 0) != cudaSuccess) {
        printf("  %-34s capture failed\n", vs[v].name.c_str());
        continue;
      }
      for (int i = 0; i < 3; ++i) cudaGraphLaunch(ge, s);
      std::vector<float> tv;
      for (int r = 0; r < 7; ++r) {
        cudaEventRecord(e0, s);
        cudaGraphLaunch(ge, s);
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        tv.push_back(ms * 1000.f / 20.f);
      }
      std::sort(tv.begin(), tv.end());
      printf("  %-34s %6.1f (%3.0f%%)\n", vs[v].name.c_str(), tv[3], 100 * limit / tv[3]);
      cudaGraphExecDestroy(ge);
      cudaGraphDestroy(g);
    }
  }
  printf("\nper projection at 8 rows, us (median of 7 rounds of 20; lone projections partly hit L2):\n");
  const char* pname[] = {"qkv", "o", "gate+up", "down", "lm_head"};
  std::vector<Proj<T>*> all = {&qkv, &o, &gu, &down, &lm};
  for (size_t v = 0; v < vs.size(); ++v) {
    printf("  %-34s", vs[v].name.c_str());
    for (size_t pi = 0; pi < all.size(); ++pi) {
      Proj<T>& p = *all[pi];
      const float t = rounds({[&] { vs[v].fn(x, p.wt, y, 8, p.K, p.N, s); }})[0];
      printf(" %s %6.1f", pname[pi], t);
    }
    printf("\n");
  }
  printf("\nnumerics on the other forms (rel err against fp32 sums):\n");
  {
    Proj<T> s64(4096, 1000, true, 64, false, 81), s128(8192, 777, false, 128, false, 82),
        s256(4096, 1003, true, 256, false, 83), s32(11008, 4100, false, 32, false, 84),
        sbig(4096, 520, false, 32, false, 85), small(256, 40, true, 32, false, 87), tiny(128, 3, false, 128, false, 88);
    {  // column 7, block 5: scale 4500 (past 4094: that step runs the exact loop), its weights q = 8 but one 9
      const T big = __float2half(4500.f);
      cudaMemcpy(sbig.s[0] + 7 * sbig.wt.nb + 5, &big, sizeof(T), cudaMemcpyHostToDevice);
      cudaMemset(sbig.wq[0] + 7 * sbig.wt.row_bytes + 80, 0x88, 16);
      cudaMemset(sbig.wq[0] + 7 * sbig.wt.row_bytes + 80, 0x89, 1);
    }
    Proj<T> sinf(4096, 520, true, 32, false, 86);  // gate column 3, block 2: scale Inf (NaN where a q is 8)
    {
      const T inf = __float2half(INFINITY);
      cudaMemcpy(sinf.s[0] + 3 * sinf.wt.nb + 2, &inf, sizeof(T), cudaMemcpyHostToDevice);
    }
    double worst = 0;
    for (int m : {1, 2, 3, 5, 8, 9, 16})
      for (size_t v = 1; v < vs.size(); ++v) {
        if (is_read(v)) continue;
        for (auto pr : {std::make_pair("gated, block 64", &s64), std::make_pair("block 128, K 8192, N 777", &s128),
                        std::make_pair("gated, block 256, N 1003", &s256), std::make_pair("K 11008, N 4100", &s32),
                        std::make_pair("a scale of 4500", &sbig), std::make_pair("gated, a scale Inf", &sinf),
                        std::make_pair("gated, K 256, N 40", &small), std::make_pair("block 128, K 128, N 3", &tiny),
                        std::make_pair("qkv", &qkv), std::make_pair("gate+up", &gu), std::make_pair("down", &down)}) {
          const double e = CheckOne<T>((vs[v].name + ": " + pr.first).c_str(), vs[v].fn, *pr.second, m, x, y, ref, s);
          worst = std::isnan(e) ? INFINITY : std::max(worst, e);
        }
      }
    using B = __nv_bfloat16;
    B *xb, *yb, *rb;
    cudaMalloc(&xb, 16 * 11008 * sizeof(B));
    cudaMalloc(&yb, 16 * 49152 * sizeof(B));
    cudaMalloc(&rb, 16 * 49152 * sizeof(B));
    FillT<B><<<256, 256>>>(xb, 16 * 11008, 1.f, 6);
    Proj<B> bl(4096, 4096, false, 32, false, 71), bgs(11008, 1000, true, 32, false, 74),
        bg64(4096, 1000, true, 64, false, 75);
    for (int m : {2, 8, 13, 16}) {
      for (auto pr : {std::make_pair("bf16", &bl), std::make_pair("bf16 gated K 11008", &bgs),
                      std::make_pair("bf16 gated block 64", &bg64)}) {
        const double e1 = CheckOne<B>((std::string(pr.first) + ", stream w32 s3").c_str(), Stream<B, 32, 3>(),
                                      *pr.second, m, xb, yb, rb, s);
        const double e2 = CheckOne<B>((std::string(pr.first) + ", fast 2 tiles w8").c_str(), FastT<B, 8, 2>(),
                                      *pr.second, m, xb, yb, rb, s);
        const double e3 = CheckOne<B>((std::string(pr.first) + ", fast 4 tiles w8").c_str(), FastT<B, 8, 4>(),
                                      *pr.second, m, xb, yb, rb, s);
        worst = std::isnan(e1) || std::isnan(e2) || std::isnan(e3) ? INFINITY : std::max({worst, e1, e2, e3});
      }
    }
    printf("worst rel err of the probed forms: %.2e\n", worst);
  }
  {  // X with an Inf and a NaN at one row: every output's class (finite, Inf, NaN) against Int4Naive
    T* xs;
    cudaMalloc(&xs, 16 * 11008 * sizeof(T));
    cudaMemcpy(xs, x, 16 * 11008 * sizeof(T), cudaMemcpyDeviceToDevice);
    for (int which = 0; which < 2; ++which) {
      const T v = __float2half(which == 0 ? INFINITY : NAN);
      cudaMemcpy(xs + 4096 * 3 + (which == 0 ? 100 : 1290), &v, sizeof(T), cudaMemcpyHostToDevice);
      for (size_t vi = 1; vi < vs.size(); ++vi) {
        if (is_read(vi)) continue;
        for (Proj<T>* p : {&qkv, &gu}) {
          const int m = 8;
          cudaMemsetAsync(y, 0x11, size_t(m) * p->N * sizeof(T), s);
          Naive<T>(xs, p->wt, ref, m, p->K, p->N, s);
          vs[vi].fn(xs, p->wt, y, m, p->K, p->N, s);
          cudaStreamSynchronize(s);
          std::vector<T> ha(size_t(m) * p->N), hr(size_t(m) * p -> N);
          cudaMemcpy(ha.data(), y, ha.size() * sizeof(T), cudaMemcpyDeviceToHost);
          cudaMemcpy(hr.data(), ref, hr.size() * sizeof(T), cudaMemcpyDeviceToHost);
          int diff = 0, nan = 0;
          for (size_t i = 0; i < ha.size(); ++i) {
            const float a = float(ha[i]), r = float(hr[i]);
            nan += std::isnan(r);
            diff += std::isnan(a) != std::isnan(r) || std::isinf(a) != std::isinf(r) || (std::isinf(a) && a != r);
          }
          printf("  X row 3 with %s, %-20s %s: %d of %zu outputs of another class (reference NaN %d)\n",
                 which == 0 ? "an Inf" : "an Inf and a NaN", vs[vi].name.c_str(), p == &qkv ? "qkv" : "gate+up", diff,
                 ha.size(), nan);
        }
      }
    }
  }
  printf("done: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
