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

#ifdef __CUDACC__
// The activations as Triton's gated kernels compute them (triton/swiglu.py _gate_activation; their PTX): exp as
// ex2.approx.f32 of g * log2(e), division as div.full.f32 (2 ulp, full range), gelu_tanh through
// 0.5 (1 + tanh(u)) = sigmoid(2u), gelu by the accurate erff (libdevice's erf there). For a CUDA kernel that stands in
// for one of them (cuda/lora_gate_pass.h) and must cost what it does: the accurate forms above take an expf's range
// reduction and an IEEE division per element, which a pass bound by its instructions' latency pays for.
__device__ __forceinline__ float GateExpFast(float z) {
  float r;
  asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(z * 1.4426950408889634f));
  return r;
}
__device__ __forceinline__ float GateDivFast(float a, float b) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
template <int A>
__device__ __forceinline__ float GateActFast(float g) {
  if constexpr (A == ONNXFUSE_GATE_SILU) {
    return GateDivFast(g, 1.0f + GateExpFast(-g));
  } else if constexpr (A == ONNXFUSE_GATE_GELU_TANH) {
    const float beta = 0.79788456080286535588f;  // sqrt(2 / pi)
    return GateDivFast(g, 1.0f + GateExpFast(-2.0f * beta * (g + ONNXFUSE_GELU_TANH_COEFF * g * g * g)));
  } else if constexpr (A == ONNXFUSE_GATE_QUICK_GELU) {
    return GateDivFast(g, 1.0f + GateExpFast(-ONNXFUSE_QUICK_GELU_ALPHA * g));
  } else if constexpr (A == ONNXFUSE_GATE_SIGMOID) {
    return GateDivFast(1.0f, 1.0f + GateExpFast(-g));
  } else {
    return GateAct<A>(g);  // gelu (erff), relu
  }
}
#endif

inline bool ValidGateActivation(int act) { return act >= 0 && act < ONNXFUSE_NUM_GATE_ACTIVATIONS; }

}  // namespace onnxfuse
