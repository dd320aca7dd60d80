// LoRALinear / LoRALinearRelu on the CPU EP: Y = act(X @ W + bias + scale * ((X @ A) @ B)).
// T = X @ A (M x r) is computed first, then scale * T rides as r extra reduction columns of the base GEMM
// ([X | scale*T] @ [W ; B]), so the rank-r update is accumulated in fp32 with the base product before the
// bias/activation epilogue — no second pass over Y. With oneDNN (constant W, A, B, bias): T = scale * (X @ A) in
// fp32 for all rows first, then per tile T @ B into an fp32 tile that X @ W adds as a post-op (after the bias,
// before the activation), written once as Y.
// MultiLoRALinear: each batch row's T = X @ A[j] (fp32, j its adapter) first, then the base GEMM whose epilogue adds
// bias + scales[j] * T @ B[j] per row of its tile before writing Y once.
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
    const auto wc = GetConstantInput(api, info, Op::kW), ac = GetConstantInput(api, info, Op::kA);
    la.template Init<T>(ac, 2);
    bias.template Init<T>(GetConstantInput(api, info, Op::kBias), 1);
    if (wc && ac && lb && wc->shape.size() == 2 && ac->shape.size() == 2 && lb->shape.size() == 2 &&
        ac->shape[0] == wc->shape[0] && lb->shape[0] == ac->shape[1] && lb->shape[1] == wc->shape[1] && bias.valid) {
      const int64_t K = wc->shape[0], N = wc->shape[1], r = ac->shape[1];
      MatmulSpec sa;  // T = scale * (X @ A), fp32 [M, r]
      sa.src = FormatOf<T>::value, sa.dst = Format::F32, sa.K = K, sa.N = r;
      sa.post = {PostOp::Scale};
      sa.scale = attrs.scale;
      MatmulSpec sb;  // T @ B (B in fp32) into a dense fp32 tile
      sb.src = sb.dst = Format::F32, sb.K = r, sb.N = N, sb.block_n = ColumnBlock(N);
      sb.ldy = -1;    // dense per block: the Add operand of X @ W
      MatmulSpec sw;  // act(X @ W + bias + tile)
      sw.src = sw.dst = FormatOf<T>::value, sw.K = K, sw.N = N, sw.block_n = ColumnBlock(N);
      sw.post = {PostOp::Add};
      if (Act_ == Act::Relu) sw.post.push_back(PostOp::Relu);
      b_f32 = ToF32Vector(static_cast<const T*>(lb->data), r * N);
      std::optional<ConstInput> b32 = ConstInput{b_f32.data(), lb->shape};
      onednn = mm_a.Init(sa, ac, nullptr) && mm_b.Init(sb, b32, nullptr) && mm_w.Init(sw, wc, &bias);
      mm_b.w = lb->data;  // Compute matches B by the constant's own pointer
    }
    if (!onednn) wb.Init(FormatOf<T>::value, wc, &lb);
    const std::string why = mm_a.why + mm_b.why + mm_w.why;  // the first that failed; empty when not tried
    log.Created(Op::kName, onednn
                               ? "W A B bias (oneDNN " + mm_w.mm.Describe(64) + ")"
                               : std::string(wb.valid ? "[W;B] " : "") + (la.valid ? "A " : "") +
                                     (bias.valid ? "bias" : "") + (why.empty() ? "" : " (built-in GEMM: " + why + ")"));
  }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& LA, const Ort::Custom::Tensor<T>& LB,
                      const Ort::Custom::Tensor<T>& B, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = LoRADims(Op::kName, X.Shape(), W.Shape(), LA.Shape(), LB.Shape(), B.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      const OrtPool pool(ctx);
      if (onednn && mm_w.Match(W.Data(), B.Data()) && mm_a.Match(LA.Data()) && mm_b.Match(LB.Data())) {
        log.Used(Op::kName, "oneDNN");
        const T* x = X.Data();
        const int64_t r = d.r, ld = std::min<int64_t>(ColumnBlock(d.N), d.N);
        std::vector<float> t(static_cast<size_t>(d.M * r));
        ForTiles(pool, d.M, 1,
                 [&](int64_t r0, int64_t rows, int64_t) { mm_a.mm.Run(rows, x + r0 * d.K, t.data() + r0 * r, 0); });
        ForTiles(pool, d.M, mm_w.mm.Blocks(), [&](int64_t r0, int64_t rows, int64_t j) {
          float* tile = reinterpret_cast<float*>(TileScratch(0, size_t(rows * ld) * sizeof(float)));
          mm_b.mm.Run(rows, t.data() + r0 * r, tile, j);
          mm_w.mm.Run(rows, x + r0 * d.K, y + r0 * d.N + mm_w.mm.BlockStart(j), j, tile);
        });
        return;
      }
      const BiasAct<T, Act_> epi(bias.Match(B.Data()), B.Data(), d.N, y);
      GemmArgs g = GemmFor(d, X.Data(), &epi.epilogue);
      g.pool = &pool;
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
  std::vector<float> b_f32;
  ConstMatmul mm_a, mm_b, mm_w;
  bool onednn = false;
  PrepackLog log;
};

template <typename T>
using LoRALinearCpu = LoRACpu<T, Act::None, schema::LoRALinear>;
template <typename T>
using LoRALinearReluCpu = LoRACpu<T, Act::Relu, schema::LoRALinearRelu>;

template <typename T>
struct MultiLoRALinearCpu {
  using Op = schema::MultiLoRALinear;
  MultiLoRALinearCpu(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, Op::kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W,
                      const Ort::Custom::Tensor<T>& LA, const Ort::Custom::Tensor<T>& LB,
                      const Ort::Custom::Tensor<T>& B, const Ort::Custom::Tensor<T>& S,
                      const Ort::Custom::Tensor<int64_t>& Index, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const MultiLoRADims d = MultiLoRALinearDims(Op::kName, X.Shape(), W.Shape(), LA.Shape(), LB.Shape(), B.Shape(),
                                                  S.Shape(), Index.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      const std::vector<int64_t> rows = RowAdapters(Op::kName, Index.Data(), d);
      const OrtPool pool(ctx);
      const std::vector<float> t = MultiXA(pool, X.Data(), LA.Data(), rows, d.M, d.K, d.r);
      const std::vector<float> bias = ToF32Vector(B.Data(), d.N);
      MultiLoRAEpilogue<T> epi;
      epi.bias = bias.data(), epi.t = t.data(), epi.b = LB.Data(), epi.scales = S.Data();
      epi.row_adapter = rows.data(), epi.y = y, epi.N = d.N, epi.r = d.r;
      GemmArgs g = GemmFor(d, X.Data(), &epi);
      g.pool = &pool;
      g.b[0] = BOperand{W.Data(), d.K, nullptr, nullptr};
      Gemm(g);
    });
  }
  OpAttrs attrs;
};

}  // namespace

void RegisterLoRALinear(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<MultiLoRALinearCpu>(domain, schema::MultiLoRALinear::kName, kCpuEp);
  AddOpAllTypes<LoRALinearCpu>(domain, schema::LoRALinear::kName, kCpuEp);
  AddOpAllTypes<LoRALinearReluCpu>(domain, schema::LoRALinearRelu::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
