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
  const std::vector<float> bias_f32 = ToF32Vector(bias.Data(), d.N);
  BiasActEpilogue<T, A> epi;
  epi.bias = bias_f32.data();
  epi.y = y;
  epi.N = d.N;
  GemmArgs g;
  g.fmt = FormatOf<T>::value;
  g.M = d.M, g.K = d.K, g.N = d.N;
  g.x = X.Data();
  g.b[0] = BOperand{W.Data(), d.K, nullptr};
  g.epilogue = &epi;
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
