// Embedding on the CUDA execution provider, in one file: the launchers' C declarations below, then the nvcc half (the
// CUDA kernels) and the host half (the CUDA EP glue and the Triton launcher); cuda/cuda.cmake says how it is built.
#include "cuda/launch.h"

extern "C" {
// Embedding: Y [n, D] = table [vocab, D] rows at ids (int64, n of them); negative ids count from the end, ids outside
// [-vocab, vocab) give rows of zeros.
int onnxfuse_cuda_embedding(int dtype, const void* table, const int64_t* ids, void* y, int64_t n, int64_t vocab,
                            int64_t d, void* stream);
// The Triton launcher (the host half, Triton builds only: cuda/ops_cuda.h's Dispatch calls it only there).
int onnxfuse_triton_embedding(int dtype, const void* table, const int64_t* ids, void* y, int64_t n, int64_t vocab,
                              int64_t d, void* stream);
}

#ifdef __CUDACC__
// Embedding (onnxfuse.schema) on the CUDA backend: Y = table[ids], rows copied 16 bytes per thread.
//
// A row of D elements is D * sizeof(T) bytes; when that, the table and Y are 16-byte aligned, each thread moves one
// uint4 (8 fp16/bf16 or 4 fp32 elements), else one element. A grid-stride loop over ids x row chunks, 64-bit indices.
// Negative ids count from the end; an id outside [-V, V) writes a row of zeros (a kernel cannot raise; the CPU
// kernel fails the call instead, as onnxruntime's Gather does).
#include <cuda_runtime.h>

#include <cstdint>

#include "gemm.h"  // Aligned16
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

using onnxfuse::cuda_kernels::Aligned16;

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

#else  // the host half: the CUDA EP glue and the Triton launcher
// Embedding on the CUDA EP: the kernel struct calling the nvcc half's launcher or the Triton one
// (at the end of this file) through Dispatch (cuda/ops_cuda.h), and its registration.
#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

template <typename T>
struct EmbeddingCuda {
  static constexpr const char* kName = schema::Embedding::kName;
  EmbeddingCuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& Table,
                      const Ort::Custom::Tensor<int64_t>& Ids, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LookupDims d = EmbeddingDimsOf(kName, Table.Shape(), Ids.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.n == 0 || d.D == 0) return;
      void* stream = StreamOf(ctx);
      const void* table = Table.Data();
      const int64_t* ids = Ids.Data();
      Dispatch(
          kName, attrs, [&] { return onnxfuse_cuda_embedding(DtypeCode<T>(), table, ids, y, d.n, d.V, d.D, stream); },
          [&] { return onnxfuse_triton_embedding(DtypeCode<T>(), table, ids, y, d.n, d.V, d.D, stream); });
    });
  }
  OpAttrs attrs;
};

}  // namespace

void RegisterEmbeddingCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<EmbeddingCuda>(domain, schema::Embedding::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of Embedding (triton/embedding.py).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

extern "C" int onnxfuse_triton_embedding(int dtype, const void* table, const int64_t* ids, void* y, int64_t n,
                                         int64_t vocab, int64_t d, void* stream) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || n < 0 || vocab < 0 || d < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (n == 0 || d == 0) return 0;
  if (n > 0x7fffffffLL || d > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  int32_t NIDS = int32_t(n), D = int32_t(d);
  int64_t VOCAB = vocab;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&table, &ids, &y, &NIDS, &VOCAB, &D, &scratch_global, &scratch_profile};
  const bool aligned = Aligned16(table) && Aligned16(ids) && Aligned16(y) && d % 16 == 0;
  return Launch(ids::kEmbedding, dtype, n, d, aligned, 0, args, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
