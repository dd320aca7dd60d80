// Embedding on the CUDA EP: the kernel struct calling cuda/embedding.cu's launcher or the Triton one
// (cuda/triton/embedding.cc) through Dispatch (cuda/ops_cuda.h), and its registration.
#include "cuda/ops_cuda.h"

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
