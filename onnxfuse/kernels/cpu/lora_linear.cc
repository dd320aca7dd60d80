// LoRALinear / LoRALinearRelu on the CPU EP: Y = act(X @ W + bias + scale * ((X @ A) @ B)).
// T = X @ A (M x r) is computed first, then scale * T rides as r extra reduction columns of the base GEMM
// ([X | scale*T] @ [W ; B]), so the rank-r update is accumulated in fp32 with the base product before the
// bias/activation epilogue — no second pass over Y.
#include "ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

// Inputs: 0 X, 1 W, 2 A, 3 B, 4 bias. When W and B are both constants, [W ; B] is packed once at kernel creation;
// a constant A and bias are converted to fp32 once.
template <typename T, Act Act_>
struct LoRACpu {
  LoRACpu(const OrtApi* api, const OrtKernelInfo* info, const char* op_name)
      : op(op_name), attrs(ReadOpAttrs(api, info, op_name)) {
    const auto lb = GetConstantInput(api, info, 3);
    wb.Init(FormatOf<T>::value, GetConstantInput(api, info, 1), &lb);
    la.template Init<T>(GetConstantInput(api, info, 2), 2);
    bias.template Init<T>(GetConstantInput(api, info, 4), 1);
    log.Created(op, std::string(wb.valid ? "[W;B] " : "") + (la.valid ? "A " : "") + (bias.valid ? "bias" : ""));
  }

  void Run(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W, const Ort::Custom::Tensor<T>& LA,
           const Ort::Custom::Tensor<T>& LB, const Ort::Custom::Tensor<T>& B, Ort::Custom::Tensor<T>& Y) {
    const LinearDims d = LoRADims(op, X.Shape(), W.Shape(), LA.Shape(), LB.Shape(), B.Shape());
    T* y = Y.Allocate(d.out_shape);
    if (d.M == 0 || d.N == 0) return;
    const BiasAct<T, Act_> epi(bias.Match(B.Data()), B.Data(), d.N, y);
    GemmArgs g = GemmFor(d, X.Data(), &epi.epilogue);
    g.r = d.r;
    g.lora_a = LA.Data();
    g.lora_a_f32 = la.Match(LA.Data());
    g.lora_scale = attrs.scale;
    g.b[0] = BOperand{W.Data(), d.K, LB.Data(), wb.Match(W.Data(), LB.Data())};
    if (g.b[0].packed != nullptr) log.Used(op);
    Gemm(g);
  }

  const char* op;
  OpAttrs attrs;
  ConstB wb;
  ConstF32 la, bias;
  PrepackLogger log;
};

template <typename T>
struct LoRALinearCpu : LoRACpu<T, Act::None> {
  LoRALinearCpu(const OrtApi* api, const OrtKernelInfo* info) : LoRACpu<T, Act::None>(api, info, "LoRALinear") {}
  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W, const Ort::Custom::Tensor<T>& A,
                      const Ort::Custom::Tensor<T>& B, const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { this->Run(X, W, A, B, bias, Y); });
  }
};

template <typename T>
struct LoRALinearReluCpu : LoRACpu<T, Act::Relu> {
  LoRALinearReluCpu(const OrtApi* api, const OrtKernelInfo* info) : LoRACpu<T, Act::Relu>(api, info, "LoRALinearRelu") {}
  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W, const Ort::Custom::Tensor<T>& A,
                      const Ort::Custom::Tensor<T>& B, const Ort::Custom::Tensor<T>& bias, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] { this->Run(X, W, A, B, bias, Y); });
  }
};

}  // namespace

void RegisterLoRALinear(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LoRALinearCpu>(domain, "LoRALinear", kCpuEp);
  AddOpAllTypes<LoRALinearReluCpu>(domain, "LoRALinearRelu", kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
