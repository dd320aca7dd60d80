// MLPStack as one launch per layer, shared by the CUDA backend (cuda/mlp_stack.cu) and the Triton backend's
// per-layer path (its launcher in the host half of the same file). Plain C++ (no ORT, no CUDA headers), so nvcc and g++
// both compile it.
#pragma once
#include <cstdint>

namespace onnxfuse {

// Layer i reads x (i = 0) or the previous layer's output, and writes y (last layer) or one of the two [M, SW]
// halves of `scratch` (scratch_need = onnxfuse_mlp_stack_scratch_bytes). launch(i, in, out) enqueues layer i and
// returns a launch.h code; the first non-zero code stops the chain.
template <typename LaunchLayer>
int StackPerLayer(int n_layers, const void* x, void* y, void* scratch, int64_t scratch_need, LaunchLayer&& launch) {
  char* buf[2] = {static_cast<char*>(scratch), static_cast<char*>(scratch) + scratch_need / 2};
  const void* in = x;
  for (int i = 0; i < n_layers; ++i) {
    void* out = i == n_layers - 1 ? y : buf[i % 2];
    const int err = launch(i, in, out);
    if (err != 0) return err;
    in = out;
  }
  return 0;
}

}  // namespace onnxfuse
