// LinearRelu and LinearSigmoid on the CUDA execution provider, in one file: its launchers' C declarations in
// cuda/launch.h (MLPStack runs them too), then the nvcc half (the CUDA kernels) and the host half (the CUDA EP glue and
// the Triton launcher); cuda/cuda.cmake says how it is built.
#include "cuda/launch.h"

#ifdef __CUDACC__
// LinearRelu and LinearSigmoid (onnxfuse.schema) on the CUDA backend: Y = act(X @ W + bias) as one cuBLASLt GEMM
// whose epilogue adds the bias (and applies ReLU) on the fp32 accumulators; sigmoid, which cuBLASLt has no epilogue
// for, is one elementwise pass over Y.
#include "common/gate_act.h"
#include "gemm.h"

namespace ock = onnxfuse::cuda_kernels;

namespace {
template <typename T>
struct SigmoidInPlace {
  T* y;
  __device__ void operator()(int64_t i) const { y[i] = ock::from_f<T>(onnxfuse::GateSigmoid(ock::to_f(y[i]))); }
};
}  // namespace

extern "C" int64_t onnxfuse_cuda_linear_act_scratch_bytes(int dtype, int64_t m, int64_t n) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || n < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
}

extern "C" int onnxfuse_cuda_linear_act(int dtype, int act, const void* x, const void* w, const void* bias, void* y,
                                        int64_t m, int64_t k, int64_t n, void* scratch, int64_t scratch_bytes,
                                        void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || (act != ONNXFUSE_ACT_RELU && act != ONNXFUSE_ACT_SIGMOID))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || n == 0) return 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  ock::GemmArgs g;
  g.dtype = dtype, g.x = x, g.w = w, g.bias = bias, g.y = y, g.m = m, g.k = k, g.n = n;
  g.relu = act == ONNXFUSE_ACT_RELU;
  if (int err = ock::Gemm(g, scratch, scratch_bytes, s)) return err;
  if (act != ONNXFUSE_ACT_SIGMOID) return 0;
  return ock::ByDtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return ock::LaunchElementwise(m * n, SigmoidInPlace<T>{static_cast<T*>(y)}, s);
  });
}

#else  // the host half: the CUDA EP glue and the Triton launcher
// LinearRelu and LinearSigmoid on the CUDA EP: the kernel structs calling the nvcc half's
// launcher or the Triton one (at the end of this file) through Dispatch (cuda/ops_cuda.h), and their registration.
#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

// Op is schema::LinearRelu (Act = ONNXFUSE_ACT_RELU) or schema::LinearSigmoid (ONNXFUSE_ACT_SIGMOID).
template <typename T, int Act, typename Op>
struct LinearActCuda {
  static constexpr const char* kName = Op::kName;
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
          [&] {
            return WithScratch(ctx, Op::kX, onnxfuse_cuda_linear_act_scratch_bytes(DtypeCode<T>(), d.M, d.N),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_linear_act(DtypeCode<T>(), Act, x, w, b, y, d.M, d.K, d.N, sp,
                                                                 bytes, stream);
                               });
          },
          [&] {
            // A negative size (an error code) comes back as the code: Dispatch may fall back to CUDA.
            return WithScratch(ctx, Op::kX, onnxfuse_triton_linear_act_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_triton_linear_act(DtypeCode<T>(), Act, x, w, b, y, d.M, d.K, d.N, sp,
                                                                   bytes, stream);
                               });
          });
    });
  }
  OpAttrs attrs;
};
template <typename T>
using LinearReluCuda = LinearActCuda<T, ONNXFUSE_ACT_RELU, schema::LinearRelu>;
template <typename T>
using LinearSigmoidCuda = LinearActCuda<T, ONNXFUSE_ACT_SIGMOID, schema::LinearSigmoid>;

}  // namespace

void RegisterLinearActCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LinearReluCuda>(domain, schema::LinearRelu::kName, kCudaEp);
  AddOpAllTypes<LinearSigmoidCuda>(domain, schema::LinearSigmoid::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of LinearRelu and LinearSigmoid (triton/linear_act.py; the persistent TMA build through WithTma).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

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
  const TritonSpec* spec = FindForShape(ids::kLinearAct, dtype, m, n, aligned, 0, arch, device, &index);
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  int64_t grid = 0;
  spec = WithTma(spec, &index, m, k, n, arch, device, scratch, scratch_bytes, &grid);
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), ACT = act, NPROG = int32_t(grid);
  void* scratch_global = spec->tma ? scratch : nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &w, &bias, &y, &M, &N, &K, &ACT, &NPROG, &scratch_global, &scratch_profile};
  return LaunchSpec(spec, index, device, grid, args, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
