// Build (from the repository root, with onednn-cpu-gomp, onednn-devel-cpu-gomp and scipy-openblas32 installed):
//   g++ -O3 -std=gnu++17 -ffp-contract=fast -fopenmp -I$VENV/include -Ionnxfuse/kernels scripts/cpu_gemm_compare.cc \
//       onnxfuse/kernels/cpu/gemm.cc -L$VENV/lib -l:libdnnl.so.3 -L$OPENBLAS/lib -lscipy_openblas
//       -Wl,-rpath,$VENV/lib:$OPENBLAS/lib
//   OMP_WAIT_POLICY=passive ./a.out [M K N ...]
// Single-thread GEMM+bias+relu engines on the bench shapes, interleaved: ours (gemm.cc), oneDNN matmul (prepacked,
// post-ops), OpenBLAS sgemm + epilogue.
// Why a program and not the CLI: it times the GEMM engines themselves, outside onnxruntime and the kernel library
// (OpenBLAS is no dependency of onnxfuse), the comparison behind the CPU backend's choice of oneDNN.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>
#include <random>
#include <algorithm>
#include <omp.h>
#include <functional>
#include <cmath>
#include <oneapi/dnnl/dnnl.hpp>
#include "cpu/gemm.h"
extern "C" {
void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
void scipy_openblas_set_num_threads(int);
}
using namespace onnxfuse::cpu;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

struct ReluEpi final : Epilogue {
  const float* bias;
  float* y;
  int64_t N;
  void Apply(int64_t m0, int64_t mb, int64_t n0, int64_t nc, const float* const* acc, int64_t ld) const override {
    for (int64_t i = 0; i < mb; ++i) {
      const float* a = acc[0] + i * ld;
      float* o = y + (m0 + i) * N + n0;
      for (int64_t j = 0; j < nc; ++j) {
        float z = a[j] + bias[n0 + j];
        o[j] = z > 0 ? z : 0;
      }
    }
  }
};
static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  omp_set_num_threads(1);
  scipy_openblas_set_num_threads(1);
  struct S {
    int M, K, N;
  };
  std::vector<S> shapes = {{64, 13, 512},    {64, 512, 256},   {64, 256, 64},    {64, 64, 16},   {64, 367, 512},
                           {64, 256, 1},     {64, 256, 688},   {64, 688, 256},   {64, 256, 256}, {16, 256, 688},
                           {2048, 512, 256}, {2048, 367, 512}, {256, 1024, 1024}};
  if (argc > 1) {
    shapes.clear();
    for (int i = 1; i + 2 < argc; i += 3) shapes.push_back({atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2])});
  }
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  printf("%-16s %9s %9s %9s %9s   (us, median of interleaved reps; GF/s for best)\n", "M,K,N", "ours", "onednn",
         "openblas", "ob+epi");
  for (auto s : shapes) {
    int M = s.M, K = s.K, N = s.N;
    std::vector<float> x(M * K), w(K * N), b(N), y0(M * N), y1(M * N), y2(M * N);
    for (auto& v : x) v = nd(rng);
    for (auto& v : w) v = nd(rng) / 16;
    for (auto& v : b) v = nd(rng);
    PackedB pb = PackB(Format::F32, BOperand{w.data(), K, nullptr}, K, N);
    ReluEpi epi;
    epi.bias = b.data();
    epi.y = y0.data();
    epi.N = N;
    GemmArgs g;
    g.fmt = Format::F32;
    g.M = M;
    g.K = K;
    g.N = N;
    g.x = x.data();
    g.b[0] = BOperand{w.data(), K, nullptr, &pb};
    g.epilogue = &epi;
    g.threads = 1;
    // oneDNN
    dnnl::memory::desc src_md({M, K}, dt::f32, tag::ab), wany({K, N}, dt::f32, tag::any), bmd({1, N}, dt::f32, tag::ab),
        dmd({M, N}, dt::f32, tag::ab);
    dnnl::post_ops po;
    po.append_eltwise(dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    dnnl::matmul::primitive_desc pd(eng, src_md, wany, bmd, dmd, attr);
    dnnl::memory wplain({{K, N}, dt::f32, tag::ab}, eng, w.data()), wp(pd.weights_desc(), eng);
    dnnl::reorder(wplain, wp).execute(strm, wplain, wp);
    dnnl::matmul mm(pd);
    dnnl::memory xs(src_md, eng, x.data()), bs(bmd, eng, b.data()), ds(dmd, eng, y1.data());
    auto run_ours = [&] { Gemm(g); };
    auto run_dnnl = [&] {
      mm.execute(strm, {{DNNL_ARG_SRC, xs}, {DNNL_ARG_WEIGHTS, wp}, {DNNL_ARG_BIAS, bs}, {DNNL_ARG_DST, ds}});
    };
    auto run_ob = [&] { scipy_cblas_sgemm(101, 111, 111, M, N, K, 1.f, x.data(), K, w.data(), N, 0.f, y2.data(), N); };
    auto run_obe = [&] {
      scipy_cblas_sgemm(101, 111, 111, M, N, K, 1.f, x.data(), K, w.data(), N, 0.f, y2.data(), N);
      for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
          float z = y2[i * N + j] + b[j];
          y2[i * N + j] = z > 0 ? z : 0;
        }
    };
    std::function<void()> fns[4] = {run_ours, run_dnnl, run_ob, run_obe};
    std::vector<double> t[4];
    double flops = 2.0 * M * K * N;
    int inner = std::max(1, int(2e7 / flops));
    for (int f = 0; f < 4; ++f)
      for (int i = 0; i < 3; ++i) fns[f]();
    for (int rep = 0; rep < 41; ++rep)
      for (int f = 0; f < 4; ++f) {
        double t0 = now();
        for (int i = 0; i < inner; ++i) fns[f]();
        t[f].push_back((now() - t0) / inner * 1e6);
      }
    double med[4];
    for (int f = 0; f < 4; ++f) {
      std::sort(t[f].begin(), t[f].end());
      med[f] = t[f][t[f].size() / 2];
    }
    double err = 0;
    for (int i = 0; i < M * N; ++i) err = std::max(err, (double)std::fabs(y0[i] - y1[i]));
    double err2 = 0;
    for (int i = 0; i < M * N; ++i) err2 = std::max(err2, (double)std::fabs(y0[i] - y2[i]));
    char nm[32];
    snprintf(nm, 32, "%d,%d,%d", M, K, N);
    printf(
        "%-16s %9.2f %9.2f %9.2f %9.2f   GF/s %6.1f %6.1f %6.1f %6.1f  err %.1e %.1e  p10-p90 ours %.1f-%.1f dnnl "
        "%.1f-%.1f\n",
        nm, med[0], med[1], med[2], med[3], flops / med[0] / 1e3, flops / med[1] / 1e3, flops / med[2] / 1e3,
        flops / med[3] / 1e3, err, err2, t[0][4], t[0][36], t[1][4], t[1][36]);
  }
}
