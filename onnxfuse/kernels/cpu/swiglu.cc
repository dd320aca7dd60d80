// SwiGLU on the CPU EP: Y = act(X @ W_gate) * (X @ W_up), act the node's gate activation (common/gate_act.h). Both
// GEMMs run tile by tile, so the gate and up products of a tile meet without a full-size intermediate. With oneDNN
// (constant weights, a silu, gelu_tanh, quick_gelu or sigmoid gate): per tile, act(X @ W_gate) into an fp32 tile (an
// eltwise post-op: swish, gelu_tanh, swish with alpha 1.702, logistic), then X @ W_up with a multiply by that tile as
// a post-op, written once as Y. Otherwise (a relu or gelu gate, weights that are not constants, no oneDNN) the
// built-in GEMM carries both accumulators to one epilogue.
#include <algorithm>
#include <type_traits>
#include <vector>

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

// Calls f(std::integral_constant<int, A>{}) for the node's activation code A, so each epilogue is compiled per
// activation (no branch in its inner loop).
template <typename F>
void WithGateAct(int act, F&& f) {
  switch (act) {
    case ONNXFUSE_GATE_GELU:
      return f(std::integral_constant<int, ONNXFUSE_GATE_GELU>{});
    case ONNXFUSE_GATE_GELU_TANH:
      return f(std::integral_constant<int, ONNXFUSE_GATE_GELU_TANH>{});
    case ONNXFUSE_GATE_QUICK_GELU:
      return f(std::integral_constant<int, ONNXFUSE_GATE_QUICK_GELU>{});
    case ONNXFUSE_GATE_RELU:
      return f(std::integral_constant<int, ONNXFUSE_GATE_RELU>{});
    case ONNXFUSE_GATE_SIGMOID:
      return f(std::integral_constant<int, ONNXFUSE_GATE_SIGMOID>{});
    default:
      return f(std::integral_constant<int, ONNXFUSE_GATE_SILU>{});
  }
}

// The oneDNN post-op that computes gate activation `act`. None for relu (oneDNN's is max(x, 0), which loses NaN)
// and for gelu (erf): oneDNN 3.2's AVX-512 gelu_erf gives NaN for +Inf where gelu(+Inf) = +Inf (onnxfuse doctor
// --special-values on a Sapphire Rapids Xeon); both run in the built-in GEMM's epilogue.
std::optional<PostOp> GatePostOp(int act) {
  switch (act) {
    case ONNXFUSE_GATE_SILU:
      return PostOp::Swish;
    case ONNXFUSE_GATE_QUICK_GELU:
      return PostOp::QuickGelu;
    case ONNXFUSE_GATE_GELU_TANH:
      return PostOp::GeluTanh;
    case ONNXFUSE_GATE_SIGMOID:
      return PostOp::Sigmoid;
    default:
      return std::nullopt;
  }
}

// Constant W_gate / W_up are prepared once, at kernel creation.
template <typename T>
struct SwiGLUCpu {
  using Op = schema::SwiGLU;
  SwiGLUCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)),
        act(ReadGateActivation(api, info, Op::kName)),
        log(LoggerOf(api, info)) {
    const auto gc = GetConstantInput(api, info, Op::kWGate), uc = GetConstantInput(api, info, Op::kWUp);
    // The gate activations with a faithful oneDNN eltwise post-op (GatePostOp) run on oneDNN; relu and gelu in the
    // built-in GEMM's epilogue.
    const std::optional<PostOp> gate_post = GatePostOp(act);
    if (gate_post && gc && uc && gc->shape.size() == 2 && gc->shape == uc->shape) {
      // silu(X @ W_gate) into a dense fp32 tile, then (X @ W_up) * tile as a binary post-op. (The other order,
      // swish then a multiply in one post-op chain, has no brgemm kernel in oneDNN 3.2: it runs the reference one.)
      MatmulSpec spec;
      spec.src = FormatOf<T>::value;
      spec.K = gc->shape[0], spec.N = gc->shape[1];
      spec.block_n = ColumnBlock(spec.N);
      spec.dst = Format::F32;
      spec.ldy = -1;
      spec.post = {*gate_post};
      onednn = gate.Init(spec, gc, nullptr);
      spec.dst = FormatOf<T>::value;
      spec.ldy = 0;
      spec.post = {PostOp::Mul};
      onednn = onednn && up.Init(spec, uc, nullptr);
    }
    if (!onednn) {
      wg.Init(FormatOf<T>::value, gc);
      wu.Init(FormatOf<T>::value, uc);
    }
    const std::string why = !gate_post ? "a relu or gelu gate (kept in the built-in epilogue)" : up.why + gate.why;
    log.Created(Op::kName, onednn ? "W_gate W_up (oneDNN " + gate.mm.Describe(64) + ", " + up.mm.Describe(64) + ")"
                                  : std::string(wg.valid ? "W_gate " : "") + (wu.valid ? "W_up" : "") +
                                        (gc && uc ? " (built-in GEMM: " + why + ")" : ""));
  }
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W_gate,
                      const Ort::Custom::Tensor<T>& W_up, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LinearDims d = SwiGLUDims(Op::kName, X.Shape(), W_gate.Shape(), W_up.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      const OrtPool pool(ctx);
      if (onednn && gate.Match(W_gate.Data()) && up.Match(W_up.Data())) {
        log.Used(Op::kName, "oneDNN");
        const T* x = X.Data();
        const int64_t ld = std::min<int64_t>(ColumnBlock(d.N), d.N);
        ForTiles(pool, d.M, gate.mm.Blocks(), [&](int64_t r0, int64_t rows, int64_t j) {
          float* tile = reinterpret_cast<float*>(TileScratch(0, size_t(rows * ld) * sizeof(float)));
          gate.mm.Run(rows, x + r0 * d.K, tile, j);
          up.mm.Run(rows, x + r0 * d.K, y + r0 * d.N + up.mm.BlockStart(j), j, tile);
        });
        return;
      }
      GemmArgs g = GemmFor(d, X.Data(), nullptr);
      g.pool = &pool;
      g.num_b = 2;
      g.b[0] = BOperand{W_gate.Data(), d.K, nullptr, wg.Match(W_gate.Data())};
      g.b[1] = BOperand{W_up.Data(), d.K, nullptr, wu.Match(W_up.Data())};
      if (g.b[0].packed != nullptr || g.b[1].packed != nullptr) log.Used(Op::kName);
      WithGateAct(act, [&](auto code) { RunSwiGLU<T, decltype(code)::value>(g, y, d.N); });
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act, checked when the kernel is created
  ConstB wg, wu;
  ConstMatmul gate, up;
  bool onednn = false;
  PrepackLog log;
};

// LoRASwiGLU: one pass of the built-in GEMM over both base products (SwiGLU's), each rank-r term added in the
// epilogue to its finished base sum: T = s X @ A ([M, r], fp32) and B (fp32) first, then per output g = acc_gate +
// T_gate[m] . B_gate[:, n], u likewise, y = act(g) * u. (The LoRA columns of the GEMM's reduction, as LoRALinear's
// kernel adds them, mix the rank-r products into the base sum's order: with the type's largest values a partial sum
// overflowed to +Inf and met the adapter's -Inf, a NaN the reference has not; onnxfuse doctor --special-values.)
template <typename T, int A>
struct LoRASwiGLUEpilogue final : Epilogue {
  const float *tg, *bg, *tu, *bu;  // T [M, r], B [r, N] per projection, fp32
  int64_t rg, ru, N;
  T* y;
  void Apply(int64_t m0, int64_t mb, int64_t n0, int64_t nc, const float* const* acc, int64_t ld) const override {
    for (int64_t i = 0; i < mb; ++i) {
      const float *g = acc[0] + i * ld, *u = acc[1] + i * ld;
      const float *ti = tg + (m0 + i) * rg, *si = tu + (m0 + i) * ru;
      T* out = y + (m0 + i) * N + n0;
      for (int64_t j = 0; j < nc; ++j) {
        float dg = 0.f, du = 0.f;
        for (int64_t c = 0; c < rg; ++c) dg += ti[c] * bg[c * N + n0 + j];
        for (int64_t c = 0; c < ru; ++c) du += si[c] * bu[c * N + n0 + j];
        out[j] = FromF32<T>(GateAct<A>(g[j] + dg) * (u[j] + du));
      }
    }
  }
};

// T = scale * X @ A in fp32 ([M, r]).
template <typename T>
std::vector<float> ScaledXA(const T* x, const T* a, int64_t M, int64_t K, int64_t r, float scale) {
  std::vector<float> t(size_t(M * r), 0.f), af(size_t(K * r));
  for (int64_t i = 0; i < K * r; ++i) af[size_t(i)] = ToF32(a[i]);
  for (int64_t m = 0; m < M; ++m) {
    float* tm = t.data() + m * r;
    for (int64_t k = 0; k < K; ++k) {
      const float xv = ToF32(x[m * K + k]);
      for (int64_t c = 0; c < r; ++c) tm[c] += xv * af[size_t(k * r + c)];
    }
    for (int64_t c = 0; c < r; ++c) tm[c] *= scale;
  }
  return t;
}

// LoRASwiGLU's pass over raw buffers (d: LoRASwiGLUDims'; y [M, N]): what LoRASwiGLU and LoRAGatedMLP run.
template <typename T>
void RunLoRASwiGLU(const ParallelRunner& pool, int act, const LinearDims& d, int64_t ru, const T* x, const T* wg,
                   const T* wu, const T* ag, const T* bg_t, const T* au, const T* bu_t, float scale_gate,
                   float scale_up, T* y) {
  const int64_t rg = d.r;
  const std::vector<float> tg = ScaledXA(x, ag, d.M, d.K, rg, scale_gate);
  const std::vector<float> tu = ScaledXA(x, au, d.M, d.K, ru, scale_up);
  const std::vector<float> bg = ToF32Vector(bg_t, rg * d.N), bu = ToF32Vector(bu_t, ru * d.N);
  GemmArgs g = GemmFor(d, x, nullptr);
  g.pool = &pool;
  g.num_b = 2;
  g.b[0] = BOperand{wg, d.K, nullptr, nullptr};
  g.b[1] = BOperand{wu, d.K, nullptr, nullptr};
  WithGateAct(act, [&](auto code) {
    LoRASwiGLUEpilogue<T, decltype(code)::value> epi;
    epi.tg = tg.data(), epi.bg = bg.data(), epi.tu = tu.data(), epi.bu = bu.data();
    epi.rg = rg, epi.ru = ru, epi.N = d.N, epi.y = y;
    g.epilogue = &epi;
    Gemm(g);
  });
}

template <typename T>
struct LoRASwiGLUCpu {
  using Op = schema::LoRASwiGLU;
  LoRASwiGLUCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), act(ReadGateActivation(api, info, Op::kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W_gate,
                      const Ort::Custom::Tensor<T>& W_up, const Ort::Custom::Tensor<T>& A_gate,
                      const Ort::Custom::Tensor<T>& B_gate, const Ort::Custom::Tensor<T>& A_up,
                      const Ort::Custom::Tensor<T>& B_up, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      int64_t ru = 0;
      const LinearDims d = LoRASwiGLUDims(Op::kName, X.Shape(), W_gate.Shape(), W_up.Shape(), A_gate.Shape(),
                                          B_gate.Shape(), A_up.Shape(), B_up.Shape(), &ru);
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      const OrtPool pool(ctx);
      RunLoRASwiGLU(pool, act, d, ru, X.Data(), W_gate.Data(), W_up.Data(), A_gate.Data(), B_gate.Data(), A_up.Data(),
                    B_up.Data(), attrs.scale_gate, attrs.scale_up, y);
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act, checked when the kernel is created
};

// MultiLoRASwiGLU: LoRASwiGLU's pass with each row's own adapter per projection (MultiXA's T, AddRankTerm).
template <typename T, int A>
struct MultiLoRASwiGLUEpilogue final : Epilogue {
  const float *tg, *tu;        // T [M, r] per projection, fp32
  const T *bg, *bu, *sg, *su;  // B [n, r, N] and scales [n] per projection
  const int64_t* row_adapter;  // [M], < 0 for none
  int64_t rg, ru, N;
  T* y;
  void Apply(int64_t m0, int64_t mb, int64_t n0, int64_t nc, const float* const* acc, int64_t ld) const override {
    std::vector<float> g(static_cast<size_t>(nc)), u(static_cast<size_t>(nc)), br(static_cast<size_t>(nc));
    for (int64_t i = 0; i < mb; ++i) {
      const int64_t m = m0 + i, j = row_adapter[m];
      std::copy(acc[0] + i * ld, acc[0] + i * ld + nc, g.begin());
      std::copy(acc[1] + i * ld, acc[1] + i * ld + nc, u.begin());
      if (j >= 0) {
        AddRankTerm(g.data(), br.data(), tg + m * rg, bg, j, rg, N, n0, nc, ToF32<T>(sg[j]));
        AddRankTerm(u.data(), br.data(), tu + m * ru, bu, j, ru, N, n0, nc, ToF32<T>(su[j]));
      }
      T* out = y + m * N + n0;
      for (int64_t c = 0; c < nc; ++c) out[c] = FromF32<T>(GateAct<A>(g[c]) * u[c]);
    }
  }
};

// MultiLoRASwiGLU's pass over raw buffers (d: MultiLoRASwiGLUDims'; rows: RowAdapters'; y [M, N]).
template <typename T>
void RunMultiLoRASwiGLU(const ParallelRunner& pool, int act, const MultiLoRADims& d, int64_t ru,
                        const std::vector<int64_t>& rows, const T* x, const T* wg, const T* wu, const T* ag,
                        const T* bg, const T* au, const T* bu, const T* sg, const T* su, T* y) {
  const std::vector<float> tg = MultiXA(pool, x, ag, rows, d.M, d.K, d.r);
  const std::vector<float> tu = MultiXA(pool, x, au, rows, d.M, d.K, ru);
  GemmArgs g = GemmFor(d, x, nullptr);
  g.pool = &pool;
  g.num_b = 2;
  g.b[0] = BOperand{wg, d.K, nullptr, nullptr};
  g.b[1] = BOperand{wu, d.K, nullptr, nullptr};
  WithGateAct(act, [&](auto code) {
    MultiLoRASwiGLUEpilogue<T, decltype(code)::value> epi;
    epi.tg = tg.data(), epi.tu = tu.data(), epi.bg = bg, epi.bu = bu;
    epi.sg = sg, epi.su = su, epi.row_adapter = rows.data();
    epi.rg = d.r, epi.ru = ru, epi.N = d.N, epi.y = y;
    g.epilogue = &epi;
    Gemm(g);
  });
}

template <typename T>
struct MultiLoRASwiGLUCpu {
  using Op = schema::MultiLoRASwiGLU;
  MultiLoRASwiGLUCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), act(ReadGateActivation(api, info, Op::kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<T>& X, const Ort::Custom::Tensor<T>& W_gate,
                      const Ort::Custom::Tensor<T>& W_up, const Ort::Custom::Tensor<T>& A_gate,
                      const Ort::Custom::Tensor<T>& B_gate, const Ort::Custom::Tensor<T>& A_up,
                      const Ort::Custom::Tensor<T>& B_up, const Ort::Custom::Tensor<T>& S_gate,
                      const Ort::Custom::Tensor<T>& S_up, const Ort::Custom::Tensor<int64_t>& Index,
                      Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      int64_t ru = 0;
      const MultiLoRADims d =
          MultiLoRASwiGLUDims(Op::kName, X.Shape(), W_gate.Shape(), W_up.Shape(), A_gate.Shape(), B_gate.Shape(),
                              A_up.Shape(), B_up.Shape(), S_gate.Shape(), S_up.Shape(), Index.Shape(), &ru);
      T* y = Y.Allocate(d.out_shape);
      if (d.M == 0 || d.N == 0) return;
      const std::vector<int64_t> rows = RowAdapters(Op::kName, Index.Data(), d);
      const OrtPool pool(ctx);
      RunMultiLoRASwiGLU(pool, act, d, ru, rows, X.Data(), W_gate.Data(), W_up.Data(), A_gate.Data(), B_gate.Data(),
                         A_up.Data(), B_up.Data(), S_gate.Data(), S_up.Data(), y);
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act, checked when the kernel is created
};

// LoRAGatedMLP: LoRASwiGLU's pass into the activation H [M, N] (a buffer of the op), then the down projection as
// LoRALinear's built-in GEMM on H: its adapter's scale * (H @ A_down) as rank-r extra reduction columns over [W_down ;
// B_down], the bias in the epilogue.
template <typename T>
struct LoRAGatedMLPCpu {
  using Op = schema::LoRAGatedMLP;
  using In = Ort::Custom::Tensor<T>;
  LoRAGatedMLPCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), act(ReadGateActivation(api, info, Op::kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const In& X, const In& W_gate, const In& W_up, const In& A_gate,
                      const In& B_gate, const In& A_up, const In& B_up, const In& W_down, const In& A_down,
                      const In& B_down, const In& bias_down, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const GatedMLPDims d = LoRAGatedMLPDims(Op::kName, X.Shape(), W_gate.Shape(), W_up.Shape(), A_gate.Shape(),
                                              B_gate.Shape(), A_up.Shape(), B_up.Shape(), W_down.Shape(),
                                              A_down.Shape(), B_down.Shape(), bias_down.Shape());
      T* y = Y.Allocate(d.down.out_shape);
      if (d.down.M == 0 || d.down.N == 0) return;
      const OrtPool pool(ctx);
      std::vector<T> h(static_cast<size_t>(d.gated.M * d.gated.N));
      if (d.gated.N > 0)
        RunLoRASwiGLU(pool, act, d.gated, d.ru, X.Data(), W_gate.Data(), W_up.Data(), A_gate.Data(), B_gate.Data(),
                      A_up.Data(), B_up.Data(), attrs.scale_gate, attrs.scale_up, h.data());
      const BiasAct<T, Act::None> epi(nullptr, bias_down.Data(), d.down.N, y);
      GemmArgs g = GemmFor(d.down, h.data(), &epi.epilogue);
      g.pool = &pool;
      g.r = d.down.r;
      g.lora_a = A_down.Data();
      g.lora_scale = attrs.scale_down;
      g.b[0] = BOperand{W_down.Data(), d.down.K, B_down.Data(), nullptr};
      Gemm(g);
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act, checked when the kernel is created
};

// MultiLoRAGatedMLP: MultiLoRASwiGLU's pass into H, then MultiLoRALinear's (each row's T = H @ A_down[j], the base
// GEMM with MultiLoRAEpilogue).
template <typename T>
struct MultiLoRAGatedMLPCpu {
  using Op = schema::MultiLoRAGatedMLP;
  using In = Ort::Custom::Tensor<T>;
  MultiLoRAGatedMLPCpu(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, Op::kName)), act(ReadGateActivation(api, info, Op::kName)) {}
  Ort::Status Compute(OrtKernelContext* ctx, const In& X, const In& W_gate, const In& W_up, const In& A_gate,
                      const In& B_gate, const In& A_up, const In& B_up, const In& W_down, const In& A_down,
                      const In& B_down, const In& bias_down, const In& S_gate, const In& S_up, const In& S_down,
                      const Ort::Custom::Tensor<int64_t>& Index, Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const MultiGatedMLPDims d =
          MultiLoRAGatedMLPDims(Op::kName, X.Shape(), W_gate.Shape(), W_up.Shape(), A_gate.Shape(), B_gate.Shape(),
                                A_up.Shape(), B_up.Shape(), W_down.Shape(), A_down.Shape(), B_down.Shape(),
                                bias_down.Shape(), S_gate.Shape(), S_up.Shape(), S_down.Shape(), Index.Shape());
      T* y = Y.Allocate(d.down.out_shape);
      if (d.down.M == 0 || d.down.N == 0) return;
      const std::vector<int64_t> rows = RowAdapters(Op::kName, Index.Data(), d.gated);
      const OrtPool pool(ctx);
      std::vector<T> h(static_cast<size_t>(d.gated.M * d.gated.N));
      if (d.gated.N > 0)
        RunMultiLoRASwiGLU(pool, act, d.gated, d.ru, rows, X.Data(), W_gate.Data(), W_up.Data(), A_gate.Data(),
                           B_gate.Data(), A_up.Data(), B_up.Data(), S_gate.Data(), S_up.Data(), h.data());
      const std::vector<float> t = MultiXA(pool, h.data(), A_down.Data(), rows, d.down.M, d.down.K, d.down.r);
      const std::vector<float> bias = ToF32Vector(bias_down.Data(), d.down.N);
      MultiLoRAEpilogue<T> epi;
      epi.bias = bias.data(), epi.t = t.data(), epi.b = B_down.Data(), epi.scales = S_down.Data();
      epi.row_adapter = rows.data(), epi.y = y, epi.N = d.down.N, epi.r = d.down.r;
      GemmArgs g = GemmFor(d.down, h.data(), &epi);
      g.pool = &pool;
      g.b[0] = BOperand{W_down.Data(), d.down.K, nullptr, nullptr};
      Gemm(g);
    });
  }
  OpAttrs attrs;
  int act;  // onnxfuse_gate_act, checked when the kernel is created
};

}  // namespace

void RegisterSwiGLU(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<SwiGLUCpu>(domain, schema::SwiGLU::kName, kCpuEp);
  AddOpAllTypes<LoRASwiGLUCpu>(domain, schema::LoRASwiGLU::kName, kCpuEp);
  AddOpAllTypes<MultiLoRASwiGLUCpu>(domain, schema::MultiLoRASwiGLU::kName, kCpuEp);
  AddOpAllTypes<LoRAGatedMLPCpu>(domain, schema::LoRAGatedMLP::kName, kCpuEp);
  AddOpAllTypes<MultiLoRAGatedMLPCpu>(domain, schema::MultiLoRAGatedMLP::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
