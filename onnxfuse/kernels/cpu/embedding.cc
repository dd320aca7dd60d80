// Embedding on the CPU EP: Y = table[ids], a row copy per id. Negative ids count from the end (Gather's rule); an id
// outside [-V, V) fails the call naming it, as onnxruntime's Gather does.
#include <cstring>

#include "cpu/ops.h"

namespace onnxfuse {
namespace cpu {
namespace {

template <typename T>
struct EmbeddingCpu {
  using Op = schema::Embedding;
  EmbeddingCpu(const OrtApi* api, const OrtKernelInfo* info) : attrs(ReadOpAttrs(api, info, Op::kName)) {}

  Ort::Status Compute(const Ort::Custom::Tensor<T>& Table, const Ort::Custom::Tensor<int64_t>& Ids,
                      Ort::Custom::Tensor<T>& Y) {
    return GuardCompute([&] {
      const LookupDims d = EmbeddingDimsOf(Op::kName, Table.Shape(), Ids.Shape());
      T* y = Y.Allocate(d.out_shape);
      if (d.n == 0 || d.D == 0) return;
      const T* table = Table.Data();
      const int64_t* ids = Ids.Data();
      const size_t row_bytes = size_t(d.D) * sizeof(T);
      for (int64_t i = 0; i < d.n; ++i) {
        int64_t id = ids[i];
        if (id < -d.V || id >= d.V)
          Fail(std::string(Op::kName) + ": id " + std::to_string(id) + " at position " + std::to_string(i) +
                   " is out of the table's range [-" + std::to_string(d.V) + ", " + std::to_string(d.V) + ")",
               ORT_INVALID_ARGUMENT);
        if (id < 0) id += d.V;
        std::memcpy(y + i * d.D, table + id * d.D, row_bytes);
      }
    });
  }

  OpAttrs attrs;
};

}  // namespace

void RegisterEmbedding(Ort::CustomOpDomain& domain) {
  AddOpAllTypes<EmbeddingCpu>(domain, schema::Embedding::kName, kCpuEp);
}

}  // namespace cpu
}  // namespace onnxfuse
