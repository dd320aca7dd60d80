// SwiGLU on the CPU EP: Y = act(X @ W_gate) * (X @ W_up), act the node's gate activation (common/gate_act.h). Both
// GEMMs share the packed X and run tile by tile, so the gate and up accumulators of a tile meet in the epilogue
// without a full-size intermediate.
#include "common/gate_act.h"
#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

// One instantiation per activation: the activation is fixed per node, so the inner loop has no branch.
template <typename T, int A>
struct SwiGLUEpilogue final : Epilogue {
  T* y;
  int64_t N;
  void Apply(int64_t m0, int64_t mb, int64_t n0, int64_t nc, const float* const* acc, int64_t ld) const override {
    for (int64_t i = 0; i < mb; ++i) {
      const float* g = acc[0] + i * ld;
      const float* u = acc[1] + i * ld;
      T* out = y + (m0 + i) * N + n0;
      for (int64_t j = 0; j < nc; ++j) out[j] = FromF32<T>(GateAct<A>(g[j]) * u[j]);
    }
  }
};

template <typename T, int A>
void RunSwiGLU(GemmArgs g, T* y, int64_t n) {
  SwiGLUEpilogue<T, A> epi;
  epi.y = y;
  epi.N = n;
  g.epilogue = &epi;
  Gemm(g);
}

// Constant W_gate / W_up are packed once, at kernel creation.
template <typename T>
struct SwiGLUCpu {
  using Op = schema::SwiGLU;
  SwiGLUCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), act(ReadGateActivation(api, info, Op::kName)),
        log(LoggerOf(api, info)) {
    wg.Init(FormatOf<T>::value, GetConstantInput(api, info, Op::kWGate));
    wu.Init(FormatOf<T>::value, GetConstantInput(api, info, Op::kWUp));
    log.Created(Op::kName, std::string(wg.valid ? "W_gate " : "") + (wu.valid ? "W_up" : ""));
  }
  Ort::Status Compute(const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W_gate,
                      const Ort::Custom::Tensor<T>& W_up, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = SwiGLUDims(Op::kName, X.Shape(), W_gate.Shape(), W_up.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      GemmArgs g = GemmFor<T>(d, X.Data(), nullptr);
      g.num_b = 2;
      g.b[0] = BOperand{W_gate.Data(), d.K, nullptr, wg.Match(W_gate.Data())};
      g.b[1] = BOperand{W_up.Data(), d.K, nullptr, wu.Match(W_up.Data())};
      if (g.b[0].packed != nullptr || g.b[1].packed != nullptr) log.Used(Op::kName);
      switch (act) {
        case ONNXFUSE_GATE_GELU: return RunSwiGLU<T, ONNXFUSE_GATE_GELU>(g, y, d.N);
        case ONNXFUSE_GATE_GELU_TANH: return RunSwiGLU<T, ONNXFUSE_GATE_GELU_TANH>(g, y, d.N);
        case ONNXFUSE_GATE_QUICK_GELU: return RunSwiGLU<T, ONNXFUSE_GATE_QUICK_GELU>(g, y, d.N);
        case ONNXFUSE_GATE_RELU: return RunSwiGLU<T, ONNXFUSE_GATE_RELU>(g, y, d.N);
        case ONNXFUSE_GATE_SIGMOID: return RunSwiGLU<T, ONNXFUSE_GATE_SIGMOID>(g, y, d.N);
        default: return RunSwiGLU<T, ONNXFUSE_GATE_SILU>(g, y, d.N);
      }
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act, checked when the kernel is created
  ConstB wg, wu;
  PrepackLog log;
};

}  // namespace

void RegisterSwiGLU(Ort::CustomOpDomain& domain) { AddOpAllTypes<SwiGLUCpu>(domain, schema::SwiGLU::kName, kCpuEp); }

}  // namespace cpu
}  // namespace onnxfuse
