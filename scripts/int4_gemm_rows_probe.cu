// Issue 28, int4 prefill at 17-512 rows: cuda/int4_linear.cu's Int4MmaGemm (mma.sync, the weights dequantized in
// registers once a block, any block size of 32 or more) against the library's path there for blocks of 32 (all of W^T
// dequantized, then one cuBLASLt GEMM) and against cuBLAS on weights already dequantized (what the fp16 model pays),
// on a Llama-2-7B layer's projections; cudaEvent time per run, the median of 7 batches of 10 (plain launches, no
// graph). First a check on small ragged shapes in fp16 and bf16 against the dequantization + cuBLAS path (max |d| /
// max |ref|), then the timings with each form's best tile rows (64 or 128) and K split (1-8) at each size. A program,
// not the CLI. The sm_90a form (cuda/sm90a/int4_rows_wgmma.cu, "wg" tiles) is timed and checked beside it where
// the device is 9.0. Build (CUDA 12.8+, from the repository root) and run on the GPU machine:
//   python -m onnxfuse.kernels.ops_header > /tmp/onnxfuse_ops.h
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DONNXFUSE_WITH_SM90A -I onnxfuse/kernels \
//        -I onnxfuse/kernels/cuda -I /tmp scripts/int4_gemm_rows_probe.cu onnxfuse/kernels/cuda/gemm.cu \
//        onnxfuse/kernels/cuda/sm90a/int4_rows_wgmma.cu -o /tmp/int4_gemm_rows_probe -ldl
//   LD_LIBRARY_PATH=<libcublasLt's folder> /tmp/int4_gemm_rows_probe [ROWS,ROWS,...] [BLOCK,BLOCK,...] [variants [V]]
// With -DWS_PROBE (and without the separate sm_90a source: it is included here) the variants add the warp-specialised
// form of scripts/int4_wgmma_ws_probe.cuh (-I scripts); with -DWG_PROBE (the same way) the sm_90a kernel at template
// settings the library does not launch (LaunchWgT: row tile, ring steps, blocks an SM).
#include "cuda/int4_linear.cu"  // the nvcc half in this TU: Int4MmaGemm, RowsPlanFor, Dequantize, Geometry

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "int4_probe_fill.cuh"
#if defined(WS_PROBE) || defined(WG_PROBE)  // the library's sm_90a TU here, its kernel's templates in reach
#include "cuda/sm90a/int4_rows_wgmma.cu"
#endif
#ifdef WS_PROBE  // the warp-specialised probe form (scripts/int4_wgmma_ws_probe.cuh)
#include "int4_wgmma_ws_probe.cuh"
#endif

namespace {

std::vector<int64_t> List(const char* arg, std::vector<int64_t> def) {
  if (arg == nullptr) return def;
  std::vector<int64_t> v;
  std::stringstream ss(arg);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(atoll(item.c_str()));
  return v;
}

template <typename T>
float ToF(T v) {
  return float(v);
}
template <>
float ToF<__half>(__half v) {
  return __half2float(v);
}
template <>
float ToF<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

__global__ void HalfToBf16(const __half* a, __nv_bfloat16* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    b[i] = __float2bfloat16(__half2float(a[i]));
}

struct Bufs {
  uint8_t* wq;
  void *sc, *x, *y, *yr, *w;
  float* part;
  void* ws;
};

// Max |got - ref| / max |ref| over Y [m, n], and whether any value is not finite.
template <typename T>
double RelDiff(const void* got, const void* ref, int64_t count, bool* nonfinite) {
  std::vector<T> a(static_cast<size_t>(count)), b(static_cast<size_t>(count));
  cudaMemcpy(a.data(), got, count * sizeof(T), cudaMemcpyDeviceToHost);
  cudaMemcpy(b.data(), ref, count * sizeof(T), cudaMemcpyDeviceToHost);
  double md = 0, mr = 0;
  *nonfinite = false;
  for (size_t i = 0; i < a.size(); ++i) {
    const double u = ToF(a[i]), v = ToF(b[i]);
    if (!std::isfinite(u) || !std::isfinite(v)) *nonfinite = true;
    md = std::max(md, fabs(u - v));
    mr = std::max(mr, fabs(v));
  }
  return mr > 0 ? md / mr : md;
}

}  // namespace

// A tile variant of Int4MmaGemm outside the library's launch (fp16; `variants` mode): BM rows, BN columns, WN warps
// along N, STAGES, K split `splits` ways.
template <int BM, int BN, int WN, int STAGES>
int LaunchVariant(const __half* x, const Int4Weights& wt, __half* y, int64_t m, int64_t k, int64_t n, float* part,
                  int splits, cudaStream_t s) {
  const int steps = int(k / 64), per = (steps + splits - 1) / splits;
  splits = (steps + per - 1) / per;
  const dim3 grid(unsigned((n + BN - 1) / BN), unsigned((m + BM - 1) / BM), unsigned(splits));
  const size_t smem = size_t(STAGES) * (BN * 32 + BM * 128);
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    kernel<<<grid, 128, smem, s>>>(x, wt.wq, static_cast<const __half*>(wt.scales), y, part, int(n), int(m), int(k),
                                   int(n), int(wt.nb), wt.lb, int(wt.row_bytes), per);
    return int(cudaGetLastError());
  };
  int err = splits > 1 ? launch(Int4MmaGemm<__half, BM, BN, WN, STAGES, 2, true>)
                       : launch(Int4MmaGemm<__half, BM, BN, WN, STAGES, 2, false>);
  if (err || splits == 1) return err;
  Int4SplitSum<__half><<<1024, 256, 0, s>>>(part, y, int(n), int(m), int(n), splits);
  return int(cudaGetLastError());
}

// The library's sm_90a form (cuda/sm90a/int4_rows_wgmma.cu) at BM rows, fp16, blocks of 32.
template <int BM>
int LaunchWg(const __half* x, const Int4Weights& wt, __half* y, int64_t m, int64_t k, int64_t n, float* part,
             int splits, cudaStream_t s) {
  return LaunchMmaGemm<__half>(x, wt, y, n, m, k, n, part, BM, splits, true, s);
}

#if defined(WS_PROBE) || defined(WG_PROBE)
// The sm_90a kernel at template settings the library does not launch: BM rows, STAGES, MINB blocks an SM.
template <int BM, int STAGES, int MINB>
int LaunchWgT(const __half* x, const Int4Weights& wt, __half* y, int64_t m, int64_t k, int64_t n, float* part,
              int splits, cudaStream_t s) {
  const int steps = int(k / 64), per = (steps + splits - 1) / splits;
  splits = (steps + per - 1) / per;
  int err = LaunchWgmma<__half, BM, STAGES, MINB>(x, wt.wq, wt.scales, y, part, n, m, k, n, wt.nb, wt.row_bytes, splits,
                                                  per, s);
  if (err || splits == 1) return err;
  Int4SplitSum<__half><<<1024, 256, 0, s>>>(part, y, int(n), int(m), int(n), splits);
  return int(cudaGetLastError());
}
#endif

#ifdef WS_PROBE
template <int BM, int STAGES>
int LaunchWs(const __half* x, const Int4Weights& wt, __half* y, int64_t m, int64_t k, int64_t n, float* part,
             int splits, cudaStream_t s) {
  const int steps = int(k / 64), per = (steps + splits - 1) / splits;
  splits = (steps + per - 1) / per;
  const dim3 grid(unsigned((n + 127) / 128), unsigned((m + BM - 1) / BM), unsigned(splits));
  const size_t smem = size_t(STAGES) * (BM * 128 + 128 * 32) + 2 * 128 * 128 + 1024;
  auto launch = [&](auto kernel) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    kernel<<<grid, 384, smem, s>>>(x, wt.wq, static_cast<const __half*>(wt.scales), y, part, int(n), int(m), int(k),
                                   int(n), int(wt.nb), int(wt.row_bytes), per);
    return int(cudaGetLastError());
  };
  int err =
      splits > 1 ? launch(ws_probe::Int4WgmmaWs<BM, STAGES, true>) : launch(ws_probe::Int4WgmmaWs<BM, STAGES, false>);
  if (err || splits == 1) return err;
  Int4SplitSum<__half><<<1024, 256, 0, s>>>(part, y, int(n), int(m), int(n), splits);
  return int(cudaGetLastError());
}
#endif

int main(int argc, char** argv) {
  const std::vector<int64_t> rows = List(argc > 1 ? argv[1] : nullptr, {17, 32, 64, 128, 256, 512});
  const std::vector<int64_t> blocks = List(argc > 2 ? argv[2] : nullptr, {32, 128});
  cudaStream_t s;
  cudaStreamCreate(&s);
  Bufs b{};
  const int64_t kMaxW = int64_t(12288) * 4096, kMaxM = 2048;  // qkv's W
  cudaMalloc(&b.wq, kMaxW / 2);
  cudaMalloc(&b.sc, kMaxW / 32 * 2);
  cudaMalloc(&b.x, kMaxM * 11008 * 2);
  cudaMalloc(&b.y, kMaxM * 12288 * 2);
  cudaMalloc(&b.yr, kMaxM * 12288 * 2);
  cudaMalloc(&b.w, kMaxW * 2);
  cudaMalloc(&b.part, 16 * kMaxM * 12288 * 4);
  cudaMalloc(&b.ws, ONNXFUSE_CUBLASLT_WORKSPACE_BYTES);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);

  // The reference: the library's path past the GEMV's rows without CUTLASS (dequantize W^T, then cuBLASLt).
  auto ref_path = [&](int dtype, const Int4Weights& wt, void* y, int64_t M, int64_t K, int64_t N) {
    int err = Dequantize(dtype, b.wq, b.sc, nullptr, b.w, K, N, wt, s);
    ock::GemmArgs g;
    g.dtype = dtype, g.x = b.x, g.w = b.w, g.y = y, g.m = M, g.k = K, g.n = N;
    g.trans_w = true;
    return err | ock::Gemm(g, b.ws, ONNXFUSE_CUBLASLT_WORKSPACE_BYTES, s);
  };
  auto gemm_only = [&](int dtype, void* y, int64_t M, int64_t K, int64_t N) {
    ock::GemmArgs g;
    g.dtype = dtype, g.x = b.x, g.w = b.w, g.y = y, g.m = M, g.k = K, g.n = N;
    g.trans_w = true;
    return ock::Gemm(g, b.ws, ONNXFUSE_CUBLASLT_WORKSPACE_BYTES, s);
  };
  auto mma_gemm = [&](int dtype, const Int4Weights& wt, int64_t M, int64_t K, int64_t N, int bm, int splits,
                      bool wgmma = false) {
    if (dtype == ONNXFUSE_FP16)
      return LaunchMmaGemm<__half>(static_cast<const __half*>(b.x), wt, static_cast<__half*>(b.y), N, M, K, N, b.part,
                                   bm, splits, wgmma, s);
    return LaunchMmaGemm<__nv_bfloat16>(static_cast<const __nv_bfloat16*>(b.x), wt, static_cast<__nv_bfloat16*>(b.y), N,
                                        M, K, N, b.part, bm, splits, wgmma, s);
  };
  const bool wg = WgmmaRows(100, 32);  // the sm_90a form is built and this is a 9.0 device
  printf("sm_90a rows form: %s\n", wg ? "yes" : "no");
  auto fill = [&](int dtype, int64_t M, int64_t K, int64_t N, int64_t block, float sscale) {
    Fill<<<1024, 256>>>(b.wq, N * K / 2, 1);
    FillHalf<<<1024, 256>>>(static_cast<__half*>(b.sc), N * (K / block), sscale, 2);
    FillHalf<<<1024, 256>>>(static_cast<__half*>(b.x), M * K, 1.f, 3);
    if (dtype == ONNXFUSE_BF16) {  // the same values rounded to bf16, in place through the weights' scratch
      HalfToBf16<<<1024, 256>>>(static_cast<const __half*>(b.sc), static_cast<__nv_bfloat16*>(b.w), N * (K / block));
      cudaMemcpy(b.sc, b.w, N * (K / block) * 2, cudaMemcpyDeviceToDevice);
      HalfToBf16<<<1024, 256>>>(static_cast<const __half*>(b.x), static_cast<__nv_bfloat16*>(b.w), M * K);
      cudaMemcpy(b.x, b.w, M * K * 2, cudaMemcpyDeviceToDevice);
    }
  };

  auto attrs = [](const char* name, const void* f) {
    cudaFuncAttributes a{};
    cudaFuncGetAttributes(&a, f);
    printf("%s: %d registers, %zu bytes local\n", name, a.numRegs, a.localSizeBytes);
  };
  attrs("Int4MmaGemm<fp16, 32 rows, block 32>",
        reinterpret_cast<const void*>(Int4MmaGemm<__half, 32, kGemmBN, 4, kGemmStages, 2, false>));
  attrs("Int4MmaGemm<fp16, 64 rows, block 32>",
        reinterpret_cast<const void*>(Int4MmaGemm<__half, 64, kGemmBN, 4, kGemmStages, 2, false>));
  attrs("Int4MmaGemm<fp16, 96 rows, block 32>",
        reinterpret_cast<const void*>(Int4MmaGemm<__half, 96, kGemmBN, 4, kGemmStages, 2, false>));
  attrs("Int4MmaGemm<bf16, 128 rows, block 128, split>",
        reinterpret_cast<const void*>(Int4MmaGemm<__nv_bfloat16, 128, kGemmBN, 4, kGemmStages, 1, true>));

  // 1. Check: ragged shapes, both types, every tile rows and a K split, against the reference path.
  struct C {
    int64_t m, k, n, block;
  } checks[] = {{17, 576, 1000, 32},   {37, 1536, 576, 64}, {100, 4096, 1032, 128}, {300, 11008, 264, 32},
                {129, 640, 4096, 256}, {64, 2048, 200, 32}, {1, 128, 8, 32}};
  int bad = 0;
  for (int dtype : {ONNXFUSE_FP16, ONNXFUSE_BF16})
    for (const C& c : checks) {
      fill(dtype, c.m, c.k, c.n, c.block, 0.01f);
      const Int4Weights wt = Geometry(b.wq, b.sc, nullptr, nullptr, nullptr, nullptr, c.k, c.block);
      int err = ref_path(dtype, wt, b.yr, c.m, c.k, c.n);
      for (int form : {32, 64, 96, 1096, 1128, 1160, 1192})  // 1000 + bm: the sm_90a form (blocks of 32)
        for (int splits : {1, 3}) {
          if (form > 1000 && (!wg || c.block != 32)) continue;
          const int bm = form % 1000;
          cudaMemset(b.y, 0xFF, c.m * c.n * 2);
          err |= mma_gemm(dtype, wt, c.m, c.k, c.n, bm, splits, form > 1000);
          cudaStreamSynchronize(s);
          bool nf = false;
          const double d = dtype == ONNXFUSE_FP16 ? RelDiff<__half>(b.y, b.yr, c.m * c.n, &nf)
                                                  : RelDiff<__nv_bfloat16>(b.y, b.yr, c.m * c.n, &nf);
          const bool ok = err == 0 && !nf && d < (dtype == ONNXFUSE_FP16 ? 2e-3 : 1.6e-2);
          bad += !ok;
          printf("check %s m %4ld k %5ld n %5ld block %3ld tile %s%d splits %d: rel %.3g%s%s\n",
                 dtype == ONNXFUSE_FP16 ? "fp16" : "bf16", long(c.m), long(c.k), long(c.n), long(c.block),
                 form > 1000 ? "wg" : "", bm, splits, d, nf ? " NONFINITE" : "", ok ? "" : "  FAIL");
        }
    }
  printf("checks: %s\n", bad ? "FAILED" : "passed");

  auto time_us = [&](auto&& fn) {
    int err = fn();
    for (int i = 0; i < 3; ++i) err |= fn();
    std::vector<float> t;
    for (int r = 0; r < 7; ++r) {
      cudaEventRecord(e0, s);
      for (int i = 0; i < 10; ++i) err |= fn();
      cudaEventRecord(e1, s);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      t.push_back(ms * 100.f);
    }
    std::sort(t.begin(), t.end());
    return err ? -1.f : t[3];
  };

  // 1b. `variants` (third argument): tile variants against the library's rule, blocks of 32, fp16.
  if (argc > 3 && std::string(argv[3]) == "variants") {
    struct V {
      const char* name;
      int (*fn)(const __half*, const Int4Weights&, __half*, int64_t, int64_t, int64_t, float*, int, cudaStream_t);
    } all_vars[] = {
        {"32s4", LaunchVariant<32, 128, 4, 4>},
        {"64s4", LaunchVariant<64, 128, 4, 4>},
        {"96s4", LaunchVariant<96, 128, 4, 4>},
        {"wg96", LaunchWg<96>},
        {"wg128", LaunchWg<128>},
        {"wg192", LaunchWg<192>},
#if defined(WS_PROBE) || defined(WG_PROBE)
        {"wg96b3", LaunchWgT<96, 4, 3>},
        {"wg96s3b3", LaunchWgT<96, 3, 3>},
        {"wg128s4b2", LaunchWgT<128, 4, 2>},
        {"wg160s3b2", LaunchWgT<160, 3, 2>},
        {"wg160s4", LaunchWgT<160, 4, 1>},
        {"wg192s3", LaunchWgT<192, 3, 1>},
        {"wg256s4", LaunchWgT<256, 4, 1>},
#endif
#ifdef WS_PROBE
        {"ws96s4", LaunchWs<96, 4>},
        {"ws128s4", LaunchWs<128, 4>},
        {"ws128s5", LaunchWs<128, 5>},
#endif
    };
    std::vector<V> vars;  // a fourth argument keeps one variant (for Nsight Compute)
    for (const V& v : all_vars)
      if (argc <= 4 || std::string(argv[4]) == v.name) vars.push_back(v);
    struct P {
      const char* name;
      int64_t k, n;
    } projs[] = {{"qkv", 4096, 12288}, {"o", 4096, 4096}, {"gate", 4096, 11008}, {"down", 11008, 4096}};
    for (int64_t M : rows) {
      std::vector<double> layer(vars.size(), 0.0);
      double rule_layer = 0, dq_layer = 0, fp16_layer = 0;
      for (const P& p : projs) {
        fill(ONNXFUSE_FP16, M, p.k, p.n, 32, 0.01f);
        const Int4Weights wt = Geometry(b.wq, b.sc, nullptr, nullptr, nullptr, nullptr, p.k, 32);
        ref_path(ONNXFUSE_FP16, wt, b.yr, M, p.k, p.n);
        const int times = std::string(p.name) == "gate" ? 2 : 1;
        const RowsPlan plan = RowsPlanFor(M, p.k, p.n, 32);
        const float tr =
            time_us([&] { return mma_gemm(ONNXFUSE_FP16, wt, M, p.k, p.n, plan.bm, plan.splits, plan.wgmma); });
        rule_layer += times * tr;
        const float tdq = time_us([&] { return ref_path(ONNXFUSE_FP16, wt, b.yr, M, p.k, p.n); });
        const float tfp = time_us([&] { return gemm_only(ONNXFUSE_FP16, b.y, M, p.k, p.n); });
        dq_layer += times * tdq, fp16_layer += times * tfp;
        printf("M %4ld %-5s rule %.1f dq+cublas %.1f cublas-fp16 %.1f |", long(M), p.name, tr, tdq, tfp);
        for (size_t v = 0; v < layer.size(); ++v) {
          float best = 1e30f;
          int bs = 0;
          for (int splits : {1, 2, 3, 4, 6, 8, 12, 16}) {
            const float t = time_us([&] {
              return vars[v].fn(static_cast<const __half*>(b.x), wt, static_cast<__half*>(b.y), M, p.k, p.n, b.part,
                                splits, s);
            });
            if (t > 0 && t < best) best = t, bs = splits;
          }
          vars[v].fn(static_cast<const __half*>(b.x), wt, static_cast<__half*>(b.y), M, p.k, p.n, b.part, bs, s);
          cudaStreamSynchronize(s);
          bool nf = false;
          const double d = RelDiff<__half>(b.y, b.yr, M * p.n, &nf);
          printf(" %s %.1f/%d%s", vars[v].name, best, bs, (nf || d > 2e-3) ? " BAD" : "");
          layer[v] += times * best;
        }
        printf("\n");
      }
      printf("M %4ld LAYER rule %.1f dq+cublas %.1f cublas-fp16 %.1f |", long(M), rule_layer, dq_layer, fp16_layer);
      for (size_t v = 0; v < layer.size(); ++v) printf(" %s %.1f", vars[v].name, layer[v]);
      printf("\n");
      fflush(stdout);
    }
    return bad ? 1 : 0;
  }

  // 2. Timing: the 7B layer's projections.
  struct P {
    const char* name;
    int64_t k, n;
  } projs[] = {{"qkv", 4096, 12288}, {"o", 4096, 4096}, {"gate", 4096, 11008}, {"down", 11008, 4096}};
  for (int64_t block : blocks)
    for (int64_t M : rows) {
      double sum_ref = 0, sum_gemm = 0, sum_new = 0, sum_rule = 0;
      for (const P& p : projs) {
        const int dtype = ONNXFUSE_FP16;
        fill(dtype, M, p.k, p.n, block, 0.01f);
        const Int4Weights wt = Geometry(b.wq, b.sc, nullptr, nullptr, nullptr, nullptr, p.k, block);
        const float t_ref = time_us([&] { return ref_path(dtype, wt, b.yr, M, p.k, p.n); });
        const float t_gemm = time_us([&] { return gemm_only(dtype, b.y, M, p.k, p.n); });
        float best = 1e30f;
        int best_bm = 0, best_split = 0;
        std::string all;
        for (int form : {32, 64, 96, 1096, 1128, 1160, 1192}) {  // 1000 + bm: the sm_90a form
          const int bm = form % 1000;
          if ((bm >= 96 && M <= 64) || (bm == 32 && M > 64) || (form > 1000 && (!wg || block != 32))) continue;
          for (int splits : {1, 2, 3, 4, 6, 8, 12, 16}) {
            const float t = time_us([&] { return mma_gemm(dtype, wt, M, p.k, p.n, bm, splits, form > 1000); });
            char buf[48];
            snprintf(buf, sizeof buf, " %s%d/%d:%.1f", form > 1000 ? "wg" : "", bm, splits, t);
            all += buf;
            if (t > 0 && t < best) best = t, best_bm = form, best_split = splits;
          }
        }
        const RowsPlan plan = RowsPlanFor(M, p.k, p.n, block);
        const float t_rule =
            time_us([&] { return mma_gemm(dtype, wt, M, p.k, p.n, plan.bm, plan.splits, plan.wgmma); });
        char rb[64];
        snprintf(rb, sizeof rb, " rule %s%d/%d:%.1f", plan.wgmma ? "wg" : "", plan.bm, plan.splits, t_rule);
        all += rb;
        sum_rule += (std::string(p.name) == "gate" ? 2 : 1) * t_rule;
        if (best_split == 0) {
          printf("block %ld M %ld %s: every Int4MmaGemm launch failed\n", long(block), long(M), p.name);
          return 1;
        }
        mma_gemm(dtype, wt, M, p.k, p.n, best_bm % 1000, best_split, best_bm > 1000);
        cudaStreamSynchronize(s);
        bool nf = false;
        const double d = RelDiff<__half>(b.y, b.yr, M * p.n, &nf);
        printf(
            "block %3ld M %4ld %-5s dq+cublas %7.1f  cublas-fp16 %7.1f  mma-gemm %7.1f (tile %d splits %d, rel %.2g%s) "
            " [%s ]\n",
            long(block), long(M), p.name, t_ref, t_gemm, best, best_bm, best_split, d, nf ? " NONFINITE" : "",
            all.c_str());
        const int times = std::string(p.name) == "gate" ? 2 : 1;  // gate and up
        sum_ref += times * t_ref, sum_gemm += times * t_gemm, sum_new += times * best;
      }
      printf(
          "block %3ld M %4ld LAYER dq+cublas %7.1f  cublas-fp16 %7.1f  mma-gemm best %7.1f, rule %7.1f  (the rule "
          "%.2fx the dequantization + cuBLAS path)\n",
          long(block), long(M), sum_ref, sum_gemm, sum_new, sum_rule, sum_ref / sum_rule);
      fflush(stdout);
    }
  return bad ? 1 : 0;
}
