// LoRALinear and LoRALinearRelu on the CUDA execution provider, in one file: the launchers' C declarations below, then
// the nvcc half (the CUDA kernels) and the host half (the CUDA EP glue and the Triton launcher); cuda/cuda.cmake says
// how it is built.
#include <algorithm>

#include "cuda/launch.h"

extern "C" {
// LoRALinear's CUDA launcher and phase 2 of its Triton one, and MultiLoRALinear's: declared in cuda/launch.h
// (LoRAGatedMLP, cuda/swiglu.cu, runs them too).
// The Triton launcher (the host half, Triton builds only: cuda/ops_cuda.h's Dispatch calls it only there).
// Device scratch (bytes) the Triton LoRA launcher needs for these sizes on the current device: the fp32 partial
// sums of X @ A ([SPLIT, M, r_pad]) and, where the persistent TMA lora_main may run, its descriptors after them
// (128-byte aligned; without room for them the other lora_main runs); a negative ONNXFUSE_ERR_* / -cudaError_t when it
// cannot tell (e.g. ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH). The caller allocates it (from onnxruntime's allocator, so the
// launch stays CUDA-graph safe), passes it to onnxfuse_triton_lora_linear and may free it right after that returns:
// only work enqueued later on the same stream can reuse the memory.
int64_t onnxfuse_triton_lora_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t r);
int onnxfuse_triton_lora_linear(int dtype, int relu, const void* x, const void* w, const void* a, const void* b,
                                const void* bias, float scale, void* y, int64_t m, int64_t k, int64_t n, int64_t r,
                                void* scratch, int64_t scratch_bytes, void* stream);
// MultiLoRALinear: Y[row] = X[row] @ W + bias + scales[j] * (X[row] @ A[j]) @ B[j], j = index[row / rows_per_index]
// (none where j < 0, NaN where j >= adapters); A [adapters, K, r], B [adapters, r, N]. CUDA backend: the cuBLASLt GEMM
// with its bias, then a shrink kernel (each row's X @ A[j], fp32 partials over slices of K) and an expand kernel
// adding scales[j] * T @ B[j] to Y. Triton: multi_lora_xa, then multi_lora_main (the GEMM loop and the adapters'
// dots in its epilogue). Scratch as the LoRALinear launchers'.
int64_t onnxfuse_triton_multi_lora_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t r);
int onnxfuse_triton_multi_lora_linear(int dtype, const void* x, const void* w, const void* a, const void* b,
                                      const void* bias, const void* scales, const int64_t* index, void* y, int64_t m,
                                      int64_t k, int64_t n, int64_t r, int64_t adapters, int64_t rows_per_index,
                                      void* scratch, int64_t scratch_bytes, void* stream);
}

#ifdef __CUDACC__
// LoRALinear and LoRALinearRelu (onnxfuse.schema) on the CUDA backend: Y = [relu](X @ W + bias + scale * ((X @ A) @ B))
// as three cuBLASLt GEMMs: T = scale * (X @ A) into the scratch after the cuBLASLt workspace ([M, r], the element
// type), Y = T @ B, then Y = [relu](X @ W + Y + bias) with the bias and ReLU in the big GEMM's epilogue.
#include "gemm.h"

namespace ock = onnxfuse::cuda_kernels;

extern "C" int64_t onnxfuse_cuda_lora_scratch_bytes(int dtype, int64_t m, int64_t r) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || r < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return ONNXFUSE_CUBLASLT_WORKSPACE_BYTES + ock::Align256(m * r * ock::ElemBytes(dtype));
}

extern "C" int onnxfuse_cuda_lora_linear(int dtype, int relu, const void* x, const void* w, const void* a,
                                         const void* b, const void* bias, float scale, void* y, int64_t m, int64_t k,
                                         int64_t n, int64_t r, void* scratch, int64_t scratch_bytes, void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || r < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  if (scratch == nullptr || scratch_bytes < onnxfuse_cuda_lora_scratch_bytes(dtype, m, r))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  ock::GemmArgs g;  // Y = [relu](X @ W + bias + scale * (X @ A) @ B)
  g.dtype = dtype, g.x = x, g.w = w, g.bias = bias, g.y = y, g.m = m, g.k = k, g.n = n, g.relu = relu != 0;
  const int64_t ws = ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
  return ock::LoRAGemm(g, a, b, scale, r, static_cast<char*>(scratch) + ws, scratch, ws,
                       static_cast<cudaStream_t>(stream));
}

extern "C" int64_t onnxfuse_cuda_multi_lora_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t r) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || m < 0 || k < 0 || r < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  return ONNXFUSE_CUBLASLT_WORKSPACE_BYTES + ock::Align256(ock::MultiLoRAPartialsBytes(m, k, r));
}

extern "C" int onnxfuse_cuda_multi_lora_linear(int dtype, const void* x, const void* w, const void* a, const void* b,
                                               const void* bias, const void* scales, const int64_t* index, void* y,
                                               int64_t m, int64_t k, int64_t n, int64_t r, int64_t adapters,
                                               int64_t rows_per_index, void* scratch, int64_t scratch_bytes,
                                               void* stream) {
  if (!ock::CheckCommon(dtype, x, y, m, k, n) || r < 0 || adapters < 0 || rows_per_index <= 0)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  if (scratch == nullptr || scratch_bytes < onnxfuse_cuda_multi_lora_scratch_bytes(dtype, m, k, r))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  ock::GemmArgs g;  // Y = X @ W + bias, then each row's adapter term
  g.dtype = dtype, g.x = x, g.w = w, g.bias = bias, g.y = y, g.m = m, g.k = k, g.n = n;
  const int64_t ws = ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
  return ock::MultiLoRAGemm(g, a, b, scales, index, r, adapters, rows_per_index,
                            reinterpret_cast<float*>(static_cast<char*>(scratch) + ws), scratch, ws,
                            static_cast<cudaStream_t>(stream));
}

#else  // the host half: the CUDA EP glue and the Triton launcher
// LoRALinear and LoRALinearRelu on the CUDA EP: the kernel structs calling the nvcc half's
// launcher or the Triton one (at the end of this file) through Dispatch (cuda/ops_cuda.h), and their registration.
#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

// Op is schema::LoRALinear (Relu = 0) or schema::LoRALinearRelu (Relu = 1).
template <typename T, int Relu, typename Op>
struct LoRACuda {
  static constexpr const char* kName = Op::kName;
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
            return WithScratch(ctx, Op::kX, onnxfuse_cuda_lora_scratch_bytes(DtypeCode<T>(), d.M, d.r),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_lora_linear(DtypeCode<T>(), Relu, x, w, a, b, bi, s, y, d.M, d.K,
                                                                  d.N, d.r, sp, bytes, stream);
                               });
          },
          [&] {
            // A negative size (e.g. no cubin for this GPU) comes back as the code: Dispatch may fall back to CUDA.
            return WithScratch(ctx, Op::kX, onnxfuse_triton_lora_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N, d.r),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_triton_lora_linear(DtypeCode<T>(), Relu, x, w, a, b, bi, s, y, d.M,
                                                                    d.K, d.N, d.r, sp, bytes, stream);
                               });
          });
    });
  }
  OpAttrs attrs;
};
template <typename T>
struct MultiLoRALinearCuda {
  using Op = schema::MultiLoRALinear;
  MultiLoRALinearCuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, Op::kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& A, const Ort::Custom::Tensor<T>& B,
                      const Ort::Custom::Tensor<T>& bias, const Ort::Custom::Tensor<T>& scales,
                      const Ort::Custom::Tensor<int64_t>& index, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const MultiLoRADims d = MultiLoRALinearDims(Op::kName, X.Shape(), W.Shape(), A.Shape(), B.Shape(), bias.Shape(),
                                                  scales.Shape(), index.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *w = W.Data(), *a = A.Data(), *b = B.Data(), *bi = bias.Data(), *sc = scales.Data();
      const int64_t* idx = index.Data();
      Dispatch(
          Op::kName, attrs,
          [&] {
            return WithScratch(ctx, Op::kX, onnxfuse_cuda_multi_lora_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.r),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_multi_lora_linear(DtypeCode<T>(), x, w, a, b, bi, sc, idx, y, d.M,
                                                                        d.K, d.N, d.r, d.adapters, d.rows_per_index, sp,
                                                                        bytes, stream);
                               });
          },
          [&] {
            return WithScratch(
                ctx, Op::kX, onnxfuse_triton_multi_lora_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N, d.r),
                [&](void* sp, int64_t bytes) {
                  return onnxfuse_triton_multi_lora_linear(DtypeCode<T>(), x, w, a, b, bi, sc, idx, y, d.M, d.K, d.N,
                                                           d.r, d.adapters, d.rows_per_index, sp, bytes, stream);
                });
          });
    });
  }
  OpAttrs attrs;
};
template <typename T>
using LoRALinearCuda = LoRACuda<T, 0, schema::LoRALinear>;
template <typename T>
using LoRALinearReluCuda = LoRACuda<T, 1, schema::LoRALinearRelu>;

}  // namespace

void RegisterLoRALinearCuda(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LoRALinearCuda>(domain, schema::LoRALinear::kName, kCudaEp);
  AddOpAllTypes<LoRALinearReluCuda>(domain, schema::LoRALinearRelu::kName, kCudaEp);
  AddOpAllTypes<MultiLoRALinearCuda>(domain, schema::MultiLoRALinear::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of LoRALinear and LoRALinearRelu (triton/lora_linear.py).
//
// LoRA runs in two phases: "lora_xa" writes fp32 partial sums of X @ A to the caller's scratch [SPLIT, M, r_pad]
// (grid: row tiles x SPLIT slices of K, SPLIT chosen so that about one program per SM runs; no atomics), then
// "lora_main" (the linear_act main loop + one T @ B dot) reads them. Both launches go to the same stream, so the
// second sees the first's writes.
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

namespace {
// Phase 2 of LoRALinear: Y = [relu](X @ W + bias + (scale * sum_s T[s]) @ B), T [split, M, r_pad] fp32; the persistent
// TMA build where `scratch` holds its descriptors. `dependent`: launched as the previous kernel's programmatic
// dependent (its epilogue waits for the partials).
int LoRAMain(int dtype, int relu, const void* x, const void* w, const void* t, int64_t split, int64_t r_pad,
             const void* b, const void* bias, float scale, void* y, int64_t m, int64_t k, int64_t n, int64_t r,
             bool aligned, void* scratch, int64_t scratch_bytes, void* stream, bool dependent) {
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  int index = -1;
  const TritonSpec* spec = FindForShape(ids::kLoraMain, dtype, m, n, aligned, int(r_pad), arch, device, &index);
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  int64_t grid = 0;
  spec = WithTma(spec, &index, m, k, n, arch, device, scratch, scratch_bytes, &grid);
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), R = int32_t(r), SPLIT = int32_t(split), RELU = relu ? 1 : 0,
          NPROG = int32_t(grid);
  float SCALE = scale;
  void* scratch_profile = nullptr;
  void* main_global = spec->tma ? scratch : nullptr;
  void* args[] = {&x, &w, &t,     &b,     &bias, &y,     &M,           &N,
                  &K, &R, &SPLIT, &SCALE, &RELU, &NPROG, &main_global, &scratch_profile};
  return LaunchSpec(spec, index, device, grid, args, stream, false, dependent);
}

// Phase 2 of MultiLoRALinear on partials T [split, M, r_pad] fp32; `dependent` as LoRAMain's.
int MultiLoRAMain(int dtype, const void* x, const void* w, const void* t, int64_t split, int64_t r_pad, const void* b,
                  const void* bias, const void* scales, const int64_t* index, void* y, int64_t m, int64_t k, int64_t n,
                  int64_t r, int64_t adapters, int64_t rows_per_index, bool aligned, void* stream,
                  bool dependent = false) {
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  int spec_index = -1;
  const TritonSpec* spec =
      FindForShape(ids::kMultiLoraMain, dtype, m, n, aligned, int(r_pad), arch, device, &spec_index);
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), R = int32_t(r), NA = int32_t(adapters),
          RPI = int32_t(rows_per_index), SPLIT = int32_t(split);
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[] = {&x, &w, &t,  &b,   &bias,  &scales,         &index,          &y, &M, &N,
                  &K, &R, &NA, &RPI, &SPLIT, &scratch_global, &scratch_profile};
  return LaunchSpec(spec, spec_index, device, Tiles(m, n, spec), args, stream, false, dependent);
}

bool LoRAAligned(const void* x, const void* w, const void* a, const void* b, const void* bias, const void* y, int64_t k,
                 int64_t n, int64_t r) {
  // r % 8: 16-byte rows of A (fp16/bf16), so its tiles load with cp.async and the phase-1 loop pipelines.
  return Aligned16(x) && Aligned16(w) && Aligned16(a) && Aligned16(b) && Aligned16(bias) && Aligned16(y) &&
         k % 16 == 0 && n % 16 == 0 && r % 8 == 0;
}
}  // namespace

extern "C" int64_t onnxfuse_triton_lora_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t r) {
  const int64_t partials = LoRAPartialsBytes(dtype, m, k, n, r);
  if (partials <= 0) return partials;
  // then, 128-byte aligned, the TMA descriptors of the persistent lora_main (where it may run)
  const int64_t tma = TmaScratchBytes(dtype, m, k);
  return tma > 0 ? RoundUp128(partials) + tma : partials;
}

extern "C" int onnxfuse_triton_lora_linear(int dtype, int relu, const void* x, const void* w, const void* a,
                                           const void* b, const void* bias, float scale, void* y, int64_t m, int64_t k,
                                           int64_t n, int64_t r, void* scratch, int64_t scratch_bytes, void* stream) {
  if (BadCommon(dtype, m, k, n) || r < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n)) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int32_t M = int32_t(m), K = int32_t(k), R = int32_t(r);
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  const bool aligned = LoRAAligned(x, w, a, b, bias, y, k, n, r);
  LoRAPlan plan;
  int err = PlanLoRA(dtype, m, k, r, aligned, &plan);
  if (err != 0) return err;
  if (scratch == nullptr || !Aligned16(scratch) || scratch_bytes < LoRAScratchBytes(m, r, plan))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  int main_index = -1;  // checked before phase 1 runs
  if (FindForShape(ids::kLoraMain, dtype, m, n, aligned, RPad(r), plan.arch, plan.device, &main_index) == nullptr)
    return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  // Phase 1: T partials = X @ A per K slice, fp32, into scratch [SPLIT, M, r_pad].
  int32_t KB_PER_SPLIT = int32_t(plan.kb_per_split), NS = 1, ZERO3 = 0;
  void* xa_args[] = {&x,
                     &a,
                     &a,
                     &scratch,
                     &scratch,
                     &M,
                     &K,
                     &R,
                     &R,
                     &NS,
                     &KB_PER_SPLIT,
                     &scratch,
                     &ZERO3,
                     &scratch_global,
                     &scratch_profile};
  const int64_t grid_xa = ((m + plan.xa->block_m - 1) / plan.xa->block_m) * plan.split;
  if ((err = LaunchSpec(plan.xa, plan.xa_index, plan.device, grid_xa, xa_args, stream)) != 0) return err;
  // Phase 2 on them; the TMA descriptors after the partials. To LORA_PDL_MAX_M rows a programmatic dependent of
  // phase 1: its K loop runs beside it, its epilogue waits for the partials.
  const int64_t partials = RoundUp128(LoRAScratchBytes(m, r, plan));
  return LoRAMain(dtype, relu, x, w, scratch, plan.split, RPad(r), b, bias, scale, y, m, k, n, r, aligned,
                  static_cast<char*>(scratch) + partials, scratch_bytes - partials, stream, m <= ids::kLoraPdlMaxM);
}

extern "C" int64_t onnxfuse_triton_lora_main_scratch_bytes(int dtype, int64_t m, int64_t k) {
  const int64_t tma = TmaScratchBytes(dtype, m, k);
  return tma > 0 ? tma : 0;
}

extern "C" int onnxfuse_triton_lora_main(int dtype, int relu, const void* x, const void* w, const void* t,
                                         int64_t split, int64_t r_pad, const void* b, const void* bias, float scale,
                                         void* y, int64_t m, int64_t k, int64_t n, int64_t r, void* scratch,
                                         int64_t scratch_bytes, void* stream) {
  if (BadCommon(dtype, m, k, n) || r < 0 || split < 1 || r_pad < RPad(r) || t == nullptr)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n) || split > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  const bool aligned = Aligned16(x) && Aligned16(w) && Aligned16(t) && Aligned16(b) && Aligned16(bias) &&
                       Aligned16(y) && k % 16 == 0 && n % 16 == 0;
  return LoRAMain(dtype, relu, x, w, t, split, r_pad, b, bias, scale, y, m, k, n, r, aligned, scratch, scratch_bytes,
                  stream, false);
}

// MultiLoRALinear: multi_lora_xa (each row's X @ A[j] partials, [SPLIT, M, r_pad] fp32), then multi_lora_main.
extern "C" int64_t onnxfuse_triton_multi_lora_scratch_bytes(int dtype, int64_t m, int64_t k, int64_t n, int64_t r) {
  return LoRAPartialsBytes(dtype, m, k, n, r, ids::kMultiLoraXa);
}

extern "C" int onnxfuse_triton_multi_lora_linear(int dtype, const void* x, const void* w, const void* a, const void* b,
                                                 const void* bias, const void* scales, const int64_t* index, void* y,
                                                 int64_t m, int64_t k, int64_t n, int64_t r, int64_t adapters,
                                                 int64_t rows_per_index, void* scratch, int64_t scratch_bytes,
                                                 void* stream) {
  if (BadCommon(dtype, m, k, n) || r < 0 || adapters < 0 || rows_per_index <= 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n) || adapters > 0x7fffffffLL || rows_per_index > 0x7fffffffLL) return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  int32_t M = int32_t(m), N = int32_t(n), K = int32_t(k), R = int32_t(r), NA = int32_t(adapters),
          RPI = int32_t(rows_per_index);
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  const bool aligned = LoRAAligned(x, w, a, b, bias, y, k, n, r) && Aligned16(scales) && Aligned16(index);
  // To LORA_PDL_MAX_M rows multi_lora_main starts as phase 1's programmatic dependent, phase 1 in at most
  // MULTI_LORA_LINEAR_PDL_MAX_SPLIT slices (triton/table.py).
  const bool dependent = m <= ids::kLoraPdlMaxM;
  LoRAPlan plan;
  int err = PlanLoRA(dtype, m, k, r, aligned, &plan, ids::kMultiLoraXa, std::max<int64_t>(adapters, 1),
                     dependent ? ids::kMultiLoraLinearPdlMaxSplit : kMaxLoRASplit);
  if (err != 0) return err;
  if (scratch == nullptr || !Aligned16(scratch) || scratch_bytes < LoRAScratchBytes(m, r, plan))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  int main_index = -1;  // checked before phase 1 runs
  if (FindForShape(ids::kMultiLoraMain, dtype, m, n, aligned, RPad(r), plan.arch, plan.device, &main_index) == nullptr)
    return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  int32_t KB_PER_SPLIT = int32_t(plan.kb_per_split), NS = 1, ZERO3 = 0;
  void* xa_args[] = {&x,
                     &a,
                     &a,
                     &index,
                     &scratch,
                     &scratch,
                     &M,
                     &K,
                     &R,
                     &R,
                     &NS,
                     &NA,
                     &RPI,
                     &KB_PER_SPLIT,
                     &scratch,
                     &ZERO3,
                     &scratch_global,
                     &scratch_profile};
  // one program per row tile, K slice and adapter (a program whose adapter no row of its tile uses returns early)
  const int64_t grid_xa = ((m + plan.xa->block_m - 1) / plan.xa->block_m) * plan.split * (adapters > 0 ? adapters : 1);
  if ((err = LaunchSpec(plan.xa, plan.xa_index, plan.device, grid_xa, xa_args, stream)) != 0) return err;
  return MultiLoRAMain(dtype, x, w, scratch, plan.split, RPad(r), b, bias, scales, index, y, m, k, n, r, adapters,
                       rows_per_index, aligned, stream, dependent);
}

extern "C" int onnxfuse_triton_multi_lora_main(int dtype, const void* x, const void* w, const void* t, int64_t split,
                                               int64_t r_pad, const void* b, const void* bias, const void* scales,
                                               const int64_t* index, void* y, int64_t m, int64_t k, int64_t n,
                                               int64_t r, int64_t adapters, int64_t rows_per_index, void* stream) {
  if (BadCommon(dtype, m, k, n) || r < 0 || adapters < 0 || rows_per_index <= 0 || split < 1 || r_pad < RPad(r) ||
      t == nullptr)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (r > ONNXFUSE_MAX_LORA_RANK) return ONNXFUSE_ERR_RANK_TOO_LARGE;
  if (TooLarge(m, k, n) || adapters > 0x7fffffffLL || rows_per_index > 0x7fffffffLL || split > 0x7fffffffLL)
    return ONNXFUSE_ERR_TOO_LARGE;
  if (m == 0 || n == 0) return 0;
  const bool aligned = Aligned16(x) && Aligned16(w) && Aligned16(t) && Aligned16(b) && Aligned16(bias) &&
                       Aligned16(y) && Aligned16(scales) && Aligned16(index) && k % 16 == 0 && n % 16 == 0;
  return MultiLoRAMain(dtype, x, w, t, split, r_pad, b, bias, scales, index, y, m, k, n, r, adapters, rows_per_index,
                       aligned, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
