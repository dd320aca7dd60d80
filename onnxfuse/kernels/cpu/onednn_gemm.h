// Constant-weight GEMMs of the CPU kernels through oneDNN's matmul primitive: Y = post_ops(X @ W + bias).
//
// The weights ([K, N], the op's element type) are split into column blocks and each block is reordered once, at
// kernel creation, into the blocked layout oneDNN's matmul picks for this CPU (AVX-512 / AMX / AVX2 brgemm
// kernels, chosen by oneDNN at run time). bias, activation (ReLU, logistic, swish, a scale) and one elementwise
// add / mul of an fp32 tile (LoRA's (X@A)@B, SwiGLU's up projection) are oneDNN post-ops, applied to the fp32
// accumulators before the single write of Y in its own element type.
//
// Threads: each Run() computes one tile (a row block x one column block) on the calling thread. The kernels spread
// tiles over onnxruntime's intra-op pool (ops.h, OrtPool), so oneDNN must not start threads of its own: primitives
// are created and executed with the calling thread's OpenMP thread count at 1 (restored afterwards, so torch or
// anything else using OpenMP on the same thread is not affected), which makes oneDNN plan and run them
// sequentially.
//
// Blocks narrower than kNarrowN columns (DLRM's 256 -> 1 head) are dot products for which a primitive call costs
// more than the arithmetic: they run as a plain loop on the fp32 weights instead.
//
// Without oneDNN in the build (ONNXFUSE_WITH_ONEDNN undefined), Init() returns false and the kernels keep the
// built-in GEMM (gemm.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu/gemm.h"

namespace onnxfuse {
namespace cpu {

// Whether this library was built with oneDNN (the build info's cpu_gemm says which one).
bool OnednnBuilt();

// What the CPU kernels run on this host, as JSON (onnxfuse_host_info, kernels.host_info()): the built-in GEMM's
// micro-kernel family ("gemm_isa", after ONNXFUSE_CPU_ISA) and, where oneDNN is built in, the ISA it dispatches to
// (after ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA) and, per element type, the matmul implementation that a prepacked
// weight of that type gets (null: none on this CPU, the kernels keep the built-in GEMM). Probed once per process
// with the same OnednnMatmul::Init the kernels call, so it says what they do rather than a guess of it.
std::string HostInfoJson();

// Swish is silu (x * sigmoid(x)); QuickGelu x * sigmoid(1.702 x) (oneDNN's swish with alpha 1.702); GeluTanh
// torch's gelu with approximate='tanh' (common/gate_act.h has the formulas).
enum class PostOp { Relu, Sigmoid, Swish, QuickGelu, GeluTanh, Scale, Add, Mul };

struct MatmulSpec {
  Format src = Format::F32;  // X and W
  Format dst = Format::F32;  // Y
  int64_t K = 0, N = 0;
  int64_t block_n = 0;       // column block width (<= 0 or >= N: one block)
  std::vector<PostOp> post;  // in order, after the bias; at most one Add or Mul (the fp32 tile given to Run)
  float scale = 1.0f;        // PostOp::Scale's factor
  int64_t ldx = 0, ldy = 0;  // row strides of X and Y in elements (0: K and N; ldy < 0: the block's width, i.e.
                             // each block's tile dense, as the Add/Mul operand of another OnednnMatmul wants it)
  // The Add/Mul tile is dense: [m, block width]. (A wider row stride makes oneDNN 3.2 leave its brgemm kernels for
  // the reference implementation, ~1000x slower.)
  int64_t typical_m = 64;  // rows the weights' layout is chosen for
};

class OnednnMatmul {
 public:
  OnednnMatmul();
  ~OnednnMatmul();
  OnednnMatmul(OnednnMatmul&&) noexcept;
  OnednnMatmul& operator=(OnednnMatmul&&) noexcept;

  // Prepacks W ([K, N] row-major, format spec.src) and bias ([N] fp32, or null). Returns false with the reason in
  // *why when oneDNN is not built in or has no implementation for these types on this CPU (e.g. fp16 without
  // AVX512-FP16); throws std::bad_alloc.
  bool Init(const MatmulSpec& spec, const void* w, const float* bias, std::string* why);
  bool Valid() const;
  int64_t Blocks() const;
  int64_t BlockStart(int64_t j) const;
  int64_t BlockWidth(int64_t j) const;
  // One tile: rows [0, m) of x (row stride spec.ldx) times column block j, written to y (the tile's first element,
  // row stride spec.ldy). `tile` is the fp32 operand of an Add/Mul post-op ([m, BlockWidth(j)], row stride
  // spec.ld_tile). Thread-safe; throws std::runtime_error on a oneDNN error.
  void Run(int64_t m, const void* x, void* y, int64_t j, const float* tile = nullptr) const;
  // What runs for m rows (oneDNN's implementation name, or "narrow"), for logs and tests.
  std::string Describe(int64_t m) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cpu
}  // namespace onnxfuse
