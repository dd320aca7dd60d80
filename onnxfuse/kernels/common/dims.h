// Shape checks of the ops' inputs (onnxfuse/schema.py's layout: X [..., K], weights [K, N], LoRA A [K, r] and
// B [r, N], bias [N]); a mismatch throws an error naming the op and the shapes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/embedding_row.h"
#include "common/status.h"

namespace onnxfuse {

// M rows (X's leading dims flattened), reduction K, output width N, LoRA rank r (0 for non-LoRA ops).
struct LinearDims {
  int64_t M = 0, K = 0, N = 0, r = 0;
  std::vector<int64_t> out_shape;  // X.shape[:-1] + [N]
};

namespace detail {
inline LinearDims RowsOf(const char* op, const std::vector<int64_t>& x) {
  if (x.empty()) Fail(std::string(op) + ": X must have rank >= 1 ([..., K]), got a scalar");
  LinearDims d;
  d.K = x.back();
  d.M = 1;
  for (size_t i = 0; i + 1 < x.size(); ++i) d.M *= x[i];
  d.out_shape.assign(x.begin(), x.end() - 1);
  return d;
}
inline void Need(bool ok, const char* op, const std::string& what) {
  if (!ok) Fail(std::string(op) + ": " + what);
}
}  // namespace detail

// X [..., K], W [K, N], bias [N].
inline LinearDims LinearActDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                const std::vector<int64_t>& bias) {
  LinearDims d = detail::RowsOf(op, x);
  detail::Need(w.size() == 2 && w[0] == d.K, op,
               "W must be [K, N] with K = X.shape[-1]; got X " + ShapeStr(x) + ", W " + ShapeStr(w));
  d.N = w[1];
  detail::Need(bias.size() == 1 && bias[0] == d.N, op,
               "bias must be [N]; got W " + ShapeStr(w) + ", bias " + ShapeStr(bias));
  d.out_shape.push_back(d.N);
  return d;
}

// X [..., K], W [K, N] (Linear).
inline LinearDims MatMulDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& w) {
  LinearDims d = detail::RowsOf(op, x);
  detail::Need(w.size() == 2 && w[0] == d.K, op,
               "W must be [K, N] with K = X.shape[-1]; got X " + ShapeStr(x) + ", W " + ShapeStr(w));
  d.N = w[1];
  d.out_shape.push_back(d.N);
  return d;
}

// LinearSkipRMSNorm: X [..., K], W [K, N], skip X.shape[:-1] + [N], gamma [N].
inline LinearDims SkipNormDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                               const std::vector<int64_t>& skip, const std::vector<int64_t>& gamma) {
  LinearDims d = MatMulDims(op, x, w);
  detail::Need(skip == d.out_shape, op,
               "skip must be X.shape[:-1] + [N] = " + ShapeStr(d.out_shape) + "; got " + ShapeStr(skip));
  detail::Need(gamma.size() == 1 && gamma[0] == d.N, op,
               "gamma must be [N] = [" + std::to_string(d.N) + "]; got " + ShapeStr(gamma));
  return d;
}

// Int4Linear: X [..., K], Wq uint8 [N, n_blocks, block / 2], scales [N, n_blocks]; n_blocks = ceil(K / block),
// block a power of two in [16, 256]. LinearDims' r carries the block size.
inline LinearDims Int4LinearDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& wq,
                                 const std::vector<int64_t>& scales) {
  LinearDims d = detail::RowsOf(op, x);
  const int64_t block = wq.size() == 3 ? 2 * wq[2] : 0;
  detail::Need(block >= 16 && block <= 256 && (block & (block - 1)) == 0, op,
               "Wq must be [N, n_blocks, block / 2] with block a power of two in [16, 256]; got Wq " + ShapeStr(wq));
  detail::Need(wq[1] == (d.K + block - 1) / block, op,
               "Wq must have ceil(K / block) blocks per column; got X " + ShapeStr(x) + ", Wq " + ShapeStr(wq));
  detail::Need(scales.size() == 2 && scales[0] == wq[0] && scales[1] == wq[1], op,
               "scales must be [N, n_blocks]; got Wq " + ShapeStr(wq) + ", scales " + ShapeStr(scales));
  d.N = wq[0];
  d.r = block;
  d.out_shape.push_back(d.N);
  return d;
}

// Int4SwiGLU: X [..., K], Wq_gate and Wq_up [N, n_blocks, block / 2] of one shape, scales_gate and scales_up
// [N, n_blocks]. LinearDims' r carries the block size.
inline LinearDims Int4SwiGLUDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& wq_gate,
                                 const std::vector<int64_t>& s_gate, const std::vector<int64_t>& wq_up,
                                 const std::vector<int64_t>& s_up) {
  LinearDims d = Int4LinearDims(op, x, wq_gate, s_gate);
  detail::Need(wq_up == wq_gate && s_up == s_gate, op,
               "Wq_up and scales_up must have Wq_gate's and scales_gate's shapes; got Wq_gate " + ShapeStr(wq_gate) +
                   ", scales_gate " + ShapeStr(s_gate) + ", Wq_up " + ShapeStr(wq_up) + ", scales_up " +
                   ShapeStr(s_up));
  return d;
}

// SkipRMSNormInt4Linear's and SkipRMSNormInt4SwiGLU's norm inputs: skip X's shape, gamma [K] (the projection's
// shapes are checked as Int4Linear's, on X).
inline void Int4SkipNormCheck(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& skip,
                              const std::vector<int64_t>& gamma) {
  detail::Need(skip == x, op, "skip must have X's shape " + ShapeStr(x) + "; got " + ShapeStr(skip));
  detail::Need(gamma.size() == 1 && !x.empty() && gamma[0] == x.back(), op,
               "gamma must be [K] = [" + std::to_string(x.empty() ? 0 : x.back()) + "]; got " + ShapeStr(gamma));
}

// Int4Linear's and Int4SwiGLU's optional zero points: uint8 [N, ceil(n_blocks / 2)] for Wq [N, n_blocks, block / 2].
inline void Int4ZeroPointsCheck(const char* op, const char* name, const std::vector<int64_t>& zp,
                                const std::vector<int64_t>& wq) {
  detail::Need(zp.size() == 2 && zp[0] == wq[0] && zp[1] == (wq[1] + 1) / 2, op,
               std::string(name) + " must be [N, ceil(n_blocks / 2)] (two 4-bit zero points a byte); got Wq " +
                   ShapeStr(wq) + ", " + name + " " + ShapeStr(zp));
}

// An optional zero-points input's data, checked against Wq's shape; null where the node has none.
inline const uint8_t* Int4ZeroPoints(const char* op, const char* name,
                                     const std::optional<const Ort::Custom::Tensor<uint8_t>*>& zp,
                                     const std::vector<int64_t>& wq) {
  if (!zp.has_value() || *zp == nullptr) return nullptr;
  Int4ZeroPointsCheck(op, name, (*zp)->Shape(), wq);
  return (*zp)->Data();
}

// Int4SwiGLU's zero points (and SkipRMSNormInt4SwiGLU's): each checked against its Wq, both or neither; (gate's, up's),
// nulls where the node has none.
inline std::pair<const uint8_t*, const uint8_t*> Int4ZeroPointPair(
    const char* op, const std::optional<const Ort::Custom::Tensor<uint8_t>*>& zp_gate,
    const std::optional<const Ort::Custom::Tensor<uint8_t>*>& zp_up, const std::vector<int64_t>& wq_gate,
    const std::vector<int64_t>& wq_up) {
  const uint8_t* g = Int4ZeroPoints(op, "zero_points_gate", zp_gate, wq_gate);
  const uint8_t* u = Int4ZeroPoints(op, "zero_points_up", zp_up, wq_up);
  detail::Need((g == nullptr) == (u == nullptr), op, "zero_points_gate and zero_points_up: both or neither");
  return {g, u};
}

// X [..., K], W_gate [K, N], W_up [K, N].
inline LinearDims SwiGLUDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& wg,
                             const std::vector<int64_t>& wu) {
  LinearDims d = detail::RowsOf(op, x);
  detail::Need(wg.size() == 2 && wg[0] == d.K, op,
               "W_gate must be [K, N] with K = X.shape[-1]; got X " + ShapeStr(x) + ", W_gate " + ShapeStr(wg));
  detail::Need(wu == wg, op, "W_up must have W_gate's shape; got W_gate " + ShapeStr(wg) + ", W_up " + ShapeStr(wu));
  d.N = wg[1];
  d.out_shape.push_back(d.N);
  return d;
}

// LoRASwiGLU: X [..., K], W_gate and W_up [K, N], A_gate [K, rg], B_gate [rg, N], A_up [K, ru], B_up [ru, N];
// LinearDims' r carries rg, *ru the up rank.
inline LinearDims LoRASwiGLUDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& wg,
                                 const std::vector<int64_t>& wu, const std::vector<int64_t>& ag,
                                 const std::vector<int64_t>& bg, const std::vector<int64_t>& au,
                                 const std::vector<int64_t>& bu, int64_t* ru) {
  LinearDims d = SwiGLUDims(op, x, wg, wu);
  const auto adapter = [&](const std::vector<int64_t>& a, const std::vector<int64_t>& b, const char* an,
                           const char* bn) {
    detail::Need(a.size() == 2 && a[0] == d.K && b.size() == 2 && b[0] == a[1] && b[1] == d.N, op,
                 std::string(an) + " must be [K, r] and " + bn + " [r, N]; got X " + ShapeStr(x) + ", " + an + " " +
                     ShapeStr(a) + ", " + bn + " " + ShapeStr(b) + ", W " + ShapeStr(wg));
    return a[1];
  };
  d.r = adapter(ag, bg, "A_gate", "B_gate");
  *ru = adapter(au, bu, "A_up", "B_up");
  return d;
}

// X [..., K], W [K, N], A [K, r], B [r, N], bias [N].
inline LinearDims LoRADims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                           const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                           const std::vector<int64_t>& bias) {
  LinearDims d = LinearActDims(op, x, w, bias);
  detail::Need(a.size() == 2 && a[0] == d.K, op,
               "A must be [K, r] with K = X.shape[-1]; got X " + ShapeStr(x) + ", A " + ShapeStr(a));
  d.r = a[1];
  detail::Need(b.size() == 2 && b[0] == d.r && b[1] == d.N, op,
               "B must be [r, N]; got A " + ShapeStr(a) + ", W " + ShapeStr(w) + ", B " + ShapeStr(b));
  return d;
}

// MultiLoRALinear: X [b, ..., K] (rank >= 2), W [K, N], bias [N], a stack of n adapters A [n, K, r], B [n, r, N],
// scales [n], and adapter_index [b] (one per batch row: rows_per_index = M / b consecutive rows of X share it).
// MultiLoRASwiGLU: SwiGLU's X, W_gate, W_up and such a stack per projection (r: the gate's rank).
struct MultiLoRADims : LinearDims {
  int64_t adapters = -1;  // the stacks' adapter count; -1 until detail::AdapterStack checks the first stack
  int64_t batch = 0, rows_per_index = 0;
};
namespace detail {
// The stack's rank; d.adapters from the first stack checked (while it is still -1), the same count for the next.
inline int64_t AdapterStack(const char* op, MultiLoRADims& d, const std::vector<int64_t>& x,
                            const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                            const std::vector<int64_t>& scales, const char* an, const char* bn, const char* sn) {
  Need(a.size() == 3 && a[1] == d.K && (d.adapters < 0 || a[0] == d.adapters), op,
       std::string(an) + " must be [n, K, r] (n adapters, as many in every stack) with K = X.shape[-1]; got X " +
           ShapeStr(x) + ", " + an + " " + ShapeStr(a));
  d.adapters = a[0];
  Need(b.size() == 3 && b[0] == d.adapters && b[1] == a[2] && b[2] == d.N, op,
       std::string(bn) + " must be [n, r, N]; got " + an + " " + ShapeStr(a) + ", " + bn + " " + ShapeStr(b) +
           " with N = " + std::to_string(d.N));
  Need(scales.size() == 1 && scales[0] == d.adapters, op,
       std::string(sn) + " must be [n], one per adapter; got " + an + " " + ShapeStr(a) + ", " + sn + " " +
           ShapeStr(scales));
  return a[2];
}
inline void AdapterRows(const char* op, MultiLoRADims& d, const std::vector<int64_t>& x,
                        const std::vector<int64_t>& index) {
  Need(x.size() >= 2, op,
       "X must be [b, ..., K] (rank >= 2: its first axis is the batch the adapter_index entries "
       "belong to); got X " +
           ShapeStr(x));
  d.batch = x[0];
  Need(index.size() == 1 && index[0] == d.batch, op,
       "adapter_index must be [b] = [X.shape[0]], one per batch row; got X " + ShapeStr(x) + ", adapter_index " +
           ShapeStr(index));
  d.rows_per_index = d.batch > 0 ? d.M / d.batch : 0;
}
}  // namespace detail

inline MultiLoRADims MultiLoRALinearDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& w,
                                         const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                                         const std::vector<int64_t>& bias, const std::vector<int64_t>& scales,
                                         const std::vector<int64_t>& index) {
  MultiLoRADims d;
  static_cast<LinearDims&>(d) = LinearActDims(op, x, w, bias);
  detail::AdapterRows(op, d, x, index);
  d.r = detail::AdapterStack(op, d, x, a, b, scales, "A", "B", "scales");
  return d;
}

inline MultiLoRADims MultiLoRASwiGLUDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& wg,
                                         const std::vector<int64_t>& wu, const std::vector<int64_t>& ag,
                                         const std::vector<int64_t>& bg, const std::vector<int64_t>& au,
                                         const std::vector<int64_t>& bu, const std::vector<int64_t>& sg,
                                         const std::vector<int64_t>& su, const std::vector<int64_t>& index,
                                         int64_t* ru) {
  MultiLoRADims d;
  static_cast<LinearDims&>(d) = SwiGLUDims(op, x, wg, wu);
  detail::AdapterRows(op, d, x, index);
  d.r = detail::AdapterStack(op, d, x, ag, bg, sg, "A_gate", "B_gate", "scales_gate");
  *ru = detail::AdapterStack(op, d, x, au, bu, su, "A_up", "B_up", "scales_up");
  return d;
}

// LoRAGatedMLP: LoRASwiGLU's shapes (gated: M, K, N, r = the gate's rank; ru the up's), then the down projection's
// on the activation [..., N]: W_down [N, K2], A_down [N, rd], B_down [rd, K2], bias_down [K2] (down: M, K = N, N = K2,
// r = rd; its out_shape is Y's).
struct GatedMLPDims {
  LinearDims gated, down;
  int64_t ru = 0;
};
inline GatedMLPDims LoRAGatedMLPDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& wg,
                                     const std::vector<int64_t>& wu, const std::vector<int64_t>& ag,
                                     const std::vector<int64_t>& bg, const std::vector<int64_t>& au,
                                     const std::vector<int64_t>& bu, const std::vector<int64_t>& wd,
                                     const std::vector<int64_t>& ad, const std::vector<int64_t>& bd,
                                     const std::vector<int64_t>& bias) {
  GatedMLPDims d;
  d.gated = LoRASwiGLUDims(op, x, wg, wu, ag, bg, au, bu, &d.ru);
  d.down = LoRADims(op, d.gated.out_shape, wd, ad, bd, bias);  // its X is the activation, W W_down, A A_down, ...
  return d;
}

// MultiLoRAGatedMLP: MultiLoRASwiGLU's shapes, then MultiLoRALinear's on the activation (W_down [N, K2], A_down
// [n, N, rd], B_down [n, rd, K2], bias_down [K2], scales_down [n]; the same n as the gate's and up's stacks).
struct MultiGatedMLPDims {
  MultiLoRADims gated, down;
  int64_t ru = 0;
};
inline MultiGatedMLPDims MultiLoRAGatedMLPDims(const char* op, const std::vector<int64_t>& x,
                                               const std::vector<int64_t>& wg, const std::vector<int64_t>& wu,
                                               const std::vector<int64_t>& ag, const std::vector<int64_t>& bg,
                                               const std::vector<int64_t>& au, const std::vector<int64_t>& bu,
                                               const std::vector<int64_t>& wd, const std::vector<int64_t>& ad,
                                               const std::vector<int64_t>& bd, const std::vector<int64_t>& bias,
                                               const std::vector<int64_t>& sg, const std::vector<int64_t>& su,
                                               const std::vector<int64_t>& sd, const std::vector<int64_t>& index) {
  MultiGatedMLPDims d;
  d.gated = MultiLoRASwiGLUDims(op, x, wg, wu, ag, bg, au, bu, sg, su, index, &d.ru);
  d.down = MultiLoRALinearDims(op, d.gated.out_shape, wd, ad, bd, bias, sd, index);
  detail::Need(d.down.adapters == d.gated.adapters, op,
               "A_down, B_down and scales_down must stack as many adapters as the gate's and up's (" +
                   std::to_string(d.gated.adapters) + "); got A_down " + ShapeStr(ad));
  return d;
}

// Shapes of a stack's inputs: X [..., K], W_i [n_{i-1}, n_i] with n_0 = K, bias_i [n_i]. widths = n_0..n_L.
struct StackDims {
  int64_t M = 0;
  std::vector<int64_t> widths;
  std::vector<int64_t> out_shape;
};

inline StackDims MLPStackDims(const char* op, size_t n_layers, const std::vector<std::vector<int64_t>>& shapes) {
  using S = schema::MLPStack;
  const size_t need = 1 + S::kInputsPerLayer * n_layers;
  if (shapes.size() != need)
    Fail(std::string(op) + ": " + std::to_string(shapes.size()) + " inputs, but the '" + schema::attr::kActivations +
         "' attribute names " + std::to_string(n_layers) +
         " layers (need X and a W, bias pair per layer: " + std::to_string(need) + ")");
  LinearDims x = detail::RowsOf(op, shapes[S::kX]);
  StackDims d;
  d.M = x.M;
  d.widths.push_back(x.K);
  for (size_t i = 0; i < n_layers; ++i) {
    const auto& w = shapes[S::W(int(i))];
    const auto& b = shapes[S::Bias(int(i))];
    const std::string layer = "layer " + std::to_string(i + 1) + ": ";
    detail::Need(w.size() == 2 && w[0] == d.widths.back(), op,
                 layer + "W must be [K, N] with K = the previous width " + std::to_string(d.widths.back()) + "; got " +
                     ShapeStr(w));
    detail::Need(b.size() == 1 && b[0] == w[1], op,
                 layer + "bias must be [N]; got W " + ShapeStr(w) + ", bias " + ShapeStr(b));
    d.widths.push_back(w[1]);
  }
  d.out_shape = x.out_shape;
  d.out_shape.push_back(d.widths.back());
  return d;
}

// RotaryEmbedding: X [..., D] of rank 2..4 (D even), cos and sin broadcasting to X's shape (rank <= X's, each dim 1
// or X's, last dim D). X is seen as [d0, d1, d2, D] (leading dims padded with 1); cos/sin are addressed by strides of
// those three leading dims in rows of D elements, 0 where they broadcast, and are contiguous along D.
struct RotaryDims {
  int64_t rows = 0, D = 0, d1 = 1, d2 = 1;
  int64_t cos_stride[3] = {0, 0, 0}, sin_stride[3] = {0, 0, 0};
  std::vector<int64_t> out_shape;  // X's
};

namespace detail {
inline void RotaryStrides(const char* op, const char* name, const std::vector<int64_t>& x4,
                          const std::vector<int64_t>& c, int64_t* stride) {
  const size_t pad = 4 - c.size();
  Need(c.back() == x4[3], op,
       std::string(name) + " must end in X's last dim; got X [..., " + std::to_string(x4[3]) + "], " + name + " " +
           ShapeStr(c));
  int64_t rows = 1;  // strides count rows of D elements
  for (int i = 2; i >= 0; --i) {
    const int64_t dim = i < int(pad) ? 1 : c[size_t(i) - pad];
    Need(dim == 1 || dim == x4[size_t(i)], op,
         std::string(name) + " must broadcast to X's shape (each dim 1 or X's); got " + name + " " + ShapeStr(c));
    stride[i] = dim == 1 ? 0 : rows;
    rows *= dim;
  }
}
}  // namespace detail

inline RotaryDims RotaryEmbeddingDims(const char* op, const std::vector<int64_t>& x, const std::vector<int64_t>& cos,
                                      const std::vector<int64_t>& sin) {
  detail::Need(x.size() >= 2 && x.size() <= 4, op, "X must have rank 2 to 4 ([..., D]); got " + ShapeStr(x));
  detail::Need(cos.size() <= x.size() && sin.size() <= x.size() && !cos.empty() && !sin.empty(), op,
               "cos and sin must have rank 1 to X's; got X " + ShapeStr(x) + ", cos " + ShapeStr(cos) + ", sin " +
                   ShapeStr(sin));
  std::vector<int64_t> x4(4 - x.size(), 1);
  x4.insert(x4.end(), x.begin(), x.end());
  RotaryDims d;
  d.D = x4[3];
  detail::Need(d.D % 2 == 0, op, "X's last dim must be even (rotate_half); got " + ShapeStr(x));
  d.rows = x4[0] * x4[1] * x4[2];
  d.d1 = x4[1];
  d.d2 = x4[2];
  detail::RotaryStrides(op, "cos", x4, cos, d.cos_stride);
  detail::RotaryStrides(op, "sin", x4, sin, d.sin_stride);
  d.out_shape = x;
  return d;
}

// FlashAttention: Q [B, S, H D], K and V [B, S_kv, H D], bias [B or 1, H or 1, S, S_kv]; Y like Q. bias_b and
// bias_h are the bias's strides (elements) between batch and head planes, 0 where it broadcasts.
struct AttentionDims {
  int64_t B = 0, S = 0, Skv = 0, H = 0, D = 0;
  int64_t bias_b = 0, bias_h = 0;
  int64_t bias_batches = 1, bias_heads = 1;  // the bias's first two dims (1 or B, 1 or H)
  std::vector<int64_t> out_shape;            // Q's
};

inline AttentionDims FlashAttentionDims(const char* op, const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                                        const std::vector<int64_t>& v, const std::vector<int64_t>& bias,
                                        int64_t heads) {
  detail::Need(q.size() == 3 && k.size() == 3 && v.size() == 3, op,
               "Q, K and V must be [B, S, H D]; got Q " + ShapeStr(q) + ", K " + ShapeStr(k) + ", V " + ShapeStr(v));
  detail::Need(heads > 0 && q[2] % heads == 0, op,
               "Q's width must be num_heads x D; got Q " + ShapeStr(q) + " with num_heads " + std::to_string(heads));
  detail::Need(k[0] == q[0] && v[0] == q[0] && k[2] == q[2] && v[2] == q[2] && v[1] == k[1], op,
               "K and V must be [B, S_kv, H D] with Q's B and width; got Q " + ShapeStr(q) + ", K " + ShapeStr(k) +
                   ", V " + ShapeStr(v));
  AttentionDims d;
  d.B = q[0];
  d.S = q[1];
  d.Skv = k[1];
  d.H = heads;
  d.D = q[2] / heads;
  detail::Need(bias.size() == 4 && (bias[0] == 1 || bias[0] == d.B) && (bias[1] == 1 || bias[1] == d.H) &&
                   bias[2] == d.S && bias[3] == d.Skv,
               op,
               "bias must be [B or 1, H or 1, S, S_kv]; got Q " + ShapeStr(q) + ", K " + ShapeStr(k) + ", bias " +
                   ShapeStr(bias) + " with num_heads " + std::to_string(heads));
  d.bias_h = bias[1] == 1 ? 0 : d.S * d.Skv;
  d.bias_b = bias[0] == 1 ? 0 : bias[1] * d.S * d.Skv;
  d.bias_batches = bias[0];
  d.bias_heads = bias[1];
  d.out_shape = q;
  return d;
}

// Embedding: table [V, D], ids of any shape (n ids); Y = ids.shape + [D].
struct LookupDims {
  int64_t V = 0, D = 0, n = 1;
  std::vector<int64_t> out_shape;
};

inline LookupDims EmbeddingDimsOf(const char* op, const std::vector<int64_t>& table, const std::vector<int64_t>& ids) {
  detail::Need(table.size() == 2, op, "table must be [V, D]; got " + ShapeStr(table));
  LookupDims d;
  d.V = table[0];
  d.D = table[1];
  for (int64_t v : ids) d.n *= v;
  d.out_shape = ids;
  d.out_shape.push_back(d.D);
  return d;
}

// Shapes of an embedding op's inputs (schema.py): X [B, d], table [R, d], table_offsets [F], cardinality [F], and
// ids [B, F] (EmbeddingInteraction) or indices [F, N] with offsets [F, B] (EmbeddingBagInteraction). Y is
// [B, width]: d + n(n-1)/2 for the dot interaction, n*d for cat, n = F + 1.
struct EmbeddingDims {
  int64_t B = 0, d = 0, F = 0, R = 0, N = 0, width = 0;
  // Bags: the step from feature f's indices to feature f + 1's (N for indices [F, N]; 0 for one shared row [1, N],
  // the per-table form concatenated) and the columns of offsets (B, the last bag ending at N; or B + 1, the ends).
  int64_t index_stride = 0, offset_cols = 0;
  std::vector<int64_t> out_shape;
};

inline EmbeddingDims EmbeddingOpDims(const char* op, int interaction, const std::vector<int64_t>& x,
                                     const std::vector<int64_t>& ids, const std::vector<int64_t>* offsets,
                                     const std::vector<int64_t>& table, const std::vector<int64_t>& table_offsets,
                                     const std::vector<int64_t>& cardinality) {
  EmbeddingDims e;
  detail::Need(x.size() == 2, op, "X must be [B, d]; got " + ShapeStr(x));
  e.B = x[0];
  e.d = x[1];
  detail::Need(table.size() == 2 && table[1] == e.d, op,
               "table must be [R, d] with d = X.shape[1]; got X " + ShapeStr(x) + ", table " + ShapeStr(table));
  e.R = table[0];
  detail::Need(table_offsets.size() == 1, op, "table_offsets must be [F]; got " + ShapeStr(table_offsets));
  e.F = table_offsets[0];
  detail::Need(cardinality.size() == 1 && cardinality[0] == e.F, op,
               "cardinality must be [F] like table_offsets; got " + ShapeStr(cardinality));
  if (offsets == nullptr) {
    detail::Need(ids.size() == 2 && ids[0] == e.B && ids[1] == e.F, op,
                 "ids must be [B, F] with B = X.shape[0] and F = table_offsets.shape[0]; got X " + ShapeStr(x) +
                     ", ids " + ShapeStr(ids) + ", table_offsets " + ShapeStr(table_offsets));
  } else {
    detail::Need(ids.size() == 2 && (ids[0] == e.F || ids[0] == 1), op,
                 "indices must be [F, N] (or [1, N], one row every feature's bags index into) with F = "
                 "table_offsets.shape[0]; got indices " +
                     ShapeStr(ids) + ", table_offsets " + ShapeStr(table_offsets));
    e.N = ids[1];
    e.index_stride = ids[0] == e.F ? e.N : 0;
    detail::Need(offsets->size() == 2 && (*offsets)[0] == e.F && ((*offsets)[1] == e.B || (*offsets)[1] == e.B + 1), op,
                 "offsets must be [F, B] or [F, B + 1] (the last column: each feature's end) with B = X.shape[0]; "
                 "got X " +
                     ShapeStr(x) + ", offsets " + ShapeStr(*offsets));
    e.offset_cols = (*offsets)[1];
  }
  const int64_t n = e.F + 1;
  e.width = interaction == ONNXFUSE_INTERACTION_DOT ? e.d + n * (n - 1) / 2 : n * e.d;
  e.out_shape = {e.B, e.width};
  return e;
}

// CachedAttention: query [B, S, (H + 2 Hkv) D] (packed), past_key and past_value [B, Hkv, P, D], seqlens_k [B],
// total_sequence_length a scalar (its value `total`, read on the host), cos_cache and sin_cache [positions, R / 2]
// with R <= D even. Y [B, S, H D]; present_key and present_value [B, Hkv, L, D], L = max(P, total). A first prompt is
// S == total. Each sequence's lengths (seqlens_k, device data on the GPU) are the kernels' to check or clamp.
struct CachedAttentionDims {
  int64_t B = 0, S = 0, H = 0, Hkv = 0, D = 0, P = 0, L = 0, R = 0, positions = 0, total = 0;
  bool first = false;
  std::vector<int64_t> y_shape, present_shape;
};

inline CachedAttentionDims CachedAttentionDimsOf(const char* op, const std::vector<int64_t>& q,
                                                 const std::vector<int64_t>& pk, const std::vector<int64_t>& pv,
                                                 const std::vector<int64_t>& seqlens, int64_t total,
                                                 const std::vector<int64_t>& cos, const std::vector<int64_t>& sin,
                                                 int64_t heads, int64_t kv_heads) {
  using detail::Need;
  CachedAttentionDims d;
  Need(heads > 0 && kv_heads > 0 && heads % kv_heads == 0, op,
       "num_heads must be a positive multiple of kv_num_heads; got " + std::to_string(heads) + " and " +
           std::to_string(kv_heads));
  Need(q.size() == 3 && q[2] % (heads + 2 * kv_heads) == 0, op,
       "query must be [B, S, (H + 2 Hkv) D] (packed QKV); got " + ShapeStr(q));
  d.B = q[0], d.S = q[1], d.H = heads, d.Hkv = kv_heads, d.D = q[2] / (heads + 2 * kv_heads);
  Need(pk.size() == 4 && pk[0] == d.B && pk[1] == d.Hkv && pk[3] == d.D && pv == pk, op,
       "past_key and past_value must both be [B, Hkv, P, D] = [" + std::to_string(d.B) + ", " + std::to_string(d.Hkv) +
           ", P, " + std::to_string(d.D) + "]; got " + ShapeStr(pk) + " and " + ShapeStr(pv));
  d.P = pk[2];
  Need(seqlens.size() == 1 && seqlens[0] == d.B, op, "seqlens_k must be [B]; got " + ShapeStr(seqlens));
  Need(cos.size() == 2 && cos == sin && 2 * cos[1] <= d.D && cos[1] > 0, op,
       "cos_cache and sin_cache must both be [positions, R / 2] with 0 < R <= D = " + std::to_string(d.D) + "; got " +
           ShapeStr(cos) + " and " + ShapeStr(sin));
  Need(d.D % 2 == 0 && d.D <= 256, op, "the head size must be even and at most 256; got " + std::to_string(d.D));
  d.R = 2 * cos[1];
  d.positions = cos[0];
  Need(total >= d.S, op,
       "total_sequence_length " + std::to_string(total) + " is below the query's length " + std::to_string(d.S));
  d.total = total;
  d.first = d.S == total;
  d.L = d.P > total ? d.P : total;
  d.y_shape = {d.B, d.S, d.H * d.D};
  d.present_shape = {d.B, d.Hkv, d.L, d.D};
  return d;
}

}  // namespace onnxfuse
