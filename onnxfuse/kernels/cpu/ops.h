// Pieces shared by the CPU op files (linear_act.cc, swiglu.cc, lora_linear.cc, mlp_stack.cc, embedding_interaction.cc):
// element-type mapping, the bias + activation epilogue, constant-weight prepacking, and the per-file registration hooks
// that register_cpu.cc calls.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/attrs.h"
#include "common/dims.h"
#include "common/registry.h"
#include "common/status.h"
#include "cpu/gemm.h"
#include "cpu/onednn_gemm.h"

namespace onnxfuse {
namespace cpu {

template <typename T>
struct FormatOf;
template <>
struct FormatOf<float> {
  static constexpr Format value = Format::F32;
};
template <>
struct FormatOf<Ort::Float16_t> {
  static constexpr Format value = Format::F16;
};
template <>
struct FormatOf<Ort::BFloat16_t> {
  static constexpr Format value = Format::BF16;
};

template <typename T>
inline float ToF32(T v);
template <>
inline float ToF32<float>(float v) {
  return v;
}
template <>
inline float ToF32<Ort::Float16_t>(Ort::Float16_t v) {
  return F16BitsToF32(v.val);
}
template <>
inline float ToF32<Ort::BFloat16_t>(Ort::BFloat16_t v) {
  return Bf16BitsToF32(v.val);
}

template <typename T>
inline T FromF32(float v);
template <>
inline float FromF32<float>(float v) {
  return v;
}
template <>
inline Ort::Float16_t FromF32<Ort::Float16_t>(float v) {
  return Ort::Float16_t::FromBits(F32ToF16Bits(v));
}
template <>
inline Ort::BFloat16_t FromF32<Ort::BFloat16_t>(float v) {
  return Ort::BFloat16_t::FromBits(F32ToBf16Bits(v));
}

// Transcendentals in fp32 (schema rule). 1 / (1 + e^-z) is exact enough and saturates cleanly: e^-z = inf -> 0.
inline float Sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

enum class Act { None, Relu, Sigmoid };

// Y = act(acc + bias) for one tile; bias is converted to fp32 once per call.
template <typename T, Act A>
struct BiasActEpilogue final : Epilogue {
  const float* bias;  // [N] fp32
  T* y;               // [M, N]
  int64_t N;
  void Apply(int64_t m0, int64_t mb, int64_t n0, int64_t nc, const float* const* acc, int64_t ld) const override {
    for (int64_t i = 0; i < mb; ++i) {
      const float* a = acc[0] + i * ld;
      T* out = y + (m0 + i) * N + n0;
      const float* bs = bias + n0;
      for (int64_t j = 0; j < nc; ++j) {
        float z = a[j] + bs[j];
        if (A == Act::Relu) z = z > 0.f ? z : (z == z ? 0.f : z);  // NaN stays NaN, like torch.relu
        if (A == Act::Sigmoid) z = Sigmoid(z);
        out[j] = FromF32<T>(z);
      }
    }
  }
};

template <typename T>
std::vector<float> ToF32Vector(const T* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = ToF32<T>(p[i]);
  return out;
}

// One row's residual add and RMS norm as onnxruntime's SkipSimplifiedLayerNormalization computes them: sum = T(a + b)
// (a may be sum itself), y = T(sum * rsqrt(mean(sum^2) + eps) * gamma), the norm of the rounded sum.
template <typename T>
void SkipRmsNormRow(const T* a, const T* b, const float* gamma, float eps, int64_t n, T* sum, T* y) {
  float sq = 0.f;
  for (int64_t j = 0; j < n; ++j) {
    sum[j] = FromF32<T>(ToF32(a[j]) + ToF32(b[j]));  // the sum in T: what the next layer adds to
    const float v = ToF32(sum[j]);
    sq += v * v;
  }
  const float inv = 1.f / std::sqrt(sq / float(n) + eps);
  for (int64_t j = 0; j < n; ++j) y[j] = FromF32<T>(ToF32(sum[j]) * inv * gamma[j]);
}

// The GEMM every op runs: X [M, K] (row-major, type T) times the B operands the caller adds, fp32 accumulation,
// `epilogue` applied per output tile.
template <typename T>
GemmArgs GemmFor(const LinearDims& d, const T* x, const Epilogue* epilogue) {
  GemmArgs g;
  g.fmt = FormatOf<T>::value;
  g.M = d.M, g.K = d.K, g.N = d.N;
  g.x = x;
  g.epilogue = epilogue;
  return g;
}

// Bias + activation epilogue. `bias_pre`, when non-null, is the bias already in fp32 (a constant converted at
// kernel creation); otherwise the bias is converted once per call into an owned copy.
template <typename T, Act A>
struct BiasAct {
  std::vector<float> bias_f32;
  BiasActEpilogue<T, A> epilogue;
  BiasAct(const float* bias_pre, const T* bias, int64_t n, T* y) {
    if (bias_pre == nullptr) bias_f32 = ToF32Vector(bias, n);
    epilogue.bias = bias_pre != nullptr ? bias_pre : bias_f32.data();
    epilogue.y = y;
    epilogue.N = n;
  }
  BiasAct(const BiasAct&) = delete;
  BiasAct& operator=(const BiasAct&) = delete;
};

// ------------------------------------------------------------------------------------------------ constant inputs
// Inputs that are constant initializers are converted/packed once, when ORT creates the kernel (once per node and
// session). ORT keeps a constant's OrtValue alive for the session, so its data pointer identifies it: Compute uses
// the prepared copy only when it is handed that same pointer, and falls back to the per-call path otherwise (an
// initializer that is also a graph input can be overridden per run, and ORT does not report it as constant).
// KernelInfoGetConstantInput_tensor is in the OrtApi since version 15 (onnxruntime 1.15); we ask for 21.

struct ConstInput {
  const void* data = nullptr;
  std::vector<int64_t> shape;
};

// The tensor of input `index` if it is a constant initializer, else nullopt (also on any API error).
inline std::optional<ConstInput> GetConstantInput(const OrtApi* api, const OrtKernelInfo* info, size_t index) {
  auto ok = [api](OrtStatus* st) {
    if (st == nullptr) return true;
    api->ReleaseStatus(st);
    return false;
  };
  int is_constant = 0;
  const OrtValue* value = nullptr;
  if (!ok(api->KernelInfoGetConstantInput_tensor(info, index, &is_constant, &value)) || !is_constant || !value)
    return std::nullopt;
  OrtTensorTypeAndShapeInfo* ti = nullptr;
  if (!ok(api->GetTensorTypeAndShape(value, &ti))) return std::nullopt;
  size_t rank = 0;
  ConstInput c;
  bool good = ok(api->GetDimensionsCount(ti, &rank));
  if (good) {
    c.shape.resize(rank);
    good = ok(api->GetDimensions(ti, c.shape.data(), rank));
  }
  api->ReleaseTensorTypeAndShapeInfo(ti);
  void* data = nullptr;
  if (!good || !ok(api->GetTensorMutableData(const_cast<OrtValue*>(value), &data)) || data == nullptr)
    return std::nullopt;
  c.data = data;
  return c;
}

// A B operand ([main ; extra], K + r rows) packed at kernel creation when every part of it is a constant.
struct ConstB {
  const void* main = nullptr;  // the constants' data pointers, to recognise them in Compute
  const void* extra = nullptr;
  PackedB packed;
  bool valid = false;

  // main [K, N] (+ extra [r, N]) as the schema requires; other shapes are left to Compute's checks.
  void Init(Format fmt, const std::optional<ConstInput>& m, const std::optional<ConstInput>* e = nullptr) {
    if (!m || m->shape.size() != 2) return;
    const int64_t K = m->shape[0], N = m->shape[1];
    int64_t r = 0;
    if (e != nullptr) {
      if (!*e || (*e)->shape.size() != 2 || (*e)->shape[1] != N) return;
      r = (*e)->shape[0];
      extra = (*e)->data;
    }
    main = m->data;
    packed = PackB(fmt, BOperand{main, K, extra}, K + r, N);
    valid = true;
  }
  // The prepacked operand if `m` / `e` are the constants it was built from, else nullptr.
  const PackedB* Match(const void* m, const void* e = nullptr) const {
    return valid && m == main && e == extra ? &packed : nullptr;
  }
};

// A constant input of the given rank (bias, LoRA's A) converted to fp32 at kernel creation.
struct ConstF32 {
  const void* src = nullptr;
  std::vector<float> data;
  bool valid = false;
  template <typename T>
  void Init(const std::optional<ConstInput>& c, size_t rank) {
    if (!c || c->shape.size() != rank) return;
    int64_t n = 1;
    for (int64_t s : c->shape) n *= s;
    data = ToF32Vector(static_cast<const T*>(c->data), n);
    src = c->data;
    valid = true;
  }
  const float* Match(const void* p) const { return valid && p == src ? data.data() : nullptr; }
};

// Diagnostics of the prepacked path for one kernel, at INFO level on the session's logger (shown with
// SessionOptions.log_severity_level <= 1): what was prepared at kernel creation, and the first Compute that used it.
// The logger is the session's, which outlives the kernel.
struct PrepackLog {
  const OrtLogger* logger = nullptr;
  std::atomic<bool> said{false};
  explicit PrepackLog(const OrtLogger* l) : logger(l) {}
  void Created(const char* op, const std::string& what) const {
    LogTo(logger, ORT_LOGGING_LEVEL_INFO,
          std::string("onnxfuse[cpu] ") + op + ": prepacked " +
              (what.empty() ? std::string("nothing (no constant weights)") : what));
  }
  void Used(const char* op, const char* engine = "built-in GEMM") {
    if (!said.exchange(true, std::memory_order_relaxed))
      LogTo(logger, ORT_LOGGING_LEVEL_INFO,
            std::string("onnxfuse[cpu] ") + op + ": computing with prepacked weights (" + engine + ")");
  }
};

// ------------------------------------------------------------------------------------------------ threads
// onnxruntime's intra-op pool for one Compute (KernelContext_ParallelFor, ORT API 17+; MLAS runs on the same
// pool). Its threads spin during a run, so handing tiles to it costs about nothing, where a pool of our own would
// compete with them for the cores. A session with intra_op_num_threads=1 has no pool: everything runs inline.
// Bodies must not let exceptions into onnxruntime's threads: the first one is kept and rethrown here.
struct OrtPool final : ParallelRunner {
  const OrtKernelContext* ctx;
  explicit OrtPool(const OrtKernelContext* c) : ctx(c) {}
  void For(int64_t n, const std::function<void(int64_t)>& body) const override {
    if (n <= 0) return;
    if (n == 1) return body(0);
    struct Job {
      const std::function<void(int64_t)>* body;
      std::atomic<bool> failed{false};
      std::mutex mu;
      std::exception_ptr error;
    } job;
    job.body = &body;
    auto run = [](void* user, size_t i) {
      Job* j = static_cast<Job*>(user);
      if (j->failed.load(std::memory_order_relaxed)) return;
      try {
        (*j->body)(static_cast<int64_t>(i));
      } catch (...) {
        std::lock_guard<std::mutex> lock(j->mu);
        if (!j->error) j->error = std::current_exception();
        j->failed.store(true);
      }
    };
    OrtStatus* st = Ort::GetApi().KernelContext_ParallelFor(ctx, run, static_cast<size_t>(n), 0, &job);
    if (st != nullptr) {  // no pool to run on: do it here
      Ort::GetApi().ReleaseStatus(st);
      for (int64_t i = 0; i < n && !job.failed.load(); ++i) run(&job, static_cast<size_t>(i));
    }
    if (job.error) std::rethrow_exception(job.error);
  }
};

// Rows per tile so that row blocks x column blocks give every thread about `per_thread` tiles (balanced on the
// pool's dynamic scheduling) without tiles so small that a call costs more than its arithmetic: a multiple of 8,
// at most max_rows.
inline int64_t RowBlock(int64_t M, int64_t col_blocks, int64_t max_rows = 256, int64_t per_thread = 2,
                        int64_t min_rows = 8) {
  const int64_t want = per_thread * int64_t(NumThreads());
  int64_t mb = std::min<int64_t>(M, max_rows);
  while (mb > min_rows && ((M + mb - 1) / mb) * col_blocks < want)
    mb = std::max<int64_t>(min_rows, (mb / 2 + 7) / 8 * 8);
  return std::max<int64_t>(mb, 1);
}

// body(row0, rows, block) for every tile of M rows x `blocks` column blocks, on `pool`. Consecutive tiles walk
// down the rows of one column block, so a thread's next tile usually finds that block's weights in cache.
template <typename F>
void ForTiles(const ParallelRunner& pool, int64_t M, int64_t blocks, F&& body, int64_t max_rows = 256,
              int64_t per_thread = 2) {
  if (M <= 0 || blocks <= 0) return;
  const int64_t mb = RowBlock(M, blocks, max_rows, per_thread);
  const int64_t row_blocks = (M + mb - 1) / mb;
  pool.For(row_blocks * blocks, [&](int64_t t) {
    const int64_t rb = t % row_blocks, j = t / row_blocks;
    body(rb * mb, std::min(mb, M - rb * mb), j);
  });
}

// Column block width of the oneDNN GEMMs of LinearAct/SwiGLU/LoRA: tiles narrow enough to spread a few rows over
// the threads, wide enough that a call is mostly arithmetic (oneDNN's own N blocking is 16-64).
inline int64_t ColumnBlock(int64_t N) { return N <= 256 ? N : 128; }

inline size_t ElemBytes(Format f) { return f == Format::F32 ? 4 : 2; }

// A constant weight (and bias) prepared for oneDNN at kernel creation; Compute uses it only when handed the same
// constants (see ConstInput above), else the built-in GEMM.
struct ConstMatmul {
  const void* w = nullptr;
  const void* bias = nullptr;
  OnednnMatmul mm;
  std::string why;  // why oneDNN is not used, for the log
  bool Init(const MatmulSpec& spec, const std::optional<ConstInput>& wc, const ConstF32* bias_c) {
    if (!wc || wc->shape.size() != 2 || wc->shape[0] != spec.K || wc->shape[1] != spec.N) {
      why = "W is not a constant";
      return false;
    }
    if (bias_c != nullptr && !bias_c->valid) {
      why = "bias is not a constant";
      return false;
    }
    if (!mm.Init(spec, wc->data, bias_c != nullptr ? bias_c->data.data() : nullptr, &why)) return false;
    w = wc->data;
    bias = bias_c != nullptr ? bias_c->src : nullptr;
    return true;
  }
  bool Match(const void* wd, const void* bd = nullptr) const { return mm.Valid() && wd == w && bd == bias; }
  // Y [M, N] = X @ W (+ bias, post-ops) in tiles of rows x column blocks on `pool` (after Match).
  template <typename T>
  void Run(const ParallelRunner& pool, const LinearDims& d, const T* x, T* y) {
    ForTiles(pool, d.M, mm.Blocks(), [&](int64_t r0, int64_t rows, int64_t j) {
      mm.Run(rows, x + r0 * d.K, y + r0 * d.N + mm.BlockStart(j), j);
    });
  }
};

// Y = X @ W on the built-in GEMM with `epilogue` writing Y: W prepacked where `w` holds this call's W (logged once).
template <typename T>
void GemmWithW(const ParallelRunner& pool, const LinearDims& d, const T* x, const T* wd, const ConstB& w,
               const Epilogue* epilogue, PrepackLog& log, const char* op) {
  GemmArgs g = GemmFor(d, x, epilogue);
  g.pool = &pool;
  g.b[0] = BOperand{wd, d.K, nullptr, w.Match(wd)};
  if (g.b[0].packed != nullptr) log.Used(op);
  Gemm(g);
}

// Per-thread scratch bytes for a tile's intermediates (kept between calls).
inline char* TileScratch(int slot, size_t bytes) {
  static thread_local std::vector<char> buf[3];
  if (buf[slot].size() < bytes) buf[slot].resize(bytes);
  return buf[slot].data();
}

// ------------------------------------------------------------------------------------------------ mixed adapter
// batches MultiLoRALinear's and MultiLoRASwiGLU's rows: the adapter of each row of X (adapter_index[row /
// rows_per_index], -1 for none); an index >= n fails naming the op.
inline std::vector<int64_t> RowAdapters(const char* op, const int64_t* index, const MultiLoRADims& d) {
  std::vector<int64_t> rows(static_cast<size_t>(d.M));
  for (int64_t i = 0; i < d.batch; ++i) {
    const int64_t j = index[i];
    if (j >= d.adapters)
      Fail(std::string(op) + ": adapter_index[" + std::to_string(i) + "] = " + std::to_string(j) +
               " names no adapter (the stack has " + std::to_string(d.adapters) + "; -1 means none)",
           ORT_INVALID_ARGUMENT);
    std::fill(rows.begin() + i * d.rows_per_index, rows.begin() + (i + 1) * d.rows_per_index, j < 0 ? -1 : j);
  }
  return rows;
}

// T[m] = X[m] @ A[j] in fp32 ([M, r]) for each row's adapter j (A [n, K, r]); rows without one stay zero.
template <typename T>
std::vector<float> MultiXA(const ParallelRunner& pool, const T* x, const T* a, const std::vector<int64_t>& adapter,
                           int64_t M, int64_t K, int64_t r) {
  std::vector<float> t(static_cast<size_t>(M * r), 0.f);
  ParallelRanges(pool, M, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t m = r0; m < r1; ++m) {
      const int64_t j = adapter[static_cast<size_t>(m)];
      if (j < 0) continue;
      float* tm = t.data() + m * r;
      const T* aj = a + j * K * r;
      for (int64_t k = 0; k < K; ++k) {
        const float xv = ToF32<T>(x[m * K + k]);
        const T* arow = aj + k * r;
        for (int64_t q = 0; q < r; ++q) tm[q] += xv * ToF32<T>(arow[q]);
      }
    }
  });
  return t;
}

// z[c] += s * sum_q t[q] * B[j, q, n0 + c] for c < nc (B [n, r, N]): one row's rank-r term over a tile's columns, the
// sum in fp32 then scaled (the reference's order); `br` is nc floats of scratch.
template <typename T>
void AddRankTerm(float* z, float* br, const float* t, const T* b, int64_t j, int64_t r, int64_t N, int64_t n0,
                 int64_t nc, float s) {
  std::fill(br, br + nc, 0.f);
  for (int64_t q = 0; q < r; ++q) {
    const float tv = t[q];
    const T* brow = b + (j * r + q) * N + n0;
    for (int64_t c = 0; c < nc; ++c) br[c] += tv * ToF32<T>(brow[c]);
  }
  for (int64_t c = 0; c < nc; ++c) z[c] += s * br[c];
}

// Y = acc + bias + scales[j] * T[m] @ B[j] per row m (j = its adapter, none where < 0); T fp32 [M, r].
template <typename T>
struct MultiLoRAEpilogue final : Epilogue {
  const float* bias;
  const float* t;
  const T* b;                  // [n, r, N]
  const T* scales;             // [n]
  const int64_t* row_adapter;  // [M]: the row's adapter, < 0 for none
  T* y;
  int64_t N, r;
  void Apply(int64_t m0, int64_t mb, int64_t n0, int64_t nc, const float* const* acc, int64_t ld) const override {
    std::vector<float> z(static_cast<size_t>(nc)), br(static_cast<size_t>(nc));
    for (int64_t i = 0; i < mb; ++i) {
      const int64_t m = m0 + i, j = row_adapter[m];
      const float* a = acc[0] + i * ld;
      for (int64_t c = 0; c < nc; ++c) z[c] = a[c] + bias[n0 + c];
      if (j >= 0) AddRankTerm(z.data(), br.data(), t + m * r, b, j, r, N, n0, nc, ToF32<T>(scales[j]));
      T* out = y + m * N + n0;
      for (int64_t c = 0; c < nc; ++c) out[c] = FromF32<T>(z[c]);
    }
  }
};

// Register<Family>(domain), defined in cpu/<family>.cc, for every family of the generated ONNXFUSE_OP_FAMILIES.
#define ONNXFUSE_DECLARE_CPU_REGISTER(Family) void Register##Family(Ort::CustomOpDomain& domain);
ONNXFUSE_OP_FAMILIES(ONNXFUSE_DECLARE_CPU_REGISTER)
#undef ONNXFUSE_DECLARE_CPU_REGISTER

}  // namespace cpu
}  // namespace onnxfuse
