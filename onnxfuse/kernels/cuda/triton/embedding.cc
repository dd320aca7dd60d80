// Triton launcher of Embedding (triton/embedding.py).
#include <cstdint>

#include "cuda/triton/runtime.h"

using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

namespace {
constexpr int kKernelEmbedding = ids::kEmbedding;
}  // namespace

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
  return Launch(kKernelEmbedding, dtype, n, d, aligned, 0, args, stream);
}
