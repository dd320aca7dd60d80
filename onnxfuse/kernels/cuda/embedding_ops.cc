// Embedding on the CUDA EP: the kernel struct calling cuda/embedding.cu's launcher or the Triton one
// (at the end of this file) through Dispatch (cuda/ops_cuda.h), and its registration.
#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

// The Triton launcher, defined at the end of this file in Triton builds (cuda/ops_cuda.h's Dispatch calls it only
// there).
extern "C" {
int onnxfuse_triton_embedding(int dtype, const void* table, const int64_t* ids, void* y, int64_t n, int64_t vocab,
                              int64_t d, void* stream);
}

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
