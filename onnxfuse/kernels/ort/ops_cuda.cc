// Every op of onnxfuse/schema.py for the CUDA execution provider, each for float, float16 and bfloat16.
//
// The structs follow ort/common.h's pattern; Compute takes ORT's compute stream from the kernel context and calls a
// launcher of cuda/launch.h (hand-written CUDA in cuda/*.cu, or the Triton AOT cubins through
// cuda/triton_launch.cc). Nothing here synchronises, allocates device memory or reads device data, so the ops run
// on a user stream and under CUDA-graph capture. Errors come back as an Ort::Status naming the op, the backend
// and the CUDA (or onnxfuse) error.
//
// Backend per node: attribute `backend`, replaced by env ONNXFUSE_BACKEND when set (ReadOpAttrs, at session
// creation). On the CUDA EP:
//   cuda   -> hand-written CUDA kernels;
//   triton -> Triton AOT kernels (a clear error if the library was built without them or has no cubin for the GPU);
//   auto   -> Triton when built with a cubin for this GPU's arch, else CUDA;
//   cpu    -> treated as auto: the node was placed on the CUDA EP, whose inputs live in device memory, so a CPU
//             kernel cannot serve it here; the CPU kernels run when the node is placed on the CPU EP.
#include <string>

#include "common.h"
#include "cuda/launch.h"

namespace onnxfuse {
namespace cuda {
namespace {

template <typename T>
constexpr int DtypeCode() {
  return static_cast<int>(DTypeOf<T>::value);  // DType and onnxfuse_dtype share their values (checked below)
}
static_assert(static_cast<int>(DType::F32) == ONNXFUSE_FP32 && static_cast<int>(DType::F16) == ONNXFUSE_FP16 &&
                  static_cast<int>(DType::BF16) == ONNXFUSE_BF16,
              "onnxfuse::DType and onnxfuse_dtype must agree");

// Runs `cuda_fn` or `triton_fn` (each returning a launch.h code) for the node's backend; throws with op and cause.
template <typename CudaFn, typename TritonFn>
void Dispatch(const char* op, const OpAttrs& attrs, CudaFn&& cuda_fn, TritonFn&& triton_fn) {
  int err = 0;
  const char* used = "cuda";
  switch (attrs.backend) {
    case Backend::Cuda:
      err = cuda_fn();
      break;
    case Backend::Triton:
      used = "triton";
      err = triton_fn();
      break;
    default:  // auto, cpu
      if (onnxfuse_triton_available()) {
        used = "triton";
        err = triton_fn();
        if (err == ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH) {
          used = "cuda";
          err = cuda_fn();
        }
      } else {
        err = cuda_fn();
      }
  }
  if (err != 0) {
    Fail(std::string(op) + " (CUDA EP, backend " + used + " from " + attrs.backend_source + "=" +
             BackendName(attrs.backend) + "): " + onnxfuse_cuda_error_string(err),
         ORT_RUNTIME_EXCEPTION);
  }
}

inline void* StreamOf(OrtKernelContext* ctx) { return Ort::KernelContext(ctx).GetGPUComputeStream(); }

template <typename T, int Act>
struct LinearActCuda {
  static constexpr const char* kName = Act == ONNXFUSE_ACT_RELU ? "LinearRelu" : "LinearSigmoid";
  LinearActCuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = LinearActDims(kName, X.Shape(), W.Shape(), bias.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *w = W.Data(), *b = bias.Data();
      Dispatch(
          kName, attrs,
          [&] { return onnxfuse_cuda_linear_act(DtypeCode<T>(), Act, x, w, b, y, d.M, d.K, d.N, stream); },
          [&] { return onnxfuse_triton_linear_act(DtypeCode<T>(), Act, x, w, b, y, d.M, d.K, d.N, stream); });
    });
  }
  OpAttrs attrs;
};
template <typename T>
using LinearReluCuda = LinearActCuda<T, ONNXFUSE_ACT_RELU>;
template <typename T>
using LinearSigmoidCuda = LinearActCuda<T, ONNXFUSE_ACT_SIGMOID>;

template <typename T>
struct SwiGLUCuda {
  SwiGLUCuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, "SwiGLU")) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Wg,
                      const Ort::Custom::Tensor<T>& Wu, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = SwiGLUDims("SwiGLU", X.Shape(), Wg.Shape(), Wu.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *wg = Wg.Data(), *wu = Wu.Data();
      Dispatch(
          "SwiGLU", attrs, [&] { return onnxfuse_cuda_swiglu(DtypeCode<T>(), x, wg, wu, y, d.M, d.K, d.N, stream); },
          [&] { return onnxfuse_triton_swiglu(DtypeCode<T>(), x, wg, wu, y, d.M, d.K, d.N, stream); });
    });
  }
  OpAttrs attrs;
};

template <typename T, int Relu>
struct LoRACuda {
  static constexpr const char* kName = Relu ? "LoRALinearRelu" : "LoRALinear";
  LoRACuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& A, const Ort::Custom::Tensor<T>& B,
                      const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = LoRADims(kName, X.Shape(), W.Shape(), A.Shape(), B.Shape(), bias.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *w = W.Data(), *a = A.Data(), *b = B.Data(), *bi = bias.Data();
      const float s = attrs.scale;
      Dispatch(
          kName, attrs,
          [&] {
            return onnxfuse_cuda_lora_linear(DtypeCode<T>(), Relu, x, w, a, b, bi, s, y, d.M, d.K, d.N, d.r, stream);
          },
          [&] {
            return onnxfuse_triton_lora_linear(DtypeCode<T>(), Relu, x, w, a, b, bi, s, y, d.M, d.K, d.N, d.r, stream);
          });
    });
  }
  OpAttrs attrs;
};
template <typename T>
using LoRALinearCuda = LoRACuda<T, 0>;
template <typename T>
using LoRALinearReluCuda = LoRACuda<T, 1>;

}  // namespace

void RegisterOps(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LinearReluCuda>(domain, "LinearRelu", kCudaEp);
  AddOpAllTypes<LinearSigmoidCuda>(domain, "LinearSigmoid", kCudaEp);
  AddOpAllTypes<SwiGLUCuda>(domain, "SwiGLU", kCudaEp);
  AddOpAllTypes<LoRALinearCuda>(domain, "LoRALinear", kCudaEp);
  AddOpAllTypes<LoRALinearReluCuda>(domain, "LoRALinearRelu", kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse
