// LinearRelu / LinearSigmoid on the CPU EP: Y = act(X @ W + bias), one GEMM with the activation in its epilogue.
// A constant W is packed and a constant bias converted to fp32 once, at kernel creation (ops.h, ConstB/ConstF32).
#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

// Op is schema::LinearRelu or schema::LinearSigmoid (same inputs: X, W, bias).
template <typename T, Act A, typename Op>
struct LinearActCpu {
  LinearActCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), log(LoggerOf(api, info)) {
    w.Init(FormatOf<T>::value, GetConstantInput(api, info, Op::kW));
    bias.template Init<T>(GetConstantInput(api, info, Op::kBias), 1);
    log.Created(Op::kName, std::string(w.valid ? "W " : "") + (bias.valid ? "bias" : ""));
  }

  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& B, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = LinearActDims(Op::kName, X.Shape(), W.Shape(), B.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      const BiasAct<T, A> epi(bias.Match(B.Data()), B.Data(), d.N, y);
      GemmArgs g = GemmFor(d, X.Data(), &epi.epilogue);
      g.b[0] = BOperand{W.Data(), d.K, nullptr, w.Match(W.Data())};
      if (g.b[0].packed != nullptr) log.Used(Op::kName);
      Gemm(g);
    });
  }

  OpAttrs attrs;  // backend is irrelevant once the node sits on the CPU EP (see common/attrs.h)
  ConstB w;
  ConstF32 bias;
  PrepackLog log;
};

template <typename T>
using LinearReluCpu = LinearActCpu<T, Act::Relu, schema::LinearRelu>;
template <typename T>
using LinearSigmoidCpu = LinearActCpu<T, Act::Sigmoid, schema::LinearSigmoid>;

}  // namespace

void RegisterLinearAct(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LinearReluCpu>(domain, schema::LinearRelu::kName, kCpuEp);
  AddOpAllTypes<LinearSigmoidCpu>(domain, schema::LinearSigmoid::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
