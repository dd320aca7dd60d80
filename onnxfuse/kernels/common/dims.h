// Shape checks of the ops' inputs (onnxfuse/schema.py's layout: X [..., K], weights [K, N], LoRA A [K, r] and
// B [r, N], bias [N]); a mismatch throws an error naming the op and the shapes.
#pragma once

#include <cstdint>
#include <string>
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
         "' attribute names " + std::to_string(n_layers) + " layers (need X and a W, bias pair per layer: " +
         std::to_string(need) + ")");
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
    detail::Need(b.size() == 1 && b[0] == w[1], op, layer + "bias must be [N]; got W " + ShapeStr(w) + ", bias " +
                                                        ShapeStr(b));
    d.widths.push_back(w[1]);
  }
  d.out_shape = x.out_shape;
  d.out_shape.push_back(d.widths.back());
  return d;
}

// Shapes of an embedding op's inputs (schema.py): X [B, d], table [R, d], table_offsets [F], cardinality [F], and
// ids [B, F] (EmbeddingInteraction) or indices [F, N] with offsets [F, B] (EmbeddingBagInteraction). Y is
// [B, width]: d + n(n-1)/2 for the dot interaction, n*d for cat, n = F + 1.
struct EmbeddingDims {
  int64_t B = 0, d = 0, F = 0, R = 0, N = 0, width = 0;
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
    detail::Need(ids.size() == 2 && ids[0] == e.F, op,
                 "indices must be [F, N] with F = table_offsets.shape[0]; got indices " + ShapeStr(ids) +
                     ", table_offsets " + ShapeStr(table_offsets));
    e.N = ids[1];
    detail::Need(offsets->size() == 2 && (*offsets)[0] == e.F && (*offsets)[1] == e.B, op,
                 "offsets must be [F, B] with B = X.shape[0]; got X " + ShapeStr(x) + ", offsets " +
                     ShapeStr(*offsets));
  }
  const int64_t n = e.F + 1;
  e.width = interaction == ONNXFUSE_INTERACTION_DOT ? e.d + n * (n - 1) / 2 : n * e.d;
  e.out_shape = {e.B, e.width};
  return e;
}

}  // namespace onnxfuse
