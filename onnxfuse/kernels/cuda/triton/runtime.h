// The Triton AOT runtime that the Triton launchers (at the end of cuda/<family>.cu) share (defined in
// cuda/triton/runtime.cc): the table entry of a compiled kernel (TritonSpec; triton/aot.py compiles triton/*.py into
// the generated triton_kernels.h, a table of these), the spec search, and the launch. Only the Triton build compiles
// this folder; without it, the CUDA EP glue never calls a launcher (cuda/ops_cuda.h, kWithTriton).
//
// Compiled by the host C++ compiler against the CUDA runtime headers only; links cudart statically and never
// libcuda. Errors are returned as codes (cudaError_t or ONNXFUSE_ERR_*), never printed.
//
// Config choice by M (the size classes of triton/table.py, through the generated onnxfuse_ops.h), then by grid size
// (FindForShape): M <= 16 "small" (decode: 16-row tiles, narrow column tiles so the weights stream once over all
// SMs), M <= 128 "medium", else "large". Tiles are the kernel files' CONFIGS (triton/<family>.py, tuned.json); the
// runtime only maps M to a class.
//
// Persistent TMA GEMMs (triton/table.py TMA_*): where FindForShape picks the aligned large-class linear_act or
// lora_main, K >= kTmaMinK and the caller's scratch has room for the device-side TMA descriptors (Triton's global
// scratch, kTmaScratchPerProgram bytes per program), the TMA build runs on min(tiles, SMs) programs (WithTma);
// without that scratch the cp.async build runs, so the scratch is an option, never a requirement.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cuda/launch.h"

namespace onnxfuse::triton_aot {

// One compiled kernel of triton_kernels.h (triton/aot.py writes the table in this field order).
struct TritonSpec {
  int kernel, dtype, size_class, aligned, r_pad, arch;
  const unsigned char* cubin;
  size_t cubin_size;
  const char* name;
  int num_warps, shared, block_m, block_n, block_k;
  int tma;  // 1: persistent TMA kernel (grid <= SMs, NPROG, descriptor scratch per program)
  int pdl;  // 1: compiled with PDL (griddepcontrol): may be launched as a programmatic dependent (LaunchSpec)
};

}  // namespace onnxfuse::triton_aot

namespace onnxfuse::triton_runtime {

using triton_aot::TritonSpec;
namespace ids = onnxfuse::triton;  // kernel ids, size classes and rank padding of triton/table.py

inline int SizeClass(int64_t m) {
  for (int c = 0; c + 1 < ids::kNumSizeClasses; ++c)
    if (m <= ids::kSizeClassMaxM[c]) return c;
  return ids::kNumSizeClasses - 1;
}

// Compute capability of the current device (the CUDA EP makes its device current on the thread that runs us), as
// major * 10 + minor, cached per device.
int CurrentArch(int* device_out);

// Number of SMs of the current device (cached per device); 132 if the query fails (H100 SXM).
int NumSMs(int device);

// The spec for (kernel, dtype, size class, aligned, r_pad) whose cubin runs on `arch`: Triton builds sm_90
// as sm_90a (runs on 9.0 only); an sm_8x cubin runs on later minors of major 8. Picks the highest such arch.
// tma: 1 for the persistent TMA build (triton/table.py TMA_KERNELS), 0 for the others.
const TritonSpec* FindExact(int kernel, int dtype, int size_class, int aligned, int r_pad, int arch, int* index,
                            int tma = 0);

// The spec of M's size class.
inline const TritonSpec* Find(int kernel, int dtype, int64_t m, bool aligned, int r_pad, int arch, int* index) {
  return FindExact(kernel, dtype, SizeClass(m), aligned ? 1 : 0, r_pad, arch, index);
}

inline int64_t Tiles(int64_t m, int64_t n, const TritonSpec* spec) {
  return ((m + spec->block_m - 1) / spec->block_m) * ((n + spec->block_n - 1) / spec->block_n);
}

// Find() by M, then by the grid it makes: a large-M GEMM with few columns (DLRM layers, N <= 512) gets fewer large
// tiles than the GPU has SMs and runs latency-bound on a fraction of the chip; the medium tile then gives up to 4x
// the programs. Shapes that fill the chip with large tiles (Llama, LoRA 4096^2) keep them.
const TritonSpec* FindForShape(int kernel, int dtype, int64_t m, int64_t n, bool aligned, int r_pad, int arch,
                               int device, int* index);

// The persistent TMA build of a GEMM launch that FindForShape resolved to `spec` (entry *index): taken when the
// spec is the aligned large-class kernel, K >= kTmaMinK and the caller's scratch holds the descriptors of
// min(tiles, SMs) programs (128-byte aligned, kTmaScratchPerProgram bytes each); else `spec` stays. On success
// *grid is the persistent grid and *index the TMA entry.
const TritonSpec* WithTma(const TritonSpec* spec, int* index, int64_t m, int64_t k, int64_t n, int arch, int device,
                          const void* scratch, int64_t scratch_bytes, int64_t* grid);

// Scratch for the TMA descriptors of a GEMM of this type and sizes on the current device: an upper bound (the
// launcher decides on alignment at launch), 0 where no TMA kernel can run (fp32 has no TMA build).
int64_t TmaScratchBytes(int dtype, int64_t m, int64_t k);

inline int64_t RoundUp128(int64_t v) { return (v + 127) / 128 * 128; }

// `args`: the kernel's arguments in the order of its KERNELS table in triton/*.py, then the two scratch pointers
// Triton 3.6 appends (global, profile): the global one is the TMA descriptors' scratch for the persistent TMA
// kernels, null for the others (aot.py refuses any other kernel that needs either).
//
// Launches the cubin `spec` (table entry `index`) with `grid` programs; `cooperative` asks the driver to guarantee
// that all of them are resident at once (or to refuse the launch), which a grid barrier needs.
//
// `dependent`: launch it as a programmatic dependent of the kernel before it on the stream (PDL,
// cudaLaunchAttributeProgrammaticStreamSerialization; sm_90+): its programs may start while that kernel still runs,
// once that kernel's programs have signalled (gemm_loop._pdl_trigger), and wait for it (_pdl_wait) before they read
// what it wrote. Taken only where the spec was compiled with PDL (spec->pdl) and ONNXFUSE_PDL is not "0"; else a
// plain launch (the kernel's wait is then a no-op). A caller asks for it only where the kernel reads nothing that
// the kernel before it writes ahead of its wait: LoRA's main kernels after phase 1 (they read X, which the kernel
// before phase 1 wrote, and wait before the partials).
int LaunchSpec(const TritonSpec* spec, int index, int device, int64_t grid, void** args, void* stream,
               bool cooperative = false, bool dependent = false);

// Whether programmatic dependent launches are on: ONNXFUSE_PDL unset or not "0" (read once).
bool PdlEnabled();

// One GEMM-shaped launch: grid = row tiles x column tiles of the spec's block; `dependent` as LaunchSpec's.
int Launch(int kernel, int dtype, int64_t m, int64_t n, bool aligned, int r_pad, void** args, void* stream,
           bool dependent = false);

inline int RPad(int64_t r) {
  for (int i = 0; i + 1 < ids::kNumRPads; ++i)
    if (r <= ids::kRPads[i]) return ids::kRPads[i];
  return ids::kRPads[ids::kNumRPads - 1];
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

inline bool BadCommon(int dtype, int64_t m, int64_t k, int64_t n) {
  return dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || k < 0 || n < 0;
}
inline bool TooLarge(int64_t m, int64_t k, int64_t n) {
  return m > 0x7fffffffLL || k > 0x7fffffffLL || n > 0x7fffffffLL;  // Triton params are i32
}

// Phase-1 plan of two-phase LoRA (the LoRA launchers): the lora_xa (or multi_lora_xa) spec and the K split. SPLIT
// slices of KB_PER_SPLIT blocks of BLOCK_K so that row tiles x SPLIT x `fanout` is about one program per SM (at most
// `max_split` slices, at least one block each); `fanout` is the launch's programs per row tile and slice: for a mixed
// batch the adapters in a stack (a program does both of a gated MLP's stacks from one X tile). A larger fanout (or a
// lower `max_split`: LoRASwiGLU's cuBLASLt path, whose lora_gate sums the partials at once) only lowers SPLIT, so a
// scratch size planned with fanout 1 covers it.
constexpr int64_t kMaxLoRASplit = 16;  // PlanLoRA's default bound on the K slices

struct LoRAPlan {
  const TritonSpec* xa = nullptr;
  int xa_index = -1, device = 0, arch = 0;
  int64_t split = 1, kb_per_split = 1;
};

inline int PlanLoRA(int dtype, int64_t m, int64_t k, int64_t r, bool aligned, LoRAPlan* plan,
                    int xa_kernel = ids::kLoraXa, int64_t fanout = 1, int64_t max_split = kMaxLoRASplit) {
  const int arch = CurrentArch(&plan->device);
  if (arch < 0) return -arch;
  plan->arch = arch;
  plan->xa = Find(xa_kernel, dtype, m, aligned, RPad(r), arch, &plan->xa_index);
  if (plan->xa == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  const int64_t grid_m = (m + plan->xa->block_m - 1) / plan->xa->block_m;
  const int64_t k_blocks = (k + plan->xa->block_k - 1) / plan->xa->block_k;
  const int64_t per_slice = grid_m * (fanout > 1 ? fanout : 1);
  int64_t split = (NumSMs(plan->device) + per_slice - 1) / per_slice;
  if (split > max_split) split = max_split;
  if (split > k_blocks) split = k_blocks;
  if (split < 1) split = 1;
  plan->kb_per_split = k_blocks > 0 ? (k_blocks + split - 1) / split : 1;
  plan->split = k_blocks > 0 ? (k_blocks + plan->kb_per_split - 1) / plan->kb_per_split : 1;
  return 0;
}

inline int64_t LoRAScratchBytes(int64_t m, int64_t r, const LoRAPlan& plan) {
  return plan.split * m * RPad(r) * int64_t(sizeof(float));
}

// The LoRA launchers' scratch-size functions start here: their argument checks (a rank below 0 or past
// ONNXFUSE_MAX_LORA_RANK, sizes past i32), then one phase-1 partials buffer's bytes ([SPLIT, M, r_pad] fp32) from a
// plan with fanout 1, which covers every fanout; 0 when M or N is 0, else a negative ONNXFUSE_ERR_* code. The xa
// configs of the aligned and unaligned builds share BLOCK_M / BLOCK_K, so the plan, made for the aligned one, serves
// both.
inline int64_t LoRAPartialsBytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t r, int xa_kernel = ids::kLoraXa) {
  if (BadCommon(dtype, m, k, n) || r < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  LoRAPlan plan;
  const int err = PlanLoRA(dtype, m, k, r, true, &plan, xa_kernel);
  if (err != 0) return err > 0 ? -int64_t(err) : int64_t(err);
  return LoRAScratchBytes(m, r, plan);
}

}  // namespace onnxfuse::triton_runtime
