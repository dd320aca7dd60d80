// Linear and LinearSkipRMSNorm on the CPU EP. Linear: Y = X @ W, one GEMM. LinearSkipRMSNorm: the same GEMM into sum,
// then per row sum += skip (rounded to T) and Y = sum * rsqrt(mean(sum^2) + epsilon) * gamma. The constant W is
// prepared once, at kernel creation: for oneDNN's matmul (onednn_gemm.h) when the library has it and this CPU has a
// kernel for the type, else packed for the built-in GEMM (ops.h, ConstB). fuse --provider cpu leaves the family to
// onnxruntime (cpu_policy.py): these kernels serve a fused model placed on the CPU. Tiles and rows run on
// onnxruntime's intra-op pool (ops.h, OrtPool).
#include <cmath>
#include <string>
#include <vector>

#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

// X @ W by a W that is a constant of the node (prepared once) or, where it is not, read per call.
template <typename T>
struct ConstProduct {
  ConstProduct(const OrtApi* api, const OrtKernelInfo* info, const char* op, int w_index) : log(LoggerOf(api, info)) {
    const auto wc = GetConstantInput(api, info, w_index);
    if (wc && wc->shape.size() == 2) {
      MatmulSpec spec;
      spec.src = spec.dst = FormatOf<T>::value;
      spec.K = wc->shape[0], spec.N = wc->shape[1];
      spec.block_n = ColumnBlock(spec.N);
      onednn = mm.Init(spec, wc, nullptr);
    }
    if (!onednn) w.Init(FormatOf<T>::value, wc);
    log.Created(op, std::string(onednn    ? "W (oneDNN " + mm.mm.Describe(64) + ")"
                                : w.valid ? "W"
                                          : "") +
                        (onednn || !wc ? "" : " (built-in GEMM: " + mm.why + ")"));
  }

  void Run(const OrtPool& pool, const LinearDims& d, const T* x, const T* wd, T* y, const char* op) {
    if (onednn && mm.Match(wd)) {
      log.Used(op, "oneDNN");
      mm.Run(pool, d, x, y);
      return;
    }
    const std::vector<float> zero(static_cast<size_t>(d.N), 0.f);  // the epilogue's bias: none
    const BiasAct<T, Act::None> epi(zero.data(), nullptr, d.N, y);
    GemmWithW(pool, d, x, wd, w, &epi.epilogue, log, op);
  }

  ConstB w;
  ConstMatmul mm;
  bool onednn = false;
  PrepackLog log;
};

template <typename T>
struct LinearCpu {
  using Op = schema::Linear;
  LinearCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), product(api, info, Op::kName, Op::kW) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = MatMulDims(Op::kName, X.Shape(), W.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      product.Run(OrtPool(ctx), d, X.Data(), W.Data(), y, Op::kName);
    });
  }

  OpAttrs attrs;  // backend is irrelevant once the node sits on the CPU EP (see common/attrs.h)
  ConstProduct<T> product;
};

template <typename T>
struct LinearSkipRMSNormCpu {
  using Op = schema::LinearSkipRMSNorm;
  LinearSkipRMSNormCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)),
        eps(ReadEpsilon(api, info, Op::kName)),
        product(api, info, Op::kName, Op::kW) {}

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& Skip, const Ort::Custom::Tensor<T>& Gamma,
                      Ort::Custom::Tensor<T>& Y, Ort::Custom::Tensor<T>& Sum) {
    return GuardCompute([&] {
      const LinearDims d = SkipNormDims(Op::kName, X.Shape(), W.Shape(), Skip.Shape(), Gamma.Shape());
      T* y = Y.Allocate(d.out_shape);
      T* s = Sum.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      const OrtPool pool(ctx);
      product.Run(pool, d, X.Data(), W.Data(), s, Op::kName);
      const std::vector<float> gamma = ToF32Vector(Gamma.Data(), d.N);
      const T* skip = Skip.Data();
      const int64_t n = d.N;
      pool.For(d.M,
               [&](int64_t m) { SkipRmsNormRow(s + m * n, skip + m * n, gamma.data(), eps, n, s + m * n, y + m * n); });
    });
  }

  OpAttrs attrs;
  float eps;
  ConstProduct<T> product;
};

}  // namespace

void RegisterLinear(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<LinearCpu>(domain, schema::Linear::kName, kCpuEp);
  AddOpAllTypes<LinearSkipRMSNormCpu>(domain, schema::LinearSkipRMSNorm::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
