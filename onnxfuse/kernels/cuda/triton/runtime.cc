// The Triton AOT runtime (cuda/triton/runtime.h): the generated cubin table, loading and launching. Cubins are loaded
// with the runtime's library API (cudaLibraryLoadData / cudaLibraryGetKernel), which is context-independent, so one
// load serves every device; the >48 KB shared-memory opt-in is per device and is done once per (kernel, device).
// Loading happens on a kernel's first launch, under std::call_once, so concurrent sessions are safe.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cuda/triton/runtime.h"
#include "triton_kernels.h"  // generated in the build directory

namespace onnxfuse::triton_runtime {

using triton_aot::kNumTritonSpecs;
using triton_aot::kTritonSpecs;

namespace {

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
      k.device_error[device] =
          cudaKernelSetAttributeForDevice(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, spec->shared, device);
  });
  if (k.device_error[device] != cudaSuccess) return int(k.device_error[device]);
  return 0;
}

}  // namespace

// Compute capability of the current device, major * 10 + minor (cached per device in cuda/gemm.cu).
int CurrentArch(int* device_out) { return onnxfuse_cuda_current_arch(device_out); }

// Number of SMs of `device` (cuda/gemm.cu, cached per device).
int NumSMs(int device) { return onnxfuse_cuda_sm_count(device); }

// The spec for (kernel, dtype, size class, aligned, r_pad) whose cubin runs on `arch`: Triton builds sm_90
// as sm_90a (runs on 9.0 only); an sm_8x cubin runs on later minors of major 8. Picks the highest such arch.
// tma: 1 for the persistent TMA build (triton/table.py TMA_KERNELS), 0 for the others.
const TritonSpec* FindExact(int kernel, int dtype, int size_class, int aligned, int r_pad, int arch, int* index,
                            int tma) {
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
  if (spec == nullptr || !spec->aligned || spec->size_class != ids::kTmaSizeClass || k < ids::kTmaMinK ||
      scratch == nullptr || (reinterpret_cast<uintptr_t>(scratch) & 127u) != 0)
    return spec;
  int tma_index = -1;
  const TritonSpec* tma = FindExact(spec->kernel, spec->dtype, spec->size_class, 1, spec->r_pad, arch, &tma_index, 1);
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

// Whether programmatic dependent launches are on: ONNXFUSE_PDL unset or not "0" (read once, cuda/gemm.cu).
bool PdlEnabled() { return onnxfuse_cuda_pdl_enabled() != 0; }

// Launches the cubin `spec` (table entry `index`) with `grid` programs; `cooperative` asks the driver to guarantee
// that all of them are resident at once (or to refuse the launch), which a grid barrier needs; `dependent`: as a
// programmatic dependent of the kernel before it, where the spec was compiled with PDL (runtime.h).
int LaunchSpec(const TritonSpec* spec, int index, int device, int64_t grid, void** args, void* stream, bool cooperative,
               bool dependent) {
  if (const int err = EnsureLoaded(spec, index, device)) return err;
  if (grid > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  if (grid <= 0) return 0;
  const void* fn = reinterpret_cast<const void*>(Loaded()[index].kernel);
  const bool pdl = dependent && spec->pdl != 0 && PdlEnabled();
  if (!cooperative && !pdl)
    return int(cudaLaunchKernel(fn, dim3(unsigned(grid)), dim3(unsigned(spec->num_warps * 32)), args,
                                size_t(spec->shared), static_cast<cudaStream_t>(stream)));
  cudaLaunchAttribute attr = {};
  if (cooperative) {
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
  } else {
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
  }
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
int Launch(int kernel, int dtype, int64_t m, int64_t n, bool aligned, int r_pad, void** args, void* stream,
           bool dependent) {
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  int index = -1;
  const TritonSpec* spec = FindForShape(kernel, dtype, m, n, aligned, r_pad, arch, device, &index);
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  return LaunchSpec(spec, index, device, Tiles(m, n, spec), args, stream, false, dependent);
}

}  // namespace onnxfuse::triton_runtime

extern "C" int onnxfuse_triton_available(void) { return 1; }
