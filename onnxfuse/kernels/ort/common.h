// onnxfuse/kernels/ort/common.h — what every ORT-facing .cc file of the kernel library shares.
//
// Compiled by g++ only: nvcc cannot parse onnxruntime_lite_custom_op.h, so .cu files never include this header
// (they get raw pointers, sizes and a cudaStream_t through plain launch functions declared in cuda/launch.h).
//
// ============================== The pattern (CPU in cpu/*.cc, CUDA in ort/ops_cuda.cc) ==============================
// Verified against the Debian 1.21 headers (ORT_API_VERSION 21) loaded into onnxruntime 1.31.1:
//
// 1. One kernel = one struct template over the element type T in {float, Ort::Float16_t, Ort::BFloat16_t}:
//
//      template <typename T>
//      struct SwiGLUCuda {
//        SwiGLUCuda(const OrtApi* api, const OrtKernelInfo* info)          // once per node, at session creation
//            : attrs(onnxfuse::ReadOpAttrs(api, info, "SwiGLU")) {}         // throws Ort::Exception on bad values
//        Ort::Status Compute(OrtKernelContext* ctx,                         // optional first arg; gives the stream
//                            const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& Wg,
//                            const Ort::Custom::Tensor<T>& Wu, Ort::Custom::Tensor<T>& Y) {
//          return onnxfuse::GuardCompute([&] {                              // exceptions -> Ort::Status
//            auto d = onnxfuse::SwiGLUDims("SwiGLU", X.Shape(), Wg.Shape(), Wu.Shape());
//            T* y = Y.Allocate(d.out_shape);
//            if (d.M == 0 || d.N == 0) return;                              // empty tensors: nothing to launch
//            void* stream = Ort::KernelContext(ctx).GetGPUComputeStream();
//            int err = launch_swiglu(onnxfuse::DTypeOf<T>::value, X.Data(), ..., stream);  // from cuda/launch.h
//            if (err) ORT_CXX_API_THROW(std::string("SwiGLU: ") + cuda_error_string(err), ORT_RUNTIME_EXCEPTION);
//          });
//        }
//        onnxfuse::OpAttrs attrs;
//      };
//
//    Inputs are declared in schema.py's order, each `const Ort::Custom::Tensor<T>&`; the output
//    `Ort::Custom::Tensor<T>&` and its shape comes from Allocate(). Compute returning Ort::Status makes the lite
//    wrapper use KernelComputeV2, so errors reach the session as a status (the message carries the op name) rather
//    than an exception crossing the library boundary. Tensor<T>::Data() of a Float16_t/BFloat16_t tensor is a
//    pointer to 16-bit storage: cast it to `const uint16_t*` / `__half*` / `__nv_bfloat16*` for launchers.
//
// 2. Registration: `onnxfuse::AddOpAllTypes<SwiGLUCuda>(domain, "SwiGLU", onnxfuse::kCudaEp)` creates the op
//    three times (float, float16, bfloat16) under ONE name in ONE domain. onnxruntime 1.31 accepts that: it merges
//    the registrations into one schema whose type constraint lists all three types and picks the kernel by the
//    node's input types (checked by tests/test_kernels_cpu.py for every op and type). The op objects live in a
//    process-lifetime registry (ORT keeps raw pointers to them after the session options are gone).
//    The same op name may also be registered for both CPU and CUDA EPs; ORT picks by node placement.
//
// 3. Attributes: read once in the constructor with ReadOpAttrs(): `backend` (string, default "auto") and `scale`
//    (float, default 1.0, LoRA ops only). A missing attribute takes the schema default; an unknown backend string
//    (attribute or env) fails kernel creation with ORT_INVALID_ARGUMENT naming the op. Env ONNXFUSE_BACKEND, when
//    set and non-empty, replaces the node attribute (read at session creation, not per run). Lite ops register no
//    attribute schema; ORT does not check custom-op attributes, so `backend` / `scale` pass through untouched.
//    Meaning of backend per EP: the EP placement decides the device; on the CPU EP every value is accepted and the
//    CPU kernel runs (so a model fused for CUDA still runs on a CPU-only session); on the CUDA EP `auto` lets the
//    library pick, `cuda`/`triton` choose the kernel family, and `cpu` is the CUDA EP's call to make (B decides).
//
// 4. Optional inputs: none of our ops has one (schema: bias is always present). If one is ever needed, declare it as
//    `std::optional<const Ort::Custom::Tensor<T>*>`; the lite header reports every input as INPUT_OUTPUT_OPTIONAL
//    anyway, so an absent trailing input only fails when the kernel touches it — our Dims helpers check counts via
//    shapes, and Tensor's constructor throws ORT_INVALID_ARGUMENT for a missing trailing input.
//
// 5. API version: ORT_API_MANUAL_INIT is defined here, before every include of the ORT C++ header, in every TU —
//    Ort::Global<void>::api_ must be defined the same way everywhere. register.cc calls Ort::InitApi() once with
//    the API of the runtime that loads us; nothing else may call the ORT C++ API before that (no static
//    initialisers using Ort::*). The lite op structs set OrtCustomOp::version = ORT_API_VERSION of the headers,
//    so the headers must not be newer than the runtime (1.21 headers into 1.31 is fine).
//
// 6. Streams: CUDA kernels take the stream from Ort::KernelContext(ctx).GetGPUComputeStream() and never
//    synchronise; cuda_context.h is not available (not in the Debian package).
// =====================================================================================================================
#pragma once

#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT
#include "onnxruntime_lite_custom_op.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace onnxfuse {

// Mirrors onnxfuse/schema.py (DOMAIN, BACKENDS, BACKEND_ENV); tests check the two agree through the library.
inline constexpr const char* kDomain = "onnxfuse";
inline constexpr const char* kBackendEnv = "ONNXFUSE_BACKEND";
inline constexpr const char* kCpuEp = "CPUExecutionProvider";
inline constexpr const char* kCudaEp = "CUDAExecutionProvider";

// The library is built with hidden visibility and a version script; the two C entry points need this too.
#define ONNXFUSE_EXPORT extern "C" __attribute__((visibility("default")))

// ------------------------------------------------------------------------------------------------ element types
// A small integer tag to hand the element type to launchers that cannot see Ort::Float16_t (nvcc side).
enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };
template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> {
  static constexpr DType value = DType::F32;
  static constexpr const char* name = "float";
  static constexpr ONNXTensorElementDataType onnx = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
};
template <> struct DTypeOf<Ort::Float16_t> {
  static constexpr DType value = DType::F16;
  static constexpr const char* name = "float16";
  static constexpr ONNXTensorElementDataType onnx = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
};
template <> struct DTypeOf<Ort::BFloat16_t> {
  static constexpr DType value = DType::BF16;
  static constexpr const char* name = "bfloat16";
  static constexpr ONNXTensorElementDataType onnx = ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
};

// ------------------------------------------------------------------------------------------------ errors
[[noreturn]] inline void Fail(std::string message, OrtErrorCode code = ORT_INVALID_ARGUMENT) {
  ORT_CXX_API_THROW(std::move(message), code);
}

// Runs a kernel body and turns whatever it throws into an Ort::Status, so no exception crosses into onnxruntime.
template <typename Body>
Ort::Status GuardCompute(Body&& body) noexcept {
  try {
    body();
    return Ort::Status{nullptr};
  } catch (const Ort::Exception& e) {
    return Ort::Status(e.what(), e.GetOrtErrorCode());
  } catch (const std::bad_alloc&) {
    return Ort::Status("onnxfuse: out of memory", ORT_FAIL);
  } catch (const std::exception& e) {
    return Ort::Status(e.what(), ORT_FAIL);
  } catch (...) {
    return Ort::Status("onnxfuse: unknown exception in kernel", ORT_FAIL);
  }
}

inline std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// ------------------------------------------------------------------------------------------------ shapes
// M rows (X's leading dims flattened), reduction K, output width N, LoRA rank r (0 for non-LoRA ops).
struct LinearDims {
  int64_t M = 0, K = 0, N = 0, r = 0;
  std::vector<int64_t> out_shape;  // X.shape[:-1] + [N]
};

namespace detail {
inline LinearDims RowsOf(const char* op, const std::vector<int64_t>& x) {
  if (x.empty()) Fail(std::string(op) + ": X must have rank >= 1 ([..., K]), got a scalar");
  LinearDims d;
  d.K = x.back();
  d.M = 1;
  for (size_t i = 0; i + 1 < x.size(); ++i) d.M *= x[i];
  d.out_shape.assign(x.begin(), x.end() - 1);
  return d;
}
inline void Need(bool ok, const char* op, const std::string& what) {
  if (!ok) Fail(std::string(op) + ": " + what);
}
}  // namespace detail

// X [..., K], W [K, N], bias [N].
inline LinearDims LinearActDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                const std::vector<int64_t>& bias) {
  LinearDims d = detail::RowsOf(op, x);
  detail::Need(w.size() == 2 && w[0] == d.K, op,
               "W must be [K, N] with K = X.shape[-1]; got X " + ShapeStr(x) + ", W " + ShapeStr(w));
  d.N = w[1];
  detail::Need(bias.size() == 1 && bias[0] == d.N, op,
               "bias must be [N]; got W " + ShapeStr(w) + ", bias " + ShapeStr(bias));
  d.out_shape.push_back(d.N);
  return d;
}

// X [..., K], W_gate [K, N], W_up [K, N].
inline LinearDims SwiGLUDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& wg,
                             const std::vector<int64_t>& wu) {
  LinearDims d = detail::RowsOf(op, x);
  detail::Need(wg.size() == 2 && wg[0] == d.K, op,
               "W_gate must be [K, N] with K = X.shape[-1]; got X " + ShapeStr(x) + ", W_gate " + ShapeStr(wg));
  detail::Need(wu == wg, op, "W_up must have W_gate's shape; got W_gate " + ShapeStr(wg) + ", W_up " + ShapeStr(wu));
  d.N = wg[1];
  d.out_shape.push_back(d.N);
  return d;
}

// X [..., K], W [K, N], A [K, r], B [r, N], bias [N].
inline LinearDims LoRADims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                           const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                           const std::vector<int64_t>& bias) {
  LinearDims d = LinearActDims(op, x, w, bias);
  detail::Need(a.size() == 2 && a[0] == d.K, op,
               "A must be [K, r] with K = X.shape[-1]; got X " + ShapeStr(x) + ", A " + ShapeStr(a));
  d.r = a[1];
  detail::Need(b.size() == 2 && b[0] == d.r && b[1] == d.N, op,
               "B must be [r, N]; got A " + ShapeStr(a) + ", W " + ShapeStr(w) + ", B " + ShapeStr(b));
  return d;
}

// ------------------------------------------------------------------------------------------------ attributes
enum class Backend { Auto, Cpu, Cuda, Triton };

inline const char* BackendName(Backend b) {
  switch (b) {
    case Backend::Cpu: return "cpu";
    case Backend::Cuda: return "cuda";
    case Backend::Triton: return "triton";
    default: return "auto";
  }
}

inline Backend ParseBackend(std::string_view s, const char* op, const char* where) {
  if (s == "auto") return Backend::Auto;
  if (s == "cpu") return Backend::Cpu;
  if (s == "cuda") return Backend::Cuda;
  if (s == "triton") return Backend::Triton;
  Fail(std::string(op) + ": unknown backend '" + std::string(s) + "' from " + where + " (expected auto|cpu|cuda|triton)");
}

struct OpAttrs {
  Backend backend = Backend::Auto;
  std::string backend_source = "default";  // "attribute", "env ONNXFUSE_BACKEND" or "default": for error messages
  float scale = 1.0f;                       // LoRA ops only; schema default 1.0
};

namespace detail {
// Optional attributes through the C API: the C++ wrapper's GetAttribute throws when an attribute is absent, and
// absent means "schema default" here.
inline bool TryGetString(const OrtApi* api, const OrtKernelInfo* info, const char* name, std::string& out) {
  size_t size = 0;
  OrtStatus* st = api->KernelInfoGetAttribute_string(info, name, nullptr, &size);
  if (st != nullptr) {
    api->ReleaseStatus(st);
    return false;
  }
  std::string buf(size, '\0');
  st = api->KernelInfoGetAttribute_string(info, name, buf.data(), &size);
  if (st != nullptr) {
    api->ReleaseStatus(st);
    return false;
  }
  buf.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  out = std::move(buf);
  return true;
}
inline bool TryGetFloat(const OrtApi* api, const OrtKernelInfo* info, const char* name, float& out) {
  OrtStatus* st = api->KernelInfoGetAttribute_float(info, name, &out);
  if (st != nullptr) {
    api->ReleaseStatus(st);
    return false;
  }
  return true;
}
}  // namespace detail

inline OpAttrs ReadOpAttrs(const OrtApi* api, const OrtKernelInfo* info, const char* op) {
  OpAttrs a;
  std::string s;
  if (detail::TryGetString(api, info, "backend", s)) {
    a.backend = ParseBackend(s, op, "node attribute 'backend'");
    a.backend_source = "attribute";
  }
  const char* env = std::getenv(kBackendEnv);
  if (env != nullptr && *env != '\0') {
    a.backend = ParseBackend(env, op, "environment variable ONNXFUSE_BACKEND");
    a.backend_source = "env ONNXFUSE_BACKEND";
  }
  detail::TryGetFloat(api, info, "scale", a.scale);
  return a;
}

// ------------------------------------------------------------------------------------------------ registration
// Keeps every created op alive for the process: the domain and the session options hold raw pointers to them, and
// sessions may outlive the options. Safe to call from several RegisterCustomOps calls (one per SessionOptions).
inline void KeepAlive(std::unique_ptr<Ort::Custom::OrtLiteCustomOp> op, Ort::CustomOpDomain& domain) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<Ort::Custom::OrtLiteCustomOp>>* ops =
      new std::vector<std::unique_ptr<Ort::Custom::OrtLiteCustomOp>>();  // never destroyed: ORT may run at exit
  std::lock_guard<std::mutex> lock(mu);
  domain.Add(op.get());
  ops->push_back(std::move(op));
}

// Registers Kernel<float>, Kernel<Ort::Float16_t>, Kernel<Ort::BFloat16_t> under one op name for one EP.
template <template <typename> class Kernel>
void AddOpAllTypes(Ort::CustomOpDomain& domain, const char* op_name, const char* ep) {
  KeepAlive(std::unique_ptr<Ort::Custom::OrtLiteCustomOp>(Ort::Custom::CreateLiteCustomOp<Kernel<float>>(op_name, ep)), domain);
  KeepAlive(std::unique_ptr<Ort::Custom::OrtLiteCustomOp>(Ort::Custom::CreateLiteCustomOp<Kernel<Ort::Float16_t>>(op_name, ep)), domain);
  KeepAlive(std::unique_ptr<Ort::Custom::OrtLiteCustomOp>(Ort::Custom::CreateLiteCustomOp<Kernel<Ort::BFloat16_t>>(op_name, ep)), domain);
}

// ------------------------------------------------------------------------------------------------ variadic ops
// MLPStack has a variable number of inputs (X, then W_i, bias_i per layer). The lite API's Variadic cannot carry
// float16/bfloat16 tensors (its TensorArray knows no 16-bit float types), so these ops use Ort::CustomOpBase
// directly: input 0 is X of type T, input 1 a homogeneous variadic list of T (at least one W, bias pair), output
// 0 is Y of type T; registered for float, float16 and bfloat16 under one name like the lite ops. Kernel<T> has a
// constructor (const OrtApi*, const OrtKernelInfo*) that may throw, and `OrtStatusPtr ComputeV2(OrtKernelContext*)`.

// The node's `activations` attribute ("relu.relu.sigmoid"): ONNXFUSE act codes (1 relu, 2 sigmoid), one per layer.
inline std::vector<int> ReadStackActivations(const OrtApi* api, const OrtKernelInfo* info, const char* op) {
  std::string s;
  if (!detail::TryGetString(api, info, "activations", s) || s.empty())
    Fail(std::string(op) + ": missing attribute 'activations' (the layers' activations joined by dots, e.g. "
                           "relu.relu.sigmoid)");
  std::vector<int> acts;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t dot = std::min(s.find('.', start), s.size());
    const std::string a = s.substr(start, dot - start);
    if (a == "relu") acts.push_back(1);
    else if (a == "sigmoid") acts.push_back(2);
    else Fail(std::string(op) + ": activation '" + a + "' in '" + s + "' is not relu or sigmoid");
    start = dot + 1;
  }
  return acts;
}

// Shapes of a stack's inputs: X [..., K], W_i [n_{i-1}, n_i] with n_0 = K, bias_i [n_i]. widths = n_0..n_L.
struct StackDims {
  int64_t M = 0;
  std::vector<int64_t> widths;
  std::vector<int64_t> out_shape;
};

inline StackDims MLPStackDims(const char* op, size_t n_layers, const std::vector<std::vector<int64_t>>& shapes) {
  if (shapes.size() != 1 + 2 * n_layers)
    Fail(std::string(op) + ": " + std::to_string(shapes.size()) + " inputs, but the 'activations' attribute names " +
         std::to_string(n_layers) + " layers (need X and a W, bias pair per layer: " +
         std::to_string(1 + 2 * n_layers) + ")");
  LinearDims x = detail::RowsOf(op, shapes[0]);
  StackDims d;
  d.M = x.M;
  d.widths.push_back(x.K);
  for (size_t i = 0; i < n_layers; ++i) {
    const auto& w = shapes[1 + 2 * i];
    const auto& b = shapes[2 + 2 * i];
    const std::string layer = "layer " + std::to_string(i + 1) + ": ";
    detail::Need(w.size() == 2 && w[0] == d.widths.back(), op,
                 layer + "W must be [K, N] with K = the previous width " + std::to_string(d.widths.back()) + "; got " +
                     ShapeStr(w));
    detail::Need(b.size() == 1 && b[0] == w[1], op, layer + "bias must be [N]; got W " + ShapeStr(w) + ", bias " +
                                                        ShapeStr(b));
    d.widths.push_back(w[1]);
  }
  d.out_shape = x.out_shape;
  d.out_shape.push_back(d.widths.back());
  return d;
}

// Inputs of a variadic-op call: shapes and raw data pointers of all inputs, in order.
struct VariadicInputs {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<const void*> data;
  explicit VariadicInputs(Ort::KernelContext& ctx) {
    const size_t n = ctx.GetInputCount();
    for (size_t i = 0; i < n; ++i) {
      Ort::ConstValue v = ctx.GetInput(i);
      shapes.push_back(v.GetTensorTypeAndShapeInfo().GetShape());
      data.push_back(v.GetTensorRawData());
    }
  }
};

template <template <typename> class Kernel, typename T>
struct VariadicOp : Ort::CustomOpBase<VariadicOp<Kernel, T>, Kernel<T>, true> {
  VariadicOp(const char* name, const char* ep) : name_(name), ep_(ep) {}
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new Kernel<T>(&api, info);
      return nullptr;
    } catch (const Ort::Exception& e) {
      return api.CreateStatus(e.GetOrtErrorCode(), e.what());
    } catch (const std::exception& e) {
      return api.CreateStatus(ORT_FAIL, e.what());
    }
  }
  const char* GetName() const { return name_; }
  const char* GetExecutionProviderType() const { return ep_; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t) const { return DTypeOf<T>::onnx; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_VARIADIC;
  }
  int GetVariadicInputMinArity() const { return 2; }
  bool GetVariadicInputHomogeneity() const { return true; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return DTypeOf<T>::onnx; }

 private:
  const char* name_;
  const char* ep_;
};

// Registers VariadicOp<Kernel, T> for the three element types. The op objects are never freed (ORT keeps raw
// pointers to them for the life of the process; BuildDomain runs once per process).
template <template <typename> class Kernel>
void AddVariadicOpAllTypes(Ort::CustomOpDomain& domain, const char* op_name, const char* ep) {
  domain.Add(new VariadicOp<Kernel, float>(op_name, ep));
  domain.Add(new VariadicOp<Kernel, Ort::Float16_t>(op_name, ep));
  domain.Add(new VariadicOp<Kernel, Ort::BFloat16_t>(op_name, ep));
}

}  // namespace onnxfuse
