// Issue 28, int4 prefill: a Llama-2-7B layer's int4 projections (fp16, block 32) at M rows, dequantized and multiplied
// three ways, cudaEvent time per run: all of W^T dequantized then one cuBLASLt GEMM (the library's path past 16 rows),
// the GEMM alone on weights already dequantized (what the fp16 model pays), and W^T in column chunks with each
// chunk's GEMM right after its dequantization (so that it reads the chunk from L2; its output into a dense chunk
// buffer, copied into Y's columns only for the check against the whole path). A program, not the CLI: it times pieces
// of the CUDA backend (cuda/int4_linear.cu's Dequantize in this translation unit, cuda/gemm.cu's Gemm) without
// onnxruntime. Build (CUDA 12.8+, from the repository root) and run on the GPU machine:
//   python -m onnxfuse.kernels.ops_header > /tmp/onnxfuse_ops.h
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -I onnxfuse/kernels -I onnxfuse/kernels/cuda -I /tmp \
//        scripts/int4_prefill_chunks.cu onnxfuse/kernels/cuda/gemm.cu -o /tmp/int4_prefill_chunks -ldl
//   LD_LIBRARY_PATH=<libcublasLt's folder> /tmp/int4_prefill_chunks 2048
#include "cuda/int4_linear.cu"  // the nvcc half in this TU: Dequantize, Geometry

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <cstdlib>
#include <vector>

#include "int4_probe_fill.cuh"

int main(int argc, char** argv) {
  const int64_t M = argc > 1 ? atoll(argv[1]) : 2048;
  struct P {
    const char* name;
    int64_t k, n;
  } projs[] = {{"qkv", 4096, 12288}, {"o", 4096, 4096}, {"gate+up", 4096, 22016}, {"down", 11008, 4096}};
  const int64_t block = 32;
  cudaStream_t s;
  cudaStreamCreate(&s);
  void* ws;
  cudaMalloc(&ws, ONNXFUSE_CUBLASLT_WORKSPACE_BYTES);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (const P& p : projs) {
    const int64_t K = p.k, N = p.n, nb = K / block;
    uint8_t* wq;
    __half *sc, *x, *y, *w, *yc;
    cudaMalloc(&wq, N * K / 2);
    cudaMalloc(&sc, N * nb * 2);
    cudaMalloc(&x, M * K * 2);
    cudaMalloc(&y, M * N * 2);
    cudaMalloc(&w, N * K * 2);
    cudaMalloc(&yc, M * 4096 * 2);  // the largest chunk's output
    Fill<<<1024, 256>>>(wq, N * K / 2, 1);
    FillHalf<<<1024, 256>>>(sc, N * nb, 0.01f, 2);
    FillHalf<<<1024, 256>>>(x, M * K, 1.f, 3);
    const Int4Weights wt = Geometry(wq, sc, nullptr, nullptr, nullptr, nullptr, K, block);
    auto gemm = [&](const __half* wc, __half* yc, int64_t nc) {
      ock::GemmArgs g;
      g.dtype = ONNXFUSE_FP16, g.x = x, g.w = wc, g.y = yc, g.m = M, g.k = K, g.n = nc;
      g.trans_w = true;
      return ock::Gemm(g, ws, ONNXFUSE_CUBLASLT_WORKSPACE_BYTES, s);
    };
    bool check = false;              // copy each chunk's output into Y's columns (the check's run only)
    auto run = [&](int64_t chunk) {  // 0: whole; -1: the GEMM alone on W already dequantized
      int err = 0;
      if (chunk < 0) return gemm(w, y, N);
      if (chunk == 0) {
        err |= Dequantize(ONNXFUSE_FP16, wq, sc, nullptr, w, K, N, wt, s);
        return err | gemm(w, y, N);
      }
      for (int64_t n0 = 0; n0 < N; n0 += chunk) {
        const int64_t nc = N - n0 < chunk ? N - n0 : chunk;
        err |= Dequantize(ONNXFUSE_FP16, wq + n0 * wt.row_bytes, sc + n0 * nb, nullptr, w, K, nc, wt, s);
        err |= gemm(w, yc, nc);
        if (check) err |= int(cudaMemcpy2DAsync(y + n0, N * 2, yc, nc * 2, nc * 2, M, cudaMemcpyDeviceToDevice, s));
      }
      return err;
    };
    std::vector<__half> ref(size_t(M * N)), got(size_t(M * N));
    run(0);
    cudaMemcpy(ref.data(), y, M * N * 2, cudaMemcpyDeviceToHost);
    for (int64_t chunk : {int64_t(0), int64_t(-1), int64_t(512), int64_t(1024), int64_t(2048), int64_t(4096)}) {
      if (chunk >= N) continue;
      cudaMemset(y, 0, M * N * 2);
      check = true;
      int err = run(chunk);
      check = false;
      for (int i = 0; i < 3; ++i) err |= run(chunk);
      cudaStreamSynchronize(s);
      cudaMemcpy(got.data(), y, M * N * 2, cudaMemcpyDeviceToHost);
      double maxd = 0;
      for (size_t i = 0; i < got.size(); i += 97) {
        double d = fabs(double(__half2float(got[i])) - double(__half2float(ref[i])));
        maxd = d > maxd ? d : maxd;
      }
      std::vector<float> t;
      for (int r = 0; r < 7; ++r) {
        cudaEventRecord(e0, s);
        for (int i = 0; i < 10; ++i) err |= run(chunk);
        cudaEventRecord(e1, s);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        t.push_back(ms * 100.f);  // us per run
      }
      std::sort(t.begin(), t.end());
      printf("%-8s M %ld K %5ld N %5ld  %-12s %8.1f us  (err %d, max diff vs whole %.3g)\n", p.name, long(M), long(K),
             long(N),
             chunk == 0  ? "whole"
             : chunk < 0 ? "gemm only"
                         : ("chunk " + std::to_string(chunk)).c_str(),
             t[3], err, maxd);
    }
    for (void* p : {static_cast<void*>(wq), static_cast<void*>(sc), static_cast<void*>(x), static_cast<void*>(y),
                    static_cast<void*>(w), static_cast<void*>(yc)})
      cudaFree(p);
  }
  return 0;
}
