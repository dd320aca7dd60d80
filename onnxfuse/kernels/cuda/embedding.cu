// Embedding (onnxfuse.schema) on the CUDA backend: Y = table[ids], rows copied 16 bytes per thread.
//
// A row of D elements is D * sizeof(T) bytes; when that, the table and Y are 16-byte aligned, each thread moves one
// uint4 (8 fp16/bf16 or 4 fp32 elements), else one element. A grid-stride loop over ids x row chunks, 64-bit indices.
// Negative ids count from the end; an id outside [-V, V) writes a row of zeros (a kernel cannot raise; the CPU
// kernel fails the call instead, as onnxruntime's Gather does).
#include <cuda_runtime.h>

#include <cstdint>

#include "launch.h"

namespace {

template <typename V>
__global__ void EmbeddingKernel(const V* __restrict__ table, const int64_t* __restrict__ ids, V* __restrict__ y,
                                int64_t n, int64_t vocab, int64_t row_vecs) {
  const int64_t total = n * row_vecs;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / row_vecs, c = i - r * row_vecs;
    int64_t id = ids[r];
    if (id < 0) id += vocab;
    V v;
    if (id >= 0 && id < vocab) {
      v = table[id * row_vecs + c];
    } else {
      v = V{};
    }
    y[i] = v;
  }
}

template <typename V>
int Run(const void* table, const int64_t* ids, void* y, int64_t n, int64_t vocab, int64_t row_vecs,
        cudaStream_t stream) {
  const int threads = 256;
  int64_t blocks = (n * row_vecs + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;
  EmbeddingKernel<V><<<unsigned(blocks), threads, 0, stream>>>(static_cast<const V*>(table), ids, static_cast<V*>(y), n,
                                                               vocab, row_vecs);
  return int(cudaGetLastError());
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

extern "C" int onnxfuse_cuda_embedding(int dtype, const void* table, const int64_t* ids, void* y, int64_t n,
                                       int64_t vocab, int64_t d, void* stream) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || n < 0 || vocab < 0 || d < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (n == 0 || d == 0) return 0;
  if (table == nullptr || ids == nullptr || y == nullptr) return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int64_t elem = dtype == ONNXFUSE_FP32 ? 4 : 2;
  const int64_t row_bytes = d * elem;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (row_bytes % 16 == 0 && Aligned16(table) && Aligned16(y))
    return Run<uint4>(table, ids, y, n, vocab, row_bytes / 16, s);
  if (elem == 4) return Run<uint32_t>(table, ids, y, n, vocab, d, s);
  return Run<uint16_t>(table, ids, y, n, vocab, d, s);
}
