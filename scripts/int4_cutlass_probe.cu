// Issue 28, prefill: the library's CUTLASS sm_90a mixed-input GEMM (cuda/cutlass/int4_mixed_gemm.cu, included here as
// it is) in tile configs beside the ones the library picks, for scripts/int4_prefill_gemm_probe.py, which drives it
// on the GPU machine with torch's tensors. Built here as a shared library:
//   python -c "from onnxfuse.kernels import ops_header; print(ops_header.render())" > /tmp/gen/onnxfuse_ops.h
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -DNDEBUG -shared -Xcompiler -fPIC \
//        -I$CUTLASS/include -I$CUTLASS/tools/util/include -Ionnxfuse/kernels -I/tmp/gen \
//        scripts/int4_cutlass_probe.cu -o int4_cutlass_probe.so
// where CUTLASS is nvidia-cutlass's cutlass_library/source. Y[m, n] = sum_k X[m, k] (q[n, k] * s[n, k/g] - 8 s[n, k/g]):
// the packed weights [N, K/2] (low nibble first) are CUTLASS's K-major uint4 A operand as they are; the scales go
// MN-major ([K/g, N]) with their zeros by the library's transpose kernel. fp16 only.
#include "cuda/cutlass/int4_mixed_gemm.cu"

// The library's arch query lives in cuda/gemm.cu, which the probe does not build: the probe runs on sm_90 only.
extern "C" int onnxfuse_cuda_current_arch(int* device_out) {
  *device_out = 0;
  return 90;
}

extern "C" int probe_scale_zero(const void* s, void* st, void* zt, int N, int nb, void* stream) {
  return onnxfuse_cutlass_int4_scales_zeros(ONNXFUSE_FP16, s, st, zt, N, nb, stream);
}

namespace {
template <int TM, int TN, bool COOP, typename Scheduler = void>
int Go(const void* x, const uint8_t* wq, const void* st, const void* zt, void* y, int M, int N, int K, int group,
       void* ws, size_t ws_bytes, void* stream) {
  using G = oci::MixedGemm<cutlass::half_t, TM, TN, COOP, Scheduler>;
  return G::Run(x, wq, st, zt, y, N, M, N, K, group, ws, int64_t(ws_bytes), static_cast<cudaStream_t>(stream));
}
}  // namespace

// config: 0 coop 128x128, 1 coop 128x256 (the library's wide tile), 2 ping-pong 64x128 (its small tile), 3 ping-pong
// 64x256, 4 coop 128x256 with stream-K (its wide tile with stream-K); K tiles of 64 (TileFor in the library says which
// it runs). 0 or an onnxfuse_error / cudaError_t code.
extern "C" int probe_gemm(int config, const void* x, const uint8_t* wq, const void* st, const void* zt, void* y, int M,
                          int N, int K, int group, void* ws, size_t ws_bytes, void* stream) {
  switch (config) {
    case 0:
      return Go<128, 128, true>(x, wq, st, zt, y, M, N, K, group, ws, ws_bytes, stream);
    case 1:
      return Go<128, 256, true>(x, wq, st, zt, y, M, N, K, group, ws, ws_bytes, stream);
    case 2:
      return Go<64, 128, false>(x, wq, st, zt, y, M, N, K, group, ws, ws_bytes, stream);
    case 3:
      return Go<64, 256, false>(x, wq, st, zt, y, M, N, K, group, ws, ws_bytes, stream);
    case 4:
      return Go<128, 256, true, cutlass::gemm::StreamKScheduler>(x, wq, st, zt, y, M, N, K, group, ws, ws_bytes,
                                                                 stream);
    default:
      return 1000;
  }
}
