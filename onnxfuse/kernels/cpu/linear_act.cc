// LinearRelu / LinearSigmoid on the CPU EP: Y = act(X @ W + bias), one GEMM with the activation in its epilogue.
#include "ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

template <typename T, Act A>
void RunLinearAct(const char* op, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                  const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
  const LinearDims d = LinearActDims(op, X.Shape(), W.Shape(), bias.Shape());
  T* y = Y.Allocate(d.out_shape);
  if (d.M == 0 || d.N == 0) return;
  const BiasAct<T, A> epi(bias.Data(), d.N, y);
  GemmArgs g = GemmFor(d, X.Data(), &epi.epilogue);
  g.b[0] = BOperand{W.Data(), d.K, nullptr};
  Gemm(g);
}

template <typename T>
struct LinearReluCpu {
  LinearReluCpu(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, "LinearRelu")) {}
  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { RunLinearAct<T, Act::Relu>("LinearRelu", X, W, bias, Y); });
  }
  OpAttrs attrs;  // backend is irrelevant once the node sits on the CPU EP (see ort/common.h, point 3)
};

template <typename T>
struct LinearSigmoidCpu {
  LinearSigmoidCpu(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, "LinearSigmoid")) {}
  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { RunLinearAct<T, Act::Sigmoid>("LinearSigmoid", X, W, bias, Y); });
  }
  OpAttrs attrs;
};

}  // namespace

void RegisterLinearAct(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LinearReluCpu>(domain, "LinearRelu", kCpuEp);
  AddOpAllTypes<LinearSigmoidCpu>(domain, "LinearSigmoid", kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
