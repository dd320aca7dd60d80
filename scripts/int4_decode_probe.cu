// Issue 28, int4 decode at 1-16 rows (a batch of 1-16 sequences): the CUDA backend's kernels below the dequantization
// path, the library's dispatch (cuda/int4_linear.cu GemvPath: the one-row GEMV at one fp16 row, Int4MmaFast, the
// tensor-core kernel's common form, where it takes the call, Int4Mma or the GEMV elsewhere) against Int4MmaFast at
// every row count, Int4Mma (the general form), the library's path for a node of accuracy_level 4 (the one-row GEMV
// with X rounded to int8, Int4RowGemvI8) and plain reads of the same bytes (a kernel a projection, with
// programmatic dependent launch: the floor a kernel a projection leaves), on a Llama-2-7B layer as genai's int4 model
// runs it (qkv, o and down Int4Linear, gate and up one Int4SwiGLU; block 32, fp16, symmetric) and on lm_head (4096 ->
// 49152). cudaEvent time per layer (median of 7 rounds of 20, the variants round-robin in each round) at 1, 2, 3, 4,
// 8 and 16 rows, against the limit (the packed weights' and scales' bytes at the read rate measured in the same run),
// and each variant's largest error against Int4Naive (fp32 sums) over the whole output; then the layer at 1, 2 and 8
// rows replayed from a CUDA graph (with programmatic edges between the kernels; ONNXFUSE_PDL_GRAPH=0: without); the
// bf16 layer at 1, 2 and 4 rows (the library against Int4MmaFast and Int4Mma); the layer with zero points at 1 and 2
// rows in bf16 and fp16 (the library against Int4Mma); each projection alone at 2 and 8 rows. Then numerics on the
// forms the layer does not reach: the one-row GEMV on blocks of 64 and 128, K = 11008 and X in the hundreds; the
// tensor-core kernels on bf16, zero points, blocks of 16 (two scales a lane's chunk) with an odd number of blocks
// (8-byte copies), blocks of 64, 128 and 256, K not a multiple of 8 (X loaded by elements), ragged N, 1-16 rows, a
// scale past 4094 and a scale Inf (the common form's exact loop); last, X with an Inf and a NaN at one row (every
// output's class, finite, Inf or NaN, against Int4Naive's).
// The one-row GEMV's own probe is the same program at 1 row (git history: benchmarks/results/h200-2026-11-30/int4/
// row-gemv-probe-*.txt). The kernels before and the forms tried on the way:
// benchmarks/results/h100-2026-11-27/int4/decode-probe.txt and
// benchmarks/results/h200-2026-11-30/int4/{decode,row-gemv}-probe-*.txt (each with the kernels before it in the same
// call). A program, not the CLI: it times kernels of the CUDA backend without onnxruntime. Build (from the repository
// root) and run on the GPU machine:
//   python -m onnxfuse.kernels.ops_header > /tmp/onnxfuse_ops.h
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -I onnxfuse/kernels -I onnxfuse/kernels/cuda -I /tmp \
//        -I scripts scripts/int4_decode_probe.cu onnxfuse/kernels/cuda/gemm.cu -o /tmp/int4_decode_probe -ldl
//   LD_LIBRARY_PATH=<libcublasLt's folder> /tmp/int4_decode_probe
#include "cuda/int4_linear.cu"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
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

// The same bytes as a projection's packed weights and scales, read and discarded (up to 4 ranges, 16-byte loads; PDL:
// triggering its dependent at once): what a kernel of that size costs when it only reads.
struct Ranges {
  const uint4* p[4];
  int64_t n[4];
};
template <bool PDL>
__global__ void ReadRanges(Ranges r, uint32_t* out) {
  if constexpr (PDL) ock::PdlTrigger();
  uint32_t a = 0;
  for (int k = 0; k < 4; ++k)
    for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < r.n[k]; i += int64_t(gridDim.x) * blockDim.x) {
      const uint4 v = __ldg(r.p[k] + i);
      a ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  if (a == 0x12345678u) *out = a;
}

// One projection's weights (gate and up: two), filled.
template <typename T>
struct Proj {
  int K, N, block;
  bool gated, zp;
  uint8_t *wq[2] = {}, *z[2] = {};
  T* s[2] = {};
  Int4Weights wt;
  Proj(int K_, int N_, bool gated_, int block_ = 32, bool zp_ = false, uint32_t seed = 1)
      : K(K_), N(N_), block(block_), gated(gated_), zp(zp_) {
    Int4Weights g = Geometry(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, K, block);
    for (int i = 0; i < (gated ? 2 : 1); ++i) {
      cudaMalloc(&wq[i], int64_t(N) * g.row_bytes);
      cudaMalloc(&s[i], int64_t(N) * g.nb * sizeof(T));
      Fill<<<1024, 256>>>(wq[i], int64_t(N) * g.row_bytes, seed + 7 * i);
      FillT<T><<<1024, 256>>>(s[i], int64_t(N) * g.nb, 0.02f, seed + 7 * i + 1);
      if (zp) {
        cudaMalloc(&z[i], int64_t(N) * g.zb);
        Fill<<<1024, 256>>>(z[i], int64_t(N) * g.zb, seed + 7 * i + 2);
      }
    }
    wt = Geometry(wq[0], s[0], z[0], wq[1], s[1], z[1], K, block);
  }
  double bytes() const {
    return (gated ? 2.0 : 1.0) *
           (double(N) * wt.row_bytes + double(N) * wt.nb * sizeof(T) + (zp ? double(N) * wt.zb : 0));
  }
};

using Fn =
    std::function<int(const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n, cudaStream_t s)>;

template <typename T, int WARPS, int STAGES = kMmaStages>
Fn Mma() {  // the tensor-core kernel at every row count, WARPS warps a block (0: by the grid), a ring of STAGES
  return [](const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n, cudaStream_t s) {
    const bool gated = wt.wq_up != nullptr, zp = wt.zp != nullptr;
    if (gated)
      return zp ? LaunchMma<T, true, true, STAGES>(x, wt, 0, y, m, k, n, s, WARPS)
                : LaunchMma<T, true, false, STAGES>(x, wt, 0, y, m, k, n, s, WARPS);
    return zp ? LaunchMma<T, false, true, STAGES>(x, wt, 0, y, m, k, n, s, WARPS)
              : LaunchMma<T, false, false, STAGES>(x, wt, 0, y, m, k, n, s, WARPS);
  };
}

template <typename T>
Fn Gemv() {  // the GEMV at every row count
  return [](const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n, cudaStream_t s) {
    const bool gated = wt.wq_up != nullptr, zp = wt.zp != nullptr;
    auto launch = [&](auto rows) {
      constexpr int MR = decltype(rows)::value;
      if (gated)
        return zp ? LaunchGemv<T, MR, true, true>(x, wt, 0, y, m, k, n, s)
                  : LaunchGemv<T, MR, true, false>(x, wt, 0, y, m, k, n, s);
      return zp ? LaunchGemv<T, MR, false, true>(x, wt, 0, y, m, k, n, s)
                : LaunchGemv<T, MR, false, false>(x, wt, 0, y, m, k, n, s);
    };
    if (m == 1) return launch(std::integral_constant<int, 1>{});
    if (m == 2) return launch(std::integral_constant<int, 2>{});
    if (m <= 4) return launch(std::integral_constant<int, 4>{});
    if (m <= 8) return launch(std::integral_constant<int, 8>{});
    return launch(std::integral_constant<int, 16>{});
  };
}

template <int C, int WARPS_SM = 0>
Fn Row() {  // the one-row GEMV with C loads a lane a step where it takes the call, else the library's path
  return [](const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n, cudaStream_t s) {
    if (!RowGemvOk(ONNXFUSE_FP16, x, wt, m, k, n)) return GemvPath(ONNXFUSE_FP16, 0, x, wt, y, m, k, n, s);
    return wt.wq_up != nullptr ? LaunchRowGemv<C, true, WARPS_SM>(x, wt, 0, y, k, n, s)
                               : LaunchRowGemv<C, false, WARPS_SM>(x, wt, 0, y, k, n, s);
  };
}

template <typename T>
Fn Int8X() {  // the library's path for a node of accuracy_level 4 (the one-row fp16 GEMV rounds X to int8)
  return [](const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n, cudaStream_t s) {
    Int4Weights w = wt;
    w.int8_x = true;
    return GemvPath(std::is_same_v<T, __half> ? ONNXFUSE_FP16 : ONNXFUSE_BF16, 0, x, w, y, m, k, n, s);
  };
}

template <bool PDL, int BLOCKS_PER_SM>
Fn Read() {  // ReadRanges over the call's weights and scales (m ignored; y untouched): the read-only floor
  return [](const void*, const Int4Weights& wt, void*, int64_t, int64_t k, int64_t n, cudaStream_t s) {
    static uint32_t* out = nullptr;
    if (out == nullptr) cudaMalloc(&out, 4);
    Ranges r = {};
    const int64_t sbytes = n * wt.nb * 2;
    r.p[0] = reinterpret_cast<const uint4*>(wt.wq), r.n[0] = n * wt.row_bytes / 16;
    r.p[1] = static_cast<const uint4*>(wt.scales), r.n[1] = sbytes / 16;
    if (wt.wq_up != nullptr) {
      r.p[2] = reinterpret_cast<const uint4*>(wt.wq_up), r.n[2] = n * wt.row_bytes / 16;
      r.p[3] = static_cast<const uint4*>(wt.scales_up), r.n[3] = sbytes / 16;
    }
    return ock::LaunchDependent(ReadRanges<PDL>, dim3(132 * BLOCKS_PER_SM), dim3(512), 0, s, r, out);
  };
}

template <typename T>
Fn Current() {
  return [](const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n, cudaStream_t s) {
    return GemvPath(std::is_same_v<T, __half> ? ONNXFUSE_FP16 : ONNXFUSE_BF16, 0, x, wt, y, m, k, n, s);
  };
}

template <typename T>
Fn MmaFastAll() {  // Int4MmaFast at every row count where it takes the call, else the library's path
  return [](const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n, cudaStream_t s) {
    if (!MmaFastOk(x, wt, k) || MmaSmem<T, false>(wt, 16) > kMmaMaxSmem)
      return GemvPath(std::is_same_v<T, __half> ? ONNXFUSE_FP16 : ONNXFUSE_BF16, 0, x, wt, y, m, k, n, s);
    return wt.wq_up != nullptr ? LaunchMmaFast<T, true>(x, wt, 0, y, m, k, n, s)
                               : LaunchMmaFast<T, false>(x, wt, 0, y, m, k, n, s);
  };
}

template <typename T>
int Naive(const void* x, const Int4Weights& wt, void* y, int64_t m, int64_t k, int64_t n, cudaStream_t s) {
  Int4Naive<T><<<unsigned(Blocks(m * n, 256)), 256, 0, s>>>(
      static_cast<const T*>(x), wt.wq, static_cast<const T*>(wt.scales), wt.wq_up, static_cast<const T*>(wt.scales_up),
      wt.zp, wt.zp_up, wt.zb, 0, static_cast<T*>(y), m, k, n, wt.nb, wt.lb, wt.row_bytes);
  return int(cudaGetLastError());
}

// the largest |a - ref| over the largest |ref| (NaN: a NaN where ref has none, or the other way)
template <typename T>
double RelErr(const T* a, const T* ref, int64_t n) {
  std::vector<T> ha(n), hr(n);
  cudaMemcpy(ha.data(), a, n * sizeof(T), cudaMemcpyDeviceToHost);
  cudaMemcpy(hr.data(), ref, n * sizeof(T), cudaMemcpyDeviceToHost);
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double r = double(float(hr[i])), v = double(float(ha[i]));
    if (std::isnan(r) != std::isnan(v)) return NAN;
    num = std::max(num, std::fabs(v - r));
    den = std::max(den, std::fabs(r));
  }
  return num / (den > 0 ? den : 1);
}

template <typename T>
double CheckOne(const char* what, Fn fn, Proj<T>& p, int m, T* x, T* y, T* ref, cudaStream_t s) {
  cudaMemsetAsync(y, 0xFF, size_t(m) * p.N * sizeof(T), s);  // NaN-filled: an output never written shows
  Naive<T>(x, p.wt, ref, m, p.K, p.N, s);
  const int rc = fn(x, p.wt, y, m, p.K, p.N, s);
  cudaStreamSynchronize(s);
  const double e = rc ? NAN : RelErr(y, ref, int64_t(m) * p.N);
  if (what) printf("  %-44s rows %2d K %5d N %5d block %3d: rc %d, rel err %.2e\n", what, m, p.K, p.N, p.block, rc, e);
  return e;
}

int main(int argc, char** argv) {
  cudaStream_t s;
  cudaStreamCreate(&s);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  // the read rate: a pass over 2 GiB with 16-byte loads, median of 7; measured twice, the larger kept for the limit
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
  const double first_tbs = read_rate();
  printf("read rate %.3f TB/s (2 GiB, median of 7)\n", first_tbs);
  const double read_tbs = std::max(first_tbs, read_rate());
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
  // us a call of each of `runs` (each run 3 times first, then in 7 rounds of 20 calls, the runs round-robin in each
  // round): the medians
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
                       {"Int4MmaFast at every row count", MmaFastAll<T>()},
                       {"Int4Mma (the general form)", Mma<T, 0>()},
                       {"library, accuracy_level 4", Int8X<T>()},
                       {"read only, 4 blocks an SM, PDL", Read<true, 4>()}};
  if (argc > 3 && std::string(argv[1]) == "ncu") {  // ncu: variant argv[2] at argv[3] rows, the layer twice
    const int v = atoi(argv[2]), m = atoi(argv[3]);
    for (int i = 0; i < 2; ++i)
      for (auto* p : layer) vs[v].fn(x, p->wt, y, m, p->K, p->N, s);
    cudaStreamSynchronize(s);
    printf("ncu run: %s, %d rows\n", vs[v].name.c_str(), m);
    return 0;
  }
  double layer_bytes = 0;
  for (auto* p : layer) layer_bytes += p->bytes();
  printf("layer: %.1f MB, limit %.1f us; lm_head %.1f MB, limit %.1f us (at %.3f TB/s)\n", layer_bytes / 1e6,
         layer_bytes / read_tbs / 1e6, lm.bytes() / 1e6, lm.bytes() / read_tbs / 1e6, read_tbs);
  const int rows[] = {1, 2, 3, 4, 8, 16};
  for (const char* what : {"layer", "lm_head"}) {
    const bool is_layer = std::string(what) == "layer";
    std::vector<Proj<T>*> ps = is_layer ? layer : std::vector<Proj<T>*>{&lm};
    const double limit = (is_layer ? layer_bytes : lm.bytes()) / read_tbs / 1e6;
    printf("\n%s, us per call (median of 7 rounds of 20), %% of the limit, largest rel err against fp32 sums:\n", what);
    printf("%-34s", "rows");
    for (int m : rows) printf(" %16d", m);
    printf("\n");
    constexpr int kRows = int(sizeof(rows) / sizeof(rows[0]));
    std::vector<std::vector<float>> res(vs.size(), std::vector<float>(kRows));
    std::vector<std::vector<double>> err(vs.size(), std::vector<double>(kRows));
    for (int ri = 0; ri < kRows; ++ri) {
      const int m = rows[ri];
      for (size_t v = 0; v < vs.size(); ++v) {
        if (vs[v].name.rfind("read only", 0) == 0) continue;
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
      for (int ri = 0; ri < kRows; ++ri) printf(" %6.1f (%3.0f%%) %s", res[v][ri], 100 * limit / res[v][ri], "");
      printf("\n%-34s", "  rel err");
      for (int ri = 0; ri < kRows; ++ri) printf(" %16.1e", err[v][ri]);
      printf("\n");
    }
  }
  // the layer at one row replayed from a CUDA graph (as genai's graph runs it: no programmatic launches in a capture)
  for (int gm : {1, 2, 8}) {
    printf("\nlayer at %d rows in a CUDA graph (20 layers a replay), us per layer (median of 7), %% of the limit:\n",
           gm);
    const double limit = layer_bytes / read_tbs / 1e6;
    for (size_t v = 0; v < vs.size(); ++v) {
      for (auto* p : layer) vs[v].fn(x, p->wt, y, gm, p->K, p->N, s);  // first calls (attributes) outside the capture
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

  {  // bf16: the layer at 1, 2 and 4 rows, the library against Int4MmaFast at every row count
    using B = __nv_bfloat16;
    Proj<B> bq(4096, 12288, false, 32, false, 91), bo(4096, 4096, false, 32, false, 92),
        bgu(4096, 11008, true, 32, false, 93), bd(11008, 4096, false, 32, false, 94);
    std::vector<Proj<B>*> bl = {&bq, &bo, &bgu, &bd};
    B *xb, *yb, *rb;
    cudaMalloc(&xb, 16 * 11008 * sizeof(B));
    cudaMalloc(&yb, 16 * 49152 * sizeof(B));
    cudaMalloc(&rb, 16 * 49152 * sizeof(B));
    FillT<B><<<256, 256>>>(xb, 16 * 11008, 1.f, 6);
    std::vector<std::pair<std::string, Fn>> bv = {{"library", Current<B>()},
                                                  {"Int4MmaFast at every row count", MmaFastAll<B>()},
                                                  {"Int4Mma (the general form)", Mma<B, 0>()}};
    Proj<B> zq(4096, 12288, false, 32, true, 95), zo(4096, 4096, false, 32, true, 96),
        zgu(4096, 11008, true, 32, true, 97), zd(11008, 4096, false, 32, true, 98);
    std::vector<Proj<B>*> zl = {&zq, &zo, &zgu, &zd};
    Proj<T> fq(4096, 12288, false, 32, true, 95), fo(4096, 4096, false, 32, true, 96),
        fgu(4096, 11008, true, 32, true, 97), fd(11008, 4096, false, 32, true, 98);
    std::vector<Proj<T>*> fl = {&fq, &fo, &fgu, &fd};
    printf("\nthe layer with zero points, us per call (median of 7 rounds of 20), largest rel err:\n");
    for (int m : {1, 2}) {
      auto time_it = [&](auto& projs, Fn fn, auto* xx, auto* yy, auto* rr) {
        const float t = rounds({[&] {
          for (auto* p : projs) fn(xx, p->wt, yy, m, p->K, p->N, s);
        }})[0];
        double e = 0;
        using E = std::remove_pointer_t<decltype(xx)>;
        for (auto* p : projs) e = std::max(e, CheckOne<E>(nullptr, fn, *p, m, xx, yy, rr, s));
        return std::make_pair(t, e);
      };
      const auto bl_ = time_it(zl, Current<B>(), xb, yb, rb), bm = time_it(zl, Mma<B, 0>(), xb, yb, rb);
      const auto fl_ = time_it(fl, Current<T>(), x, y, ref), fm = time_it(fl, Mma<T, 0>(), x, y, ref);
      printf(
          "  rows %d bf16: library %6.1f us (err %.1e), Int4Mma %6.1f us (err %.1e); fp16: library %6.1f (err %.1e), "
          "Int4Mma %6.1f (err %.1e)\n",
          m, bl_.first, bl_.second, bm.first, bm.second, fl_.first, fl_.second, fm.first, fm.second);
    }
    printf("\nbf16 layer, us per call (median of 7 rounds of 20), largest rel err:\n");
    for (int m : {1, 2, 4}) {
      std::vector<std::function<void()>> runs;
      for (size_t v = 0; v < bv.size(); ++v)
        runs.push_back([&, v, m] {
          for (auto* p : bl) bv[v].second(xb, p->wt, yb, m, p->K, p->N, s);
        });
      const std::vector<float> t = rounds(runs);
      for (size_t v = 0; v < bv.size(); ++v) {
        double e = 0;
        for (auto* p : bl) e = std::max(e, CheckOne<B>(nullptr, bv[v].second, *p, m, xb, yb, rb, s));
        printf("  rows %d %-34s %6.1f us (%3.0f%%)  rel err %.1e\n", m, bv[v].first.c_str(), t[v],
               100 * layer_bytes / read_tbs / 1e6 / t[v], e);
      }
    }
  }

  printf("\nper projection, us (median of 7 rounds of 20):\n");
  const char* pname[] = {"qkv", "o", "gate+up", "down", "lm_head"};
  std::vector<Proj<T>*> all = {&qkv, &o, &gu, &down, &lm};
  for (int m : {1, 2, 8}) {
    for (size_t v = 0; v < vs.size(); ++v) {
      printf("  rows %2d %-34s", m, vs[v].name.c_str());
      for (size_t pi = 0; pi < all.size(); ++pi) {
        Proj<T>& p = *all[pi];
        const float t = rounds({[&] { vs[v].fn(x, p.wt, y, m, p.K, p.N, s); }})[0];
        printf(" %s %6.1f (%3.0f%%)", pname[pi], t, 100 * p.bytes() / read_tbs / 1e6 / t);
      }
      printf("\n");
    }
  }
  printf(
      "\nthe tensor-core kernel's numerics on the other forms (the library's dispatch from 3 rows; 8 and 16 warps):\n");
  {
    Proj<T> zp(4096, 1000, false, 64, true, 61), zpg(4096, 1000, true, 128, true, 62),
        b16(4112, 520, false, 16, false, 63), k8(4100, 777, true, 32, false, 64),
        b256(4096, 300, false, 256, false, 65), b16z(4112, 8200, true, 16, true, 66);
    {  // the row GEMV's forms: blocks 64 and 128 (gated, ragged N), K = 11008 (a last warp of 24 units), X up to 3000
      Proj<T> b64(4096, 1000, true, 64, false, 67), b128(8192, 777, false, 128, false, 68);
      T* xbig;
      cudaMalloc(&xbig, 11008 * sizeof(T));
      FillT<T><<<64, 256>>>(xbig, 11008, 300.f, 9);
      for (size_t v = 0; v < vs.size(); ++v) {
        if (vs[v].name.rfind("read only", 0) == 0) continue;
        CheckOne<T>((vs[v].name + ": gated, block 64").c_str(), vs[v].fn, b64, 1, x, y, ref, s);
        CheckOne<T>((vs[v].name + ": block 128, K 8192").c_str(), vs[v].fn, b128, 1, x, y, ref, s);
        CheckOne<T>((vs[v].name + ": K 11008, |x| to 300").c_str(), vs[v].fn, down, 1, xbig, y, ref, s);
        CheckOne<T>((vs[v].name + ": gated, |x| to 300").c_str(), vs[v].fn, gu, 1, xbig, y, ref, s);
      }
    }
    for (int m : {1, 3, 8, 9, 16}) {
      CheckOne<T>("fp16 zero points, block 64", Mma<T, 8>(), zp, m, x, y, ref, s);
      CheckOne<T>("fp16 gated, zero points, block 128", Mma<T, 16>(), zpg, m, x, y, ref, s);
      CheckOne<T>("fp16 block 16, 257 blocks (8-byte copies)", Mma<T, 8>(), b16, m, x, y, ref, s);
      CheckOne<T>("fp16 gated, zero points, block 16", Current<T>(), b16z, m, x, y, ref, s);
      CheckOne<T>("fp16 gated, K % 8 != 0 (X by elements)", Mma<T, 16>(), k8, m, x, y, ref, s);
      CheckOne<T>("fp16 block 256", Current<T>(), b256, m, x, y, ref, s);
      for (size_t v = 1; v < vs.size(); ++v) {
        if (vs[v].name.rfind("read only", 0) == 0) continue;
        CheckOne<T>((vs[v].name + ": gated, zero points, block 16").c_str(), vs[v].fn, b16z, m, x, y, ref, s);
        CheckOne<T>((vs[v].name + ": gated, K % 8 != 0").c_str(), vs[v].fn, k8, m, x, y, ref, s);
        CheckOne<T>((vs[v].name + ": block 16, 8-byte copies").c_str(), vs[v].fn, b16, m, x, y, ref, s);
      }
    }
    {  // the common form's shapes: gated block 64, block 128 (K 8192, ragged N), block 256, K 11008, big scales
      Proj<T> s64(4096, 1000, true, 64, false, 81), s128(8192, 777, false, 128, false, 82),
          s256(4096, 1003, true, 256, false, 83), s32(11008, 4100, false, 32, false, 84),
          sbig(4096, 520, false, 32, false, 85);
      {  // column 7, block 5: scale 4500 (past 4094: the block runs the exact loop), its weights q = 8 but one 9
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
      for (int m : {1, 2, 3, 5, 8, 9, 16})
        for (size_t v = 0; v < vs.size(); ++v) {
          if (vs[v].name.rfind("read only", 0) == 0) continue;
          CheckOne<T>((vs[v].name + ": gated, block 64").c_str(), vs[v].fn, s64, m, x, y, ref, s);
          CheckOne<T>((vs[v].name + ": block 128, K 8192, N 777").c_str(), vs[v].fn, s128, m, x, y, ref, s);
          CheckOne<T>((vs[v].name + ": gated, block 256, N 1003").c_str(), vs[v].fn, s256, m, x, y, ref, s);
          CheckOne<T>((vs[v].name + ": K 11008, N 4100").c_str(), vs[v].fn, s32, m, x, y, ref, s);
          CheckOne<T>((vs[v].name + ": a scale of 4500").c_str(), vs[v].fn, sbig, m, x, y, ref, s);
          CheckOne<T>((vs[v].name + ": gated, a scale Inf").c_str(), vs[v].fn, sinf, m, x, y, ref, s);
        }
    }
    using B = __nv_bfloat16;
    B *xb, *yb, *rb;
    cudaMalloc(&xb, 16 * 11008 * sizeof(B));
    cudaMalloc(&yb, 16 * 49152 * sizeof(B));
    cudaMalloc(&rb, 16 * 49152 * sizeof(B));
    FillT<B><<<256, 256>>>(xb, 16 * 11008, 1.f, 6);
    Proj<B> bl(4096, 4096, false, 32, false, 71), bg(11008, 1000, true, 32, true, 72),
        bk(4100, 333, false, 16, false, 73), bgs(11008, 1000, true, 32, false, 74);
    for (int m : {1, 2, 3, 8, 13, 16}) {
      CheckOne<B>("bf16, Int4MmaFast at every row count", MmaFastAll<B>(), bl, m, xb, yb, rb, s);
      CheckOne<B>("bf16 gated, Int4MmaFast at every row count", MmaFastAll<B>(), bgs, m, xb, yb, rb, s);
      CheckOne<B>("bf16", Current<B>(), bl, m, xb, yb, rb, s);
      CheckOne<B>("bf16 gated, zero points", Mma<B, 8>(), bg, m, xb, yb, rb, s);
      CheckOne<B>("bf16 K % 8 != 0, block 16", Mma<B, 16>(), bk, m, xb, yb, rb, s);
      CheckOne<B>("bf16, the GEMV", Gemv<B>(), bl, m, xb, yb, rb, s);
      CheckOne<B>("bf16, the library", Current<B>(), bl, m, xb, yb, rb, s);
      CheckOne<B>("bf16 gated, the library", Current<B>(), bgs, m, xb, yb, rb, s);
    }
  }
  {  // X with an Inf (unit 3) and a NaN (unit 40) at one row: every output's class (finite, Inf, NaN) against Int4Naive
    T* xs;
    cudaMalloc(&xs, 11008 * sizeof(T));
    cudaMemcpy(xs, x, 11008 * sizeof(T), cudaMemcpyDeviceToDevice);
    for (int which = 0; which < 2; ++which) {
      const T v = __float2half(which == 0 ? INFINITY : NAN);
      cudaMemcpy(xs + (which == 0 ? 100 : 1290), &v, sizeof(T), cudaMemcpyHostToDevice);
      for (size_t vi = 0; vi < vs.size(); ++vi) {
        if (vs[vi].name.rfind("read only", 0) == 0) continue;
        for (Proj<T>* p : {&qkv, &gu}) {
          cudaMemsetAsync(y, 0x11, size_t(p->N) * sizeof(T), s);
          Naive<T>(xs, p->wt, ref, 1, p->K, p->N, s);
          vs[vi].fn(xs, p->wt, y, 1, p->K, p->N, s);
          cudaStreamSynchronize(s);
          std::vector<T> ha(p->N), hr(p->N);
          cudaMemcpy(ha.data(), y, p->N * sizeof(T), cudaMemcpyDeviceToHost);
          cudaMemcpy(hr.data(), ref, p->N * sizeof(T), cudaMemcpyDeviceToHost);
          int diff = 0, nan = 0;
          for (int i = 0; i < p->N; ++i) {
            const float a = float(ha[i]), r = float(hr[i]);
            nan += std::isnan(r);
            diff += std::isnan(a) != std::isnan(r) || std::isinf(a) != std::isinf(r) || (std::isinf(a) && a != r);
          }
          printf("  X with %s, %-34s %s: %d of %d outputs of another class (reference NaN %d)\n",
                 which == 0 ? "an Inf" : "an Inf and a NaN", vs[vi].name.c_str(), p == &qkv ? "qkv" : "gate+up", diff,
                 p->N, nan);
        }
      }
    }
  }
  printf("done: %s\n", cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
