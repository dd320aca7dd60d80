// Every op of onnxfuse/schema.py for the CPU EP, each for float, float16 and bfloat16: one Register<Family>() per
// family of the generated ONNXFUSE_OP_FAMILIES (onnxfuse.ops.FAMILIES), in op-index order.
#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {

void RegisterOps(Ort::CustomOpDomain& domain) {
#define ONNXFUSE_CALL_CPU_REGISTER(Family) Register##Family(domain);
  ONNXFUSE_OP_FAMILIES(ONNXFUSE_CALL_CPU_REGISTER)
#undef ONNXFUSE_CALL_CPU_REGISTER
}

}  // namespace cpu
}  // namespace onnxfuse
