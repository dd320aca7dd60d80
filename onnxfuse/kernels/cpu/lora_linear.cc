// LoRALinear / LoRALinearRelu on the CPU EP: Y = act(X @ W + bias + scale * ((X @ A) @ B)).
// T = X @ A (M x r) is computed first, then scale * T rides as r extra reduction columns of the base GEMM
// ([X | scale*T] @ [W ; B]), so the rank-r update is accumulated in fp32 with the base product before the
// bias/activation epilogue — no second pass over Y.
#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

// Op is schema::LoRALinear or schema::LoRALinearRelu (same inputs: X, W, A, B, bias). When W and B are both
// constants, [W ; B] is packed once at kernel creation; a constant A and bias are converted to fp32 once.
template <typename T, Act Act_, typename Op>
struct LoRACpu {
  LoRACpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), log(LoggerOf(api, info)) {
    const auto lb = GetConstantInput(api, info, Op::kB);
    wb.Init(FormatOf<T>::value, GetConstantInput(api, info, Op::kW), &lb);
    la.template Init<T>(GetConstantInput(api, info, Op::kA), 2);
    bias.template Init<T>(GetConstantInput(api, info, Op::kBias), 1);
    log.Created(Op::kName,
                std::string(wb.valid ? "[W;B] " : "") + (la.valid ? "A " : "") + (bias.valid ? "bias" : ""));
  }

  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& LA, const Ort::Custom::Tensor<T>& LB,
                      const Ort::Custom::Tensor<T>& B, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = LoRADims(Op::kName, X.Shape(), W.Shape(), LA.Shape(), LB.Shape(), B.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      const BiasAct<T, Act_> epi(bias.Match(B.Data()), B.Data(), d.N, y);
      GemmArgs g = GemmFor(d, X.Data(), &epi.epilogue);
      g.r = d.r;
      g.lora_a = LA.Data();
      g.lora_a_f32 = la.Match(LA.Data());
      g.lora_scale = attrs.scale;
      g.b[0] = BOperand{W.Data(), d.K, LB.Data(), wb.Match(W.Data(), LB.Data())};
      if (g.b[0].packed != nullptr) log.Used(Op::kName);
      Gemm(g);
    });
  }

  OpAttrs attrs;
  ConstB wb;
  ConstF32 la, bias;
  PrepackLog log;
};

template <typename T>
using LoRALinearCpu = LoRACpu<T, Act::None, schema::LoRALinear>;
template <typename T>
using LoRALinearReluCpu = LoRACpu<T, Act::Relu, schema::LoRALinearRelu>;

}  // namespace

void RegisterLoRALinear(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LoRALinearCpu>(domain, schema::LoRALinear::kName, kCpuEp);
  AddOpAllTypes<LoRALinearReluCpu>(domain, schema::LoRALinearRelu::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
