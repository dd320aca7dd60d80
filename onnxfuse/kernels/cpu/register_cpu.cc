// Every op of onnxfuse/schema.py for the CPU EP, each for float, float16 and bfloat16.
#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {

void RegisterOps(Ort::CustomOpDomain& domain) {
  RegisterLinearAct(domain);
  RegisterSwiGLU(domain);
  RegisterLoRALinear(domain);
  RegisterMLPStack(domain);
  RegisterRotaryEmbedding(domain);
  RegisterEmbedding(domain);
  RegisterEmbeddingInteraction(domain);
}

}  // namespace cpu
}  // namespace onnxfuse
