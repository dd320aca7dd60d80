// LoRALinear / LoRALinearRelu on the CPU EP: Y = act(X @ W + bias + scale * ((X @ A) @ B)).
// T = X @ A (M x r) is computed first, then scale * T rides as r extra reduction columns of the base GEMM
// ([X | scale*T] @ [W ; B]), so the rank-r update is accumulated in fp32 with the base product before the
// bias/activation epilogue — no second pass over Y.
#include "ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

template <typename T, Act A>
void RunLoRA(const char* op, float scale, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
             const Ort::Custom::Tensor<T>& LA, const Ort::Custom::Tensor<T>& LB, const Ort::Custom::Tensor<T>& bias,
             Ort::Custom::Tensor<T>& Y) {
  const LinearDims d = LoRADims(op, X.Shape(), W.Shape(), LA.Shape(), LB.Shape(), bias.Shape());
  T* y = Y.Allocate(d.out_shape);
  if (d.M == 0 || d.N == 0) return;
  const BiasAct<T, A> epi(bias.Data(), d.N, y);
  GemmArgs g = GemmFor(d, X.Data(), &epi.epilogue);
  g.r = d.r;
  g.lora_a = LA.Data();
  g.lora_scale = scale;
  g.b[0] = BOperand{W.Data(), d.K, LB.Data()};
  Gemm(g);
}

template <typename T>
struct LoRALinearCpu {
  LoRALinearCpu(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, "LoRALinear")) {}
  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W, const Ort::Custom::Tensor<T>& A,
                      const Ort::Custom::Tensor<T>& B, const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { RunLoRA<T, Act::None>("LoRALinear", attrs.scale, X, W, A, B, bias, Y); });
  }
  OpAttrs attrs;
};

template <typename T>
struct LoRALinearReluCpu {
  LoRALinearReluCpu(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, "LoRALinearRelu")) {}
  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W, const Ort::Custom::Tensor<T>& A,
                      const Ort::Custom::Tensor<T>& B, const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { RunLoRA<T, Act::Relu>("LoRALinearRelu", attrs.scale, X, W, A, B, bias, Y); });
  }
  OpAttrs attrs;
};

}  // namespace

void RegisterLoRALinear(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LoRALinearCpu>(domain, "LoRALinear", kCpuEp);
  AddOpAllTypes<LoRALinearReluCpu>(domain, "LoRALinearRelu", kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
