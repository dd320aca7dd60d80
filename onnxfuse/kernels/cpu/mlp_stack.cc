// MLPStack on the CPU EP: h_i = act_i(h_{i-1} @ W_i + bias_i) for each layer, each layer one fused GEMM with its
// bias + activation epilogue (gemm.h) on onnxruntime's intra-op threads (OrtPoolRunner), the intermediates in per-call buffers of the op's element type (rounded as
// the unfused graph stores them). Constant W_i are packed and constant bias_i converted to fp32 once, at kernel
// creation, like LinearRelu's. The stack_mode attribute is checked but has one meaning here: layer by layer.
#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

template <typename T>
struct MLPStackCpu {
  using Op = schema::MLPStack;
  MLPStackCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), acts(ReadStackActivations(api, info, Op::kName)),
        log(LoggerOf(api, info)) {
    ReadStackMode(api, info, Op::kName);  // validated like backend, then irrelevant on the CPU
    w.resize(acts.size());
    bias.resize(acts.size());
    std::string what;
    for (size_t i = 0; i < acts.size(); ++i) {
      w[i].Init(FormatOf<T>::value, GetConstantInput(api, info, Op::W(int(i))));
      bias[i].template Init<T>(GetConstantInput(api, info, Op::Bias(int(i))), 1);
      what += std::string(w[i].valid ? " W_" + std::to_string(i + 1) : "") +
              (bias[i].valid ? " bias_" + std::to_string(i + 1) : "");
    }
    log.Created(Op::kName, what);
  }

  template <Act A>
  void Layer(const T* in, const void* wd, const T* bd, T* out, int64_t m, int64_t k, int64_t n, size_t i,
             const TaskRunner* runner) {
    LinearDims d;
    d.M = m, d.K = k, d.N = n;
    const BiasAct<T, A> epi(bias[i].Match(bd), bd, n, out);
    GemmArgs g = GemmFor(d, in, &epi.epilogue);
    g.runner = runner;
    g.b[0] = BOperand{wd, k, nullptr, w[i].Match(wd)};
    if (g.b[0].packed != nullptr) log.Used(Op::kName);
    Gemm(g);
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    return GuardCompute([&] {
      Ort::KernelContext ctx(context);
      const VariadicInputs in(ctx);
      const StackDims d = MLPStackDims(Op::kName, acts.size(), in.shapes);
      T* y = static_cast<T*>(ctx.GetOutput(Op::kY, d.out_shape).GetTensorMutableRawData());
      if (d.M == 0 || d.widths.back() == 0) return;
      std::vector<T> buf[2];
      const OrtPoolRunner runner(context);  // the layers' GEMMs run on the session's own threads
      const T* h = static_cast<const T*>(in.data[Op::kX]);
      for (size_t i = 0; i < acts.size(); ++i) {
        const int64_t k = d.widths[i], n = d.widths[i + 1];
        T* out = y;
        if (i + 1 < acts.size()) {
          buf[i % 2].resize(static_cast<size_t>(d.M * n));
          out = buf[i % 2].data();
        }
        const void* wd = in.data[Op::W(int(i))];
        const T* bd = static_cast<const T*>(in.data[Op::Bias(int(i))]);
        if (acts[i] == ONNXFUSE_ACT_RELU) Layer<Act::Relu>(h, wd, bd, out, d.M, k, n, i, &runner);
        else Layer<Act::Sigmoid>(h, wd, bd, out, d.M, k, n, i, &runner);
        h = out;
      }
    }).release();
  }

  OpAttrs attrs;  // backend is irrelevant once the node sits on the CPU EP (see common/attrs.h)
  std::vector<int> acts;
  std::vector<ConstB> w;
  std::vector<ConstF32> bias;
  PrepackLog log;
};

}  // namespace

void RegisterMLPStack(Ort::CustomOpDomain& domain) {
  AddVariadicOpAllTypes<MLPStackCpu>(domain, schema::MLPStack::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
