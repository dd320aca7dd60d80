// SwiGLU's gate activations (onnxfuse/schema.py GATE_ACTIVATIONS, codes onnxfuse_gate_act), in fp32 and as PyTorch
// defines them, shared by the CPU epilogue (g++) and the CUDA kernels (nvcc) so both compute the same formula:
//   silu        g * sigmoid(g)
//   gelu        0.5 * g * (1 + erf(g / sqrt(2)))                            torch gelu, approximate='none'
//   gelu_tanh   0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 * g^3)))     torch gelu, approximate='tanh'
//   quick_gelu  g * sigmoid(1.702 * g)
//   relu        max(g, 0), NaN stays NaN (torch.relu)
//   sigmoid     1 / (1 + exp(-g))
// erff / tanhf / expf are the accurate libm (host) and CUDA math (device) functions, not the fast intrinsics:
// gelu and gelu_tanh differ by less than 1e-3, so their error must stay well below that.
#pragma once

#include <math.h>

#include "onnxfuse_ops.h"

#ifdef __CUDACC__
#define ONNXFUSE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define ONNXFUSE_HOST_DEVICE inline
#endif

namespace onnxfuse {

ONNXFUSE_HOST_DEVICE float GateSigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

template <int A>
ONNXFUSE_HOST_DEVICE float GateAct(float g) {
  if constexpr (A == ONNXFUSE_GATE_SILU) {
    return g * GateSigmoid(g);
  } else if constexpr (A == ONNXFUSE_GATE_GELU) {
    return 0.5f * g * (1.0f + erff(g * 0.70710678118654752440f));
  } else if constexpr (A == ONNXFUSE_GATE_GELU_TANH) {
    const float beta = 0.79788456080286535588f;  // sqrt(2 / pi)
    return 0.5f * g * (1.0f + tanhf(beta * (g + ONNXFUSE_GELU_TANH_COEFF * g * g * g)));
  } else if constexpr (A == ONNXFUSE_GATE_QUICK_GELU) {
    return g * GateSigmoid(ONNXFUSE_QUICK_GELU_ALPHA * g);
  } else if constexpr (A == ONNXFUSE_GATE_RELU) {
    return g > 0.0f ? g : (g != g ? g : 0.0f);
  } else {
    static_assert(A == ONNXFUSE_GATE_SIGMOID, "unknown gate activation code");
    return GateSigmoid(g);
  }
}

// The same by a run-time code (uniform across a kernel launch, so the branch costs a few instructions per element
// of the epilogue; an unknown code is rejected by the launchers before any launch).
ONNXFUSE_HOST_DEVICE float GateActivation(int act, float g) {
  switch (act) {
    case ONNXFUSE_GATE_GELU:
      return GateAct<ONNXFUSE_GATE_GELU>(g);
    case ONNXFUSE_GATE_GELU_TANH:
      return GateAct<ONNXFUSE_GATE_GELU_TANH>(g);
    case ONNXFUSE_GATE_QUICK_GELU:
      return GateAct<ONNXFUSE_GATE_QUICK_GELU>(g);
    case ONNXFUSE_GATE_RELU:
      return GateAct<ONNXFUSE_GATE_RELU>(g);
    case ONNXFUSE_GATE_SIGMOID:
      return GateAct<ONNXFUSE_GATE_SIGMOID>(g);
    default:
      return GateAct<ONNXFUSE_GATE_SILU>(g);
  }
}

inline bool ValidGateActivation(int act) { return act >= 0 && act < ONNXFUSE_NUM_GATE_ACTIVATIONS; }

}  // namespace onnxfuse
