// MLPStack with the hand-written CUDA kernels: one linear_act launch per layer (cuda/linear_act.cu), the
// intermediates in the caller's scratch. The one-kernel stack is the Triton backend's (triton/mlp_stack.py); this
// is the portable fallback and the reference the Triton path is checked against on the GPU. Also the scratch-size
// rule both backends share.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "launch.h"
#include "stack_chain.h"

namespace {
int64_t ElemBytes(int dtype) { return dtype == ONNXFUSE_FP32 ? 4 : 2; }
}  // namespace

// Two [M, SW] buffers, SW = widest hidden layer rounded up to 16 elements (so every row starts 32-byte aligned).
extern "C" int64_t onnxfuse_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || n_layers < 1 || n_layers > ONNXFUSE_MAX_STACK_LAYERS ||
      m < 0 || widths == nullptr)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  return 2 * m * onnxfuse_mlp_stack_scratch_width(n_layers, widths) * ElemBytes(dtype);
}

extern "C" int onnxfuse_cuda_mlp_stack(int dtype, int n_layers, const int* acts, const void* x, const void* const* w,
                                       const void* const* b, void* y, int64_t m, const int64_t* widths, void* scratch,
                                       int64_t scratch_bytes, void* stream) {
  const int64_t need = onnxfuse_mlp_stack_scratch_bytes(dtype, n_layers, m, widths);
  if (need < 0) return int(need);
  if (acts == nullptr || w == nullptr || b == nullptr || (need > 0 && (scratch == nullptr || scratch_bytes < need)))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  return onnxfuse::StackPerLayer(n_layers, x, y, scratch, need, [&](int i, const void* in, void* out) {
    return onnxfuse_cuda_linear_act(dtype, acts[i], in, w[i], b[i], out, m, widths[i], widths[i + 1], stream);
  });
}
