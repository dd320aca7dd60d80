// Launchers for the Triton AOT cubins (triton/*.py compiled by triton/aot.py into the generated triton_kernels.h).
//
// Compiled by the host C++ compiler against the CUDA runtime headers only; links cudart statically and never
// libcuda: cubins are loaded with the runtime's library API (cudaLibraryLoadData / cudaLibraryGetKernel), which is
// context-independent, so one load serves every device; the >48 KB shared-memory opt-in is per device and is done
// once per (kernel, device). Loading happens on a kernel's first launch, under std::call_once, so concurrent
// sessions are safe. Errors are returned as codes (cudaError_t or ONNXFUSE_ERR_*), never printed.
//
// Config choice by M (the size classes of triton/table.py, through the generated onnxfuse_ops.h), then by grid size
// (FindForShape): M <= 16 "small" (decode: 16-row tiles, narrow column tiles so the weights stream once over all
// SMs), M <= 128 "medium", else "large". Autotuned tiles go into aot.py's CONFIGS (or its --configs JSON); this file
// only maps M to a class.
//
// MLPStack: stack_mode picks the row-block kernel, the persistent grid kernel (cooperative launch, a barrier counter
// at the end of the caller's scratch, zeroed with cudaMemsetAsync on the same stream before each launch, so the
// sequence is CUDA-graph safe), or one linear_act per layer; auto follows triton/table.py (ChooseStackMode).
//
// Persistent TMA GEMMs (triton/table.py TMA_*): where FindForShape picks the aligned large-class linear_act or
// lora_main, K >= kTmaMinK and the caller's scratch has room for the device-side TMA descriptors (Triton's global
// scratch, kTmaScratchPerProgram bytes per program), the TMA build runs on min(tiles, SMs) programs (WithTma);
// without that scratch the cp.async build runs, so the scratch is an option, never a requirement.
//
// LoRA runs in two phases: "lora_xa" writes fp32 partial sums of X @ A to the caller's scratch [SPLIT, M, r_pad]
// (grid: row tiles x SPLIT slices of K, SPLIT chosen so that about one program per SM runs; no atomics), then
// "lora_main" (the linear_act main loop + one T @ B dot) reads them. Both launches go to the same stream, so the
// second sees the first's writes.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "cuda/launch.h"
#include "cuda/stack_chain.h"

#ifdef ONNXFUSE_WITH_TRITON
#include "triton_kernels.h"  // generated in the build directory

namespace {

using onnxfuse::triton_aot::kNumTritonSpecs;
using onnxfuse::triton_aot::kTritonSpecs;
using onnxfuse::triton_aot::TritonSpec;

namespace ids = onnxfuse::triton;  // kernel ids, size classes and rank padding of triton/table.py
constexpr int kKernelLinearAct = ids::kLinearAct, kKernelSwiglu = ids::kSwiglu, kKernelLoRAXA = ids::kLoraXa,
              kKernelLoRAMain = ids::kLoraMain, kKernelMLPStack = ids::kMlpStack,
              kKernelRotary = ids::kRotaryEmbedding, kKernelEmbedding = ids::kEmbedding,
              kKernelEmbeddingInteraction = ids::kEmbeddingInteraction, kKernelMLPStackGrid = ids::kMlpStackGrid;
constexpr int kMaxDevices = 64;

struct LoadedKernel {
  std::once_flag load_once;
  cudaError_t load_error = cudaSuccess;
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr;
  std::once_flag device_once[kMaxDevices];
  cudaError_t device_error[kMaxDevices] = {};
};

LoadedKernel* Loaded() {
  static LoadedKernel* table = new LoadedKernel[kNumTritonSpecs];  // never freed: kernels may run until exit
  return table;
}

int SizeClass(int64_t m) {
  for (int c = 0; c + 1 < ids::kNumSizeClasses; ++c)
    if (m <= ids::kSizeClassMaxM[c]) return c;
  return ids::kNumSizeClasses - 1;
}

// Compute capability of the current device (the CUDA EP makes its device current on the thread that runs us), as
// major * 10 + minor, cached per device.
int CurrentArch(int* device_out) {
  static std::atomic<int> arch_of[kMaxDevices] = {};
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return -int(e);
  if (device < 0 || device >= kMaxDevices) return -int(cudaErrorInvalidDevice);
  *device_out = device;
  int arch = arch_of[device].load(std::memory_order_relaxed);
  if (arch == 0) {
    int major = 0, minor = 0;
    if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess) return -int(e);
    if ((e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) != cudaSuccess) return -int(e);
    arch = major * 10 + minor;
    arch_of[device].store(arch, std::memory_order_relaxed);
  }
  return arch;
}

// Number of SMs of the current device (cached per device); 132 if the query fails (H100 SXM).
int NumSMs(int device) {
  static std::atomic<int> sms_of[kMaxDevices] = {};
  int sms = sms_of[device].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) sms = 132;
    sms_of[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

// The spec for (kernel, dtype, size class, aligned, r_pad) whose cubin runs on `arch`: Triton builds sm_90
// as sm_90a (runs on 9.0 only); an sm_8x cubin runs on later minors of major 8. Picks the highest such arch.
// tma: 1 for the persistent TMA build (triton/table.py TMA_KERNELS), 0 for the others.
const TritonSpec* FindExact(int kernel, int dtype, int size_class, int aligned, int r_pad, int arch, int* index,
                            int tma = 0) {
  const TritonSpec* best = nullptr;
  for (int i = 0; i < kNumTritonSpecs; ++i) {
    const TritonSpec& s = kTritonSpecs[i];
    if (s.kernel != kernel || s.dtype != dtype || s.size_class != size_class || s.aligned != aligned ||
        s.r_pad != r_pad || s.tma != tma)
      continue;
    const bool runs = (s.arch == arch) || (s.arch / 10 == arch / 10 && s.arch < arch && s.arch / 10 != 9);
    if (runs && (best == nullptr || s.arch > best->arch)) {
      best = &s;
      *index = i;
    }
  }
  return best;
}

// The spec of M's size class.
const TritonSpec* Find(int kernel, int dtype, int64_t m, bool aligned, int r_pad, int arch, int* index) {
  return FindExact(kernel, dtype, SizeClass(m), aligned ? 1 : 0, r_pad, arch, index);
}

int64_t Tiles(int64_t m, int64_t n, const TritonSpec* spec) {
  return ((m + spec->block_m - 1) / spec->block_m) * ((n + spec->block_n - 1) / spec->block_n);
}

// Find() by M, then by the grid it makes: a large-M GEMM with few columns (DLRM layers, N <= 512) gets fewer large
// tiles than the GPU has SMs and runs latency-bound on a fraction of the chip; the medium tile then gives up to 4x
// the programs. Shapes that fill the chip with large tiles (Llama, LoRA 4096^2) keep them.
const TritonSpec* FindForShape(int kernel, int dtype, int64_t m, int64_t n, bool aligned, int r_pad, int arch,
                               int device, int* index) {
  const TritonSpec* spec = Find(kernel, dtype, m, aligned, r_pad, arch, index);
  if (spec == nullptr || SizeClass(m) != 2 || Tiles(m, n, spec) >= NumSMs(device)) return spec;
  int medium_index = -1;
  const TritonSpec* medium = FindExact(kernel, dtype, 1, aligned ? 1 : 0, r_pad, arch, &medium_index);
  if (medium != nullptr && Tiles(m, n, medium) > Tiles(m, n, spec)) {
    *index = medium_index;
    return medium;
  }
  return spec;
}

// The persistent TMA build of a GEMM launch that FindForShape resolved to `spec` (entry *index): taken when the
// spec is the aligned large-class kernel, K >= kTmaMinK and the caller's scratch holds the descriptors of
// min(tiles, SMs) programs (128-byte aligned, kTmaScratchPerProgram bytes each); else `spec` stays. On success
// *grid is the persistent grid and *index the TMA entry.
const TritonSpec* WithTma(const TritonSpec* spec, int* index, int64_t m, int64_t k, int64_t n, int arch, int device,
                          const void* scratch, int64_t scratch_bytes, int64_t* grid) {
  *grid = spec == nullptr ? 0 : Tiles(m, n, spec);
  if (spec == nullptr || !spec->aligned || spec->size_class != ids::kTmaSizeClass ||
      k < ids::kTmaMinK || scratch == nullptr || (reinterpret_cast<uintptr_t>(scratch) & 127u) != 0)
    return spec;
  int tma_index = -1;
  const TritonSpec* tma =
      FindExact(spec->kernel, spec->dtype, spec->size_class, 1, spec->r_pad, arch, &tma_index, 1);
  if (tma == nullptr) return spec;
  const int64_t sms = NumSMs(device);
  const int64_t programs = *grid < sms ? *grid : sms;
  if (scratch_bytes < programs * ids::kTmaScratchPerProgram) return spec;
  *grid = programs;
  *index = tma_index;
  return tma;
}

// Scratch for the TMA descriptors of a GEMM of this type and sizes on the current device: an upper bound (the
// launcher decides on alignment at launch), 0 where no TMA kernel can run (fp32 has no TMA build).
int64_t TmaScratchBytes(int dtype, int64_t m, int64_t k) {
  int device = 0;
  const int arch = CurrentArch(&device);
  if (dtype == ONNXFUSE_FP32 || arch < 90 || SizeClass(m) != ids::kTmaSizeClass || k < ids::kTmaMinK) return 0;
  return NumSMs(device) * ids::kTmaScratchPerProgram;
}

int64_t RoundUp128(int64_t v) { return (v + 127) / 128 * 128; }

// Loads the cubin `spec` (table entry `index`) once, and opts it into its shared memory once per device.
int EnsureLoaded(const TritonSpec* spec, int index, int device) {
  LoadedKernel& k = Loaded()[index];
  std::call_once(k.load_once, [&] {
    k.load_error = cudaLibraryLoadData(&k.library, spec->cubin, nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (k.load_error == cudaSuccess) k.load_error = cudaLibraryGetKernel(&k.kernel, k.library, spec->name);
  });
  if (k.load_error != cudaSuccess) return int(k.load_error);
  std::call_once(k.device_once[device], [&] {
    // Triton's shared memory is dynamic; above the default 48 KB a kernel must opt in, per device.
    if (spec->shared > 48 * 1024)
      k.device_error[device] = cudaKernelSetAttributeForDevice(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                               spec->shared, device);
  });
  if (k.device_error[device] != cudaSuccess) return int(k.device_error[device]);
  return 0;
}

// Launches the cubin `spec` (table entry `index`) with `grid` programs; `cooperative` asks the driver to guarantee
// that all of them are resident at once (or to refuse the launch), which a grid barrier needs.
int LaunchSpec(const TritonSpec* spec, int index, int device, int64_t grid, void** args, void* stream,
               bool cooperative = false) {
  if (const int err = EnsureLoaded(spec, index, device)) return err;
  if (grid > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  if (grid <= 0) return 0;
  const void* fn = reinterpret_cast<const void*>(Loaded()[index].kernel);
  if (!cooperative)
    return int(cudaLaunchKernel(fn, dim3(unsigned(grid)), dim3(unsigned(spec->num_warps * 32)), args,
                                size_t(spec->shared), static_cast<cudaStream_t>(stream)));
  cudaLaunchAttribute attr = {};
  attr.id = cudaLaunchAttributeCooperative;
  attr.val.cooperative = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(grid));
  cfg.blockDim = dim3(unsigned(spec->num_warps * 32));
  cfg.dynamicSmemBytes = size_t(spec->shared);
  cfg.stream = static_cast<cudaStream_t>(stream);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return int(cudaLaunchKernelExC(&cfg, fn, args));
}

// One GEMM-shaped launch: grid = row tiles x column tiles of the spec's block.
int Launch(int kernel, int dtype, int64_t m, int64_t n, bool aligned, int r_pad, void** args, void* stream) {
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  int index = -1;
  const TritonSpec* spec = FindForShape(kernel, dtype, m, n, aligned, r_pad, arch, device, &index);
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  return LaunchSpec(spec, index, device, Tiles(m, n, spec), args, stream);
}

int RPad(int64_t r) {
  for (int i = 0; i + 1 < ids::kNumRPads; ++i)
    if (r <= ids::kRPads[i]) return ids::kRPads[i];
  return ids::kRPads[ids::kNumRPads - 1];
}

// Phase-1 plan of two-phase LoRA: the lora_xa spec and the K split. SPLIT slices of KB_PER_SPLIT blocks of BLOCK_K
// so that row tiles x SPLIT is about one program per SM (at most 16 slices, at least one block each).
struct LoRAPlan {
  const TritonSpec* xa = nullptr;
  int xa_index = -1, device = 0, arch = 0;
  int64_t split = 1, kb_per_split = 1;
};

int PlanLoRA(int dtype, int64_t m, int64_t k, int64_t r, bool aligned, LoRAPlan* plan) {
  const int arch = CurrentArch(&plan->device);
  if (arch < 0) return -arch;
  plan->arch = arch;
  plan->xa = Find(kKernelLoRAXA, dtype, m, aligned, RPad(r), arch, &plan->xa_index);
  if (plan->xa == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  const int64_t grid_m = (m + plan->xa->block_m - 1) / plan->xa->block_m;
  const int64_t k_blocks = (k + plan->xa->block_k - 1) / plan->xa->block_k;
  int64_t split = (NumSMs(plan->device) + grid_m - 1) / grid_m;
  if (split > 16) split = 16;
  if (split > k_blocks) split = k_blocks;
  if (split < 1) split = 1;
  plan->kb_per_split = k_blocks > 0 ? (k_blocks + split - 1) / split : 1;
  plan->split = k_blocks > 0 ? (k_blocks + plan->kb_per_split - 1) / plan->kb_per_split : 1;
  return 0;
}

int64_t LoRAScratchBytes(int64_t m, int64_t r, const LoRAPlan& plan) {
  return plan.split * m * RPad(r) * int64_t(sizeof(float));
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

bool BadCommon(int dtype, int64_t m, int64_t k, int64_t n) {
  return dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || k < 0 || n < 0;
}
bool TooLarge(int64_t m, int64_t k, int64_t n) {
  return m > 0x7fffffffLL || k > 0x7fffffffLL || n > 0x7fffffffLL;  // Triton params are i32
}

}  // namespace

extern "C" int onnxfuse_triton_available(void) { return 1; }

// The argument order of each launch matches the kernel's KERNELS table in triton/*.py; Triton 3.6 appends two scratch
// pointers (global, profile): the global one is the TMA descriptors' scratch for the persistent TMA kernels, null for
// the others (aot.py refuses any other kernel that needs either).
extern "C" int64_t onnxfuse_triton_linear_act_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n) {
  if (BadCommon(dtype, m, k, n)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return TmaScratchBytes(dtype, m, k);
}

extern "C" int onnxfuse_triton_linear_act(int dtype, int act, const void* x, const void* w, const void* bias, void* y,
                                          int64_t m, int64_t k, int64_t n, void* scratch, int64_t scratch_bytes,
                                          void* stream) {
  if (BadCommon(dtype, m, k, n) || (act != ONNXFUSE_ACT_RELU && act != ONNXFUSE_ACT_SIGMOID))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  const bool aligned = Aligned16(x) && Aligned16(w) && Aligned16(bias) && Aligned16(y) && k % 16 == 0 && n % 16 == 0;
  int index = -1;
  const TritonSpec* spec = FindForShape(kKernelLinearAct, dtype, m, n, aligned, 0, arch, device, &index);
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  int64_t grid = 0;
  spec = WithTma(spec, &index, m, k, n, arch, device, scratch, scratch_bytes, &grid);
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), ACT = act, NPROG = int32_t(grid);
  void* scratch_global = spec->tma ? scratch : nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &w, &bias, &y, &M, &N, &K, &ACT, &NPROG, &scratch_global, &scratch_profile};
  return LaunchSpec(spec, index, device, grid, args, stream);
}

extern "C" int onnxfuse_triton_swiglu(int dtype, int act, const void* x, const void* w_gate, const void* w_up, void* y,
                                      int64_t m, int64_t k, int64_t n, void* stream) {
  if (BadCommon(dtype, m, k, n) || act < 0 || act >= ONNXFUSE_NUM_GATE_ACTIVATIONS) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), ACT = act;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &w_gate, &w_up, &y, &M, &N, &K, &ACT, &scratch_global, &scratch_profile};
  const bool aligned = Aligned16(x) && Aligned16(w_gate) && Aligned16(w_up) && Aligned16(y) && k % 16 == 0 &&
                       n % 16 == 0;
  return Launch(kKernelSwiglu, dtype, m, n, aligned, 0, args, stream);
}

namespace {
bool LoRAAligned(const void* x, const void* w, const void* a, const void* b, const void* bias, const void* y,
                 int64_t k, int64_t n, int64_t r) {
  // r % 8: 16-byte rows of A (fp16/bf16), so its tiles load with cp.async and the phase-1 loop pipelines.
  return Aligned16(x) && Aligned16(w) && Aligned16(a) && Aligned16(b) && Aligned16(bias) && Aligned16(y) &&
         k % 16 == 0 && n % 16 == 0 && r % 8 == 0;
}
}  // namespace

extern "C" int64_t onnxfuse_triton_lora_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t r) {
  if (BadCommon(dtype, m, k, n) || r < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  LoRAPlan plan;
  // The xa configs of the aligned and unaligned builds share BLOCK_M / BLOCK_K, so the plan does not depend on it.
  const int err = PlanLoRA(dtype, m, k, r, true, &plan);
  if (err != 0) return err > 0 ? -int64_t(err) : int64_t(err);
  // then, 128-byte aligned, the TMA descriptors of the persistent lora_main (where it may run)
  const int64_t tma = TmaScratchBytes(dtype, m, k);
  return tma > 0 ? RoundUp128(LoRAScratchBytes(m, r, plan)) + tma : LoRAScratchBytes(m, r, plan);
}

extern "C" int onnxfuse_triton_lora_linear(int dtype, int relu, const void* x, const void* w, const void* a,
                                           const void* b, const void* bias, float scale, void* y, int64_t m, int64_t k,
                                           int64_t n, int64_t r, void* scratch, int64_t scratch_bytes,
                                           void* stream) {
  if (BadCommon(dtype, m, k, n) || r < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), R = int32_t(r), RELU = relu ? 1 : 0;
  float SCALE = scale;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  const int r_pad = RPad(r);
  const bool aligned = LoRAAligned(x, w, a, b, bias, y, k, n, r);
  LoRAPlan plan;
  int err = PlanLoRA(dtype, m, k, r, aligned, &plan);
  if (err != 0) return err;
  if (scratch == nullptr || !Aligned16(scratch) || scratch_bytes < LoRAScratchBytes(m, r, plan))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  int index = -1;
  const TritonSpec* main_spec =
      FindForShape(kKernelLoRAMain, dtype, m, n, aligned, r_pad, plan.arch, plan.device, &index);
  if (main_spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  // Phase 1: T partials = X @ A per K slice, fp32, into scratch [SPLIT, M, r_pad].
  int32_t KB_PER_SPLIT = int32_t(plan.kb_per_split), SPLIT = int32_t(plan.split);
  void* xa_args[] = {&x, &a, &scratch, &M, &K, &R, &KB_PER_SPLIT, &scratch_global, &scratch_profile};
  const int64_t grid_xa = ((m + plan.xa->block_m - 1) / plan.xa->block_m) * plan.split;
  if ((err = LaunchSpec(plan.xa, plan.xa_index, plan.device, grid_xa, xa_args, stream)) != 0) return err;
  // Phase 2: Y = X @ W + (scale * sum T) @ B + bias [relu]; the TMA descriptors after the partials.
  const int64_t partials = RoundUp128(LoRAScratchBytes(m, r, plan));
  int64_t grid = 0;
  main_spec = WithTma(main_spec, &index, m, k, n, plan.arch, plan.device, static_cast<char*>(scratch) + partials,
                      scratch_bytes - partials, &grid);
  int32_t NPROG = int32_t(grid);
  void* main_global = main_spec->tma ? static_cast<char*>(scratch) + partials : nullptr;
  void* main_args[] = {&x, &w, &scratch, &b, &bias, &y, &M, &N, &K, &R, &SPLIT, &SCALE, &RELU, &NPROG, &main_global,
                       &scratch_profile};
  return LaunchSpec(main_spec, index, plan.device, grid, main_args, stream);
}

namespace {
// stack_mode=auto: which kernel runs a stack of M rows (triton/table.py's thresholds and the measurements behind
// them, through onnxfuse_ops.h).
//   grid   M <= kStackGridMaxM: the persistent kernel, every layer split over all SMs (small M: a row block per
//          program would leave most SMs idle);
//   fused  M >= kStackRowsMinSmMult x SMs: the row-block kernel;
//   layers in between, and whenever a layer is wider than kStackMaxWidth (every program would read every weight).
int ChooseStackMode(int64_t m, int n_layers, const int64_t* widths, int device) {
  for (int i = 0; i <= n_layers; ++i)
    if (widths[i] > ids::kStackMaxWidth) return ONNXFUSE_STACK_LAYERS;
  if (m <= ids::kStackGridMaxM) return ONNXFUSE_STACK_GRID;
  if (m >= ids::kStackRowsMinSmMult * NumSMs(device)) return ONNXFUSE_STACK_FUSED;
  return ONNXFUSE_STACK_LAYERS;
}

// The most tiles any layer of the stack has for the grid kernel's tile: the grid is min(SMs, this).
int64_t GridStackTiles(int64_t m, int n_layers, const int64_t* widths, const TritonSpec* spec) {
  int64_t most = 1;
  for (int i = 0; i < n_layers; ++i) {
    const int64_t t = Tiles(m, widths[i + 1], spec);
    most = t > most ? t : most;
  }
  return most;
}

// The layer arguments both stack kernels take after their own (triton/mlp_stack.py's _LAYER_PARAMS): hidden layers
// 1..3 (unused ones: null pointers, zero widths, relu) and the final layer. args() lists their addresses in order.
struct StackLayerArgs {
  const void* hw[3] = {nullptr, nullptr, nullptr};
  const void* hb[3] = {nullptr, nullptr, nullptr};
  int32_t hn[3] = {0, 0, 0};
  int32_t ha[3] = {ONNXFUSE_ACT_RELU, ONNXFUSE_ACT_RELU, ONNXFUSE_ACT_RELU};
  const void* wf;
  const void* bf;
  int32_t nf, af;

  StackLayerArgs(int n_layers, const int* acts, const void* const* w, const void* const* b, const int64_t* widths)
      : wf(w[n_layers - 1]), bf(b[n_layers - 1]), nf(int32_t(widths[n_layers])), af(acts[n_layers - 1]) {
    for (int i = 0; i + 1 < n_layers; ++i) {
      hw[i] = w[i];
      hb[i] = b[i];
      hn[i] = int32_t(widths[i + 1]);
      ha[i] = acts[i];
    }
  }
  // Copies the 16 addresses into out[0..15].
  void args(void** out) {
    void* a[] = {&hw[0], &hb[0], &hn[0], &ha[0], &hw[1], &hb[1], &hn[1], &ha[1],
                 &hw[2], &hb[2], &hn[2], &ha[2], &wf, &bf, &nf, &af};
    for (int i = 0; i < 16; ++i) out[i] = a[i];
  }
};
}  // namespace

// The layer buffers, the grid kernel's barrier counter, then (128-byte aligned) the TMA descriptors of the
// per-layer linear_act launches where a layer may run on the persistent TMA kernel.
static int64_t StackTmaOffset(int64_t need) { return RoundUp128(need + ONNXFUSE_STACK_BARRIER_BYTES); }

extern "C" int64_t onnxfuse_triton_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths) {
  const int64_t need = onnxfuse_mlp_stack_scratch_bytes(dtype, n_layers, m, widths);
  if (need < 0) return need;
  int64_t tma = 0;
  for (int i = 0; i < n_layers; ++i) {
    const int64_t t = TmaScratchBytes(dtype, m, widths[i]);
    tma = t > tma ? t : tma;
  }
  return tma > 0 ? StackTmaOffset(need) + tma : need + ONNXFUSE_STACK_BARRIER_BYTES;
}

extern "C" int onnxfuse_triton_mlp_stack(int dtype, int n_layers, const int* acts, const void* x,
                                         const void* const* w, const void* const* b, void* y, int64_t m,
                                         const int64_t* widths, int mode, void* scratch, int64_t scratch_bytes,
                                         void* stream) {
  const int64_t need = onnxfuse_mlp_stack_scratch_bytes(dtype, n_layers, m, widths);
  if (need < 0) return int(need);
  if (acts == nullptr || w == nullptr || b == nullptr || mode < 0 || mode >= onnxfuse::schema::kNumStackModes)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  for (int i = 0; i < n_layers; ++i) {
    if ((acts[i] != ONNXFUSE_ACT_RELU && acts[i] != ONNXFUSE_ACT_SIGMOID) || w[i] == nullptr || b[i] == nullptr)
      return ONNXFUSE_ERR_BAD_ARGUMENT;
  }
  for (int i = 0; i <= n_layers; ++i) {
    if (widths[i] < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
    if (TooLarge(m, widths[i], 0)) return ONNXFUSE_ERR_TOO_LARGE;
  }
  if (need > 0 && (scratch == nullptr || !Aligned16(scratch) || scratch_bytes < need)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || widths[n_layers] == 0) return 0;
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  const int mode_requested = mode;
  if (mode == ONNXFUSE_STACK_AUTO) mode = ChooseStackMode(m, n_layers, widths, device);
  bool aligned = Aligned16(x) && Aligned16(y) && (need == 0 || Aligned16(scratch));
  for (int i = 0; i < n_layers; ++i) aligned = aligned && Aligned16(w[i]) && Aligned16(b[i]);
  for (int i = 1; i < n_layers; ++i) aligned = aligned && widths[i] % 16 == 0;
  if (mode == ONNXFUSE_STACK_GRID) {
    if (scratch == nullptr || scratch_bytes < need + ONNXFUSE_STACK_BARRIER_BYTES) return ONNXFUSE_ERR_BAD_ARGUMENT;
    int index = -1;
    const TritonSpec* spec = FindExact(kKernelMLPStackGrid, dtype, SizeClass(m), aligned ? 1 : 0, 0, arch, &index);
    if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
    int64_t grid = GridStackTiles(m, n_layers, widths, spec);
    const int64_t sms = NumSMs(device);
    grid = grid < sms ? grid : sms;  // at most one program per SM: all resident, so the barrier cannot deadlock
    int32_t M = int32_t(m), K0 = int32_t(widths[0]), L = n_layers;
    int32_t SW = int32_t(onnxfuse_mlp_stack_scratch_width(n_layers, widths));
    const void* s_ptr = need > 0 ? scratch : y;
    void* bar_ptr = static_cast<char*>(scratch) + need;
    StackLayerArgs layers(n_layers, acts, w, b, widths);
    void* scratch_global = nullptr;
    void* scratch_profile = nullptr;
    void* args[8 + 16 + 2] = {&x, &y, &s_ptr, &bar_ptr, &M, &K0, &SW, &L};
    layers.args(args + 8);
    args[24] = &scratch_global;
    args[25] = &scratch_profile;
    // The barrier counter starts at zero for every launch: reset on the stream, so a CUDA graph replays it too.
    cudaError_t e = cudaMemsetAsync(bar_ptr, 0, sizeof(int32_t), static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) return int(e);
    const int err = LaunchSpec(spec, index, device, grid, args, stream, ids::kStackGridCooperative != 0);
    // The driver could not make every program resident at once (another context holding SMs, say): nothing ran,
    // so the stack runs layer by layer instead of risking the barrier.
    if (err != int(cudaErrorCooperativeLaunchTooLarge) || mode_requested == ONNXFUSE_STACK_GRID) return err;
    (void)cudaGetLastError();  // the refused launch left its error in the runtime's last-error slot
    mode = ONNXFUSE_STACK_LAYERS;
  }
  if (mode != ONNXFUSE_STACK_FUSED) {
    const int64_t tma_offset = StackTmaOffset(need);
    void* tma_scratch = scratch != nullptr && scratch_bytes > tma_offset ? static_cast<char*>(scratch) + tma_offset
                                                                         : nullptr;
    const int64_t tma_bytes = tma_scratch != nullptr ? scratch_bytes - tma_offset : 0;
    return onnxfuse::StackPerLayer(n_layers, x, y, scratch, need, [&](int i, const void* in, void* out) {
      return onnxfuse_triton_linear_act(dtype, acts[i], in, w[i], b[i], out, m, widths[i], widths[i + 1], tma_scratch,
                                        tma_bytes, stream);
    });
  }
  // BLOCK_M (mlp_stack's size classes 0/1/2 = 16/32/64 rows): the smallest whose grid fits on the SMs, else the
  // largest.
  const TritonSpec* spec = nullptr;
  int index = -1;
  for (int size_class = 0; size_class < ids::kNumSizeClasses; ++size_class) {
    int idx = -1;
    const TritonSpec* s = FindExact(kKernelMLPStack, dtype, size_class, aligned ? 1 : 0, 0, arch, &idx);
    if (s == nullptr) continue;
    spec = s;
    index = idx;
    if ((m + s->block_m - 1) / s->block_m <= NumSMs(device)) break;
  }
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  int32_t M = int32_t(m), K0 = int32_t(widths[0]), L = n_layers;
  int32_t SW = int32_t(onnxfuse_mlp_stack_scratch_width(n_layers, widths));
  const void* s_ptr = need > 0 ? scratch : y;  // never read or written when L == 1
  StackLayerArgs layers(n_layers, acts, w, b, widths);
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[7 + 16 + 2] = {&x, &y, &s_ptr, &M, &K0, &SW, &L};
  layers.args(args + 7);
  args[23] = &scratch_global;
  args[24] = &scratch_profile;
  return LaunchSpec(spec, index, device, (m + spec->block_m - 1) / spec->block_m, args, stream);
}

extern "C" int onnxfuse_triton_rotary_embedding(int dtype, const void* x, const void* cos, const void* sin, void* y,
                                                int64_t rows, int64_t d, int64_t d1, int64_t d2,
                                                const int64_t* cos_stride, const int64_t* sin_stride, void* stream) {
  const int check = onnxfuse_rotary_check(dtype, x, cos, sin, y, rows, d, d1, d2, cos_stride, sin_stride);
  if (check != 0) return check > 0 ? 0 : check;
  const int64_t big[] = {rows, d, d1, d2, cos_stride[0], cos_stride[1], cos_stride[2], sin_stride[0], sin_stride[1],
                         sin_stride[2]};
  for (int64_t v : big)
    if (v > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;  // Triton params are i32 (offsets are 64-bit inside)
  int32_t ROWS = int32_t(rows), HALF = int32_t(d / 2), D1 = int32_t(d1), D2 = int32_t(d2);
  int32_t CS0 = int32_t(cos_stride[0]), CS1 = int32_t(cos_stride[1]), CS2 = int32_t(cos_stride[2]);
  int32_t SS0 = int32_t(sin_stride[0]), SS1 = int32_t(sin_stride[1]), SS2 = int32_t(sin_stride[2]);
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &cos, &sin, &y, &ROWS, &HALF, &D1, &D2, &CS0, &CS1, &CS2, &SS0, &SS1, &SS2, &scratch_global,
                  &scratch_profile};
  const bool aligned = Aligned16(x) && Aligned16(cos) && Aligned16(sin) && Aligned16(y) && HALF % 16 == 0;
  return Launch(kKernelRotary, dtype, rows, d / 2, aligned, 0, args, stream);
}

extern "C" int onnxfuse_triton_embedding(int dtype, const void* table, const int64_t* ids, void* y, int64_t n,
                                         int64_t vocab, int64_t d, void* stream) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || n < 0 || vocab < 0 || d < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (n == 0 || d == 0) return 0;
  if (n > 0x7fffffffLL || d > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  int32_t NIDS = int32_t(n), D = int32_t(d);
  int64_t VOCAB = vocab;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&table, &ids, &y, &NIDS, &VOCAB, &D, &scratch_global, &scratch_profile};
  const bool aligned = Aligned16(table) && Aligned16(ids) && Aligned16(y) && d % 16 == 0;
  return Launch(kKernelEmbedding, dtype, n, d, aligned, 0, args, stream);
}

extern "C" int onnxfuse_triton_embedding_interaction(int dtype, int interaction, int hash, const void* x,
                                                     const int64_t* ids, const int64_t* offsets, const void* table,
                                                     const int64_t* table_offsets, const int64_t* cardinality,
                                                     void* y, int64_t batch, int64_t d, int64_t features,
                                                     int64_t n_indices, int64_t rows, void* stream) {
  int64_t width = 0;
  const int check = onnxfuse_embedding_interaction_check(dtype, interaction, hash, batch, d, features, n_indices, rows,
                                                         &width);
  if (check != 0) return check > 0 ? 0 : check;
  if (TooLarge(batch, width, n_indices) || TooLarge(d, features, 0)) return ONNXFUSE_ERR_TOO_LARGE;
  const int64_t n = features + 1;
  // The smallest compiled tile holding n vectors of d: NP indexes the size class, DP is the r_pad field.
  int np_index = -1, dp = 0;
  for (int i = 0; i < ids::kNumEmbedNps && np_index < 0; ++i)
    if (n <= ids::kEmbedNps[i]) np_index = i;
  for (int i = 0; i < ids::kNumEmbedDps && dp == 0; ++i)
    if (d <= ids::kEmbedDps[i]) dp = int(ids::kEmbedDps[i]);
  if (np_index < 0 || dp == 0) return ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE;  // no tile this large: the CUDA kernel
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  int index = -1;
  const TritonSpec* spec = FindExact(kKernelEmbeddingInteraction, dtype, np_index, 0, dp, arch, &index);
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  int32_t B = int32_t(batch), F = int32_t(features), N = int32_t(n_indices), D = int32_t(d), WIDTH = int32_t(width);
  int64_t R = rows;
  int32_t BAG = offsets != nullptr ? 1 : 0, HASH = hash == ONNXFUSE_HASH_MOD ? 1 : 0;
  int32_t DOT = interaction == ONNXFUSE_INTERACTION_DOT ? 1 : 0;
  const int64_t* offs = offsets != nullptr ? offsets : ids;  // never read without bags
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &ids, &offs, &table, &table_offsets, &cardinality, &y, &B, &F, &N, &D, &WIDTH, &R, &BAG,
                  &HASH, &DOT, &scratch_global, &scratch_profile};
  return LaunchSpec(spec, index, device, (batch + spec->block_m - 1) / spec->block_m, args, stream);
}

#else  // built without Triton: the launchers exist and say so.

extern "C" int onnxfuse_triton_available(void) { return 0; }
extern "C" int64_t onnxfuse_triton_linear_act_scratch_bytes(int, int64_t, int64_t, int64_t) {
  return ONNXFUSE_ERR_NO_TRITON;
}
extern "C" int onnxfuse_triton_linear_act(int, int, const void*, const void*, const void*, void*, int64_t, int64_t,
                                          int64_t, void*, int64_t, void*) {
  return ONNXFUSE_ERR_NO_TRITON;
}
extern "C" int onnxfuse_triton_swiglu(int, int, const void*, const void*, const void*, void*, int64_t, int64_t,
                                      int64_t, void*) {
  return ONNXFUSE_ERR_NO_TRITON;
}
extern "C" int64_t onnxfuse_triton_lora_scratch_bytes(int, int64_t, int64_t, int64_t, int64_t) {
  return ONNXFUSE_ERR_NO_TRITON;
}
extern "C" int onnxfuse_triton_lora_linear(int, int, const void*, const void*, const void*, const void*, const void*,
                                           float, void*, int64_t, int64_t, int64_t, int64_t, void*, int64_t, void*) {
  return ONNXFUSE_ERR_NO_TRITON;
}
extern "C" int onnxfuse_triton_mlp_stack(int, int, const int*, const void*, const void* const*, const void* const*,
                                         void*, int64_t, const int64_t*, int, void*, int64_t, void*) {
  return ONNXFUSE_ERR_NO_TRITON;
}
extern "C" int onnxfuse_triton_rotary_embedding(int, const void*, const void*, const void*, void*, int64_t, int64_t,
                                                int64_t, int64_t, const int64_t*, const int64_t*, void*) {
  return ONNXFUSE_ERR_NO_TRITON;
}
extern "C" int onnxfuse_triton_embedding(int, const void*, const int64_t*, void*, int64_t, int64_t, int64_t, void*) {
  return ONNXFUSE_ERR_NO_TRITON;
}
extern "C" int64_t onnxfuse_triton_mlp_stack_scratch_bytes(int, int, int64_t, const int64_t*) {
  return ONNXFUSE_ERR_NO_TRITON;
}
extern "C" int onnxfuse_triton_embedding_interaction(int, int, int, const void*, const int64_t*, const int64_t*,
                                                     const void*, const int64_t*, const int64_t*, void*, int64_t,
                                                     int64_t, int64_t, int64_t, int64_t, void*) {
  return ONNXFUSE_ERR_NO_TRITON;
}

#endif

