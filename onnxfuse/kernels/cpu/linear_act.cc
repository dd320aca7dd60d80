// LinearRelu / LinearSigmoid on the CPU EP: Y = act(X @ W + bias), one GEMM with the activation in its epilogue.
// Constant W and bias (initializers) are prepared once, at kernel creation: for oneDNN's matmul with bias and the
// activation as post-ops (onednn_gemm.h) when the library has it and this CPU has a kernel for the type, else packed
// for the built-in GEMM (ops.h, ConstB/ConstF32). Tiles run on onnxruntime's intra-op pool (ops.h, OrtPool).
#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

// Op is schema::LinearRelu or schema::LinearSigmoid (same inputs: X, W, bias).
template <typename T, Act A, typename Op>
struct LinearActCpu {
  LinearActCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), log(LoggerOf(api, info)) {
    const auto wc = GetConstantInput(api, info, Op::kW);
    bias.template Init<T>(GetConstantInput(api, info, Op::kBias), 1);
    if (wc && wc->shape.size() == 2) {
      MatmulSpec spec;
      spec.src = spec.dst = FormatOf<T>::value;
      spec.K = wc->shape[0], spec.N = wc->shape[1];
      spec.block_n = ColumnBlock(spec.N);
      spec.post = {A == Act::Relu ? PostOp::Relu : PostOp::Sigmoid};
      onednn = mm.Init(spec, wc, &bias);
    }
    if (!onednn) w.Init(FormatOf<T>::value, wc);
    log.Created(Op::kName, std::string(onednn    ? "W (oneDNN " + mm.mm.Describe(64) + ") "
                                       : w.valid ? "W "
                                                 : "") +
                               (bias.valid ? "bias" : "") + (onednn || !wc ? "" : " (built-in GEMM: " + mm.why + ")"));
  }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& B, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = LinearActDims(Op::kName, X.Shape(), W.Shape(), B.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      const OrtPool pool(ctx);
      if (onednn && mm.Match(W.Data(), B.Data())) {
        log.Used(Op::kName, "oneDNN");
        mm.Run(pool, d, X.Data(), y);
        return;
      }
      const BiasAct<T, A> epi(bias.Match(B.Data()), B.Data(), d.N, y);
      GemmWithW(pool, d, X.Data(), W.Data(), w, &epi.epilogue, log, Op::kName);
    });
  }

  OpAttrs attrs;  // backend is irrelevant once the node sits on the CPU EP (see common/attrs.h)
  ConstB w;
  ConstF32 bias;
  ConstMatmul mm;
  bool onednn = false;
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
