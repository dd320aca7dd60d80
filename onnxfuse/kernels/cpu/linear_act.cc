// LinearRelu / LinearSigmoid on the CPU EP: Y = act(X @ W + bias), one GEMM with the activation in its epilogue.
// A constant W is packed and a constant bias converted to fp32 once, at kernel creation (ops.h, ConstB/ConstF32).
#include "ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

// Inputs: 0 X, 1 W, 2 bias.
template <typename T, Act A>
struct LinearActCpu {
  LinearActCpu(const OrtApi* api, const OrtKernelInfo* info, const char* op_name)
      : op(op_name), attrs(ReadOpAttrs(api, info, op_name)) {
    w.Init(FormatOf<T>::value, GetConstantInput(api, info, 1));
    bias.template Init<T>(GetConstantInput(api, info, 2), 1);
    log.Created(op, std::string(w.valid ? "W " : "") + (bias.valid ? "bias" : ""));
  }

  void Run(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W, const Ort::Custom::Tensor<T>& B,
           Ort::Custom::Tensor<T>& Y) {
    const LinearDims d = LinearActDims(op, X.Shape(), W.Shape(), B.Shape());
    T* y = Y.Allocate(d.out_shape);
    if (d.M == 0 || d.N == 0) return;
    const BiasAct<T, A> epi(bias.Match(B.Data()), B.Data(), d.N, y);
    GemmArgs g = GemmFor(d, X.Data(), &epi.epilogue);
    g.b[0] = BOperand{W.Data(), d.K, nullptr, w.Match(W.Data())};
    if (g.b[0].packed != nullptr) log.Used(op);
    Gemm(g);
  }

  const char* op;
  OpAttrs attrs;  // backend is irrelevant once the node sits on the CPU EP (see ort/common.h, point 3)
  ConstB w;
  ConstF32 bias;
  PrepackLogger log;
};

template <typename T>
struct LinearReluCpu : LinearActCpu<T, Act::Relu> {
  LinearReluCpu(const OrtApi* api, const OrtKernelInfo* info) : LinearActCpu<T, Act::Relu>(api, info, "LinearRelu") {}
  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { this->Run(X, W, bias, Y); });
  }
};

template <typename T>
struct LinearSigmoidCpu : LinearActCpu<T, Act::Sigmoid> {
  LinearSigmoidCpu(const OrtApi* api, const OrtKernelInfo* info)
      : LinearActCpu<T, Act::Sigmoid>(api, info, "LinearSigmoid") {}
  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { this->Run(X, W, bias, Y); });
  }
};

}  // namespace

void RegisterLinearAct(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LinearReluCpu>(domain, "LinearRelu", kCpuEp);
  AddOpAllTypes<LinearSigmoidCpu>(domain, "LinearSigmoid", kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
