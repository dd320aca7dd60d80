// Triton launcher of EmbeddingInteraction and EmbeddingBagInteraction (triton/embedding_interaction.py).
#include <cstdint>

#include "cuda/triton/runtime.h"

using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

namespace {
constexpr int kKernelEmbeddingInteraction = ids::kEmbeddingInteraction;
}  // namespace

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
  const TritonSpec* spec = FindExact(kKernelEmbeddingInteraction, dtype, np_index, 0, dp, arch, &index);
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
