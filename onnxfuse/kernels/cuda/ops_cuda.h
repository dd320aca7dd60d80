// What the CUDA execution-provider glue of every op family shares (the host half of cuda/<family>.cu: the kernel
// structs and Register<Family>Cuda(), called by cuda::RegisterOps in cuda/ops_cuda.cc): backend dispatch, device
// scratch, the compute stream. Each op is registered for float, float16 and bfloat16.
//
// The structs follow docs/adding-an-op.md; Compute takes ORT's compute stream from the kernel context and calls a
// launcher (hand-written CUDA in the nvcc half of the same file, or the Triton launcher over the AOT cubins at the
// end of its host half; both declared at the file's top). Nothing here synchronises, reads device data or calls
// cudaMalloc, so the ops run on a user stream and under CUDA-graph capture. Device scratch (the CUDA backend's cuBLASLt
// workspace and intermediates, the Triton two-phase LoRA's X @ A, the stacks' layer buffers) comes from onnxruntime's
// allocator of the kernel's device (KernelContext_GetAllocator, the CUDA EP's arena) and is freed as soon as the
// launches are enqueued: the arena may hand it to a later kernel, which runs after ours on the same stream (the pattern
// of onnxruntime's own CUDA kernels' scratch buffers). Errors come back as an Ort::Status naming the op, the backend
// and the CUDA (or onnxfuse) error.
//
// Everything a kernel is told comes from its node's attributes, read when the session creates it: backend,
// SwiGLU's activation and MLPStack's stack_mode (auto|fused|layers). Nothing is read from the environment.
//
// Backend per node (attribute `backend`, common/attrs.h). On the CUDA EP:
//   cuda   -> the CUDA kernels: cuBLASLt GEMMs with fused epilogues (cuda/gemm.cu) and hand-written CUDA for the
//             rest (rotary, embeddings);
//   triton -> Triton AOT kernels (a clear error if the library was built without them or has no cubin for the GPU);
//   auto   -> Triton when built with a cubin for this GPU's arch, else CUDA; but CUDA for the op, M, K (and N) rules
//             of triton/table.py's AUTO_CUDA (measured faster there);
//   cpu    -> treated as auto: the node was placed on the CUDA EP, whose inputs live in device memory, so a CPU
//             kernel cannot serve it here; the CPU kernels run when the node is placed on the CPU EP.
#pragma once

#include <memory>
#include <string>

#include "common/attrs.h"
#include "common/dims.h"
#include "common/registry.h"
#include "common/status.h"
#include "cuda/launch.h"

namespace onnxfuse {
namespace cuda {

template <typename T>
constexpr int DtypeCode() {
  return DTypeOf<T>::code;
}

// Whether backend=auto runs the CUDA backend for this Triton kernel id, M, K and N (triton/table.py AUTO_CUDA; N
// only where a rule names its largest).
inline bool AutoPrefersCuda(int kernel, int64_t m, int64_t k, int64_t n = 0) {
  for (const triton::AutoRule& r : triton::kAutoCuda)
    if (r.kernel == kernel && m >= r.m_first && m <= r.m_last && k >= r.k_min && n <= r.n_max) return true;
  return false;
}

// Whether this library has the Triton launchers (ONNXFUSE_WITH_TRITON): known at compile time. Without them no
// launcher is called (nor linked): the Triton backend is ONNXFUSE_ERR_NO_TRITON, here and only here.
#ifdef ONNXFUSE_WITH_TRITON
inline constexpr bool kWithTriton = true;
#else
inline constexpr bool kWithTriton = false;
#endif

// Runs a Triton launch (a launch.h code), or says that the library has none.
template <typename TritonFn>
int RunTriton(TritonFn& triton_fn) {
  if constexpr (kWithTriton) {
    return triton_fn();
  } else {
    return ONNXFUSE_ERR_NO_TRITON;
  }
}

// Built with Triton and a cubin for the current GPU's arch.
inline bool TritonAvailable() {
  if constexpr (kWithTriton) {
    return onnxfuse_triton_available() != 0;
  } else {
    return false;
  }
}

// Runs `cuda_fn` or `triton_fn` (each returning a launch.h code) for the node's backend; throws with op and cause.
// `prefer_cuda`: AutoPrefersCuda() for the call, which backend=auto follows.
template <typename CudaFn, typename TritonFn>
void Dispatch(const char* op, const OpAttrs& attrs, CudaFn&& cuda_fn, TritonFn&& triton_fn, bool prefer_cuda = false) {
  int err = 0;
  Backend used = Backend::kCuda;
  switch (attrs.backend) {
    case Backend::kCuda:
      err = cuda_fn();
      break;
    case Backend::kTriton:
      used = Backend::kTriton;
      err = RunTriton(triton_fn);
      break;
    default:  // auto, cpu
      if (TritonAvailable() && !prefer_cuda) {
        used = Backend::kTriton;
        err = RunTriton(triton_fn);
        if (err == ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH || err == ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE) {
          used = Backend::kCuda;
          err = cuda_fn();
        }
      } else {
        err = cuda_fn();
      }
  }
  if (err != 0) {
    Fail(std::string(op) + " (CUDA EP, backend " + BackendName(used) + " from " + attrs.backend_source + " " +
             schema::attr::kBackend + "=" + BackendName(attrs.backend) + "): " + onnxfuse_cuda_error_string(err),
         ORT_RUNTIME_EXCEPTION);
  }
}

inline void* StreamOf(OrtKernelContext* ctx) { return Ort::KernelContext(ctx).GetGPUComputeStream(); }

// Device memory from onnxruntime's allocator for the device of the kernel's input `like_input`; freed (returned to
// the arena) on destruction. Throws Ort::Exception when no allocator or memory is available.
class DeviceScratch {
 public:
  DeviceScratch(OrtKernelContext* ctx, size_t like_input, size_t bytes) {
    const OrtApi& api = Ort::GetApi();
    Ort::ConstMemoryInfo input_info = Ort::KernelContext(ctx).GetInput(like_input).GetTensorMemoryInfo();
    // The CUDA EP's device memory on the input's device; if the runtime does not match that description, the
    // input's own memory info names the same device.
    Ort::MemoryInfo cuda_info("Cuda", OrtArenaAllocator, input_info.GetDeviceId(), OrtMemTypeDefault);
    OrtStatus* st = api.KernelContext_GetAllocator(ctx, cuda_info, &allocator_);
    if (st != nullptr) {
      api.ReleaseStatus(st);
      allocator_ = nullptr;
      Ort::ThrowOnError(api.KernelContext_GetAllocator(ctx, input_info, &allocator_));
    }
    st = api.AllocatorAlloc(allocator_, bytes, &p_);
    if (st != nullptr) {
      api.ReleaseAllocator(allocator_);
      allocator_ = nullptr;
      p_ = nullptr;
      Ort::ThrowOnError(st);
    }
  }
  ~DeviceScratch() {
    const OrtApi& api = Ort::GetApi();
    if (p_ != nullptr) {
      if (OrtStatus* st = api.AllocatorFree(allocator_, p_)) api.ReleaseStatus(st);
    }
    if (allocator_ != nullptr) api.ReleaseAllocator(allocator_);  // the wrapper KernelContext_GetAllocator made
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  void* get() const { return p_; }

 private:
  OrtAllocator* allocator_ = nullptr;
  void* p_ = nullptr;
};

// Runs launch(scratch, bytes) with `bytes` (a *_scratch_bytes() result: negative is an error code) of scratch.
template <typename Launch>
int WithScratch(OrtKernelContext* ctx, size_t like_input, int64_t bytes, Launch&& launch) {
  if (bytes < 0) return int(bytes);
  std::unique_ptr<DeviceScratch> scratch;
  if (bytes > 0) scratch = std::make_unique<DeviceScratch>(ctx, like_input, size_t(bytes));
  return launch(scratch ? scratch->get() : nullptr, bytes);
}

// Register<Family>Cuda(domain), defined in the host half of cuda/<family>.cu, for every family of the generated
// ONNXFUSE_OP_FAMILIES.
#define ONNXFUSE_DECLARE_CUDA_REGISTER(Family) void Register##Family##Cuda(Ort::CustomOpDomain& domain);
ONNXFUSE_OP_FAMILIES(ONNXFUSE_DECLARE_CUDA_REGISTER)
#undef ONNXFUSE_DECLARE_CUDA_REGISTER

}  // namespace cuda
}  // namespace onnxfuse
