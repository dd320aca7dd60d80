// MLPStack on the CUDA EP: the kernel struct calling cuda/mlp_stack.cu's launcher or the Triton one
// (cuda/triton/mlp_stack.cc) through Dispatch (cuda/ops_cuda.h), and its registration.
#include <vector>

#include "cuda/ops_cuda.h"

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
