// EmbeddingInteraction and EmbeddingBagInteraction on the CUDA EP: the kernel structs calling
// cuda/embedding_interaction.cu's launcher or the Triton one (at the end of this file) through
// Dispatch (cuda/ops_cuda.h), and their registration.
#include <type_traits>
#include <vector>

#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

// The Triton launcher, defined at the end of this file in Triton builds (cuda/ops_cuda.h's Dispatch calls it only
// there).
extern "C" {
int onnxfuse_triton_embedding_interaction(int dtype, int interaction, int hash, const void* x, const int64_t* ids,
                                          const int64_t* offsets, const void* table, const int64_t* table_offsets,
                                          const int64_t* cardinality, void* y, int64_t batch, int64_t d,
                                          int64_t features, int64_t n_indices, int64_t rows, void* stream);
}

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

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of EmbeddingInteraction and EmbeddingBagInteraction (triton/embedding_interaction.py).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

extern "C" int onnxfuse_triton_embedding_interaction(int dtype, int interaction, int hash, const void* x,
                                                     const int64_t* ids, const int64_t* offsets, const void* table,
                                                     const int64_t* table_offsets, const int64_t* cardinality, void* y,
                                                     int64_t batch, int64_t d, int64_t features, int64_t n_indices,
                                                     int64_t rows, void* stream) {
  int64_t width = 0;
  const int check =
      onnxfuse_embedding_interaction_check(dtype, interaction, hash, batch, d, features, n_indices, rows, &width);
  if (check != 0) return check > 0 ? 0 : check;
  if (TooLarge(batch, width, n_indices) || TooLarge(d, features, 0)) return ONNXFUSE_ERR_TOO_LARGE;
  const int64_t n = features + 1;
  // The smallest compiled tile holding n vectors of d: NP indexes the size class, DP is the r_pad field.
  int np_index = -1, dp = 0;
  for (int i = 0; i < ids::kNumEmbedNps && np_index < 0; ++i)
    if (n <= ids::kEmbedNps[i]) np_index = i;
  for (int i = 0; i < ids::kNumEmbedDps && dp == 0; ++i)
    if (d <= ids::kEmbedDps[i]) dp = int(ids::kEmbedDps[i]);
  if (np_index < 0 || dp == 0) return ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE;  // no tile this large: the CUDA kernel
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  int index = -1;
  const TritonSpec* spec = FindExact(ids::kEmbeddingInteraction, dtype, np_index, 0, dp, arch, &index);
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  int32_t B = int32_t(batch), F = int32_t(features), N = int32_t(n_indices), D = int32_t(d), WIDTH = int32_t(width);
  int64_t R = rows;
  int32_t BAG = offsets != nullptr ? 1 : 0, HASH = hash == ONNXFUSE_HASH_MOD ? 1 : 0;
  int32_t DOT = interaction == ONNXFUSE_INTERACTION_DOT ? 1 : 0;
  const int64_t* offs = offsets != nullptr ? offsets : ids;  // never read without bags
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &ids, &offs, &table, &table_offsets,  &cardinality,    &y, &B, &F, &N, &D, &WIDTH,
                  &R, &BAG, &HASH, &DOT,   &scratch_global, &scratch_profile};
  return LaunchSpec(spec, index, device, (batch + spec->block_m - 1) / spec->block_m, args, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
