// Triton launcher of LinearRelu and LinearSigmoid (triton/linear_act.py; the persistent TMA build through WithTma).
#include <cstdint>

#include "cuda/triton/runtime.h"

using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

namespace {
constexpr int kKernelLinearAct = ids::kLinearAct;
}  // namespace

extern "C" int64_t onnxfuse_triton_linear_act_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n) {
  if (BadCommon(dtype, m, k, n)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return TmaScratchBytes(dtype, m, k);
}

extern "C" int onnxfuse_triton_linear_act(int dtype, int act, const void* x, const void* w, const void* bias, void* y,
                                          int64_t m, int64_t k, int64_t n, void* scratch, int64_t scratch_bytes,
                                          void* stream) {
  if (BadCommon(dtype, m, k, n) || (act != ONNXFUSE_ACT_RELU && act != ONNXFUSE_ACT_SIGMOID))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  const bool aligned = Aligned16(x) && Aligned16(w) && Aligned16(bias) && Aligned16(y) && k % 16 == 0 && n % 16 == 0;
  int index = -1;
  const TritonSpec* spec = FindForShape(kKernelLinearAct, dtype, m, n, aligned, 0, arch, device, &index);
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  int64_t grid = 0;
  spec = WithTma(spec, &index, m, k, n, arch, device, scratch, scratch_bytes, &grid);
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), ACT = act, NPROG = int32_t(grid);
  void* scratch_global = spec->tma ? scratch : nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &w, &bias, &y, &M, &N, &K, &ACT, &NPROG, &scratch_global, &scratch_profile};
  return LaunchSpec(spec, index, device, grid, args, stream);
}
