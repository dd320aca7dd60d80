// Build and run (from the repository root; AVX-512 hosts):
//   g++ -O3 -march=native -fopenmp scripts/cpu_gemv_probe.cc -o /tmp/gemv_probe
//   OMP_NUM_THREADS=$(nproc) /tmp/gemv_probe K N LAYERS      # e.g. 576 1536 200 (SmolLM2's gate/up), 576 49152 8
// The decode GEMV's reachable memory rate on this host (issue 27, CPU): y = x @ W for LAYERS distinct [K, N] fp32
// weights (together far past the caches, as a decoder's layers are), split over N (each thread its column slice of
// every row) or over K (each thread a contiguous run of rows into its own partial y, then a sum), in GB/s of weight
// read. Why a program and not the CLI: it measures a kernel onnxfuse does not have yet, outside onnxruntime, against
// the read rate `onnxfuse bench genai` measures and onnxruntime's MatMuls in the decoder's profile
// (scripts/decode_profile.py).
#include <immintrin.h>
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>
// y[N] = x[K] @ W[K,N] (row-major), split over N across threads (each thread: its column slice of every row)
static void gemv_nsplit(const float* x, const float* W, float* y, int K, int N) {
#pragma omp parallel
  {
    int t = omp_get_thread_num(), T = omp_get_num_threads();
    int per = ((N + T - 1) / T + 15) / 16 * 16;
    int n0 = std::min(N, t * per), n1 = std::min(N, n0 + per);
    for (int n = n0; n < n1; n += 64) {
      int w = std::min(64, n1 - n);
      if (w == 64) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int k = 0; k < K; ++k) {
          __m512 xk = _mm512_set1_ps(x[k]);
          const float* r = W + (size_t)k * N + n;
          a0 = _mm512_fmadd_ps(xk, _mm512_loadu_ps(r), a0);
          a1 = _mm512_fmadd_ps(xk, _mm512_loadu_ps(r + 16), a1);
          a2 = _mm512_fmadd_ps(xk, _mm512_loadu_ps(r + 32), a2);
          a3 = _mm512_fmadd_ps(xk, _mm512_loadu_ps(r + 48), a3);
        }
        _mm512_storeu_ps(y + n, a0);
        _mm512_storeu_ps(y + n + 16, a1);
        _mm512_storeu_ps(y + n + 32, a2);
        _mm512_storeu_ps(y + n + 48, a3);
      } else {
        for (int j = 0; j < w; ++j) {
          float s = 0;
          for (int k = 0; k < K; ++k) s += x[k] * W[(size_t)k * N + n + j];
          y[n + j] = s;
        }
      }
    }
  }
}
// split over K: each thread streams a contiguous block of rows into its own partial y, then a reduction
static void gemv_ksplit(const float* x, const float* W, float* y, int K, int N, std::vector<float>& part) {
  int T = omp_get_max_threads();
  part.resize((size_t)T * N);
#pragma omp parallel
  {
    int t = omp_get_thread_num();
    int per = (K + T - 1) / T;
    int k0 = std::min(K, t * per), k1 = std::min(K, k0 + per);
    float* p = part.data() + (size_t)t * N;
    for (int n = 0; n < N; n += 16) {
      _mm512_storeu_ps(p + n, _mm512_setzero_ps());
    }
    for (int k = k0; k < k1; ++k) {
      __m512 xk = _mm512_set1_ps(x[k]);
      const float* r = W + (size_t)k * N;
      int n = 0;
      for (; n + 64 <= N; n += 64) {
        _mm512_storeu_ps(p + n, _mm512_fmadd_ps(xk, _mm512_loadu_ps(r + n), _mm512_loadu_ps(p + n)));
        _mm512_storeu_ps(p + n + 16, _mm512_fmadd_ps(xk, _mm512_loadu_ps(r + n + 16), _mm512_loadu_ps(p + n + 16)));
        _mm512_storeu_ps(p + n + 32, _mm512_fmadd_ps(xk, _mm512_loadu_ps(r + n + 32), _mm512_loadu_ps(p + n + 32)));
        _mm512_storeu_ps(p + n + 48, _mm512_fmadd_ps(xk, _mm512_loadu_ps(r + n + 48), _mm512_loadu_ps(p + n + 48)));
      }
      for (; n < N; ++n) p[n] += x[k] * r[n];
    }
  }
  for (int n = 0; n < N; ++n) {
    float s = 0;
    for (int t = 0; t < T; ++t) s += part[(size_t)t * N + n];
    y[n] = s;
  }
}
int main(int argc, char** argv) {
  int K = atoi(argv[1]), N = atoi(argv[2]), L = atoi(argv[3]);
  std::vector<float*> Ws(L);
  for (int l = 0; l < L; ++l) {
    Ws[l] = (float*)aligned_alloc(64, (size_t)K * N * 4);
    for (size_t i = 0; i < (size_t)K * N; ++i) Ws[l][i] = (i % 7) * 0.01f;
  }
  std::vector<float> x(K, 0.5f), y(N), part;
  for (int mode = 0; mode < 2; ++mode) {
    std::vector<double> times;
    for (int rep = 0; rep < 7; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int l = 0; l < L; ++l) {
        if (mode == 0)
          gemv_nsplit(x.data(), Ws[l], y.data(), K, N);
        else
          gemv_ksplit(x.data(), Ws[l], y.data(), K, N, part);
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      times.push_back(s);
    }
    std::sort(times.begin(), times.end());
    const double med = times[times.size() / 2];  // the median, as scripts/cpu_decode_matmul.py times onnxruntime
    printf("%s K%d N%d L%d: %.3f ms, %.1f GB/s\n", mode ? "ksplit" : "nsplit", K, N, L, med * 1e3,
           (double)L * K * N * 4 / med / 1e9);
  }
}
