// Launchers for the Triton AOT cubins (triton/*.py compiled by triton/aot.py into the generated triton_kernels.h).
//
// Compiled by the host C++ compiler against the CUDA runtime headers only; links cudart statically and never
// libcuda: cubins are loaded with the runtime's library API (cudaLibraryLoadData / cudaLibraryGetKernel), which is
// context-independent, so one load serves every device; the >48 KB shared-memory opt-in is per device and is done
// once per (kernel, device). Loading happens on a kernel's first launch, under std::call_once, so concurrent
// sessions are safe. Errors are returned as codes (cudaError_t or ONNXFUSE_ERR_*), never printed.
//
// Config choice by M (size classes of aot.py): M <= 16 "small" (decode: 16-row tiles, narrow column tiles so the
// weights stream once over all SMs), M <= 128 "medium", else "large". Autotuned tiles go into aot.py's CONFIGS
// (or its --configs JSON); this file only maps M to a class.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "cuda/launch.h"

#ifdef ONNXFUSE_WITH_TRITON
#include "triton_kernels.h"  // generated in the build directory

namespace {

using onnxfuse::triton_aot::kNumTritonSpecs;
using onnxfuse::triton_aot::kTritonSpecs;
using onnxfuse::triton_aot::TritonSpec;

constexpr int kKernelLinearAct = 0, kKernelSwiglu = 1, kKernelLoRA = 2;
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

int SizeClass(int64_t m) { return m <= 16 ? 0 : (m <= 128 ? 1 : 2); }

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

// The spec for (kernel, dtype, size class, aligned, r_pad) whose cubin runs on `arch`: Triton builds sm_90 as
// sm_90a (runs on 9.0 only); an sm_8x cubin runs on later minors of major 8. Picks the highest such arch.
const TritonSpec* Find(int kernel, int dtype, int size_class, int aligned, int r_pad, int arch, int* index) {
  const TritonSpec* best = nullptr;
  for (int i = 0; i < kNumTritonSpecs; ++i) {
    const TritonSpec& s = kTritonSpecs[i];
    if (s.kernel != kernel || s.dtype != dtype || s.size_class != size_class || s.aligned != aligned ||
        s.r_pad != r_pad)
      continue;
    const bool runs = (s.arch == arch) || (s.arch / 10 == arch / 10 && s.arch < arch && s.arch / 10 != 9);
    if (runs && (best == nullptr || s.arch > best->arch)) {
      best = &s;
      *index = i;
    }
  }
  return best;
}

int Launch(int kernel, int dtype, int64_t m, int64_t n, bool aligned, int r_pad, void** args, void* stream) {
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  int index = -1;
  const TritonSpec* spec = Find(kernel, dtype, SizeClass(m), aligned ? 1 : 0, r_pad, arch, &index);
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
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
  const int64_t tiles = ((m + spec->block_m - 1) / spec->block_m) * ((n + spec->block_n - 1) / spec->block_n);
  if (tiles > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  return int(cudaLaunchKernel(reinterpret_cast<const void*>(k.kernel), dim3(unsigned(tiles)),
                              dim3(unsigned(spec->num_warps * 32)), args, size_t(spec->shared),
                              static_cast<cudaStream_t>(stream)));
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
// pointers (global, profile), passed as null (aot.py refuses kernels that need either).
extern "C" int onnxfuse_triton_linear_act(int dtype, int act, const void* x, const void* w, const void* bias, void* y,
                                          int64_t m, int64_t k, int64_t n, void* stream) {
  if (BadCommon(dtype, m, k, n) || (act != ONNXFUSE_ACT_RELU && act != ONNXFUSE_ACT_SIGMOID))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), ACT = act;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &w, &bias, &y, &M, &N, &K, &ACT, &scratch_global, &scratch_profile};
  const bool aligned = Aligned16(x) && Aligned16(w) && Aligned16(bias) && Aligned16(y) && k % 16 == 0 && n % 16 == 0;
  return Launch(kKernelLinearAct, dtype, m, n, aligned, 0, args, stream);
}

extern "C" int onnxfuse_triton_swiglu(int dtype, const void* x, const void* w_gate, const void* w_up, void* y,
                                      int64_t m, int64_t k, int64_t n, void* stream) {
  if (BadCommon(dtype, m, k, n)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k);
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &w_gate, &w_up, &y, &M, &N, &K, &scratch_global, &scratch_profile};
  const bool aligned = Aligned16(x) && Aligned16(w_gate) && Aligned16(w_up) && Aligned16(y) && k % 16 == 0 &&
                       n % 16 == 0;
  return Launch(kKernelSwiglu, dtype, m, n, aligned, 0, args, stream);
}

extern "C" int onnxfuse_triton_lora_linear(int dtype, int relu, const void* x, const void* w, const void* a,
                                           const void* b, const void* bias, float scale, void* y, int64_t m, int64_t k,
                                           int64_t n, int64_t r, void* stream) {
  if (BadCommon(dtype, m, k, n) || r < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), R = int32_t(r), RELU = relu ? 1 : 0;
  float SCALE = scale;
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &w, &a, &b, &bias, &y, &M, &N, &K, &R, &SCALE, &RELU, &scratch_global, &scratch_profile};
  const int r_pad = r <= 16 ? 16 : (r <= 32 ? 32 : 64);
  const bool aligned = Aligned16(x) && Aligned16(w) && Aligned16(a) && Aligned16(b) && Aligned16(bias) &&
                       Aligned16(y) && k % 16 == 0 && n % 16 == 0;
  return Launch(kKernelLoRA, dtype, m, n, aligned, r_pad, args, stream);
}

#else  // built without Triton: the launchers exist and say so.

extern "C" int onnxfuse_triton_available(void) { return 0; }
extern "C" int onnxfuse_triton_linear_act(int, int, const void*, const void*, const void*, void*, int64_t, int64_t,
                                          int64_t, void*) {
  return ONNXFUSE_ERR_NO_TRITON;
}
extern "C" int onnxfuse_triton_swiglu(int, const void*, const void*, const void*, void*, int64_t, int64_t, int64_t,
                                      void*) {
  return ONNXFUSE_ERR_NO_TRITON;
}
extern "C" int onnxfuse_triton_lora_linear(int, int, const void*, const void*, const void*, const void*, const void*,
                                           float, void*, int64_t, int64_t, int64_t, int64_t, void*) {
  return ONNXFUSE_ERR_NO_TRITON;
}

#endif
