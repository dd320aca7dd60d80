// Linear on the CPU EP: Y = X @ W, one GEMM. The constant W is prepared once, at kernel creation: for oneDNN's matmul
// (onednn_gemm.h) when the library has it and this CPU has a kernel for the type, else packed for the built-in GEMM
// (ops.h, ConstB). fuse --provider cpu leaves the pattern to onnxruntime (cpu_policy.py): this kernel serves a fused
// model placed on the CPU. Tiles run on onnxruntime's intra-op pool (ops.h, OrtPool).
#include <vector>

#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

using Op = schema::Linear;

template <typename T>
struct LinearCpu {
  LinearCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), log(LoggerOf(api, info)) {
    const auto wc = GetConstantInput(api, info, Op::kW);
    if (wc && wc->shape.size() == 2) {
      MatmulSpec spec;
      spec.src = spec.dst = FormatOf<T>::value;
      spec.K = wc->shape[0], spec.N = wc->shape[1];
      spec.block_n = ColumnBlock(spec.N);
      onednn = mm.Init(spec, wc, nullptr);
    }
    if (!onednn) w.Init(FormatOf<T>::value, wc);
    log.Created(Op::kName, std::string(onednn    ? "W (oneDNN " + mm.mm.Describe(64) + ")"
                                       : w.valid ? "W"
                                                 : "") +
                               (onednn || !wc ? "" : " (built-in GEMM: " + mm.why + ")"));
  }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = MatMulDims(Op::kName, X.Shape(), W.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      const OrtPool pool(ctx);
      if (onednn && mm.Match(W.Data())) {
        log.Used(Op::kName, "oneDNN");
        mm.Run(pool, d, X.Data(), y);
        return;
      }
      const std::vector<float> zero(static_cast<size_t>(d.N), 0.f);  // the epilogue's bias: none
      const BiasAct<T, Act::None> epi(zero.data(), nullptr, d.N, y);
      GemmWithW(pool, d, X.Data(), W.Data(), w, &epi.epilogue, log, Op::kName);
    });
  }

  OpAttrs attrs;  // backend is irrelevant once the node sits on the CPU EP (see common/attrs.h)
  ConstB w;
  ConstMatmul mm;
  bool onednn = false;
  PrepackLog log;
};

}  // namespace

void RegisterLinear(Ort::CustomOpDomain& domain) { AddOpAllTypes<LinearCpu>(domain, Op::kName, kCpuEp); }

}  // namespace cpu
}  // namespace onnxfuse
