// EmbeddingInteraction and EmbeddingBagInteraction on the CUDA EP: the kernel structs calling
// cuda/embedding_interaction.cu's launcher or the Triton one (cuda/triton/embedding_interaction.cc) through
// Dispatch (cuda/ops_cuda.h), and their registration.
#include <type_traits>
#include <vector>

#include "cuda/ops_cuda.h"

namespace onnxfuse {
namespace cuda {
namespace {

// EmbeddingInteraction (Bag = false) and EmbeddingBagInteraction (Bag = true): one launch either way. backend=auto
// runs the Triton kernel when triton/table.py's EMBEDDING_AUTO_TRITON says so and a tile fits, else the CUDA one.
template <typename T, bool Bag>
struct EmbeddingInteractionBase {
  using Op = std::conditional_t<Bag, schema::EmbeddingBagInteraction, schema::EmbeddingInteraction>;
  static constexpr const char* kName = Op::kName;
  EmbeddingInteractionBase(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)),
        interaction(ReadInteraction(api, info, kName)),
        hash(Bag ? ONNXFUSE_HASH_NONE : ReadHash(api, info, kName)) {
    if (attrs.backend == Backend::kAuto && !triton::kEmbeddingAutoTriton) attrs.backend = Backend::kCuda;
  }
  void Run(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<int64_t>& ids,
           const Ort::Custom::Tensor<int64_t>* offsets, const Ort::Custom::Tensor<T>& table,
           const Ort::Custom::Tensor<int64_t>& table_offsets, const Ort::Custom::Tensor<int64_t>& cardinality,
           Ort::Custom::Tensor<T>& Y) {
    std::vector<int64_t> offsets_shape;
    if (offsets != nullptr) offsets_shape = offsets->Shape();
    const EmbeddingDims e =
        EmbeddingOpDims(kName, interaction, X.Shape(), ids.Shape(), offsets != nullptr ? &offsets_shape : nullptr,
                        table.Shape(), table_offsets.Shape(), cardinality.Shape());
    T* y = Y.Allocate(e.out_shape);
    if (e.B == 0 || e.width == 0) return;
    void* stream = StreamOf(ctx);
    const void *x = X.Data(), *tb = e.R > 0 ? table.Data() : nullptr;
    const int64_t* id = (offsets == nullptr || e.N > 0) ? ids.Data() : nullptr;
    const int64_t* off = offsets != nullptr ? offsets->Data() : nullptr;
    const int64_t *to = table_offsets.Data(), *ca = cardinality.Data();
    const int dt = DtypeCode<T>();
    Dispatch(
        kName, attrs,
        [&] {
          return onnxfuse_cuda_embedding_interaction(dt, interaction, hash, x, id, off, tb, to, ca, y, e.B, e.d, e.F,
                                                     e.N, e.R, stream);
        },
        [&] {
          return onnxfuse_triton_embedding_interaction(dt, interaction, hash, x, id, off, tb, to, ca, y, e.B, e.d, e.F,
                                                       e.N, e.R, stream);
        });
  }
  OpAttrs attrs;
  int interaction;
  int hash;
};

template <typename T>
struct EmbeddingInteractionCuda : EmbeddingInteractionBase<T, false> {
  using EmbeddingInteractionBase<T, false>::EmbeddingInteractionBase;
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<int64_t>& ids,
                      const Ort::Custom::Tensor<T>& table, const Ort::Custom::Tensor<int64_t>& table_offsets,
                      const Ort::Custom::Tensor<int64_t>& cardinality, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { this->Run(ctx, X, ids, nullptr, table, table_offsets, cardinality, Y); });
  }
};

template <typename T>
struct EmbeddingBagInteractionCuda : EmbeddingInteractionBase<T, true> {
  using EmbeddingInteractionBase<T, true>::EmbeddingInteractionBase;
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X,
                      const Ort::Custom::Tensor<int64_t>& indices, const Ort::Custom::Tensor<int64_t>& offsets,
                      const Ort::Custom::Tensor<T>& table, const Ort::Custom::Tensor<int64_t>& table_offsets,
                      const Ort::Custom::Tensor<int64_t>& cardinality, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { this->Run(ctx, X, indices, &offsets, table, table_offsets, cardinality, Y); });
  }
};

}  // namespace

void RegisterEmbeddingInteractionCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<EmbeddingInteractionCuda>(domain, schema::EmbeddingInteraction::kName, kCudaEp);
  AddOpAllTypes<EmbeddingBagInteractionCuda>(domain, schema::EmbeddingBagInteraction::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse
