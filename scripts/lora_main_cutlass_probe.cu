// Issue 30, 2048 tokens, measured and not kept: a LoRA linear's main GEMM on CUTLASS's sm_90a warp-specialised TMA
// GEMM with the rank-r term in its epilogue (Y = X @ W + bias + scale * T @ B, T the fp32 X @ A partials), against
// Triton's lora_main and cuBLAS (scripts/lora_down_probe.py --cutlass; H200 results in
// benchmarks/results/h200-2026-11-29/lora/lora-down-cutlass-probe.txt: the GEMM alone 20 us slower than cuBLAS on the
// 7B down projection, the rank term's 16 epilogue nodes another 14, so 307.6 us against lora_main's 287.7).
// Built here as a shared library:
//   python -c "from onnxfuse.kernels import ops_header; print(ops_header.render())" > /tmp/gen/onnxfuse_ops.h
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -DNDEBUG -shared -Xcompiler -fPIC \
//        -I$CUTLASS/include -I$CUTLASS/tools/util/include -Ionnxfuse/kernels -I/tmp/gen \
//        scripts/lora_main_cutlass_probe.cu -o lora_main_cutlass_probe.so
// where CUTLASS is nvidia-cutlass's cutlass_library/source. fp16 only.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "cuda/launch.h"

namespace onnxfuse::cutlass_lora {

using namespace cute;
namespace fus = cutlass::epilogue::fusion;

constexpr int kMaxRank = 16;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

// The padded row length of scale * T^T: a multiple of 8 floats, so every row starts 32-byte aligned.
inline int64_t MPad(int64_t m) { return (m + 7) / 8 * 8; }

// ct [r, m_pad] = scale * sum_p t[p, :, :r]^T, t [split, m, r_pad] fp32. A thread per (row, j): the reads along j and
// the writes along rows are both short; the whole thing is m * r floats.
__global__ void ScaledPartialsT(const float* __restrict__ t, float* __restrict__ ct, int m, int r, int r_pad,
                                int split, int64_t m_pad, float scale) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  const int j = blockIdx.y;
  if (row >= m) return;
  float acc = 0.f;
  for (int p = 0; p < split; ++p) acc += t[(int64_t(p) * m + row) * r_pad + j];
  ct[int64_t(j) * m_pad + row] = scale * acc;
}

// The epilogue's tree: L(-1) = acc + bias, L(j) = c_j * b_j + L(j - 1), the last node's output the element type.
template <typename T, typename CtaTile, int J, int R>
struct RankSum {
  using Prev = typename RankSum<T, CtaTile, J - 1, R>::Node;
  using Out = cute::conditional_t<J == R - 1, T, float>;
  using Col = fus::Sm90ColBroadcast<0, CtaTile, float, float, Stride<_1, _0, int64_t>, 4>;
  using Row = fus::Sm90RowBroadcast<0, CtaTile, T, float, Stride<_0, _1, int64_t>, 8>;
  using Node = fus::Sm90EVT<fus::Sm90Compute<cutlass::homogeneous_multiply_add, Out, float, kRound>, Col, Row, Prev>;

  static typename Node::Arguments Args(const float* ct, int64_t m_pad, const T* b, int64_t n, int r, const T* bias) {
    const bool live = J < r;
    typename Col::Arguments c{live ? ct + J * m_pad : nullptr, 0.f, {}};
    typename Row::Arguments w{live ? b + J * n : nullptr, T(0), {}};
    return {c, w, RankSum<T, CtaTile, J - 1, R>::Args(ct, m_pad, b, n, r, bias), {}};
  }
};

template <typename T, typename CtaTile, int R>
struct RankSum<T, CtaTile, -1, R> {
  using Bias = fus::Sm90RowBroadcast<0, CtaTile, T, float, Stride<_0, _1, int64_t>, 8>;
  using Node = fus::Sm90EVT<fus::Sm90Compute<cutlass::plus, float, float, kRound>, fus::Sm90AccFetch, Bias>;

  static typename Node::Arguments Args(const float*, int64_t, const T*, int64_t, int, const T* bias) {
    return {{}, {bias, T(0), {}}, {}};
  }
};

// The current device's SM count (cached per process, as int4_mixed_gemm.cu's).
cutlass::KernelHardwareInfo Hardware() {
  static const int sms = [] {
    int device = 0, count = 132;
    if (cudaGetDevice(&device) == cudaSuccess) cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    return count;
  }();
  cutlass::KernelHardwareInfo hw;
  if (cudaGetDevice(&hw.device_id) != cudaSuccess) hw.device_id = 0;
  hw.sm_count = sms;
  return hw;
}

template <typename T, int TM, int TN, int CM, typename Scheduler = void, int R = kMaxRank>
struct LoRAMainGemm {
  using Layout = cutlass::layout::RowMajor;  // X [m, k], W [k, n] (N-major B), Y [m, n]
  static constexpr int kAlign = 8;           // 16 bytes of T
  using TileShape = Shape<Int<TM>, Int<TN>, _64>;
  using ClusterShape = Shape<Int<CM>, _1, _1>;
  using Tree = typename RankSum<T, TileShape, R - 1, R>::Node;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, Layout, kAlign, T, Layout, kAlign,
      cutlass::epilogue::TmaWarpSpecializedCooperative, Tree>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, Layout, kAlign, T, Layout, kAlign, float, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments Args(const void* x, const void* w, const float* ct, int64_t m_pad, const void* b,
                                       const void* bias, void* y, int m, int n, int k, int r) {
    auto sx = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, make_shape(m, k, 1));
    auto sw = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, make_shape(n, k, 1));
    auto sy = cutlass::make_cute_packed_stride(typename Kernel::StrideD{}, make_shape(m, n, 1));
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {m, n, k, 1},
                                  {static_cast<const T*>(x), sx, static_cast<const T*>(w), sw},
                                  {{}, nullptr, sy, static_cast<T*>(y), sy},
                                  Hardware()};
    args.epilogue.thread = RankSum<T, TileShape, R - 1, R>::Args(ct, m_pad, static_cast<const T*>(b), n, r,
                                                                 static_cast<const T*>(bias));
    return args;
  }

  static int64_t Workspace(int m, int n, int k) {
    return int64_t(Gemm::get_workspace_size(Args(nullptr, nullptr, nullptr, 0, nullptr, nullptr, nullptr, m, n, k, 0)));
  }

  static int Run(const void* x, const void* w, const float* ct, int64_t m_pad, const void* b, const void* bias, void* y,
                 int m, int n, int k, int r, void* ws, int64_t ws_bytes, cudaStream_t stream) {
    const auto args = Args(x, w, ct, m_pad, b, bias, y, m, n, k, r);
    if (int64_t(Gemm::get_workspace_size(args)) > ws_bytes) return ONNXFUSE_ERR_BAD_ARGUMENT;
    Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return ONNXFUSE_ERR_BAD_ARGUMENT;
    if (gemm.initialize(args, ws, stream) != cutlass::Status::kSuccess) return ONNXFUSE_ERR_BAD_ARGUMENT;
    if (gemm.run(stream) != cutlass::Status::kSuccess) {
      const cudaError_t e = cudaGetLastError();
      return e != cudaSuccess ? int(e) : ONNXFUSE_ERR_BAD_ARGUMENT;
    }
    return int(cudaGetLastError());
  }
};

}  // namespace onnxfuse::cutlass_lora

namespace ocl = onnxfuse::cutlass_lora;

namespace {
template <typename G>
int Go(const void* x, const void* w, const float* t, const void* b, const void* bias, float scale, void* y, int M,
       int N, int K, int r, void* ws, size_t ws_bytes, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t m_pad = ocl::MPad(M);
  float* ct = static_cast<float*>(ws);
  const int64_t ct_bytes = (ocl::kMaxRank * m_pad * 4 + 255) / 256 * 256;
  if (r > 0) {
    ocl::ScaledPartialsT<<<dim3(unsigned((M + 255) / 256), unsigned(r)), 256, 0, s>>>(t, ct, M, r, 16, 1, m_pad,
                                                                                      scale);
  }
  return G::Run(x, w, ct, m_pad, b, bias, y, M, N, K, r, static_cast<char*>(ws) + ct_bytes,
                int64_t(ws_bytes) - ct_bytes, s);
}
using H = cutlass::half_t;
}  // namespace

// config: 0 coop 128x256 (the first choice), 1 coop 128x256 cluster 2x1, 2 coop 256x128, 3 coop 128x256 stream-K,
// 4 coop 128x128. r = 0: no adapter term (every rank node null). 0 or an error code.
extern "C" int probe_lora_main(int config, const void* x, const void* w, const float* t, const void* b,
                               const void* bias, float scale, void* y, int M, int N, int K, int r, void* ws,
                               size_t ws_bytes, void* stream) {
  switch (config) {
    case 0:
      return Go<ocl::LoRAMainGemm<H, 128, 256, 1>>(x, w, t, b, bias, scale, y, M, N, K, r, ws, ws_bytes, stream);
    case 1:
      return Go<ocl::LoRAMainGemm<H, 128, 256, 2>>(x, w, t, b, bias, scale, y, M, N, K, r, ws, ws_bytes, stream);
    case 2:
      return Go<ocl::LoRAMainGemm<H, 256, 128, 1>>(x, w, t, b, bias, scale, y, M, N, K, r, ws, ws_bytes, stream);
    case 3:
      return Go<ocl::LoRAMainGemm<H, 128, 256, 1, cutlass::gemm::StreamKScheduler>>(x, w, t, b, bias, scale, y, M, N,
                                                                                     K, r, ws, ws_bytes, stream);
    case 4:
      return Go<ocl::LoRAMainGemm<H, 128, 128, 1>>(x, w, t, b, bias, scale, y, M, N, K, r, ws, ws_bytes, stream);
    default:
      return 1000;
  }
}

extern "C" size_t probe_lora_main_ws(int M, int N, int K) {
  return size_t((ocl::kMaxRank * ocl::MPad(M) * 4 + 255) / 256 * 256) + (64 << 20);
}
