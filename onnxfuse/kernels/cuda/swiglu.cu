// SwiGLU on the CUDA execution provider, in one file: the launchers' C declarations below, then the nvcc half (the CUDA
// kernels) and the host half (the CUDA EP glue and the Triton launcher); cuda/cuda.cmake says how it is built.
#include <algorithm>

#include "cuda/launch.h"

extern "C" {
// SwiGLU: Y = act(X @ W_gate) * (X @ W_up), act an onnxfuse_gate_act code (silu, gelu, gelu_tanh, quick_gelu,
// relu, sigmoid; common/gate_act.h), computed in fp32: two GEMMs (the gate into Y, the up product into scratch),
// then one elementwise pass.
int64_t onnxfuse_cuda_swiglu_scratch_bytes(int dtype, int64_t m, int64_t n);
int onnxfuse_cuda_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y, int64_t m,
                         int64_t k, int64_t n, void* scratch, int64_t scratch_bytes, void* stream);
// SwiGLU's two base GEMMs alone (G = X @ W_gate into g, U = X @ W_up into u, both [m, n]; cuBLASLt with `workspace`
// of ONNXFUSE_CUBLASLT_WORKSPACE_BYTES): what the CUDA backend runs before its pass, and what LoRASwiGLU's Triton
// launcher runs before its lora_gate pass from triton/table.py LORA_SWIGLU_CUBLAS's shapes.
int onnxfuse_cuda_swiglu_gemms(int dtype, const void* x, const void* w_gate, const void* w_up, void* g, void* u,
                               int64_t m, int64_t k, int64_t n, void* workspace, void* stream);
// LoRASwiGLU's cuBLASLt path (the Triton launcher below, from triton/table.py LORA_SWIGLU_CUBLAS's shapes): its gate
// pass in CUDA (cuda/lora_gate_pass.h) for fp16/bf16, ranks to 16 and N a multiple of 64 (`_takes`: whether it
// takes a dtype, N and the largest of the ranks), else Triton's lora_gate. y = act(g + sg Tg @ Bg) * (u + su Tu @ Bu)
// over [m, n] (y may be g), tg/tu phase 1's partials [split, m, 16] fp32, A_down [n, rd] and its fp32 sum td [m, 16]
// added to (rd 0: none); 16-byte aligned buffers; sms: the device's SM count.
int onnxfuse_cuda_lora_gate_pass_takes(int dtype, int64_t n, int64_t r);
int onnxfuse_cuda_lora_gate_pass(int dtype, int act, const void* g, const void* u, const float* tg, const float* tu,
                                 int64_t split, const void* bg, const void* bu, int64_t rg, int64_t ru, float sg,
                                 float su, const void* ad, float* td, int64_t rd, void* y, int64_t m, int64_t n,
                                 int sms, void* stream);
// The Triton launcher (the host half, Triton builds only: cuda/ops_cuda.h's Dispatch calls it only there).
int onnxfuse_triton_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y, int64_t m,
                           int64_t k, int64_t n, void* stream);
// LoRASwiGLU: Y = act(X @ W_gate + sg (X @ A_gate) @ B_gate) * (X @ W_up + su (X @ A_up) @ B_up), A_gate [k, rg],
// B_gate [rg, n], A_up [k, ru], B_up [ru, n]: per projection T = s X @ A, then T @ B into the output, then X @ W
// accumulated onto it in the GEMM's epilogue (beta 1, as LoRALinear's CUDA backend), then SwiGLU's pass.
int64_t onnxfuse_cuda_lora_swiglu_scratch_bytes(int dtype, int64_t m, int64_t n, int64_t rg, int64_t ru);
int onnxfuse_cuda_lora_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                              const void* a_gate, const void* b_gate, const void* a_up, const void* b_up,
                              float scale_gate, float scale_up, void* y, int64_t m, int64_t k, int64_t n, int64_t rg,
                              int64_t ru, void* scratch, int64_t scratch_bytes, void* stream);
// Its Triton launcher: lora_linear.py's X @ A phase for both adapters (one launch) into fp32 partials, then one kernel
// with SwiGLU's main loop and both rank-r terms before the activation (triton/swiglu.py); from triton/table.py
// LORA_SWIGLU_CUBLAS's rows and K, the two base GEMMs on cuBLASLt and one gate pass instead of that kernel (the CUDA
// one where it takes the shape, else Triton's lora_gate).
int64_t onnxfuse_triton_lora_swiglu_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t rg, int64_t ru);
int onnxfuse_triton_lora_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                const void* a_gate, const void* b_gate, const void* a_up, const void* b_up,
                                float scale_gate, float scale_up, void* y, int64_t m, int64_t k, int64_t n, int64_t rg,
                                int64_t ru, void* scratch, int64_t scratch_bytes, void* stream);
// MultiLoRASwiGLU: LoRASwiGLU with a stack of adapters per projection (A_gate [adapters, k, rg], B_gate [adapters,
// rg, n], scales_gate [adapters], the same for up) and each row's adapter index[row / rows_per_index] (none where
// < 0, NaN where >= adapters). CUDA: per projection the GEMM, then gemm.h's shrink and expand kernels
// (MultiLoRAGemm), then SwiGLU's pass. Triton: lora_linear.py's multi_lora_xa per stack, then multi_lora_swiglu
// (SwiGLU's main loop with each adapter's rank-r dots before the activation).
int64_t onnxfuse_cuda_multi_lora_swiglu_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t rg,
                                                      int64_t ru);
int onnxfuse_cuda_multi_lora_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                    const void* a_gate, const void* b_gate, const void* a_up, const void* b_up,
                                    const void* scales_gate, const void* scales_up, const int64_t* index, void* y,
                                    int64_t m, int64_t k, int64_t n, int64_t rg, int64_t ru, int64_t adapters,
                                    int64_t rows_per_index, void* scratch, int64_t scratch_bytes, void* stream);
int64_t onnxfuse_triton_multi_lora_swiglu_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t rg,
                                                        int64_t ru);
int onnxfuse_triton_multi_lora_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                      const void* a_gate, const void* b_gate, const void* a_up, const void* b_up,
                                      const void* scales_gate, const void* scales_up, const int64_t* index, void* y,
                                      int64_t m, int64_t k, int64_t n, int64_t rg, int64_t ru, int64_t adapters,
                                      int64_t rows_per_index, void* scratch, int64_t scratch_bytes, void* stream);
// LoRAGatedMLP: Y [m, k2] = LoRALinear(H, W_down [n, k2], A_down [n, rd], B_down [rd, k2], bias_down, scale_down) of
// H = LoRASwiGLU(X, ...) [m, n], which lives in the scratch (first, 256-byte aligned). CUDA backend: LoRASwiGLU's
// CUDA launcher into H, then LoRALinear's. Triton: phase 1 of the gate and up adapters, whose programs also zero the
// down adapter's X @ A sum ([m, r_pad] fp32, r_pad of the largest of the three ranks, after H in the scratch); the
// gated kernel (lora_swiglu, or from LORA_SWIGLU_CUBLAS's shapes cuBLASLt's GEMMs and lora_gate) adds each finished
// tile's H @ A_down to it; then lora_main on it (one partial).
int64_t onnxfuse_cuda_lora_gated_mlp_scratch_bytes(int dtype, int64_t m, int64_t n, int64_t rg, int64_t ru, int64_t rd);
int onnxfuse_cuda_lora_gated_mlp(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                 const void* a_gate, const void* b_gate, const void* a_up, const void* b_up,
                                 const void* w_down, const void* a_down, const void* b_down, const void* bias_down,
                                 float scale_gate, float scale_up, float scale_down, void* y, int64_t m, int64_t k,
                                 int64_t n, int64_t k2, int64_t rg, int64_t ru, int64_t rd, void* scratch,
                                 int64_t scratch_bytes, void* stream);
int64_t onnxfuse_triton_lora_gated_mlp_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t k2, int64_t rg,
                                                     int64_t ru, int64_t rd);
int onnxfuse_triton_lora_gated_mlp(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                   const void* a_gate, const void* b_gate, const void* a_up, const void* b_up,
                                   const void* w_down, const void* a_down, const void* b_down, const void* bias_down,
                                   float scale_gate, float scale_up, float scale_down, void* y, int64_t m, int64_t k,
                                   int64_t n, int64_t k2, int64_t rg, int64_t ru, int64_t rd, void* scratch,
                                   int64_t scratch_bytes, void* stream);
// MultiLoRAGatedMLP: the same over stacks of adapters (A_down [adapters, n, rd], B_down [adapters, rd, k2],
// scales_down [adapters]) with each row's adapter index[row / rows_per_index]: MultiLoRASwiGLU's launchers and
// MultiLoRALinear's, the Triton one with multi_lora_swiglu's epilogue adding each row's H @ A_down[j].
int64_t onnxfuse_cuda_multi_lora_gated_mlp_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t rg,
                                                         int64_t ru, int64_t rd);
int onnxfuse_cuda_multi_lora_gated_mlp(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                       const void* a_gate, const void* b_gate, const void* a_up, const void* b_up,
                                       const void* w_down, const void* a_down, const void* b_down,
                                       const void* bias_down, const void* scales_gate, const void* scales_up,
                                       const void* scales_down, const int64_t* index, void* y, int64_t m, int64_t k,
                                       int64_t n, int64_t k2, int64_t rg, int64_t ru, int64_t rd, int64_t adapters,
                                       int64_t rows_per_index, void* scratch, int64_t scratch_bytes, void* stream);
int64_t onnxfuse_triton_multi_lora_gated_mlp_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t rg,
                                                           int64_t ru, int64_t rd);
int onnxfuse_triton_multi_lora_gated_mlp(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                         const void* a_gate, const void* b_gate, const void* a_up, const void* b_up,
                                         const void* w_down, const void* a_down, const void* b_down,
                                         const void* bias_down, const void* scales_gate, const void* scales_up,
                                         const void* scales_down, const int64_t* index, void* y, int64_t m, int64_t k,
                                         int64_t n, int64_t k2, int64_t rg, int64_t ru, int64_t rd, int64_t adapters,
                                         int64_t rows_per_index, void* scratch, int64_t scratch_bytes, void* stream);
}

#ifdef __CUDACC__
// SwiGLU (onnxfuse.schema) on the CUDA backend: Y = act(X @ W_gate) * (X @ W_up), act one of the gate activations
// (common/gate_act.h, by run-time code). Two cuBLASLt GEMMs, the gate product into Y and the up product into the
// scratch after the cuBLASLt workspace, then one elementwise pass Y = act(Y) * U in fp32, 16 bytes per load and
// store where the buffers allow (M x N a multiple of the vector, 16-byte aligned): memory bound, it reads two
// [M, N] and writes one.
#include "common/gate_act.h"
#include "gemm.h"
#include "lora_gate_pass.h"

namespace ock = onnxfuse::cuda_kernels;

namespace {
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// Element block i (VEC elements): y = act(y) * up.
template <typename T, int VEC>
struct GateTimesUp {
  T* y;
  const T* up;
  int act;
  __device__ void operator()(int64_t i) const {
    using V = Vec<T, VEC>;
    V g = reinterpret_cast<const V*>(y)[i];
    const V u = reinterpret_cast<const V*>(up)[i];
#pragma unroll
    for (int e = 0; e < VEC; ++e)
      g.v[e] = ock::from_f<T>(onnxfuse::GateActivation(act, ock::to_f(g.v[e])) * ock::to_f(u.v[e]));
    reinterpret_cast<V*>(y)[i] = g;
  }
};

template <typename T>
int GatePass(T* y, const T* up, int64_t count, int act, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vec =
      count % kVec == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 && reinterpret_cast<uintptr_t>(up) % 16 == 0;
  if (vec) return ock::LaunchElementwise(count / kVec, GateTimesUp<T, kVec>{y, up, act}, s);
  return ock::LaunchElementwise(count, GateTimesUp<T, 1>{y, up, act}, s);
}
}  // namespace

extern "C" int onnxfuse_cuda_lora_gate_pass_takes(int dtype, int64_t n, int64_t r) {
  return ock::gate_pass::Takes(dtype, n, r);
}

extern "C" int onnxfuse_cuda_lora_gate_pass(int dtype, int act, const void* g, const void* u, const float* tg,
                                            const float* tu, int64_t split, const void* bg, const void* bu, int64_t rg,
                                            int64_t ru, float sg, float su, const void* ad, float* td, int64_t rd,
                                            void* y, int64_t m, int64_t n, int sms, void* stream) {
  if (split < 1 || split > (int64_t(1) << 30)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  const ock::gate_pass::Args a{g, u, tg, tu, bg, bu, ad, td, y, m, n, int(split), int(rg), int(ru), int(rd), sg, su};
  return ock::gate_pass::Run(dtype, act, a, sms, 0, static_cast<cudaStream_t>(stream));
}

extern "C" int64_t onnxfuse_cuda_swiglu_scratch_bytes(int dtype, int64_t m, int64_t n) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || n < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return ONNXFUSE_CUBLASLT_WORKSPACE_BYTES + ock::Align256(m * n * ock::ElemBytes(dtype));
}

extern "C" int onnxfuse_cuda_swiglu_gemms(int dtype, const void* x, const void* w_gate, const void* w_up, void* g,
                                          void* u, int64_t m, int64_t k, int64_t n, void* workspace, void* stream) {
  if (!ock::CheckCommon(dtype, x, g, m, k, n) || (m > 0 && n > 0 && (u == nullptr || workspace == nullptr)))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  ock::GemmArgs a;
  a.dtype = dtype, a.x = x, a.w = w_gate, a.y = g, a.m = m, a.k = k, a.n = n;
  if (int err = ock::Gemm(a, workspace, ONNXFUSE_CUBLASLT_WORKSPACE_BYTES, s)) return err;
  a.w = w_up, a.y = u;
  return ock::Gemm(a, workspace, ONNXFUSE_CUBLASLT_WORKSPACE_BYTES, s);
}

extern "C" int onnxfuse_cuda_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y,
                                    int64_t m, int64_t k, int64_t n, void* scratch, int64_t scratch_bytes,
                                    void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || !onnxfuse::ValidGateActivation(act)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || n == 0) return 0;
  if (scratch == nullptr || scratch_bytes < onnxfuse_cuda_swiglu_scratch_bytes(dtype, m, n))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  void* up = static_cast<char*>(scratch) + ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
  if (int err = onnxfuse_cuda_swiglu_gemms(dtype, x, w_gate, w_up, y, up, m, k, n, scratch, stream)) return err;
  return ock::ByDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return GatePass<T>(static_cast<T*>(y), static_cast<const T*>(up), m * n, act, s);
  });
}

extern "C" int64_t onnxfuse_cuda_lora_swiglu_scratch_bytes(int dtype, int64_t m, int64_t n, int64_t rg, int64_t ru) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || n < 0 || rg < 0 || ru < 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int64_t e = ock::ElemBytes(dtype);
  return ONNXFUSE_CUBLASLT_WORKSPACE_BYTES + ock::Align256(m * n * e) + ock::Align256(m * std::max(rg, ru) * e);
}

extern "C" int onnxfuse_cuda_lora_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                         const void* a_gate, const void* b_gate, const void* a_up, const void* b_up,
                                         float scale_gate, float scale_up, void* y, int64_t m, int64_t k, int64_t n,
                                         int64_t rg, int64_t ru, void* scratch, int64_t scratch_bytes, void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || !onnxfuse::ValidGateActivation(act) || rg < 0 || ru < 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (rg > ONNXFUSE_MAX_LORA_RANK || ru > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  if (scratch == nullptr || scratch_bytes < onnxfuse_cuda_lora_swiglu_scratch_bytes(dtype, m, n, rg, ru))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t ws = ONNXFUSE_CUBLASLT_WORKSPACE_BYTES, e = ock::ElemBytes(dtype);
  char* up = static_cast<char*>(scratch) + ws;
  char* t = up + ock::Align256(m * n * e);
  // one projection: out = X @ W + scale * (X @ A) @ B (LoRALinear's three GEMMs, without bias)
  auto projection = [&](const void* w, const void* a, const void* b, float scale, int64_t r, void* out) {
    ock::GemmArgs g;
    g.dtype = dtype, g.x = x, g.w = w, g.y = out, g.m = m, g.k = k, g.n = n;
    return ock::LoRAGemm(g, a, b, scale, r, t, scratch, ws, s);
  };
  if (int err = projection(w_gate, a_gate, b_gate, scale_gate, rg, y)) return err;
  if (int err = projection(w_up, a_up, b_up, scale_up, ru, up)) return err;
  return ock::ByDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return GatePass<T>(static_cast<T*>(y), reinterpret_cast<const T*>(up), m * n, act, s);
  });
}

extern "C" int64_t onnxfuse_cuda_multi_lora_swiglu_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t rg,
                                                                 int64_t ru) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || k < 0 || n < 0 || rg < 0 || ru < 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  return ONNXFUSE_CUBLASLT_WORKSPACE_BYTES + ock::Align256(m * n * ock::ElemBytes(dtype)) +
         ock::Align256(ock::MultiLoRAPartialsBytes(m, k, std::max(rg, ru)));
}

extern "C" int onnxfuse_cuda_multi_lora_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                               const void* a_gate, const void* b_gate, const void* a_up,
                                               const void* b_up, const void* scales_gate, const void* scales_up,
                                               const int64_t* index, void* y, int64_t m, int64_t k, int64_t n,
                                               int64_t rg, int64_t ru, int64_t adapters, int64_t rows_per_index,
                                               void* scratch, int64_t scratch_bytes, void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || !onnxfuse::ValidGateActivation(act) || rg < 0 || ru < 0 ||
      adapters < 0 || rows_per_index <= 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (rg > ONNXFUSE_MAX_LORA_RANK || ru > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  if (scratch == nullptr || scratch_bytes < onnxfuse_cuda_multi_lora_swiglu_scratch_bytes(dtype, m, k, n, rg, ru))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t ws = ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
  char* up = static_cast<char*>(scratch) + ws;
  float* t = reinterpret_cast<float*>(up + ock::Align256(m * n * ock::ElemBytes(dtype)));
  // one projection: out = X @ W + each row's adapter term (MultiLoRALinear's CUDA backend, without bias)
  auto projection = [&](const void* w, const void* a, const void* b, const void* sc, int64_t r, void* out) {
    ock::GemmArgs g;
    g.dtype = dtype, g.x = x, g.w = w, g.y = out, g.m = m, g.k = k, g.n = n;
    return ock::MultiLoRAGemm(g, a, b, sc, index, r, adapters, rows_per_index, t, scratch, ws, s);
  };
  if (int err = projection(w_gate, a_gate, b_gate, scales_gate, rg, y)) return err;
  if (int err = projection(w_up, a_up, b_up, scales_up, ru, up)) return err;
  return ock::ByDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return GatePass<T>(static_cast<T*>(y), reinterpret_cast<const T*>(up), m * n, act, s);
  });
}

// LoRAGatedMLP's CUDA backend: H (the scratch's first part) = LoRASwiGLU, then Y = LoRALinear(H); the two launchers
// share the rest of the scratch one after the other.
extern "C" int64_t onnxfuse_cuda_lora_gated_mlp_scratch_bytes(int dtype, int64_t m, int64_t n, int64_t rg, int64_t ru,
                                                              int64_t rd) {
  const int64_t gated = onnxfuse_cuda_lora_swiglu_scratch_bytes(dtype, m, n, rg, ru);
  const int64_t down = onnxfuse_cuda_lora_scratch_bytes(dtype, m, rd);
  if (gated < 0 || down < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return ock::Align256(m * n * ock::ElemBytes(dtype)) + std::max(gated, down);
}

extern "C" int onnxfuse_cuda_lora_gated_mlp(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                            const void* a_gate, const void* b_gate, const void* a_up, const void* b_up,
                                            const void* w_down, const void* a_down, const void* b_down,
                                            const void* bias_down, float scale_gate, float scale_up, float scale_down,
                                            void* y, int64_t m, int64_t k, int64_t n, int64_t k2, int64_t rg,
                                            int64_t ru, int64_t rd, void* scratch, int64_t scratch_bytes,
                                            void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, k2) || n < 0 || rd < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (rd > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (m == 0 || k2 == 0) return 0;
  const int64_t need = onnxfuse_cuda_lora_gated_mlp_scratch_bytes(dtype, m, n, rg, ru, rd);
  if (need < 0) return int(need);
  if (scratch == nullptr || scratch_bytes < need) return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int64_t h_bytes = ock::Align256(m * n * ock::ElemBytes(dtype));
  void* h = scratch;
  void* rest = static_cast<char*>(scratch) + h_bytes;
  if (int err = onnxfuse_cuda_lora_swiglu(dtype, act, x, w_gate, w_up, a_gate, b_gate, a_up, b_up, scale_gate, scale_up,
                                          h, m, k, n, rg, ru, rest, scratch_bytes - h_bytes, stream))
    return err;
  return onnxfuse_cuda_lora_linear(dtype, 0, h, w_down, a_down, b_down, bias_down, scale_down, y, m, n, k2, rd, rest,
                                   scratch_bytes - h_bytes, stream);
}

extern "C" int64_t onnxfuse_cuda_multi_lora_gated_mlp_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n,
                                                                    int64_t rg, int64_t ru, int64_t rd) {
  const int64_t gated = onnxfuse_cuda_multi_lora_swiglu_scratch_bytes(dtype, m, k, n, rg, ru);
  const int64_t down = onnxfuse_cuda_multi_lora_scratch_bytes(dtype, m, n, rd);
  if (gated < 0 || down < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return ock::Align256(m * n * ock::ElemBytes(dtype)) + std::max(gated, down);
}

extern "C" int onnxfuse_cuda_multi_lora_gated_mlp(
    int dtype, int act, const void* x, const void* w_gate, const void* w_up, const void* a_gate, const void* b_gate,
    const void* a_up, const void* b_up, const void* w_down, const void* a_down, const void* b_down,
    const void* bias_down, const void* scales_gate, const void* scales_up, const void* scales_down,
    const int64_t* index, void* y, int64_t m, int64_t k, int64_t n, int64_t k2, int64_t rg, int64_t ru, int64_t rd,
    int64_t adapters, int64_t rows_per_index, void* scratch, int64_t scratch_bytes, void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, k2) || n < 0 || rd < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (rd > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (m == 0 || k2 == 0) return 0;
  const int64_t need = onnxfuse_cuda_multi_lora_gated_mlp_scratch_bytes(dtype, m, k, n, rg, ru, rd);
  if (need < 0) return int(need);
  if (scratch == nullptr || scratch_bytes < need) return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int64_t h_bytes = ock::Align256(m * n * ock::ElemBytes(dtype));
  void* h = scratch;
  void* rest = static_cast<char*>(scratch) + h_bytes;
  if (int err = onnxfuse_cuda_multi_lora_swiglu(dtype, act, x, w_gate, w_up, a_gate, b_gate, a_up, b_up, scales_gate,
                                                scales_up, index, h, m, k, n, rg, ru, adapters, rows_per_index, rest,
                                                scratch_bytes - h_bytes, stream))
    return err;
  return onnxfuse_cuda_multi_lora_linear(dtype, h, w_down, a_down, b_down, bias_down, scales_down, index, y, m, n, k2,
                                         rd, adapters, rows_per_index, rest, scratch_bytes - h_bytes, stream);
}

#else  // the host half: the CUDA EP glue and the Triton launcher
// SwiGLU on the CUDA EP: the kernel struct calling the nvcc half's launcher or the Triton one
// (at the end of this file) through Dispatch (cuda/ops_cuda.h), and its registration.
#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

template <typename T>
struct SwiGLUCuda {
  static constexpr const char* kName = schema::SwiGLU::kName;
  SwiGLUCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)), act(ReadGateActivation(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Wg,
                      const Ort::Custom::Tensor<T>& Wu, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = SwiGLUDims(kName, X.Shape(), Wg.Shape(), Wu.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *wg = Wg.Data(), *wu = Wu.Data();
      Dispatch(
          kName, attrs,
          [&] {
            return WithScratch(ctx, schema::SwiGLU::kX, onnxfuse_cuda_swiglu_scratch_bytes(DtypeCode<T>(), d.M, d.N),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_swiglu(DtypeCode<T>(), act, x, wg, wu, y, d.M, d.K, d.N, sp,
                                                             bytes, stream);
                               });
          },
          [&] { return onnxfuse_triton_swiglu(DtypeCode<T>(), act, x, wg, wu, y, d.M, d.K, d.N, stream); },
          AutoPrefersCuda(triton::kSwiglu, d.M, d.K));
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act of the node's activation attribute
};

template <typename T>
struct LoRASwiGLUCuda {
  using Op = schema::LoRASwiGLU;
  static constexpr const char* kName = Op::kName;
  LoRASwiGLUCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)), act(ReadGateActivation(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Wg,
                      const Ort::Custom::Tensor<T>& Wu, const Ort::Custom::Tensor<T>& Ag,
                      const Ort::Custom::Tensor<T>& Bg, const Ort::Custom::Tensor<T>& Au,
                      const Ort::Custom::Tensor<T>& Bu, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      int64_t ru = 0;
      const LinearDims d =
          LoRASwiGLUDims(kName, X.Shape(), Wg.Shape(), Wu.Shape(), Ag.Shape(), Bg.Shape(), Au.Shape(), Bu.Shape(), &ru);
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *wg = Wg.Data(), *wu = Wu.Data(), *ag = Ag.Data(), *bg = Bg.Data(), *au = Au.Data(),
                 *bu = Bu.Data();
      const float sg = attrs.scale_gate, su = attrs.scale_up;
      const int64_t rg = d.r;
      Dispatch(
          kName, attrs,
          [&] {
            return WithScratch(ctx, Op::kX, onnxfuse_cuda_lora_swiglu_scratch_bytes(DtypeCode<T>(), d.M, d.N, rg, ru),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_lora_swiglu(DtypeCode<T>(), act, x, wg, wu, ag, bg, au, bu, sg,
                                                                  su, y, d.M, d.K, d.N, rg, ru, sp, bytes, stream);
                               });
          },
          [&] {
            // A negative size (e.g. no cubin for this GPU) comes back as the code: Dispatch may fall back to CUDA.
            return WithScratch(ctx, Op::kX,
                               onnxfuse_triton_lora_swiglu_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N, rg, ru),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_triton_lora_swiglu(DtypeCode<T>(), act, x, wg, wu, ag, bg, au, bu, sg,
                                                                    su, y, d.M, d.K, d.N, rg, ru, sp, bytes, stream);
                               });
          },
          AutoPrefersCuda(triton::kLoraSwiglu, d.M, d.K));
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act of the node's activation attribute
};

template <typename T>
struct MultiLoRASwiGLUCuda {
  using Op = schema::MultiLoRASwiGLU;
  static constexpr const char* kName = Op::kName;
  MultiLoRASwiGLUCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)), act(ReadGateActivation(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Wg,
                      const Ort::Custom::Tensor<T>& Wu, const Ort::Custom::Tensor<T>& Ag,
                      const Ort::Custom::Tensor<T>& Bg, const Ort::Custom::Tensor<T>& Au,
                      const Ort::Custom::Tensor<T>& Bu, const Ort::Custom::Tensor<T>& Sg,
                      const Ort::Custom::Tensor<T>& Su, const Ort::Custom::Tensor<int64_t>& index,
                      Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      int64_t ru = 0;
      const MultiLoRADims d = MultiLoRASwiGLUDims(kName, X.Shape(), Wg.Shape(), Wu.Shape(), Ag.Shape(), Bg.Shape(),
                                                  Au.Shape(), Bu.Shape(), Sg.Shape(), Su.Shape(), index.Shape(), &ru);
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *wg = Wg.Data(), *wu = Wu.Data(), *ag = Ag.Data(), *bg = Bg.Data(), *au = Au.Data(),
                 *bu = Bu.Data(), *sg = Sg.Data(), *su = Su.Data();
      const int64_t* idx = index.Data();
      const int64_t rg = d.r;
      Dispatch(
          kName, attrs,
          [&] {
            return WithScratch(ctx, Op::kX,
                               onnxfuse_cuda_multi_lora_swiglu_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N, rg, ru),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_multi_lora_swiglu(
                                     DtypeCode<T>(), act, x, wg, wu, ag, bg, au, bu, sg, su, idx, y, d.M, d.K, d.N, rg,
                                     ru, d.adapters, d.rows_per_index, sp, bytes, stream);
                               });
          },
          [&] {
            return WithScratch(ctx, Op::kX,
                               onnxfuse_triton_multi_lora_swiglu_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N, rg, ru),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_triton_multi_lora_swiglu(
                                     DtypeCode<T>(), act, x, wg, wu, ag, bg, au, bu, sg, su, idx, y, d.M, d.K, d.N, rg,
                                     ru, d.adapters, d.rows_per_index, sp, bytes, stream);
                               });
          });
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act of the node's activation attribute
};

// LoRAGatedMLP: Dispatch between the CUDA backend's launcher (LoRASwiGLU's and LoRALinear's CUDA ones) and the Triton
// one (the down adapter's X @ A in the gated kernel's epilogue); auto as LoRASwiGLU's.
template <typename T>
struct LoRAGatedMLPCuda {
  using Op = schema::LoRAGatedMLP;
  using In = Ort::Custom::Tensor<T>;
  static constexpr const char* kName = Op::kName;
  LoRAGatedMLPCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)), act(ReadGateActivation(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const In& X, const In& Wg, const In& Wu, const In& Ag, const In& Bg,
                      const In& Au, const In& Bu, const In& Wd, const In& Ad, const In& Bd, const In& bias,
                      Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const GatedMLPDims d = LoRAGatedMLPDims(kName, X.Shape(), Wg.Shape(), Wu.Shape(), Ag.Shape(), Bg.Shape(),
                                              Au.Shape(), Bu.Shape(), Wd.Shape(), Ad.Shape(), Bd.Shape(), bias.Shape());
      T* y = Y.Allocate(d.down.out_shape);
      if (d.down.M == 0 || d.down.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *wg = Wg.Data(), *wu = Wu.Data(), *ag = Ag.Data(), *bg = Bg.Data(), *au = Au.Data(),
                 *bu = Bu.Data(), *wd = Wd.Data(), *ad = Ad.Data(), *bd = Bd.Data(), *bi = bias.Data();
      const float sg = attrs.scale_gate, su = attrs.scale_up, sd = attrs.scale_down;
      const int64_t m = d.gated.M, k = d.gated.K, n = d.gated.N, k2 = d.down.N, rg = d.gated.r, ru = d.ru,
                    rd = d.down.r;
      Dispatch(
          kName, attrs,
          [&] {
            return WithScratch(
                ctx, Op::kX, onnxfuse_cuda_lora_gated_mlp_scratch_bytes(DtypeCode<T>(), m, n, rg, ru, rd),
                [&](void* sp, int64_t bytes) {
                  return onnxfuse_cuda_lora_gated_mlp(DtypeCode<T>(), act, x, wg, wu, ag, bg, au, bu, wd, ad, bd, bi,
                                                      sg, su, sd, y, m, k, n, k2, rg, ru, rd, sp, bytes, stream);
                });
          },
          [&] {
            return WithScratch(
                ctx, Op::kX, onnxfuse_triton_lora_gated_mlp_scratch_bytes(DtypeCode<T>(), m, k, n, k2, rg, ru, rd),
                [&](void* sp, int64_t bytes) {
                  return onnxfuse_triton_lora_gated_mlp(DtypeCode<T>(), act, x, wg, wu, ag, bg, au, bu, wd, ad, bd, bi,
                                                        sg, su, sd, y, m, k, n, k2, rg, ru, rd, sp, bytes, stream);
                });
          },
          AutoPrefersCuda(triton::kLoraSwiglu, m, k));
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act of the node's activation attribute
};

template <typename T>
struct MultiLoRAGatedMLPCuda {
  using Op = schema::MultiLoRAGatedMLP;
  using In = Ort::Custom::Tensor<T>;
  static constexpr const char* kName = Op::kName;
  MultiLoRAGatedMLPCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)), act(ReadGateActivation(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const In& X, const In& Wg, const In& Wu, const In& Ag, const In& Bg,
                      const In& Au, const In& Bu, const In& Wd, const In& Ad, const In& Bd, const In& bias,
                      const In& Sg, const In& Su, const In& Sd, const Ort::Custom::Tensor<int64_t>& index,
                      Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const MultiGatedMLPDims d = MultiLoRAGatedMLPDims(
          kName, X.Shape(), Wg.Shape(), Wu.Shape(), Ag.Shape(), Bg.Shape(), Au.Shape(), Bu.Shape(), Wd.Shape(),
          Ad.Shape(), Bd.Shape(), bias.Shape(), Sg.Shape(), Su.Shape(), Sd.Shape(), index.Shape());
      T* y = Y.Allocate(d.down.out_shape);
      if (d.down.M == 0 || d.down.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *wg = Wg.Data(), *wu = Wu.Data(), *ag = Ag.Data(), *bg = Bg.Data(), *au = Au.Data(),
                 *bu = Bu.Data(), *wd = Wd.Data(), *ad = Ad.Data(), *bd = Bd.Data(), *bi = bias.Data(), *sg = Sg.Data(),
                 *su = Su.Data(), *sd = Sd.Data();
      const int64_t* idx = index.Data();
      const int64_t m = d.gated.M, k = d.gated.K, n = d.gated.N, k2 = d.down.N, rg = d.gated.r, ru = d.ru,
                    rd = d.down.r, na = d.gated.adapters, rpi = d.gated.rows_per_index;
      Dispatch(
          kName, attrs,
          [&] {
            return WithScratch(ctx, Op::kX,
                               onnxfuse_cuda_multi_lora_gated_mlp_scratch_bytes(DtypeCode<T>(), m, k, n, rg, ru, rd),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_multi_lora_gated_mlp(
                                     DtypeCode<T>(), act, x, wg, wu, ag, bg, au, bu, wd, ad, bd, bi, sg, su, sd, idx, y,
                                     m, k, n, k2, rg, ru, rd, na, rpi, sp, bytes, stream);
                               });
          },
          [&] {
            return WithScratch(ctx, Op::kX,
                               onnxfuse_triton_multi_lora_gated_mlp_scratch_bytes(DtypeCode<T>(), m, k, n, rg, ru, rd),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_triton_multi_lora_gated_mlp(
                                     DtypeCode<T>(), act, x, wg, wu, ag, bg, au, bu, wd, ad, bd, bi, sg, su, sd, idx, y,
                                     m, k, n, k2, rg, ru, rd, na, rpi, sp, bytes, stream);
                               });
          });
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act of the node's activation attribute
};

}  // namespace

void RegisterSwiGLUCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<SwiGLUCuda>(domain, schema::SwiGLU::kName, kCudaEp);
  AddOpAllTypes<LoRASwiGLUCuda>(domain, schema::LoRASwiGLU::kName, kCudaEp);
  AddOpAllTypes<MultiLoRASwiGLUCuda>(domain, schema::MultiLoRASwiGLU::kName, kCudaEp);
  AddOpAllTypes<LoRAGatedMLPCuda>(domain, schema::LoRAGatedMLP::kName, kCudaEp);
  AddOpAllTypes<MultiLoRAGatedMLPCuda>(domain, schema::MultiLoRAGatedMLP::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of SwiGLU (triton/swiglu.py).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

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
  return Launch(ids::kSwiglu, dtype, m, n, aligned, 0, args, stream);
}

// LoRASwiGLU: lora_xa (lora_linear.py), one launch for both adapters, into their fp32 partials [SPLIT, M, r_pad] (one
// plan, r_pad of the larger rank), then lora_swiglu (swiglu.py), or from LORA_SWIGLU_CUBLAS's shapes the base GEMMs
// on cuBLASLt and lora_gate.
namespace {
bool LoRASwiGLUAligned(const void* const (&p)[7], const void* y, int64_t k, int64_t n, int64_t rg, int64_t ru) {
  for (const void* q : p)
    if (!Aligned16(q)) return false;
  return Aligned16(y) && k % 16 == 0 && n % 16 == 0 && rg % 8 == 0 && ru % 8 == 0;  // 16-byte rows of A
}

// From triton/table.py LORA_SWIGLU_CUBLAS's rows and K up, the base GEMMs run on cuBLASLt and the gate pass (CUDA's,
// cuda/lora_gate_pass.h, where it takes the shape, else Triton's lora_gate) adds the rank-r terms and the activation;
// the scratch then also holds the cuBLASLt workspace and the up product [M, N], after the two partials (each part
// 256-byte aligned).
bool LoRASwiGLUOnCublas(int64_t m, int64_t k) {
  return m >= ids::kLoraSwigluCublasMinM && k >= ids::kLoraSwigluCublasMinK;
}
// What that path adds to the scratch after the two partials: the cuBLASLt workspace, then the up product [M, N].
int64_t LoRASwiGLUCublasBytes(int dtype, int64_t m, int64_t n) {
  return ONNXFUSE_CUBLASLT_WORKSPACE_BYTES + m * n * (dtype == ONNXFUSE_FP32 ? 4 : 2);
}
int64_t RoundUp256(int64_t v) { return (v + 255) / 256 * 256; }
}  // namespace

namespace {
// The down projection's share of a gated launch: its adapter's A [n, rd] and the fp32 sum [m, RPad(r)] the gated
// kernel adds H @ A to (LoRAGatedMLP); rd 0: none (LoRASwiGLU alone; the kernels skip the epilogue).
struct DownXA {
  const void* a = nullptr;
  void* t = nullptr;
  int64_t r = 0;
};

// LoRASwiGLU's Triton launch with the down projection's share `down`: phase 1 of both adapters (zeroing down.t when
// down.r > 0), then lora_swiglu or (LORA_SWIGLU_CUBLAS) cuBLASLt's GEMMs and lora_gate. r_pad covers all three ranks.
int LoRASwiGLUTriton(int dtype, int act, const void* x, const void* w_gate, const void* w_up, const void* a_gate,
                     const void* b_gate, const void* a_up, const void* b_up, float scale_gate, float scale_up, void* y,
                     int64_t m, int64_t k, int64_t n, int64_t rg, int64_t ru, DownXA down, void* scratch,
                     int64_t scratch_bytes, void* stream) {
  const int64_t r = std::max({rg, ru, down.r});
  const bool aligned = LoRASwiGLUAligned({x, w_gate, w_up, a_gate, b_gate, a_up, b_up}, y, k, n, rg, ru) &&
                       (down.r == 0 || (Aligned16(down.a) && down.r % 8 == 0));
  const bool on_cublas = LoRASwiGLUOnCublas(m, k);
  // On the cuBLASLt path at most LORA_GATE_MAX_SPLIT slices of K (lora_gate sums them in one load); to
  // LORA_PDL_MAX_M rows, where phase 1 runs beside lora_swiglu's K loop, at most LORA_PDL_MAX_SPLIT.
  const int64_t max_split = on_cublas                ? ids::kLoraGateMaxSplit
                            : m <= ids::kLoraPdlMaxM ? ids::kLoraPdlMaxSplit
                                                     : kMaxLoRASplit;
  LoRAPlan plan;
  int err = PlanLoRA(dtype, m, k, r, aligned, &plan, ids::kLoraXa, 1, max_split);
  if (err != 0) return err;
  const int64_t part = RoundUp256(LoRAScratchBytes(m, r, plan));
  const int64_t need = 2 * part + (on_cublas ? LoRASwiGLUCublasBytes(dtype, m, n) : 0);
  if (scratch == nullptr || !Aligned16(scratch) || scratch_bytes < need) return ONNXFUSE_ERR_BAD_ARGUMENT;
  void* tg = scratch;
  void* tu = static_cast<char*>(scratch) + part;
  void* td = down.r > 0 ? down.t : tg;  // never written with ZERO3 0, never read with RD 0
  const void* ad = down.r > 0 ? down.a : b_gate;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), RG = int32_t(rg), RU = int32_t(ru), ACT = act,
          RD = int32_t(down.r), ZERO3 = down.r > 0 ? 1 : 0;
  int32_t KB_PER_SPLIT = int32_t(plan.kb_per_split), SPLIT = int32_t(plan.split);
  float SG = scale_gate, SU = scale_up;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  // Phase 1, both adapters in one launch (NS 2), each program both from one X tile: T partials = X @ A per K slice
  // (fp32), zero past each rank up to r_pad; the first slice's programs zero the down sum.
  int32_t NS = 2;
  const int64_t grid_xa = ((m + plan.xa->block_m - 1) / plan.xa->block_m) * plan.split;
  void* xa_args[] = {&x,     &a_gate,         &a_up,           &tg, &tu, &M, &K, &RG, &RU, &NS, &KB_PER_SPLIT, &td,
                     &ZERO3, &scratch_global, &scratch_profile};
  if ((err = LaunchSpec(plan.xa, plan.xa_index, plan.device, grid_xa, xa_args, stream)) != 0) return err;
  if (on_cublas) {
    // The base GEMMs on cuBLASLt (gate into Y, up into the scratch after the workspace), then the gate pass: Y =
    // act(Y + sg Tg @ Bg) * (U + su Tu @ Bu), in place; in CUDA where it takes the shape, else Triton's lora_gate.
    // (Phase 1 after the GEMMs as their programmatic dependent, and lora_gate as its, measured slower: triton/table.py
    // LORA_PDL_MAX_M.)
    void* workspace = static_cast<char*>(scratch) + 2 * part;
    void* up = static_cast<char*>(workspace) + ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
    if ((err = onnxfuse_cuda_swiglu_gemms(dtype, x, w_gate, w_up, y, up, m, k, n, workspace, stream)) != 0) return err;
    if (aligned && onnxfuse_cuda_lora_gate_pass_takes(dtype, n, r))  // 16-bit, ranks to 16: the CUDA pass
      return onnxfuse_cuda_lora_gate_pass(
          dtype, act, y, up, static_cast<const float*>(tg), static_cast<const float*>(tu), plan.split, b_gate, b_up, rg,
          ru, scale_gate, scale_up, ad, static_cast<float*>(td), down.r, y, m, n, NumSMs(plan.device), stream);
    void* gate_args[] = {&y,
                         &up,
                         &tg,
                         &b_gate,
                         &tu,
                         &b_up,
                         &y,
                         &M,
                         &N,
                         &RG,
                         &RU,
                         &SPLIT,
                         &SG,
                         &SU,
                         &ACT,
                         &ad,
                         &td,
                         &RD,
                         &scratch_global,
                         &scratch_profile};
    return Launch(ids::kLoraGate, dtype, m, n, aligned, RPad(r), gate_args, stream);
  }
  // Phase 2: SwiGLU's main loop, both rank-r terms, the activation and the product (and the down sum); to
  // LORA_PDL_MAX_M rows phase 1's programmatic dependent (its K loop beside phase 1, the rank-r terms after it).
  void* args[] = {&x,
                  &w_gate,
                  &w_up,
                  &tg,
                  &b_gate,
                  &tu,
                  &b_up,
                  &y,
                  &M,
                  &N,
                  &K,
                  &RG,
                  &RU,
                  &SPLIT,
                  &SG,
                  &SU,
                  &ACT,
                  &ad,
                  &td,
                  &RD,
                  &scratch_global,
                  &scratch_profile};
  return Launch(ids::kLoraSwiglu, dtype, m, n, aligned, RPad(r), args, stream, m <= ids::kLoraPdlMaxM);
}

// LoRASwiGLUTriton's scratch for ranks up to r (from phase 1's plan): the two partials, then on the cuBLASLt path
// LoRASwiGLUCublasBytes.
int64_t LoRASwiGLUTritonBytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t r) {
  const int64_t part = LoRAPartialsBytes(dtype, m, k, n, r);  // one plan, r_pad for every adapter
  if (part <= 0) return part;
  const int64_t partials = 2 * RoundUp256(part);
  if (!LoRASwiGLUOnCublas(m, k)) return partials;
  return partials + LoRASwiGLUCublasBytes(dtype, m, n);
}
}  // namespace

extern "C" int64_t onnxfuse_triton_lora_swiglu_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t rg,
                                                             int64_t ru) {
  if (rg < 0 || ru < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return LoRASwiGLUTritonBytes(dtype, m, k, n, std::max(rg, ru));
}

extern "C" int onnxfuse_triton_lora_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                           const void* a_gate, const void* b_gate, const void* a_up, const void* b_up,
                                           float scale_gate, float scale_up, void* y, int64_t m, int64_t k, int64_t n,
                                           int64_t rg, int64_t ru, void* scratch, int64_t scratch_bytes, void* stream) {
  if (BadCommon(dtype, m, k, n) || rg < 0 || ru < 0 || act < 0 || act >= ONNXFUSE_NUM_GATE_ACTIVATIONS)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (rg > ONNXFUSE_MAX_LORA_RANK || ru > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  return LoRASwiGLUTriton(dtype, act, x, w_gate, w_up, a_gate, b_gate, a_up, b_up, scale_gate, scale_up, y, m, k, n, rg,
                          ru, DownXA{}, scratch, scratch_bytes, stream);
}

// A gated LoRA MLP's scratch: H [m, n], the down sum [m, r_pad] fp32, then the larger of the gated launch's scratch
// and the down projection's (LoRAGatedMLP: lora_main's TMA descriptors; MultiLoRAGatedMLP: none), which run one after
// the other on the stream; each part 256-byte aligned.
namespace {
struct GatedLayout {
  int64_t h = 0, td = 0, rest = 0;
  int64_t total() const { return h + td + rest; }
};
int64_t GatedLayoutOf(int dtype, int64_t m, int64_t n, int64_t r, int64_t gated_bytes, int64_t down_bytes,
                      GatedLayout* l) {
  if (gated_bytes < 0) return gated_bytes;
  l->h = RoundUp256(m * n * (dtype == ONNXFUSE_FP32 ? 4 : 2));
  l->td = RoundUp256(m * RPad(r) * int64_t(sizeof(float)));
  l->rest = RoundUp256(std::max(gated_bytes, down_bytes));
  return l->total();
}
bool BadGated(int dtype, int act, int64_t m, int64_t k, int64_t n, int64_t k2, int64_t rg, int64_t ru, int64_t rd) {
  return BadCommon(dtype, m, k, n) || BadCommon(dtype, m, n, k2) || rg < 0 || ru < 0 || rd < 0 || act < 0 ||
         act >= ONNXFUSE_NUM_GATE_ACTIVATIONS;
}
}  // namespace

extern "C" int64_t onnxfuse_triton_lora_gated_mlp_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t k2,
                                                                int64_t rg, int64_t ru, int64_t rd) {
  if (BadGated(dtype, 0, m, k, n, k2, rg, ru, rd)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int64_t r = std::max({rg, ru, rd});
  if (m == 0 || n == 0 || k2 == 0) return 0;
  GatedLayout l;
  return GatedLayoutOf(dtype, m, n, r, LoRASwiGLUTritonBytes(dtype, m, k, n, r),
                       onnxfuse_triton_lora_main_scratch_bytes(dtype, m, n), &l);
}

extern "C" int onnxfuse_triton_lora_gated_mlp(int dtype, int act, const void* x, const void* w_gate, const void* w_up,
                                              const void* a_gate, const void* b_gate, const void* a_up,
                                              const void* b_up, const void* w_down, const void* a_down,
                                              const void* b_down, const void* bias_down, float scale_gate,
                                              float scale_up, float scale_down, void* y, int64_t m, int64_t k,
                                              int64_t n, int64_t k2, int64_t rg, int64_t ru, int64_t rd, void* scratch,
                                              int64_t scratch_bytes, void* stream) {
  if (BadGated(dtype, act, m, k, n, k2, rg, ru, rd) || rd < 1) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (rg > ONNXFUSE_MAX_LORA_RANK || ru > ONNXFUSE_MAX_LORA_RANK || rd > ONNXFUSE_MAX_LORA_RANK)
    return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n) || TooLarge(m, n, k2)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || k2 == 0 || n == 0) return ONNXFUSE_ERR_BAD_ARGUMENT;  // the EP glue runs the CUDA backend there
  const int64_t r = std::max({rg, ru, rd});
  GatedLayout l;
  const int64_t need = GatedLayoutOf(dtype, m, n, r, LoRASwiGLUTritonBytes(dtype, m, k, n, r),
                                     onnxfuse_triton_lora_main_scratch_bytes(dtype, m, n), &l);
  if (need < 0) return int(need);
  if (scratch == nullptr || !Aligned16(scratch) || scratch_bytes < need) return ONNXFUSE_ERR_BAD_ARGUMENT;
  char* h = static_cast<char*>(scratch);
  void* td = h + l.h;
  void* rest = h + l.h + l.td;
  int err = LoRASwiGLUTriton(dtype, act, x, w_gate, w_up, a_gate, b_gate, a_up, b_up, scale_gate, scale_up, h, m, k, n,
                             rg, ru, DownXA{a_down, td, rd}, rest, l.rest, stream);
  if (err != 0) return err;
  return onnxfuse_triton_lora_main(dtype, 0, h, w_down, td, 1, RPad(r), b_down, bias_down, scale_down, y, m, n, k2, rd,
                                   rest, l.rest, stream);
}

// MultiLoRASwiGLU: multi_lora_xa (lora_linear.py), one launch for both stacks, into their fp32 partials (one plan,
// r_pad of the larger rank), then multi_lora_swiglu (swiglu.py). Scratch as LoRASwiGLU's.
namespace {
// MultiLoRASwiGLU's Triton launch with the down projection's share (MultiLoRAGatedMLP: down.a [adapters, n, rd]; its
// phase 1 zeroes down.t, multi_lora_swiglu adds each row's H @ A_down[j] to it).
int MultiLoRASwiGLUTriton(int dtype, int act, const void* x, const void* w_gate, const void* w_up, const void* a_gate,
                          const void* b_gate, const void* a_up, const void* b_up, const void* scales_gate,
                          const void* scales_up, const int64_t* index, void* y, int64_t m, int64_t k, int64_t n,
                          int64_t rg, int64_t ru, int64_t adapters, int64_t rows_per_index, DownXA down, void* scratch,
                          int64_t scratch_bytes, void* stream) {
  const int64_t r = std::max({rg, ru, down.r});
  const bool aligned = LoRASwiGLUAligned({x, w_gate, w_up, a_gate, b_gate, a_up, b_up}, y, k, n, rg, ru) &&
                       Aligned16(scales_gate) && Aligned16(scales_up) && Aligned16(index) &&
                       (down.r == 0 || (Aligned16(down.a) && down.r % 8 == 0));
  // To LORA_PDL_MAX_M rows multi_lora_swiglu starts as phase 1's programmatic dependent, phase 1 in at most
  // MULTI_LORA_PDL_MAX_SPLIT slices so that the gated kernel's programs find room beside it (triton/table.py).
  const bool dependent = m <= ids::kLoraPdlMaxM;
  LoRAPlan plan;
  int err = PlanLoRA(dtype, m, k, r, aligned, &plan, ids::kMultiLoraXa, std::max<int64_t>(adapters, 1),
                     dependent ? ids::kMultiLoraPdlMaxSplit : kMaxLoRASplit);
  if (err != 0) return err;
  const int64_t part = RoundUp128(LoRAScratchBytes(m, r, plan));
  if (scratch == nullptr || !Aligned16(scratch) || scratch_bytes < 2 * part) return ONNXFUSE_ERR_BAD_ARGUMENT;
  void* tg = scratch;
  void* tu = static_cast<char*>(scratch) + part;
  void* td = down.r > 0 ? down.t : tg;  // never written with ZERO3 0, never read with RD 0
  const void* ad = down.r > 0 ? down.a : b_gate;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), RG = int32_t(rg), RU = int32_t(ru), ACT = act,
          NA = int32_t(adapters), RPI = int32_t(rows_per_index), RD = int32_t(down.r), ZERO3 = down.r > 0 ? 1 : 0;
  int32_t KB_PER_SPLIT = int32_t(plan.kb_per_split), SPLIT = int32_t(plan.split);
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  // one program per row tile, K slice and adapter, both stacks from each X tile (NS 2; a program whose adapter no
  // row of its tile uses does nothing)
  int32_t NS = 2;
  const int64_t grid_xa = ((m + plan.xa->block_m - 1) / plan.xa->block_m) * plan.split * (adapters > 0 ? adapters : 1);
  void* xa_args[] = {
      &x,  &a_gate, &a_up,           &index,          &tg, &tu, &M, &K, &RG, &RU, &NS, &NA, &RPI, &KB_PER_SPLIT,
      &td, &ZERO3,  &scratch_global, &scratch_profile};
  if ((err = LaunchSpec(plan.xa, plan.xa_index, plan.device, grid_xa, xa_args, stream)) != 0) return err;
  void* args[] = {&x,
                  &w_gate,
                  &w_up,
                  &tg,
                  &b_gate,
                  &scales_gate,
                  &tu,
                  &b_up,
                  &scales_up,
                  &index,
                  &y,
                  &M,
                  &N,
                  &K,
                  &RG,
                  &RU,
                  &NA,
                  &RPI,
                  &SPLIT,
                  &ACT,
                  &ad,
                  &td,
                  &RD,
                  &scratch_global,
                  &scratch_profile};
  return Launch(ids::kMultiLoraSwiglu, dtype, m, n, aligned, RPad(r), args, stream, dependent);
}

int64_t MultiLoRASwiGLUTritonBytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t r) {
  const int64_t part = LoRAPartialsBytes(dtype, m, k, n, r, ids::kMultiLoraXa);
  return part <= 0 ? part : 2 * RoundUp128(part);
}
}  // namespace

extern "C" int64_t onnxfuse_triton_multi_lora_swiglu_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n,
                                                                   int64_t rg, int64_t ru) {
  if (rg < 0 || ru < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return MultiLoRASwiGLUTritonBytes(dtype, m, k, n, std::max(rg, ru));
}

extern "C" int onnxfuse_triton_multi_lora_swiglu(int dtype, int act, const void* x, const void* w_gate,
                                                 const void* w_up, const void* a_gate, const void* b_gate,
                                                 const void* a_up, const void* b_up, const void* scales_gate,
                                                 const void* scales_up, const int64_t* index, void* y, int64_t m,
                                                 int64_t k, int64_t n, int64_t rg, int64_t ru, int64_t adapters,
                                                 int64_t rows_per_index, void* scratch, int64_t scratch_bytes,
                                                 void* stream) {
  if (BadCommon(dtype, m, k, n) || rg < 0 || ru < 0 || act < 0 || act >= ONNXFUSE_NUM_GATE_ACTIVATIONS ||
      adapters < 0 || rows_per_index <= 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (rg > ONNXFUSE_MAX_LORA_RANK || ru > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n) || adapters > 0x7fffffffLL || rows_per_index > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  return MultiLoRASwiGLUTriton(dtype, act, x, w_gate, w_up, a_gate, b_gate, a_up, b_up, scales_gate, scales_up, index,
                               y, m, k, n, rg, ru, adapters, rows_per_index, DownXA{}, scratch, scratch_bytes, stream);
}

// MultiLoRAGatedMLP: H, the down sum, then MultiLoRASwiGLUTriton's scratch (multi_lora_main needs none).
extern "C" int64_t onnxfuse_triton_multi_lora_gated_mlp_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n,
                                                                      int64_t rg, int64_t ru, int64_t rd) {
  if (BadGated(dtype, 0, m, k, n, 1, rg, ru, rd)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || n == 0) return 0;
  const int64_t r = std::max({rg, ru, rd});
  GatedLayout l;
  return GatedLayoutOf(dtype, m, n, r, MultiLoRASwiGLUTritonBytes(dtype, m, k, n, r), 0, &l);
}

extern "C" int onnxfuse_triton_multi_lora_gated_mlp(
    int dtype, int act, const void* x, const void* w_gate, const void* w_up, const void* a_gate, const void* b_gate,
    const void* a_up, const void* b_up, const void* w_down, const void* a_down, const void* b_down,
    const void* bias_down, const void* scales_gate, const void* scales_up, const void* scales_down,
    const int64_t* index, void* y, int64_t m, int64_t k, int64_t n, int64_t k2, int64_t rg, int64_t ru, int64_t rd,
    int64_t adapters, int64_t rows_per_index, void* scratch, int64_t scratch_bytes, void* stream) {
  if (BadGated(dtype, act, m, k, n, k2, rg, ru, rd) || rd < 1 || adapters < 0 || rows_per_index <= 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (rg > ONNXFUSE_MAX_LORA_RANK || ru > ONNXFUSE_MAX_LORA_RANK || rd > ONNXFUSE_MAX_LORA_RANK)
    return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n) || TooLarge(m, n, k2) || adapters > 0x7fffffffLL || rows_per_index > 0x7fffffffLL)
    return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || k2 == 0 || n == 0) return ONNXFUSE_ERR_BAD_ARGUMENT;  // the EP glue runs the CUDA backend there
  const int64_t r = std::max({rg, ru, rd});
  GatedLayout l;
  const int64_t need = GatedLayoutOf(dtype, m, n, r, MultiLoRASwiGLUTritonBytes(dtype, m, k, n, r), 0, &l);
  if (need < 0) return int(need);
  if (scratch == nullptr || !Aligned16(scratch) || scratch_bytes < need) return ONNXFUSE_ERR_BAD_ARGUMENT;
  char* h = static_cast<char*>(scratch);
  void* td = h + l.h;
  int err = MultiLoRASwiGLUTriton(dtype, act, x, w_gate, w_up, a_gate, b_gate, a_up, b_up, scales_gate, scales_up,
                                  index, h, m, k, n, rg, ru, adapters, rows_per_index, DownXA{a_down, td, rd},
                                  h + l.h + l.td, l.rest, stream);
  if (err != 0) return err;
  return onnxfuse_triton_multi_lora_main(dtype, h, w_down, td, 1, RPad(r), b_down, bias_down, scales_down, index, y, m,
                                         n, k2, rd, adapters, rows_per_index, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
