// The library's CUDA gate pass (onnxfuse/kernels/cuda/lora_gate_pass.h, what LoRASwiGLU's cuBLASLt path runs) as a
// probe entry with lora_gate_ldm's signature, so scripts/lora_gate_mma_probe.py --entry lora_gate_lib times the
// library's kernel itself beside Triton's lora_gate and the probe forms. Needs the generated onnxfuse_ops.h
// (onnxfuse.kernels.build plan(...).ops_header, written to DIR):
//
//   nvcc -std=c++17 -O3 -shared -Xcompiler -fPIC -gencode=arch=compute_90,code=sm_90 -I DIR -I onnxfuse/kernels \
//        -I onnxfuse/kernels/cuda scripts/lora_gate_lib.cu -o /tmp/lora_gate_lib.so
#include <cuda_runtime.h>

#include <cstdint>

#include "lora_gate_pass.h"

namespace gp = onnxfuse::cuda_kernels::gate_pass;

namespace {
template <int S>
int RunStages(int dtype, const void* g, const void* u, const float* tg, const float* tu, int s_count, const void* bg,
              const void* bu, float sg, float su, const void* ad, float* td, int rd, void* y, int64_t m, int64_t n,
              int splits, void* stream, int act) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return int(cudaErrorInvalidDevice);
  const gp::Args a{g, u, tg, tu, bg, bu, ad, td, y, m, n, s_count, gp::kRank, gp::kRank, rd, sg, su};
  return gp::Run<S>(dtype, act, a, sms, splits, static_cast<cudaStream_t>(stream));
}
}  // namespace

// dtype 1 fp16, 2 bf16 (the onnxfuse_ops.h codes); ranks 16 on gate and up, rd the down adapter's (0: none); splits:
// column ranges (0: the library's choice); act: an onnxfuse_gate_act code, passed as lora_gate_mma's `skip` argument.
// lora_gate_lib runs the library's ring (gp::kStages), lora_gate_lib3 / lora_gate_lib4 one of 3 / 4 stages.
#define ONNXFUSE_GATE_LIB_ENTRY(NAME, S)                                                                              \
  extern "C" int NAME(int dtype, const void* g, const void* u, const float* tg, const float* tu, int s_count,         \
                      const void* bg, const void* bu, float sg, float su, const void* ad, float* td, int rd, void* y, \
                      int64_t m, int64_t n, int splits, void* stream, int act) {                                      \
    return RunStages<S>(dtype, g, u, tg, tu, s_count, bg, bu, sg, su, ad, td, rd, y, m, n, splits, stream, act);      \
  }
ONNXFUSE_GATE_LIB_ENTRY(lora_gate_lib, gp::kStages)
ONNXFUSE_GATE_LIB_ENTRY(lora_gate_lib3, 3)
ONNXFUSE_GATE_LIB_ENTRY(lora_gate_lib4, 4)
