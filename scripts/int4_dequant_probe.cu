// Issue 28, int4 prefill: the dequantization that precedes the GEMM past 16 rows (cuda/int4_linear.cu Dequantize:
// W^T [N, K] in fp16 from the packed 4-bit rows and their block scales, block 32, symmetric) against its form before
// 2026-11-27 (copied below: 16 values a thread, the zero point and the vector path as run-time flags) and other thread
// shapes, on a Llama-2-7B layer's projections and lm_head; cudaEvent time per call (median of 7 x 10), the read +
// write bytes over it, and whether each variant's output equals the library's bit for bit. A program, not the CLI:
// it times kernels of the CUDA backend without onnxruntime. Build (from the repository root) and run on the GPU
// machine:
//   python -m onnxfuse.kernels.ops_header > /tmp/onnxfuse_ops.h
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -I onnxfuse/kernels -I onnxfuse/kernels/cuda -I /tmp \
//        scripts/int4_dequant_probe.cu onnxfuse/kernels/cuda/gemm.cu -o /tmp/int4_dequant_probe -ldl
//   LD_LIBRARY_PATH=<libcublasLt's folder> /tmp/int4_dequant_probe
#include "cuda/int4_linear.cu"
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "int4_probe_fill.cuh"

// fp16 half2 math (FasterTransformer's nibble trick), a thread per G 16-value groups (16-byte loads where G >= 2)
template <int G>
__global__ void DqHalf2(const uint8_t* __restrict__ wq, const __half* __restrict__ scales, __half* __restrict__ w,
                        int K, int N, int nb, int lb, int row_bytes) {
  const int groups = (K + 15) / 16;
  const int g0 = (blockIdx.x * blockDim.x + threadIdx.x) * G;
  if (g0 >= groups) return;
  for (int col = blockIdx.y; col < N; col += gridDim.y) {
    const uint8_t* q = wq + int64_t(col) * row_bytes + g0 * 8;
    uint32_t words[2 * G];
    if constexpr (G == 2) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(q));
      words[0] = v.x, words[1] = v.y, words[2] = v.z, words[3] = v.w;
    } else {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(q));
      words[0] = v.x, words[1] = v.y;
    }
#pragma unroll
    for (int i = 0; i < G; ++i) {
      const int g = g0 + i;
      if (g >= groups) break;
      const __half2 s2 = __half2half2(scales[int64_t(col) * nb + ((g * 16) >> lb)]);
      uint4 out[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        __half2 d[4];
        CentredHalf2(words[2 * i + h], d, 8);
        __half2 o[4] = {__lows2half2(d[0], d[1]), __lows2half2(d[2], d[3]), __highs2half2(d[0], d[1]),
                        __highs2half2(d[2], d[3])};
#pragma unroll
        for (int j = 0; j < 4; ++j) o[j] = __hmul2(o[j], s2);
        out[h] = *reinterpret_cast<const uint4*>(o);
      }
      uint4* dst = reinterpret_cast<uint4*>(w + int64_t(col) * K + g * 16);
      dst[0] = out[0];
      dst[1] = out[1];
    }
  }
}

// a thread per 8 values (one 4-byte load, one 16-byte store), float math, the zero point a constant
__global__ void Dq8(const uint8_t* __restrict__ wq, const __half* __restrict__ scales, __half* __restrict__ w, int K,
                    int N, int nb, int lb, int row_bytes) {
  const int words = K / 8;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= words) return;
  for (int col = blockIdx.y; col < N; col += gridDim.y) {
    const uint32_t word = __ldg(reinterpret_cast<const uint32_t*>(wq + int64_t(col) * row_bytes) + i);
    const float sc = __half2float(scales[int64_t(col) * nb + ((i * 8) >> lb)]);
    __half v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __float2half(Centred(word, j) * sc);
    reinterpret_cast<uint4*>(w + int64_t(col) * K)[i] = *reinterpret_cast<const uint4*>(v);
  }
}
// a thread per 16 values, C columns a block (the columns' loads issued together)
template <int C>
__global__ void DqCols(const uint8_t* __restrict__ wq, const __half* __restrict__ scales, __half* __restrict__ w, int K,
                       int N, int nb, int lb, int row_bytes) {
  const int groups = K / 16;
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const int col0 = blockIdx.y * C;
  uint2 words[C];
  float sc[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const int col = col0 + c < N ? col0 + c : N - 1;
    words[c] = __ldg(reinterpret_cast<const uint2*>(wq + int64_t(col) * row_bytes + g * 8));
    sc[c] = __half2float(scales[int64_t(col) * nb + ((g * 16) >> lb)]);
  }
#pragma unroll
  for (int c = 0; c < C; ++c) {
    if (col0 + c >= N) break;
    __half v[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      v[j] = __float2half(Centred(words[c].x, j) * sc[c]);
      v[8 + j] = __float2half(Centred(words[c].y, j) * sc[c]);
    }
    uint4* dst = reinterpret_cast<uint4*>(w + int64_t(col0 + c) * K + g * 16);
    dst[0] = reinterpret_cast<const uint4*>(v)[0];
    dst[1] = reinterpret_cast<const uint4*>(v)[1];
  }
}

// the library's kernel before 2026-11-27, verbatim
template <typename T>
__global__ void Int4DequantizeBefore(const uint8_t* __restrict__ wq, const T* __restrict__ scales,
                                     const uint8_t* __restrict__ zp, T* __restrict__ w, int K, int N, int nb, int lb,
                                     int row_bytes, int zb, bool vec) {
  const int groups = (K + 15) / 16;
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  const int k0 = g * 16;
  for (int col = blockIdx.y; col < N; col += gridDim.y) {
    const uint8_t* q = wq + int64_t(col) * row_bytes + g * 8;
    uint2 words;
    if (vec) {
      words = __ldg(reinterpret_cast<const uint2*>(q));
    } else {
      words.x = uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24;
      words.y = uint32_t(q[4]) | uint32_t(q[5]) << 8 | uint32_t(q[6]) << 16 | uint32_t(q[7]) << 24;
    }
    const float sc = ock::to_f(scales[int64_t(col) * nb + (k0 >> lb)]);
    const float bias = zp == nullptr ? ZBias(8) : ZBias(ZeroPoint(zp + int64_t(col) * zb, k0 >> lb));
    T vals[16];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      vals[j] = ock::from_f<T>(Centred(words.x, j, bias) * sc);
      vals[8 + j] = ock::from_f<T>(Centred(words.y, j, bias) * sc);
    }
    T* out = w + int64_t(col) * K + k0;
    if (vec && sizeof(T) == 2 && k0 + 16 <= K && K % 8 == 0) {
      reinterpret_cast<uint4*>(out)[0] = reinterpret_cast<const uint4*>(vals)[0];
      reinterpret_cast<uint4*>(out)[1] = reinterpret_cast<const uint4*>(vals)[1];
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j)
        if (k0 + j < K) out[j] = vals[j];
    }
  }
}

int main() {
  struct P {
    const char* name;
    int K, N;
  } ps[] = {{"qkv", 4096, 12288},
            {"o", 4096, 4096},
            {"gate+up", 4096, 22016},
            {"down", 11008, 4096},
            {"lm_head", 4096, 49152}};
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaStream_t s;
  cudaStreamCreate(&s);
  for (auto& p : ps) {
    const int K = p.K, N = p.N, block = 32, nb = K / block, lb = 5, row_bytes = K / 2;
    uint8_t* wq;
    __half *sc, *w0, *w1;
    cudaMalloc(&wq, int64_t(N) * K / 2);
    cudaMalloc(&sc, int64_t(N) * nb * 2);
    cudaMalloc(&w0, int64_t(N) * K * 2);
    cudaMalloc(&w1, int64_t(N) * K * 2);
    Fill<<<1024, 256>>>(wq, int64_t(N) * K / 2, 1);
    FillHalf<<<1024, 256>>>(sc, int64_t(N) * nb, 0.01f, 2);
    const Int4Weights wt = Geometry(wq, sc, nullptr, nullptr, nullptr, nullptr, K, block);
    const double bytes = double(N) * K * 2 + double(N) * K / 2 + double(N) * nb * 2;
    auto time = [&](auto fn) {
      for (int i = 0; i < 3; ++i) fn();
      std::vector<float> t;
      for (int r = 0; r < 7; ++r) {
        cudaEventRecord(e0, s);
        for (int i = 0; i < 10; ++i) fn();
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        t.push_back(ms * 100.f);
      }
      std::sort(t.begin(), t.end());
      return t[3];
    };
    float lib = time([&] { Dequantize(ONNXFUSE_FP16, wq, sc, nullptr, w0, K, N, wt, s); });
    const int groups = K / 16;
    const int nyA = N < 65535 ? N : 65535;
    float a =
        time([&] { DqHalf2<1><<<dim3((groups + 255) / 256, nyA), 256, 0, s>>>(wq, sc, w1, K, N, nb, lb, row_bytes); });
    std::vector<uint16_t> h0(size_t(N) * K), h1(size_t(N) * K);
    cudaMemcpy(h0.data(), w0, h0.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(h1.data(), w1, h1.size() * 2, cudaMemcpyDeviceToHost);
    const bool eqA = memcmp(h0.data(), h1.data(), h0.size() * 2) == 0;
    cudaMemset(w1, 0, int64_t(N) * K * 2);
    auto check = [&] {
      cudaMemcpy(h1.data(), w1, h1.size() * 2, cudaMemcpyDeviceToHost);
      const bool eq = memcmp(h0.data(), h1.data(), h0.size() * 2) == 0;
      cudaMemset(w1, 0, int64_t(N) * K * 2);
      return eq;
    };
    float v1 = time([&] {
      Int4DequantizeBefore<__half><<<dim3(unsigned((K + 15) / 16 + 255) / 256, nyA), 256, 0, s>>>(
          wq, sc, nullptr, w1, K, N, nb, lb, row_bytes, 0, true);
    });
    const bool e1 = check();
    float v1b = time([&] { Dq8<<<dim3((K / 8 + 511) / 512, nyA), 512, 0, s>>>(wq, sc, w1, K, N, nb, lb, row_bytes); });
    const bool e1b = check();
    float c2 = time([&] {
      DqCols<2><<<dim3((groups + 255) / 256, (N + 1) / 2), 256, 0, s>>>(wq, sc, w1, K, N, nb, lb, row_bytes);
    });
    const bool e2 = check();
    float c4 = time([&] {
      DqCols<4><<<dim3((groups + 255) / 256, (N + 3) / 4), 256, 0, s>>>(wq, sc, w1, K, N, nb, lb, row_bytes);
    });
    const bool e4 = check();
    float l128 =
        time([&] { DqCols<1><<<dim3((groups + 127) / 128, N), 128, 0, s>>>(wq, sc, w1, K, N, nb, lb, row_bytes); });
    const bool e128 = check();
    printf(
        "%-8s K %5d N %5d  library %6.1f us (%.2f TB/s)  16/thread half2 %6.1f (%d)  before %6.1f (%d)  8/thread x512 "
        "%6.1f (%d)  16/thread 2 cols %6.1f (%d)  4 cols %6.1f (%d)  128 threads %6.1f (%d)\n",
        p.name, K, N, lib, bytes / lib / 1e6, a, eqA, v1, e1, v1b, e1b, c2, e2, c4, e4, l128, e128);
    cudaFree(wq);
    cudaFree(sc);
    cudaFree(w0);
    cudaFree(w1);
  }
}
