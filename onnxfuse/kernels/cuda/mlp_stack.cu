// MLPStack on the CUDA backend: one linear_act launch (a cuBLASLt GEMM, cuda/linear_act.cu) per layer, the
// intermediates in the caller's scratch. The one-kernel stacks are the Triton backend's (triton/mlp_stack.py). Also
// the scratch-size rule both backends share.
#include <cstdint>

#include "gemm.h"
#include "stack_chain.h"

namespace ock = onnxfuse::cuda_kernels;

// Two [M, SW] buffers, SW = widest hidden layer rounded up to 16 elements (so every row starts 32-byte aligned).
extern "C" int64_t onnxfuse_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || n_layers < 1 || n_layers > ONNXFUSE_MAX_STACK_LAYERS || m < 0 ||
      widths == nullptr)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  return 2 * m * onnxfuse_mlp_stack_scratch_width(n_layers, widths) * ock::ElemBytes(dtype);
}

// The CUDA backend's: the cuBLASLt workspace first, then those two buffers.
extern "C" int64_t onnxfuse_cuda_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths) {
  const int64_t buffers = onnxfuse_mlp_stack_scratch_bytes(dtype, n_layers, m, widths);
  return buffers < 0 ? buffers : ONNXFUSE_CUBLASLT_WORKSPACE_BYTES + buffers;
}

extern "C" int onnxfuse_cuda_mlp_stack(int dtype, int n_layers, const int* acts, const void* x, const void* const* w,
                                       const void* const* b, void* y, int64_t m, const int64_t* widths, void* scratch,
                                       int64_t scratch_bytes, void* stream) {
  const int64_t need = onnxfuse_cuda_mlp_stack_scratch_bytes(dtype, n_layers, m, widths);
  if (need < 0) return int(need);
  if (acts == nullptr || w == nullptr || b == nullptr || scratch == nullptr || scratch_bytes < need)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int64_t ws = ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
  char* buffers = static_cast<char*>(scratch) + ws;
  return onnxfuse::StackPerLayer(n_layers, x, y, buffers, need - ws, [&](int i, const void* in, void* out) {
    return onnxfuse_cuda_linear_act(dtype, acts[i], in, w[i], b[i], out, m, widths[i], widths[i + 1], scratch, ws,
                                    stream);
  });
}
