// Every op of onnxfuse/schema.py for the CUDA execution provider: one Register<Family>Cuda() per family of the
// generated ONNXFUSE_OP_FAMILIES (onnxfuse.ops.FAMILIES), in op-index order. The kernel structs live beside their
// kernels, in the host half of cuda/<family>.cu; what they share (Dispatch, DeviceScratch) in cuda/ops_cuda.h.
#include "cuda/ops_cuda.h"

namespace onnxfuse {
namespace cuda {

void RegisterOps(Ort::CustomOpDomain& domain) {
#define ONNXFUSE_CALL_CUDA_REGISTER(Family) Register##Family##Cuda(domain);
  ONNXFUSE_OP_FAMILIES(ONNXFUSE_CALL_CUDA_REGISTER)
#undef ONNXFUSE_CALL_CUDA_REGISTER
}

}  // namespace cuda
}  // namespace onnxfuse
