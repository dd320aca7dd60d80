// MLPStack on the CPU EP: h_i = act_i(h_{i-1} @ W_i + bias_i) for each layer, each layer one fused GEMM with its
// bias + activation epilogue (gemm.h), the intermediates in per-call buffers of the op's element type (rounded as
// the unfused graph stores them). Constant W_i are packed and constant bias_i converted to fp32 once, at kernel
// creation, like LinearRelu's.
//
// With oneDNN (every W_i and bias_i constant) the stack runs per row block: each task of onnxruntime's pool carries
// a block of rows through all layers (oneDNN matmul + bias + activation post-ops per layer), its intermediates in a
// per-thread buffer that stays in L1/L2, so the whole MLP is one pass over the pool instead of one per layer
// (stack_mode auto or fused). stack_mode=layers runs one parallel pass per layer instead (for A/B timings).
#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

template <typename T>
struct MLPStackCpu {
  using Op = schema::MLPStack;
  MLPStackCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)),
        acts(ReadStackActivations(api, info, Op::kName)),
        log(LoggerOf(api, info)) {
    mode = ReadStackMode(api, info, Op::kName);
    w.resize(acts.size());
    bias.resize(acts.size());
    mm.resize(acts.size());
    std::vector<std::optional<ConstInput>> wc(acts.size());
    std::string why;
    onednn = true;
    for (size_t i = 0; i < acts.size(); ++i) {
      wc[i] = GetConstantInput(api, info, Op::W(int(i)));
      bias[i].template Init<T>(GetConstantInput(api, info, Op::Bias(int(i))), 1);
      if (onednn && wc[i] && wc[i]->shape.size() == 2) {
        MatmulSpec spec;
        spec.src = spec.dst = FormatOf<T>::value;
        spec.K = wc[i]->shape[0], spec.N = wc[i]->shape[1];
        spec.post = {acts[i] == ONNXFUSE_ACT_RELU ? PostOp::Relu : PostOp::Sigmoid};
        spec.typical_m = kRowBlock;
        onednn = mm[i].Init(spec, wc[i], &bias[i]);
        if (!onednn) why = "layer " + std::to_string(i + 1) + ": " + mm[i].why;
      } else if (onednn) {
        onednn = false;
        why = "W_" + std::to_string(i + 1) + " is not a constant";
      }
    }
    std::string what;
    for (size_t i = 0; i < acts.size(); ++i) {
      if (!onednn) w[i].Init(FormatOf<T>::value, wc[i]);
      what += std::string(onednn || w[i].valid ? " W_" + std::to_string(i + 1) : "") +
              (bias[i].valid ? " bias_" + std::to_string(i + 1) : "");
    }
    std::string impls;
    for (size_t i = 0; onednn && i < acts.size(); ++i) impls += (i ? ", " : "") + mm[i].mm.Describe(kRowBlock);
    log.Created(Op::kName,
                what.empty() ? what : what + (onednn ? " (oneDNN " + impls + ")" : " (built-in GEMM: " + why + ")"));
  }

  // Rows per task of the fused path: one task per thread while that is at most kRowBlock rows (intermediates of
  // kRowBlock x 512 fp32 = 128 KiB stay in L2), a multiple of 8; each task is a few layer calls of ~1-3 us overhead,
  // so smaller blocks cost more in calls than they gain in balance.
  static constexpr int64_t kRowBlock = 64;

  // The oneDNN path: every layer prepared and handed the constants it was prepared from.
  bool OnednnMatches(const VariadicInputs& in) const {
    if (!onednn) return false;
    for (size_t i = 0; i < acts.size(); ++i)
      if (!mm[i].Match(in.data[Op::W(int(i))], in.data[Op::Bias(int(i))])) return false;
    return true;
  }

  void RunOnednn(const ParallelRunner& pool, const StackDims& d, const T* x, T* y) {
    const size_t layers = acts.size();
    int64_t widest = 0;
    for (size_t i = 1; i < layers; ++i) widest = std::max(widest, d.widths[i]);
    if (mode == ONNXFUSE_STACK_LAYERS) {  // one pass over the pool per layer, full-size intermediates
      std::vector<T> buf[2];
      const T* h = x;
      for (size_t i = 0; i < layers; ++i) {
        T* out = y;
        if (i + 1 < layers) {
          buf[i % 2].resize(static_cast<size_t>(d.M * d.widths[i + 1]));
          out = buf[i % 2].data();
        }
        const int64_t k = d.widths[i], n = d.widths[i + 1];
        ForTiles(
            pool, d.M, 1, [&](int64_t r0, int64_t rows, int64_t) { mm[i].mm.Run(rows, h + r0 * k, out + r0 * n, 0); },
            kRowBlock);
        h = out;
      }
      return;
    }
    ForTiles(
        pool, d.M, 1,
        [&](int64_t r0, int64_t rows, int64_t) {
          T* buf[2] = {reinterpret_cast<T*>(TileScratch(1, size_t(rows * widest) * sizeof(T))),
                       reinterpret_cast<T*>(TileScratch(2, size_t(rows * widest) * sizeof(T)))};
          const T* h = x + r0 * d.widths[0];
          for (size_t i = 0; i < layers; ++i) {
            T* out = i + 1 < layers ? buf[i % 2] : y + r0 * d.widths[layers];
            mm[i].mm.Run(rows, h, out, 0);
            h = out;
          }
        },
        kRowBlock, 1);
  }

  template <Act A>
  void Layer(const ParallelRunner& pool, const T* in, const void* wd, const T* bd, T* out, int64_t m, int64_t k,
             int64_t n, size_t i) {
    LinearDims d;
    d.M = m, d.K = k, d.N = n;
    const BiasAct<T, A> epi(bias[i].Match(bd), bd, n, out);
    GemmArgs g = GemmFor(d, in, &epi.epilogue);
    g.pool = &pool;
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
             const OrtPool pool(context);
             if (OnednnMatches(in)) {
               log.Used(Op::kName, "oneDNN");
               RunOnednn(pool, d, static_cast<const T*>(in.data[Op::kX]), y);
               return;
             }
             std::vector<T> buf[2];
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
               if (acts[i] == ONNXFUSE_ACT_RELU)
                 Layer<Act::Relu>(pool, h, wd, bd, out, d.M, k, n, i);
               else
                 Layer<Act::Sigmoid>(pool, h, wd, bd, out, d.M, k, n, i);
               h = out;
             }
           })
        .release();
  }

  OpAttrs attrs;  // backend is irrelevant once the node sits on the CPU EP (see common/attrs.h)
  std::vector<int> acts;
  std::vector<ConstB> w;
  std::vector<ConstF32> bias;
  std::vector<ConstMatmul> mm;
  bool onednn = false;
  int mode = 0;
  PrepackLog log;
};

}  // namespace

void RegisterMLPStack(Ort::CustomOpDomain& domain) {
  AddVariadicOpAllTypes<MLPStackCpu>(domain, schema::MLPStack::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
