// Issue 28, prefill: CUTLASS's sm90 mixed-input GEMM (int4 weights dequantized in registers inside the wgmma main
// loop) on MatMulNBits' own layout, against the library's dequantization + cuBLAS. Built here as a shared library
// (scripts/int4_cutlass_probe.py builds and drives it on the GPU machine with torch's tensors):
//   nvcc -O3 -std=c++17 -arch=sm_90a --expt-relaxed-constexpr -DNDEBUG -shared -Xcompiler -fPIC \
//        -I$CUTLASS/include -I$CUTLASS/tools/util/include scripts/int4_cutlass_probe.cu -o int4_cutlass_probe.so
// where CUTLASS is nvidia-cutlass's cutlass_library/source. Y[m, n] = sum_k X[m, k] (q[n, k] * s[n, k/g] + z[n, k/g])
// with z = -zp * s (8 without zero points): the packed weights [N, K/2] (low nibble first) are CUTLASS's K-major
// uint4 A operand as they are; the scales and zeros go MN-major ([K/g, N]) by a small transpose kernel.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace int4_probe {
using namespace cute;

// s^T and z^T = -zp * s ([nb, N], N contiguous) from scales [N, nb] and zero points [N, ceil(nb/2)] (or 8).
__global__ void ScaleZeroT(const __half* __restrict__ s, const uint8_t* __restrict__ zp, __half* __restrict__ st,
                           __half* __restrict__ zt, int N, int nb, int zb) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  const int b = blockIdx.y;
  if (n >= N) return;
  const float sc = __half2float(s[int64_t(n) * nb + b]);
  int z = 8;
  if (zp != nullptr) {
    const uint8_t byte = zp[int64_t(n) * zb + (b >> 1)];
    z = (b & 1) ? (byte >> 4) : (byte & 15);
  }
  st[int64_t(b) * N + n] = __float2half(sc);
  zt[int64_t(b) * N + n] = __float2half(-float(z) * sc);
}

template <int TM, int TN, int TK, bool COOP, typename Scheduler = void>
struct MixedGemm {
  using MmaType = cutlass::half_t;
  using ElementW = cutlass::uint4b_t;  // A after the swap: the weights, [N, K] K-major
  using LayoutW = cutlass::layout::RowMajor;
  using LayoutX = cutlass::layout::ColumnMajor;  // B after the swap: X [M, K] row-major is K x M column-major
  using LayoutY = cutlass::layout::ColumnMajor;  // D^T [N, M] column-major is Y [M, N] row-major
  static constexpr int kAlignW = 128 / cutlass::sizeof_bits<ElementW>::value;
  static constexpr int kAlignX = 8;
  static constexpr int kAlignY = 8;
  using TileShape = Shape<Int<TM>, Int<TN>, Int<TK>>;
  using ClusterShape = Shape<_1, _1, _1>;
  using KernelSchedule = cute::conditional_t<COOP, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                             cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpilogueSchedule = cute::conditional_t<COOP, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                               cutlass::epilogue::TmaWarpSpecialized>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutY, kAlignY, MmaType, LayoutY, kAlignY,
      EpilogueSchedule>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::tuple<ElementW, MmaType, MmaType>, LayoutW, kAlignW,
      MmaType, LayoutX, kAlignX, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static int Run(const void* x, const uint8_t* wq, const __half* st, const __half* zt, void* y, int M, int N, int K,
                 int group, void* workspace, size_t ws_bytes, cudaStream_t stream, size_t* need) {
    using StrideW = typename Kernel::StrideA;
    using StrideX = typename Kernel::StrideB;
    using StrideY = typename Kernel::StrideD;
    using StrideS = typename Mainloop::StrideScale;
    const int nb = (K + group - 1) / group;
    StrideW sw = cutlass::make_cute_packed_stride(StrideW{}, cute::make_shape(N, K, 1));
    StrideX sx = cutlass::make_cute_packed_stride(StrideX{}, cute::make_shape(M, K, 1));
    StrideY sy = cutlass::make_cute_packed_stride(StrideY{}, cute::make_shape(N, M, 1));
    StrideS ss = cutlass::make_cute_packed_stride(StrideS{}, cute::make_shape(N, nb, 1));
    typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGemm,
        {N, M, K, 1},
        {reinterpret_cast<const ElementW*>(wq), sw, static_cast<const MmaType*>(x), sx,
         reinterpret_cast<const MmaType*>(st), ss, group, reinterpret_cast<const MmaType*>(zt)},
        {{1.0f, 0.0f}, nullptr, sy, static_cast<MmaType*>(y), sy}};
    Gemm gemm;
    const size_t ws = Gemm::get_workspace_size(args);
    if (need != nullptr) {
      *need = ws;
      return 0;
    }
    if (ws > ws_bytes) return 1001;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1002;
    if (gemm.initialize(args, workspace, stream) != cutlass::Status::kSuccess) return 1003;
    if (gemm.run(stream) != cutlass::Status::kSuccess) return 1004;
    return int(cudaGetLastError());
  }
};

template <typename G>
int Go(const void* x, const uint8_t* wq, const void* st, const void* zt, void* y, int M, int N, int K, int group,
       void* ws, size_t ws_bytes, void* stream, size_t* need) {
  return G::Run(x, wq, static_cast<const __half*>(st), static_cast<const __half*>(zt), y, M, N, K, group, ws, ws_bytes,
                static_cast<cudaStream_t>(stream), need);
}

}  // namespace int4_probe

using namespace int4_probe;

extern "C" int probe_scale_zero(const void* s, const uint8_t* zp, void* st, void* zt, int N, int nb, int zb,
                                void* stream) {
  dim3 grid((N + 255) / 256, nb);
  ScaleZeroT<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const __half*>(s), zp, static_cast<__half*>(st), static_cast<__half*>(zt), N, nb, zb);
  return int(cudaGetLastError());
}

// config: 0 coop 128x128x64, 1 coop 128x256x64, 2 pingpong 64x128x64, 3 pingpong 64x256x64, 4 config 1 with
// stream-K. The K tile is 64: the
// mixed-input main loop needs four k-blocks of 16 a tile (K_BLOCK_MAX >= 4, a static assertion at a K tile of 32),
// and the group size must be a multiple of it, so blocks of 16 and 32 cannot take this path.
extern "C" int probe_gemm(int config, const void* x, const uint8_t* wq, const void* st, const void* zt, void* y, int M,
                          int N, int K, int group, void* ws, size_t ws_bytes, void* stream, size_t* need) {
  switch (config) {
    case 0:
      return Go<MixedGemm<128, 128, 64, true>>(x, wq, st, zt, y, M, N, K, group, ws, ws_bytes, stream, need);
    case 1:
      return Go<MixedGemm<128, 256, 64, true>>(x, wq, st, zt, y, M, N, K, group, ws, ws_bytes, stream, need);
    case 2:
      return Go<MixedGemm<64, 128, 64, false>>(x, wq, st, zt, y, M, N, K, group, ws, ws_bytes, stream, need);
    case 3:
      return Go<MixedGemm<64, 256, 64, false>>(x, wq, st, zt, y, M, N, K, group, ws, ws_bytes, stream, need);
    case 4:  // config 1 with the stream-K tile scheduler (the last wave's tiles split along K)
      return Go<MixedGemm<128, 256, 64, true, cutlass::gemm::StreamKScheduler>>(x, wq, st, zt, y, M, N, K, group, ws,
                                                                                 ws_bytes, stream, need);
    default:
      return 1000;
  }
}
