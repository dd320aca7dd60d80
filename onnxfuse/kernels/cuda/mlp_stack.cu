// MLPStack on the CUDA execution provider, in one file: the launchers' C declarations below, then the nvcc half (the
// CUDA kernels) and the host half (the CUDA EP glue and the Triton launcher); cuda/cuda.cmake says how it is built.
#include "cuda/launch.h"

extern "C" {
// MLPStack: n_layers (1..ONNXFUSE_MAX_STACK_LAYERS) layers h_i = act_i(h_{i-1} @ w[i] + b[i]) with widths[0] = K
// and widths[i + 1] = N of layer i; acts[i] is ONNXFUSE_ACT_RELU or ONNXFUSE_ACT_SIGMOID. The intermediates live
// in the caller's device scratch of onnxfuse_mlp_stack_scratch_bytes() bytes (two [M, SW] buffers of the element
// type, SW = the widest hidden layer rounded up to 16). The CUDA backend runs one linear_act launch per layer and
// needs onnxfuse_cuda_mlp_stack_scratch_bytes(): those buffers, then the cuBLASLt workspace.
int64_t onnxfuse_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths);
int64_t onnxfuse_cuda_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths);
// SW of that scratch: the widest hidden layer (widths[1 .. n_layers-1]) rounded up to 16 elements.
static inline int64_t onnxfuse_mlp_stack_scratch_width(int n_layers, const int64_t* widths) {
  int64_t sw = 0;
  for (int i = 1; i < n_layers; ++i) sw = widths[i] > sw ? widths[i] : sw;
  return (sw + 15) / 16 * 16;
}
int onnxfuse_cuda_mlp_stack(int dtype, int n_layers, const int* acts, const void* x, const void* const* w,
                            const void* const* b, void* y, int64_t m, const int64_t* widths, void* scratch,
                            int64_t scratch_bytes, void* stream);
// The Triton launcher (the host half, Triton builds only: cuda/ops_cuda.h's Dispatch calls it only there).
// MLPStack from the Triton cubins: mode ONNXFUSE_STACK_FUSED runs the whole stack as ONE kernel (each program
// carries BLOCK_M rows through every layer), ONNXFUSE_STACK_GRID as ONE persistent kernel whose programs (at most
// one per SM, launched cooperatively) split each layer's tiles and meet at a grid barrier between layers,
// ONNXFUSE_STACK_LAYERS one Triton linear_act launch per layer, and ONNXFUSE_STACK_AUTO the one triton/table.py's
// thresholds pick for the shape (node attribute stack_mode). The scratch must have
// onnxfuse_triton_mlp_stack_scratch_bytes() bytes (the barrier counter is reset in-stream by each grid launch).
int onnxfuse_triton_mlp_stack(int dtype, int n_layers, const int* acts, const void* x, const void* const* w,
                              const void* const* b, void* y, int64_t m, const int64_t* widths, int mode, void* scratch,
                              int64_t scratch_bytes, void* stream);
// Device scratch (bytes) the Triton MLPStack launcher needs: onnxfuse_mlp_stack_scratch_bytes() plus the grid
// kernel's barrier counter (ONNXFUSE_STACK_BARRIER_BYTES after the two [M, SW] buffers), or a negative code.
int64_t onnxfuse_triton_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths);
#define ONNXFUSE_STACK_BARRIER_BYTES 256
}

#ifdef __CUDACC__
// MLPStack on the CUDA backend: one linear_act launch (a cuBLASLt GEMM, cuda/linear_act.cu) per layer, the
// intermediates in the caller's scratch. The one-kernel stacks are the Triton backend's (triton/mlp_stack.py). Also
// the scratch-size rule both backends share.
#include <cstdint>

#include "gemm.h"
#include "stack_chain.h"

namespace ock = onnxfuse::cuda_kernels;

// Two [M, SW] buffers, SW = widest hidden layer rounded up to 16 elements (so every row starts 32-byte aligned).
extern "C" int64_t onnxfuse_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths) {
  if (dtype < ONNXFUSE_FP32 || dtype > ONNXFUSE_BF16 || n_layers < 1 || n_layers > ONNXFUSE_MAX_STACK_LAYERS || m < 0 ||
      widths == nullptr)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  return 2 * m * onnxfuse_mlp_stack_scratch_width(n_layers, widths) * ock::ElemBytes(dtype);
}

// The CUDA backend's: the cuBLASLt workspace first, then those two buffers.
extern "C" int64_t onnxfuse_cuda_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths) {
  const int64_t buffers = onnxfuse_mlp_stack_scratch_bytes(dtype, n_layers, m, widths);
  return buffers < 0 ? buffers : ONNXFUSE_CUBLASLT_WORKSPACE_BYTES + buffers;
}

extern "C" int onnxfuse_cuda_mlp_stack(int dtype, int n_layers, const int* acts, const void* x, const void* const* w,
                                       const void* const* b, void* y, int64_t m, const int64_t* widths, void* scratch,
                                       int64_t scratch_bytes, void* stream) {
  const int64_t need = onnxfuse_cuda_mlp_stack_scratch_bytes(dtype, n_layers, m, widths);
  if (need < 0) return int(need);
  if (acts == nullptr || w == nullptr || b == nullptr || scratch == nullptr || scratch_bytes < need)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  const int64_t ws = ONNXFUSE_CUBLASLT_WORKSPACE_BYTES;
  char* buffers = static_cast<char*>(scratch) + ws;
  return onnxfuse::StackPerLayer(n_layers, x, y, buffers, need - ws, [&](int i, const void* in, void* out) {
    return onnxfuse_cuda_linear_act(dtype, acts[i], in, w[i], b[i], out, m, widths[i], widths[i + 1], scratch, ws,
                                    stream);
  });
}

#else  // the host half: the CUDA EP glue and the Triton launcher
// MLPStack on the CUDA EP: the kernel struct calling the nvcc half's launcher or the Triton one
// (at the end of this file) through Dispatch (cuda/ops_cuda.h), and its registration.
#include <vector>

#include "cuda/ops_cuda.h"
#ifdef ONNXFUSE_WITH_TRITON
#include <cuda_runtime_api.h>
#include "cuda/stack_chain.h"
#include "cuda/triton/runtime.h"
#endif

namespace onnxfuse {
namespace cuda {
namespace {

// How the Triton backend runs a stack: the node's stack_mode (auto, fused or layers); the CUDA backend always
// launches once per layer.
template <typename T>
struct MLPStackCuda {
  using Op = schema::MLPStack;
  static constexpr const char* kName = Op::kName;
  MLPStackCuda(const OrtApi* api, const OrtKernelInfo* info)
      : attrs(ReadOpAttrs(api, info, kName)),
        acts(ReadStackActivations(api, info, kName)),
        mode(ReadStackMode(api, info, kName)) {
    if (acts.size() > ONNXFUSE_MAX_STACK_LAYERS)
      Fail(std::string(kName) + ": " + std::to_string(acts.size()) + " layers; the GPU kernels take at most " +
           std::to_string(ONNXFUSE_MAX_STACK_LAYERS) + " (fuse splits longer chains)");
  }
  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    return GuardCompute([&] {
             Ort::KernelContext ctx(context);
             const VariadicInputs in(ctx);
             const StackDims d = MLPStackDims(kName, acts.size(), in.shapes);
             void* y = ctx.GetOutput(Op::kY, d.out_shape).GetTensorMutableRawData();
             if (d.M == 0 || d.widths.back() == 0) return;
             const int n = int(acts.size());
             std::vector<const void*> w(n), b(n);
             for (int i = 0; i < n; ++i) {
               w[i] = in.data[Op::W(i)];
               b[i] = in.data[Op::Bias(i)];
             }
             const int dt = DtypeCode<T>();
             const int64_t* widths = d.widths.data();
             void* stream = StreamOf(context);
             Dispatch(
                 kName, attrs,
                 [&] {
                   return WithScratch(context, Op::kX, onnxfuse_cuda_mlp_stack_scratch_bytes(dt, n, d.M, widths),
                                      [&](void* sp, int64_t bytes) {
                                        return onnxfuse_cuda_mlp_stack(dt, n, acts.data(), in.data[Op::kX], w.data(),
                                                                       b.data(), y, d.M, widths, sp, bytes, stream);
                                      });
                 },
                 [&] {
                   // The layer buffers and the grid kernel's barrier counter (negative: an error code).
                   return WithScratch(context, Op::kX, onnxfuse_triton_mlp_stack_scratch_bytes(dt, n, d.M, widths),
                                      [&](void* sp, int64_t bytes) {
                                        return onnxfuse_triton_mlp_stack(dt, n, acts.data(), in.data[Op::kX], w.data(),
                                                                         b.data(), y, d.M, widths, mode, sp, bytes,
                                                                         stream);
                                      });
                 },
                 AutoPrefersCuda(triton::kMlpStack, d.M, widths[0]));
           })
        .release();
  }
  OpAttrs attrs;
  std::vector<int> acts;
  int mode;
};

}  // namespace

void RegisterMLPStackCuda(Ort::CustomOpDomain& domain) {
  AddVariadicOpAllTypes<MLPStackCuda>(domain, schema::MLPStack::kName, kCudaEp);
}

}  // namespace cuda
}  // namespace onnxfuse

#ifdef ONNXFUSE_WITH_TRITON
// ----------------------------------------------------------------------------------------------------
// Triton launcher of MLPStack (triton/mlp_stack.py).
//
// MLPStack: stack_mode picks the row-block kernel, the persistent grid kernel (cooperative launch, a barrier counter
// at the end of the caller's scratch, zeroed with cudaMemsetAsync on the same stream before each launch, so the
// sequence is CUDA-graph safe), or one linear_act per layer; auto follows triton/table.py (ChooseStackMode).
// (Triton builds only: without Triton, Dispatch never calls it; cuda/ops_cuda.h.)
using namespace onnxfuse::triton_runtime;  // NOLINT: the launchers below are the runtime's users

namespace {
// stack_mode=auto: which kernel runs a stack of M rows (triton/table.py's thresholds and the measurements behind
// them, through onnxfuse_ops.h).
//   grid   M <= kStackGridMaxM: the persistent kernel, every layer split over all SMs (small M: a row block per
//          program would leave most SMs idle);
//   fused  M >= kStackRowsMinSmMult x SMs: the row-block kernel;
//   layers in between, and whenever a layer is wider than kStackMaxWidth (every program would read every weight).
int ChooseStackMode(int64_t m, int n_layers, const int64_t* widths, int device) {
  for (int i = 0; i <= n_layers; ++i)
    if (widths[i] > ids::kStackMaxWidth) return ONNXFUSE_STACK_LAYERS;
  if (m <= ids::kStackGridMaxM) return ONNXFUSE_STACK_GRID;
  if (m >= ids::kStackRowsMinSmMult * NumSMs(device)) return ONNXFUSE_STACK_FUSED;
  return ONNXFUSE_STACK_LAYERS;
}

// The most tiles any layer of the stack has for the grid kernel's tile: the grid is min(SMs, this).
int64_t GridStackTiles(int64_t m, int n_layers, const int64_t* widths, const TritonSpec* spec) {
  int64_t most = 1;
  for (int i = 0; i < n_layers; ++i) {
    const int64_t t = Tiles(m, widths[i + 1], spec);
    most = t > most ? t : most;
  }
  return most;
}

// The layer arguments both stack kernels take after their own (triton/mlp_stack.py's _LAYER_PARAMS): hidden layers
// 1..3 (unused ones: null pointers, zero widths, relu) and the final layer. args() lists their addresses in order.
struct StackLayerArgs {
  const void* hw[3] = {nullptr, nullptr, nullptr};
  const void* hb[3] = {nullptr, nullptr, nullptr};
  int32_t hn[3] = {0, 0, 0};
  int32_t ha[3] = {ONNXFUSE_ACT_RELU, ONNXFUSE_ACT_RELU, ONNXFUSE_ACT_RELU};
  const void* wf;
  const void* bf;
  int32_t nf, af;

  StackLayerArgs(int n_layers, const int* acts, const void* const* w, const void* const* b, const int64_t* widths)
      : wf(w[n_layers - 1]), bf(b[n_layers - 1]), nf(int32_t(widths[n_layers])), af(acts[n_layers - 1]) {
    for (int i = 0; i + 1 < n_layers; ++i) {
      hw[i] = w[i];
      hb[i] = b[i];
      hn[i] = int32_t(widths[i + 1]);
      ha[i] = acts[i];
    }
  }
  // Copies the 16 addresses into out[0..15].
  void args(void** out) {
    void* a[] = {&hw[0], &hb[0], &hn[0], &ha[0], &hw[1], &hb[1], &hn[1], &ha[1],
                 &hw[2], &hb[2], &hn[2], &ha[2], &wf,    &bf,    &nf,    &af};
    for (int i = 0; i < 16; ++i) out[i] = a[i];
  }
};
}  // namespace

// The layer buffers, the grid kernel's barrier counter, then (128-byte aligned) the TMA descriptors of the
// per-layer linear_act launches where a layer may run on the persistent TMA kernel.
static int64_t StackTmaOffset(int64_t need) { return RoundUp128(need + ONNXFUSE_STACK_BARRIER_BYTES); }

extern "C" int64_t onnxfuse_triton_mlp_stack_scratch_bytes(int dtype, int n_layers, int64_t m, const int64_t* widths) {
  const int64_t need = onnxfuse_mlp_stack_scratch_bytes(dtype, n_layers, m, widths);
  if (need < 0) return need;
  int64_t tma = 0;
  for (int i = 0; i < n_layers; ++i) {
    const int64_t t = TmaScratchBytes(dtype, m, widths[i]);
    tma = t > tma ? t : tma;
  }
  return tma > 0 ? StackTmaOffset(need) + tma : need + ONNXFUSE_STACK_BARRIER_BYTES;
}

extern "C" int onnxfuse_triton_mlp_stack(int dtype, int n_layers, const int* acts, const void* x, const void* const* w,
                                         const void* const* b, void* y, int64_t m, const int64_t* widths, int mode,
                                         void* scratch, int64_t scratch_bytes, void* stream) {
  const int64_t need = onnxfuse_mlp_stack_scratch_bytes(dtype, n_layers, m, widths);
  if (need < 0) return int(need);
  if (acts == nullptr || w == nullptr || b == nullptr || mode < 0 || mode >= onnxfuse::schema::kNumStackModes)
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  for (int i = 0; i < n_layers; ++i) {
    if ((acts[i] != ONNXFUSE_ACT_RELU && acts[i] != ONNXFUSE_ACT_SIGMOID) || w[i] == nullptr || b[i] == nullptr)
      return ONNXFUSE_ERR_BAD_ARGUMENT;
  }
  for (int i = 0; i <= n_layers; ++i) {
    if (widths[i] < 0) return ONNXFUSE_ERR_BAD_ARGUMENT;
    if (TooLarge(m, widths[i], 0)) return ONNXFUSE_ERR_TOO_LARGE;
  }
  if (need > 0 && (scratch == nullptr || !Aligned16(scratch) || scratch_bytes < need)) return ONNXFUSE_ERR_BAD_ARGUMENT;
  if (m == 0 || widths[n_layers] == 0) return 0;
  int device = 0;
  const int arch = CurrentArch(&device);
  if (arch < 0) return -arch;
  const int mode_requested = mode;
  if (mode == ONNXFUSE_STACK_AUTO) mode = ChooseStackMode(m, n_layers, widths, device);
  bool aligned = Aligned16(x) && Aligned16(y) && (need == 0 || Aligned16(scratch));
  for (int i = 0; i < n_layers; ++i) aligned = aligned && Aligned16(w[i]) && Aligned16(b[i]);
  for (int i = 1; i < n_layers; ++i) aligned = aligned && widths[i] % 16 == 0;
  if (mode == ONNXFUSE_STACK_GRID) {
    if (scratch == nullptr || scratch_bytes < need + ONNXFUSE_STACK_BARRIER_BYTES) return ONNXFUSE_ERR_BAD_ARGUMENT;
    int index = -1;
    const TritonSpec* spec = FindExact(ids::kMlpStackGrid, dtype, SizeClass(m), aligned ? 1 : 0, 0, arch, &index);
    if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
    int64_t grid = GridStackTiles(m, n_layers, widths, spec);
    const int64_t sms = NumSMs(device);
    grid = grid < sms ? grid : sms;  // at most one program per SM: all resident, so the barrier cannot deadlock
    int32_t M = int32_t(m), K0 = int32_t(widths[0]), L = n_layers;
    int32_t SW = int32_t(onnxfuse_mlp_stack_scratch_width(n_layers, widths));
    const void* s_ptr = need > 0 ? scratch : y;
    void* bar_ptr = static_cast<char*>(scratch) + need;
    StackLayerArgs layers(n_layers, acts, w, b, widths);
    void* scratch_global = nullptr;
    void* scratch_profile = nullptr;
    void* args[8 + 16 + 2] = {&x, &y, &s_ptr, &bar_ptr, &M, &K0, &SW, &L};
    layers.args(args + 8);
    args[24] = &scratch_global;
    args[25] = &scratch_profile;
    // The barrier counter starts at zero for every launch: reset on the stream, so a CUDA graph replays it too.
    cudaError_t e = cudaMemsetAsync(bar_ptr, 0, sizeof(int32_t), static_cast<cudaStream_t>(stream));
    if (e != cudaSuccess) return int(e);
    const int err = LaunchSpec(spec, index, device, grid, args, stream, ids::kStackGridCooperative != 0);
    // The driver could not make every program resident at once (another context holding SMs, say): nothing ran,
    // so the stack runs layer by layer instead of risking the barrier.
    if (err != int(cudaErrorCooperativeLaunchTooLarge) || mode_requested == ONNXFUSE_STACK_GRID) return err;
    (void)cudaGetLastError();  // the refused launch left its error in the runtime's last-error slot
    mode = ONNXFUSE_STACK_LAYERS;
  }
  if (mode != ONNXFUSE_STACK_FUSED) {
    const int64_t tma_offset = StackTmaOffset(need);
    void* tma_scratch =
        scratch != nullptr && scratch_bytes > tma_offset ? static_cast<char*>(scratch) + tma_offset : nullptr;
    const int64_t tma_bytes = tma_scratch != nullptr ? scratch_bytes - tma_offset : 0;
    return onnxfuse::StackPerLayer(n_layers, x, y, scratch, need, [&](int i, const void* in, void* out) {
      return onnxfuse_triton_linear_act(dtype, acts[i], in, w[i], b[i], out, m, widths[i], widths[i + 1], tma_scratch,
                                        tma_bytes, stream);
    });
  }
  // BLOCK_M (mlp_stack's size classes 0/1/2 = 16/32/64 rows): the smallest whose grid fits on the SMs, else the
  // largest.
  const TritonSpec* spec = nullptr;
  int index = -1;
  for (int size_class = 0; size_class < ids::kNumSizeClasses; ++size_class) {
    int idx = -1;
    const TritonSpec* s = FindExact(ids::kMlpStack, dtype, size_class, aligned ? 1 : 0, 0, arch, &idx);
    if (s == nullptr) continue;
    spec = s;
    index = idx;
    if ((m + s->block_m - 1) / s->block_m <= NumSMs(device)) break;
  }
  if (spec == nullptr) return ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH;
  int32_t M = int32_t(m), K0 = int32_t(widths[0]), L = n_layers;
  int32_t SW = int32_t(onnxfuse_mlp_stack_scratch_width(n_layers, widths));
  const void* s_ptr = need > 0 ? scratch : y;  // never read or written when L == 1
  StackLayerArgs layers(n_layers, acts, w, b, widths);
  void* scratch_global = nullptr;
  void* scratch_profile = nullptr;
  void* args[7 + 16 + 2] = {&x, &y, &s_ptr, &M, &K0, &SW, &L};
  layers.args(args + 7);
  args[23] = &scratch_global;
  args[24] = &scratch_profile;
  return LaunchSpec(spec, index, device, (m + spec->block_m - 1) / spec->block_m, args, stream);
}
#endif  // ONNXFUSE_WITH_TRITON
#endif  // __CUDACC__
