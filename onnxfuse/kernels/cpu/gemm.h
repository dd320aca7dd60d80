// The CPU kernels' shared GEMM: Y = epilogue(X @ W [+ more K rows from a second source]) with fp32 accumulation.
//
// Layout (schema.py): X [M, K] row-major, W [K, N] row-major. Classic Goto/BLIS blocking:
//   * X is converted to fp32 once per call and packed into MR-row micro-panels ([panel][k][MR]); LoRA appends r
//     extra "K" columns holding scale * (X @ A), so the rank-r branch rides in the same accumulation as the base
//     GEMM (concatenated [X | s*XA] @ [W ; B]) and never needs an extra pass over Y.
//   * Each worker thread takes output tiles of MB rows x NC columns; per KC slice of K it converts + packs the W
//     block into NR-wide fp32 panels (fits L2), runs the MR x NR register-blocked micro-kernel, and when K is done
//     applies the fused epilogue (bias + activation, or silu(gate) * up) to that tile only and writes Y.
//   * The micro-kernel and packers are compiled three times (AVX-512, AVX2+FMA+F16C, baseline x86-64) with GCC
//     target attributes and chosen at run time, so the binary stays portable.
//   * Constant weights (initializers) can be packed once, at kernel creation, with PackB(): the whole [K_total, N]
//     operand as [N/NR panels][K_total][NR] fp32, which is exactly the per-tile block layout above with the panel
//     stride K_total*NR instead of kc*NR; Gemm then reads it in place and skips the per-call conversion.
// Threads: the kernels hand their tiles to onnxruntime's own intra-op pool (GemmArgs::pool, a ParallelRunner over
// KernelContext_ParallelFor, ops.h): the pool MLAS uses, whose threads already spin during a run, so the fused ops
// neither start threads of their own nor fight onnxruntime's for the cores. The tiling aims at NumThreads() tiles
// per pass (ONNXFUSE_CPU_THREADS, read once on the first GEMM, overrides std::thread::hardware_concurrency()).
// Small problems, and calls without a pool, run on the calling thread.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

namespace onnxfuse {
namespace cpu {

// ------------------------------------------------------------------------------------------------ element formats
// Storage of the three ONNX element types; half types are handled as raw 16-bit patterns (Ort::Float16_t and
// Ort::BFloat16_t are a single uint16_t, so their tensors can be read through uint16_t pointers).
enum class Format { F32, F16, BF16 };

inline float Bf16BitsToF32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even; NaN stays a (quiet) NaN instead of rounding into infinity.
inline uint16_t F32ToBf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// IEEE half <-> float with integer code (no _Float16: that would tie the library to GCC 12's libgcc at run time).
// Branch-free so packers auto-vectorise; exact for every half value (normals, subnormals, inf, NaN).
inline float F16BitsToF32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t o = uint32_t(h & 0x7fffu) << 13;  // exponent/mantissa into float position
  const uint32_t exp = o & 0x0f800000u;
  o += 0x38000000u;                            // rebias 15 -> 127
  o += exp == 0x0f800000u ? 0x38000000u : 0u;  // inf/NaN: exponent all ones
  const uint32_t sub = exp == 0 ? 0x00800000u : 0u;
  o += sub;
  float f;
  std::memcpy(&f, &o, 4);
  const float magic = 6.103515625e-05f;  // 2^-14: renormalises subnormals
  f -= exp == 0 ? magic : 0.0f;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u |= sign;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round to nearest even, overflow to inf, NaN to quiet NaN (the algorithm of onnxruntime_float16.h).
inline uint16_t F32ToF16Bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint16_t out;
  if (u >= 0x47800000u) {  // >= 65536 before rounding: inf or NaN
    out = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {  // result is subnormal or zero: let an fp add do the rounding
    float f;
    std::memcpy(&f, &u, 4);
    f += 0.5f;  // denorm magic 2^-1: aligns the 10 subnormal mantissa bits at the bottom
    uint32_t r;
    std::memcpy(&r, &f, 4);
    out = uint16_t(r - 0x3f000000u);
  } else {
    const uint32_t mant_odd = (u >> 13) & 1u;
    u += 0xc8000fffu;  // rebias 127 -> 15 and add the rounding bias
    u += mant_odd;
    out = uint16_t(u >> 13);
  }
  return uint16_t(out | (sign >> 16));
}

// ------------------------------------------------------------------------------------------------ threads
// ONNXFUSE_CPU_THREADS if set (> 0), else the hardware's thread count; decided once per process. How many threads
// the tiling plans for (GemmArgs::threads, ops.h RowBlock); 1 runs a GEMM on the calling thread.
int NumThreads();

// Runs body(i) for i in [0, n), possibly in parallel, and returns when all are done; the first exception a body
// throws is rethrown (the others are skipped). The kernels pass onnxruntime's intra-op pool (ops.h, OrtPool).
struct ParallelRunner {
  virtual ~ParallelRunner() = default;
  virtual void For(int64_t n, const std::function<void(int64_t)>& body) const = 0;
};

// ------------------------------------------------------------------------------------------------ GEMM
struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};

// A B operand converted to fp32 and packed once for the micro-kernel of this CPU (see PackB).
struct PackedB {
  int64_t k = 0, n = 0;                      // rows (K_total) and columns of the operand
  int nr = 0;                                // panel width it was packed for (the selected ISA's NR)
  std::unique_ptr<float, AlignedFree> data;  // [ceil(n / nr)][k][nr], zero-padded columns
};

// One B operand: rows [0, k_main) come from `main` ([k_main, N]), rows [k_main, K_total) from `extra`
// ([K_total - k_main, N]); both row-major with N columns, element format `fmt`.
// `packed`, when set, is the same operand prepacked by PackB (main/extra are then not read).
struct BOperand {
  const void* main = nullptr;
  int64_t k_main = 0;
  const void* extra = nullptr;
  const PackedB* packed = nullptr;
};

// Converts + packs a whole B operand (K_total rows, N columns, element format fmt) for Gemm; throws
// std::bad_alloc. The result does not refer to src afterwards.
PackedB PackB(Format fmt, const BOperand& src, int64_t k_total, int64_t n);

// Writes one finished output tile. acc[b] points at operand b's fp32 accumulator for rows [m0, m0+mb) and
// columns [n0, n0+nc), row stride ld.
struct Epilogue {
  virtual ~Epilogue() = default;
  virtual void Apply(int64_t m0, int64_t mb, int64_t n0, int64_t nc, const float* const* acc, int64_t ld) const = 0;
};

struct GemmArgs {
  Format fmt = Format::F32;
  int64_t M = 0, K = 0, N = 0;  // K = columns of X (base reduction)
  const void* x = nullptr;      // [M, K]
  // LoRA: extra r reduction columns = scale * (X @ lora_a) ([K, r]); operand B rows [K, K+r) then come from
  // BOperand::extra. r = 0 disables it.
  int64_t r = 0;
  const void* lora_a = nullptr;
  const float* lora_a_f32 = nullptr;  // optional: lora_a already converted to fp32 ([K, r]); then lora_a is unused
  float lora_scale = 1.0f;
  int num_b = 1;  // 1, or 2 (SwiGLU: gate and up share X)
  BOperand b[2];
  const Epilogue* epilogue = nullptr;
  int threads = 0;                       // 0: NumThreads(); how many tiles to aim for per pass
  const ParallelRunner* pool = nullptr;  // where tiles run; null: the calling thread
};

// Runs the whole fused GEMM; throws std::bad_alloc / std::system_error on resource failure.
void Gemm(const GemmArgs& args);

// Which micro-kernel family Gemm uses on this CPU ("avx512", "avx2", "generic"); for benchmarks and build info.
const char* GemmIsa();

// Runs fn(begin, end) over [0, n) in chunks of `grain` items on `pool` (onnxruntime's intra-op pool in the CPU EP
// kernels, cpu/ops.h OrtPool). The first exception is rethrown here. For the non-GEMM kernels (the embedding ops).
void ParallelRanges(const ParallelRunner& pool, int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& fn);

}  // namespace cpu
}  // namespace onnxfuse
