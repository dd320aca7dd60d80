// Int4Linear's and Int4SwiGLU's GEMM past the GEMV's rows on sm_90 (H100, H200): CUTLASS's mixed-input main loop
// (cutlass/gemm/collective/sm90_mma_tma_gmma_rs_warpspecialized_mixed_input.hpp), which loads the packed 4-bit weights
// by TMA and dequantizes them in registers into wgmma's A operand, so no dequantized copy of W is written or read.
// Built only for sm_90a and only where CUTLASS's headers are found (cuda/cuda.cmake, ONNXFUSE_CUTLASS_DIR: PyPI's
// nvidia-cutlass); int4_linear.cu calls it where onnxfuse_cutlass_int4_ready() says the device is sm_90.
//
// The product as CUTLASS sees it (its A operand must be the narrow one): D^T [N, M] = W [N, K] @ X^T, W uint4 K-major
// (MatMulNBits' packed rows as they are, the lower k of a byte in its low nibble), X [M, K] row-major is the K-major
// B operand, D^T column-major with leading dimension ldy is Y [M, ldy] row-major. CUTLASS dequantizes w = q * s + z
// per block of K ("ConvertAndScaleWithZero", the multiply and add contracted into one FMA), its scales and zeros
// MN-major ([K / block, N]): a first kernel writes s^T and z^T = -8 * s^T into the caller's scratch. z is exact, so
// fma(q, s, z) is (q - 8) * s rounded once, as the reference rounds it (0 where q = 8, so Inf in X meets a true 0 and
// gives NaN). Symmetric weights only: with a zero point zp, z = -zp * s would be rounded and a weight with q = zp
// would come out as that rounding's residue, not 0 (int4_linear.cu keeps them on the dequantization).
//
// Limits (CUTLASS's): the block is a multiple of the K tile, 64 (its main loop needs four k-blocks of 16 a tile, so
// blocks of 16 and 32 cannot take this path), K a multiple of the block, N and ldy multiples of 8, every pointer
// 16-byte aligned (TMA). Tile configs: TileFor below.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "cuda/launch.h"

namespace onnxfuse::cutlass_int4 {

// s^T and z^T = -8 * s^T [nb, N] from scales [N, nb], through a 32 x 32 tile of shared memory so that both the reads
// (along nb) and the writes (along N) are coalesced.
template <typename T>
__global__ void ScalesZerosT(const T* __restrict__ s, T* __restrict__ st, T* __restrict__ zt, int n, int nb) {
  __shared__ float ts[32][33];
  const int n0 = blockIdx.x * 32, b0 = blockIdx.y * 32;
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const int col = n0 + r, b = b0 + threadIdx.x;
    if (col < n && b < nb) ts[r][threadIdx.x] = float(s[int64_t(col) * nb + b]);
  }
  __syncthreads();
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const int b = b0 + r, col = n0 + threadIdx.x;
    if (col < n && b < nb) {
      const float sc = ts[threadIdx.x][r];
      st[int64_t(b) * n + col] = T(sc);
      zt[int64_t(b) * n + col] = T(-8.f * sc);
    }
  }
}

// The current device and its SM count (cuda/gemm.cu, cached per device).
cutlass::KernelHardwareInfo Hardware() {
  cutlass::KernelHardwareInfo hw;
  if (cudaGetDevice(&hw.device_id) != cudaSuccess) hw.device_id = 0;
  hw.sm_count = onnxfuse_cuda_sm_count(hw.device_id);
  return hw;
}

template <typename T, int TM, int TN, bool COOP, typename Scheduler = void>
struct MixedGemm {
  using ElementW = cutlass::uint4b_t;
  using LayoutW = cutlass::layout::RowMajor;     // W [N, K], K-major
  using LayoutX = cutlass::layout::ColumnMajor;  // X^T: K x M column-major is X [M, K] row-major
  using LayoutY = cutlass::layout::ColumnMajor;  // D^T [N, M] column-major is Y [M, N] row-major
  static constexpr int kAlignW = 32;             // 16 bytes of 4-bit values
  static constexpr int kAlign = 8;               // 16 bytes of T
  using TileShape = cute::Shape<cute::Int<TM>, cute::Int<TN>, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using KernelSchedule = cute::conditional_t<COOP, cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                                             cutlass::gemm::KernelTmaWarpSpecializedPingpong>;
  using EpilogueSchedule = cute::conditional_t<COOP, cutlass::epilogue::TmaWarpSpecializedCooperative,
                                               cutlass::epilogue::TmaWarpSpecialized>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutY, kAlign, T, LayoutY, kAlign,
      EpilogueSchedule>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cute::tuple<ElementW, T, T>, LayoutW, kAlignW, T, LayoutX,
      kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue, Scheduler>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Gemm::Arguments Args(const void* x, const uint8_t* wq, const void* st, const void* zt, void* y,
                                       int64_t ldy, int m, int n, int k, int block) {
    using StrideY = typename Kernel::StrideD;
    auto sw = cutlass::make_cute_packed_stride(typename Kernel::StrideA{}, cute::make_shape(n, k, 1));
    auto sx = cutlass::make_cute_packed_stride(typename Kernel::StrideB{}, cute::make_shape(m, k, 1));
    auto ss = cutlass::make_cute_packed_stride(typename Mainloop::StrideScale{}, cute::make_shape(n, k / block, 1));
    StrideY sy = cutlass::make_cute_packed_stride(StrideY{}, cute::make_shape(n, m, 1));
    cute::get<1>(sy) = ldy;  // Y's rows: ldy apart (Int4SwiGLU writes gate and up side by side)
    return {cutlass::gemm::GemmUniversalMode::kGemm,
            {n, m, k, 1},
            {reinterpret_cast<const ElementW*>(wq), sw, static_cast<const T*>(x), sx, static_cast<const T*>(st), ss,
             block, static_cast<const T*>(zt)},
            {{1.0f, 0.0f}, nullptr, sy, static_cast<T*>(y), sy},
            Hardware()};
  }

  static int64_t Workspace(int m, int n, int k, int block) {
    return int64_t(Gemm::get_workspace_size(Args(nullptr, nullptr, nullptr, nullptr, nullptr, n, m, n, k, block)));
  }

  static int Run(const void* x, const uint8_t* wq, const void* st, const void* zt, void* y, int64_t ldy, int m, int n,
                 int k, int block, void* ws, int64_t ws_bytes, cudaStream_t stream) {
    const auto args = Args(x, wq, st, zt, y, ldy, m, n, k, block);
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

// The tile config. Up to 128 rows X fits one row tile (the tile's second extent runs over X's rows): the wide tile
// would leave half its tensor-core work on padding, so a 128 x 128 cooperative tile where ceil(N / 128) tiles fill
// 0.6 of a wave or more (a 7B layer's qkv, gate, up), else the small ping-pong tile (o, down). Measured on an H200
// with a Llama-2-7B layer's projections at 17-160 rows (scripts/int4_prefill_gemm_probe.py, benchmarks/results/
// h200-2026-11-29/int4/int4-prefill-gemm-probe-small-rows.json, us with the scale transpose): qkv 37-42 against the
// wide tile's 49-81, gate 37-41 against 49-83, o 27-31 and down 60-67 on the small tile (the wide one with stream-K:
// 43-46 and 63-91). Past 128 rows by waves: w = the wide tile's tiles (ceil(N / 128) x ceil(M / 256)) over the SMs.
// Two waves or more, or 0.6 to 1 and 1.75 to 2: the wide tile, data-parallel; 1 to 1.75 (a last wave mostly idle) and
// below 0.6 (half the SMs idle): the wide tile with stream-K (the tiles' K split over the SMs), except a short K below
// 0.3 waves, where the small ping-pong tile fills more SMs. Measured on an H200 with a Llama-2-7B layer's projections
// at 256-2048 rows (int4-prefill-gemm-probe-streamk.json there): at 512 rows stream-K 87 / 39 / 80 / 77 us against
// data-parallel 98 / 51 / 94 / 117 (qkv, o, gate, down); at 1024 and 2048 data-parallel at most 14 % and 22 % faster
// where w >= 0.6.
enum class Tile { kWide, kWideStreamK, kSquare, kSmall };

Tile TileFor(int64_t m, int64_t n, int64_t k) {
  const double w = double(((n + 127) / 128) * ((m + 255) / 256)) / Hardware().sm_count;
  if (m <= 128) return w >= 0.6 ? Tile::kSquare : Tile::kSmall;
  if (w >= 1.75 || (w >= 0.6 && w < 1)) return Tile::kWide;
  if (w >= 0.3 || k >= 8192) return Tile::kWideStreamK;
  return Tile::kSmall;
}

template <typename T, typename F>
int ByTile(int64_t m, int64_t n, int64_t k, F&& f) {
  switch (TileFor(m, n, k)) {
    case Tile::kWide:
      return f(MixedGemm<T, 128, 256, true>{});
    case Tile::kWideStreamK:
      return f(MixedGemm<T, 128, 256, true, cutlass::gemm::StreamKScheduler>{});
    case Tile::kSquare:
      return f(MixedGemm<T, 128, 128, true>{});
    default:
      return f(MixedGemm<T, 64, 128, false>{});
  }
}

template <typename F>
int ByType(int dtype, F&& f) {
  if (dtype == ONNXFUSE_FP16) return f(cutlass::half_t{});
  return f(cutlass::bfloat16_t{});
}

}  // namespace onnxfuse::cutlass_int4

namespace oci = onnxfuse::cutlass_int4;

extern "C" int onnxfuse_cutlass_int4_ready(void) {
  static const bool off = [] {
    const char* v = std::getenv("ONNXFUSE_INT4_CUTLASS");
    return v != nullptr && v[0] == '0' && v[1] == '\0';
  }();
  if (off) return 0;
  int device = 0;
  return onnxfuse_cuda_current_arch(&device) == 90;  // sm_90a code runs on compute capability 9.0 only
}

extern "C" int onnxfuse_cutlass_int4_shape_ok(int dtype, int64_t m, int64_t k, int64_t n, int64_t block) {
  return (dtype == ONNXFUSE_FP16 || dtype == ONNXFUSE_BF16) && block >= 64 && block <= 256 && k > 0 && k % block == 0 &&
         n > 0 && n % 8 == 0 && m > 0 && m <= 0x7fffffff && k <= 0x7fffffff && n <= 0x3fffffff;
}

extern "C" int64_t onnxfuse_cutlass_int4_workspace_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t block) {
  return oci::ByType(dtype, [&](auto tag) {
    using T = decltype(tag);
    return oci::ByTile<T>(m, n, k,
                          [&](auto g) { return int(decltype(g)::Workspace(int(m), int(n), int(k), int(block))); });
  });
}

extern "C" int onnxfuse_cutlass_int4_scales_zeros(int dtype, const void* scales, void* st, void* zt, int64_t n,
                                                  int64_t nb, void* stream) {
  const dim3 grid(unsigned((n + 31) / 32), unsigned((nb + 31) / 32)), block(32, 8);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (dtype == ONNXFUSE_FP16)
    oci::ScalesZerosT<__half><<<grid, block, 0, s>>>(static_cast<const __half*>(scales), static_cast<__half*>(st),
                                                     static_cast<__half*>(zt), int(n), int(nb));
  else
    oci::ScalesZerosT<__nv_bfloat16><<<grid, block, 0, s>>>(static_cast<const __nv_bfloat16*>(scales),
                                                            static_cast<__nv_bfloat16*>(st),
                                                            static_cast<__nv_bfloat16*>(zt), int(n), int(nb));
  return int(cudaGetLastError());
}

extern "C" int onnxfuse_cutlass_int4_gemm(int dtype, const void* x, const uint8_t* wq, const void* st, const void* zt,
                                          void* y, int64_t ldy, int64_t m, int64_t k, int64_t n, int64_t block,
                                          void* ws, int64_t ws_bytes, void* stream) {
  if (!onnxfuse_cutlass_int4_shape_ok(dtype, m, k, n, block) || ldy < n || ldy % 8 != 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  return oci::ByType(dtype, [&](auto tag) {
    using T = decltype(tag);
    return oci::ByTile<T>(m, n, k, [&](auto g) {
      return decltype(g)::Run(x, wq, st, zt, y, ldy, int(m), int(n), int(k), int(block), ws, ws_bytes,
                              static_cast<cudaStream_t>(stream));
    });
  });
}
