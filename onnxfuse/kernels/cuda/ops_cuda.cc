// Every op of onnxfuse/schema.py for the CUDA execution provider, each for float, float16 and bfloat16.
//
// The structs follow docs/adding-an-op.md; Compute takes ORT's compute stream from the kernel context and calls a
// launcher of cuda/launch.h (hand-written CUDA in cuda/*.cu, or the Triton AOT cubins through
// cuda/triton_launch.cc). Nothing here synchronises, reads device data or calls cudaMalloc, so the ops run on a
// user stream and under CUDA-graph capture. Device scratch (the CUDA backend's cuBLASLt workspace and
// intermediates, the Triton two-phase LoRA's X @ A, the stacks' layer buffers) comes from onnxruntime's allocator
// of the kernel's device (KernelContext_GetAllocator, the CUDA EP's arena) and is freed as soon as the launches are
// enqueued: the arena may hand it to a later kernel, which runs after ours on the same stream (the pattern of
// onnxruntime's own CUDA kernels' scratch buffers). Errors come back as an Ort::Status naming the op, the backend
// and the CUDA (or onnxfuse) error.
//
// Everything a kernel is told comes from its node's attributes, read when the session creates it: backend,
// SwiGLU's activation and MLPStack's stack_mode (auto|fused|layers). Nothing is read from the environment.
//
// Backend per node (attribute `backend`, common/attrs.h). On the CUDA EP:
//   cuda   -> the CUDA kernels: cuBLASLt GEMMs with fused epilogues (cuda/gemm.cu) and hand-written CUDA for the
//             rest (rotary, embeddings);
//   triton -> Triton AOT kernels (a clear error if the library was built without them or has no cubin for the GPU);
//   auto   -> Triton when built with a cubin for this GPU's arch, else CUDA; but CUDA for the op, M and K rules of
//             triton/table.py's AUTO_CUDA (measured faster there);
//   cpu    -> treated as auto: the node was placed on the CUDA EP, whose inputs live in device memory, so a CPU
//             kernel cannot serve it here; the CPU kernels run when the node is placed on the CPU EP.
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/attrs.h"
#include "common/dims.h"
#include "common/registry.h"
#include "common/status.h"
#include "cuda/launch.h"

namespace onnxfuse {
namespace cuda {
namespace {

template <typename T>
constexpr int DtypeCode() {
  return DTypeOf<T>::code;
}

// Whether backend=auto runs the CUDA backend for this Triton kernel id, M and K (triton/table.py AUTO_CUDA).
bool AutoPrefersCuda(int kernel, int64_t m, int64_t k) {
  for (const triton::AutoRule& r : triton::kAutoCuda)
    if (r.kernel == kernel && m >= r.m_first && m <= r.m_last && k >= r.k_min) return true;
  return false;
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
      err = triton_fn();
      break;
    default:  // auto, cpu
      if (onnxfuse_triton_available() && !prefer_cuda) {
        used = Backend::kTriton;
        err = triton_fn();
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
            // A negative size (no Triton in this library) comes back as the code: Dispatch may fall back to CUDA.
            return WithScratch(ctx, Op::kX, onnxfuse_triton_linear_act_scratch_bytes(DtypeCode<T>(), d.M, d.K, d.N),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_triton_linear_act(DtypeCode<T>(), Act, x, w, b, y, d.M, d.K, d.N,
                                                                   sp, bytes, stream);
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

template <typename T>
struct SwiGLUCuda {
  static constexpr const char* kName = schema::SwiGLU::kName;
  SwiGLUCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)), act(ReadGateActivation(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Wg,
                      const Ort::Custom::Tensor<T>& Wu, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = SwiGLUDims(kName, X.Shape(), Wg.Shape(), Wu.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *wg = Wg.Data(), *wu = Wu.Data();
      Dispatch(
          kName, attrs,
          [&] {
            return WithScratch(ctx, schema::SwiGLU::kX, onnxfuse_cuda_swiglu_scratch_bytes(DtypeCode<T>(), d.M, d.N),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_swiglu(DtypeCode<T>(), act, x, wg, wu, y, d.M, d.K, d.N, sp,
                                                             bytes, stream);
                               });
          },
          [&] {
            return onnxfuse_triton_swiglu(DtypeCode<T>(), act, x, wg, wu, y, d.M, d.K, d.N, stream);
          },
          AutoPrefersCuda(triton::kSwiglu, d.M, d.K));
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act of the node's activation attribute
};

template <typename T>
struct RotaryEmbeddingCuda {
  static constexpr const char* kName = schema::RotaryEmbedding::kName;
  RotaryEmbeddingCuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Cos,
                      const Ort::Custom::Tensor<T>& Sin, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const RotaryDims d = RotaryEmbeddingDims(kName, X.Shape(), Cos.Shape(), Sin.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.rows == 0 || d.D == 0) return;
      void* stream = StreamOf(ctx);
      const void *x = X.Data(), *c = Cos.Data(), *s = Sin.Data();
      Dispatch(
          kName, attrs,
          [&] {
            return onnxfuse_cuda_rotary_embedding(DtypeCode<T>(), x, c, s, y, d.rows, d.D, d.d1, d.d2, d.cos_stride,
                                                  d.sin_stride, stream);
          },
          [&] {
            return onnxfuse_triton_rotary_embedding(DtypeCode<T>(), x, c, s, y, d.rows, d.D, d.d1, d.d2,
                                                    d.cos_stride, d.sin_stride, stream);
          });
    });
  }
  OpAttrs attrs;
};

template <typename T>
struct EmbeddingCuda {
  static constexpr const char* kName = schema::Embedding::kName;
  EmbeddingCuda(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& Table,
                      const Ort::Custom::Tensor<int64_t>& Ids, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LookupDims d = EmbeddingDimsOf(kName, Table.Shape(), Ids.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.n == 0 || d.D == 0) return;
      void* stream = StreamOf(ctx);
      const void* table = Table.Data();
      const int64_t* ids = Ids.Data();
      Dispatch(
          kName, attrs, [&] { return onnxfuse_cuda_embedding(DtypeCode<T>(), table, ids, y, d.n, d.V, d.D, stream); },
          [&] { return onnxfuse_triton_embedding(DtypeCode<T>(), table, ids, y, d.n, d.V, d.D, stream); });
    });
  }
  OpAttrs attrs;
};

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
                                 return onnxfuse_cuda_lora_linear(DtypeCode<T>(), Relu, x, w, a, b, bi, s, y, d.M,
                                                                  d.K, d.N, d.r, sp, bytes, stream);
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
using LoRALinearCuda = LoRACuda<T, 0, schema::LoRALinear>;
template <typename T>
using LoRALinearReluCuda = LoRACuda<T, 1, schema::LoRALinearRelu>;

// How the Triton backend runs a stack: the node's stack_mode (auto, fused or layers); the CUDA backend always
// launches once per layer.
template <typename T>
struct MLPStackCuda {
  using Op = schema::MLPStack;
  static constexpr const char* kName = Op::kName;
  MLPStackCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)), acts(ReadStackActivations(api, info, kName)),
        mode(ReadStackMode(api, info, kName)) {
    if (acts.size() > ONNXFUSE_MAX_STACK_LAYERS)
      Fail(std::string(kName) + ": " + std::to_string(acts.size()) + " layers; the GPU kernels take at most " +
           std::to_string(ONNXFUSE_MAX_STACK_LAYERS) + " (fuse splits longer chains)");
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    return GuardCompute([&] {
      Ort::KernelContext ctx(context);
      const VariadicInputs in(ctx);
      const StackDims d = MLPStackDims(kName, acts.size(), in.shapes);
      void* y = ctx.GetOutput(Op::kY, d.out_shape).GetTensorMutableRawData();
      if (d.M == 0 || d.widths.back() == 0) return;
      const int n = int(acts.size());
      std::vector<const void*> w(n), b(n);
      for (int i = 0; i < n; ++i) {
        w[i] = in.data[Op::W(i)];
        b[i] = in.data[Op::Bias(i)];
      }
      const int dt = DtypeCode<T>();
      const int64_t* widths = d.widths.data();
      void* stream = StreamOf(context);
      Dispatch(
          kName, attrs,
          [&] {
            return WithScratch(context, Op::kX, onnxfuse_cuda_mlp_stack_scratch_bytes(dt, n, d.M, widths),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_cuda_mlp_stack(dt, n, acts.data(), in.data[Op::kX], w.data(),
                                                                b.data(), y, d.M, widths, sp, bytes, stream);
                               });
          },
          [&] {
            // The layer buffers and the grid kernel's barrier counter (negative: no Triton).
            return WithScratch(context, Op::kX, onnxfuse_triton_mlp_stack_scratch_bytes(dt, n, d.M, widths),
                               [&](void* sp, int64_t bytes) {
                                 return onnxfuse_triton_mlp_stack(dt, n, acts.data(), in.data[Op::kX], w.data(),
                                                                  b.data(), y, d.M, widths, mode, sp, bytes, stream);
                               });
          },
          AutoPrefersCuda(triton::kMlpStack, d.M, widths[0]));
    }).release();
  }
  OpAttrs attrs;
  std::vector<int> acts;
  int mode;
};

// EmbeddingInteraction (Bag = false) and EmbeddingBagInteraction (Bag = true): one launch either way. backend=auto
// runs the Triton kernel when triton/table.py's EMBEDDING_AUTO_TRITON says so and a tile fits, else the CUDA one.
template <typename T, bool Bag>
struct EmbeddingInteractionBase {
  using Op = std::conditional_t<Bag, schema::EmbeddingBagInteraction, schema::EmbeddingInteraction>;
  static constexpr const char* kName = Op::kName;
  EmbeddingInteractionBase(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)), interaction(ReadInteraction(api, info, kName)),
        hash(Bag ? ONNXFUSE_HASH_NONE : ReadHash(api, info, kName)) {
    if (attrs.backend == Backend::kAuto && !triton::kEmbeddingAutoTriton) attrs.backend = Backend::kCuda;
  }
  void Run(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<int64_t>& ids,
           const Ort::Custom::Tensor<int64_t>* offsets, const Ort::Custom::Tensor<T>& table,
           const Ort::Custom::Tensor<int64_t>& table_offsets, const Ort::Custom::Tensor<int64_t>& cardinality,
           Ort::Custom::Tensor<T>& Y) {
    std::vector<int64_t> offsets_shape;
    if (offsets != nullptr) offsets_shape = offsets->Shape();
    const EmbeddingDims e = EmbeddingOpDims(kName, interaction, X.Shape(), ids.Shape(),
                                            offsets != nullptr ? &offsets_shape : nullptr, table.Shape(),
                                            table_offsets.Shape(), cardinality.Shape());
    T* y = Y.Allocate(e.out_shape);
    if (e.B == 0 || e.width == 0) return;
    void* stream = StreamOf(ctx);
    const void *x = X.Data(), *tb = e.R > 0 ? table.Data() : nullptr;
    const int64_t* id = (offsets == nullptr || e.N > 0) ? ids.Data() : nullptr;
    const int64_t* off = offsets != nullptr ? offsets->Data() : nullptr;
    const int64_t *to = table_offsets.Data(), *ca = cardinality.Data();
    const int dt = DtypeCode<T>();
    Dispatch(
        kName, attrs,
        [&] {
          return onnxfuse_cuda_embedding_interaction(dt, interaction, hash, x, id, off, tb, to, ca, y, e.B, e.d, e.F,
                                                     e.N, e.R, stream);
        },
        [&] {
          return onnxfuse_triton_embedding_interaction(dt, interaction, hash, x, id, off, tb, to, ca, y, e.B, e.d,
                                                       e.F, e.N, e.R, stream);
        });
  }
  OpAttrs attrs;
  int interaction;
  int hash;
};

template <typename T>
struct EmbeddingInteractionCuda : EmbeddingInteractionBase<T, false> {
  using EmbeddingInteractionBase<T, false>::EmbeddingInteractionBase;
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<int64_t>& ids,
                      const Ort::Custom::Tensor<T>& table, const Ort::Custom::Tensor<int64_t>& table_offsets,
                      const Ort::Custom::Tensor<int64_t>& cardinality, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { this->Run(ctx, X, ids, nullptr, table, table_offsets, cardinality, Y); });
  }
};

template <typename T>
struct EmbeddingBagInteractionCuda : EmbeddingInteractionBase<T, true> {
  using EmbeddingInteractionBase<T, true>::EmbeddingInteractionBase;
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X,
                      const Ort::Custom::Tensor<int64_t>& indices, const Ort::Custom::Tensor<int64_t>& offsets,
                      const Ort::Custom::Tensor<T>& table, const Ort::Custom::Tensor<int64_t>& table_offsets,
                      const Ort::Custom::Tensor<int64_t>& cardinality, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { this->Run(ctx, X, indices, &offsets, table, table_offsets, cardinality, Y); });
  }
};

}  // namespace

void RegisterOps(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LinearReluCuda>(domain, schema::LinearRelu::kName, kCudaEp);
  AddOpAllTypes<LinearSigmoidCuda>(domain, schema::LinearSigmoid::kName, kCudaEp);
  AddOpAllTypes<SwiGLUCuda>(domain, schema::SwiGLU::kName, kCudaEp);
  AddOpAllTypes<LoRALinearCuda>(domain, schema::LoRALinear::kName, kCudaEp);
  AddOpAllTypes<LoRALinearReluCuda>(domain, schema::LoRALinearRelu::kName, kCudaEp);
  AddVariadicOpAllTypes<MLPStackCuda>(domain, schema::MLPStack::kName, kCudaEp);
  AddOpAllTypes<RotaryEmbeddingCuda>(domain, schema::RotaryEmbedding::kName, kCudaEp);
  AddOpAllTypes<EmbeddingCuda>(domain, schema::Embedding::kName, kCudaEp);
  AddOpAllTypes<EmbeddingInteractionCuda>(domain, schema::EmbeddingInteraction::kName, kCudaEp);
  AddOpAllTypes<EmbeddingBagInteractionCuda>(domain, schema::EmbeddingBagInteraction::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse
