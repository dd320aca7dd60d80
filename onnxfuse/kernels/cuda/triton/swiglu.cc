// Triton launcher of SwiGLU (triton/swiglu.py).
#include <cstdint>

#include "cuda/triton/runtime.h"

using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

namespace {
constexpr int kKernelSwiglu = ids::kSwiglu;
}  // namespace

extern "C" int onnxfuse_triton_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y,
                                      int64_t m, int64_t k, int64_t n, void* stream) {
  if (BadCommon(dtype, m, k, n) || act < 0 || act >= ONNXFUSE_NUM_GATE_ACTIVATIONS) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), ACT = act;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &w_gate, &w_up, &y, &M, &N, &K, &ACT, &scratch_global, &scratch_profile};
  const bool aligned =
      Aligned16(x) && Aligned16(w_gate) && Aligned16(w_up) && Aligned16(y) && k % 16 == 0 && n % 16 == 0;
  return Launch(kKernelSwiglu, dtype, m, n, aligned, 0, args, stream);
}
