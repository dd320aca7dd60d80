// The part of NVIDIA's cuBLASLt C API that the CUDA backend calls, declared here so that the library builds with any
// CUDA toolkit's nvcc (the toolkit's cuBLAS headers are optional) and loads libcublasLt at run time (dlopen, see
// cuda/gemm.cu) instead of linking it: the library keeps loading where no cuBLAS is installed (CPU-only
// onnxruntime), and on the GPU it uses the libcublasLt.so.N that onnxruntime-gpu's CUDA EP has already loaded.
//
// These are ABI facts of the cuBLASLt C interface, unchanged since CUDA 11 (cuBLASLt 11, 12 and 13): the enum values,
// the two small structs and the function signatures. tests/kernels/test_cublaslt_abi.py compiles this header next to
// a real cublasLt.h (where one is found: the CUDA toolkit, the nvidia-cublas wheel, $ONNXFUSE_CUBLASLT_INCLUDE) and
// asserts every value and size is the same.
#pragma once
#include <cuda_runtime_api.h>
#include <library_types.h>  // cudaDataType_t (CUDA_R_16F, CUDA_R_16BF, CUDA_R_32F): part of the CUDA runtime headers

#include <stddef.h>
#include <stdint.h>

namespace onnxfuse::cublaslt {

using Status = int;  // cublasStatus_t
constexpr Status kStatusSuccess = 0;
constexpr Status kStatusNotSupported = 15;

// cublasComputeType_t
constexpr int kCompute32F = 68;  // fp32 accumulation, inputs not down-converted (no TF32)

// cublasOperation_t
constexpr int32_t kOpN = 0;
constexpr int32_t kOpT = 1;

// cublasLtMatmulDescAttributes_t
constexpr int kDescTransA = 3;
constexpr int kDescTransB = 4;
constexpr int kDescEpilogue = 7;     // uint32_t
constexpr int kDescBiasPointer = 8;  // const void*

// cublasLtEpilogue_t
constexpr uint32_t kEpilogueDefault = 1;
constexpr uint32_t kEpilogueRelu = 2;
constexpr uint32_t kEpilogueBias = 4;
constexpr uint32_t kEpilogueReluBias = 6;

// cublasLtMatmulPreferenceAttributes_t
constexpr int kPrefMaxWorkspaceBytes = 1;   // uint64_t
constexpr int kPrefMinAlignmentABytes = 5;  // uint32_t, and B, C, D after it
constexpr int kPrefMinAlignmentBBytes = 6;
constexpr int kPrefMinAlignmentCBytes = 7;
constexpr int kPrefMinAlignmentDBytes = 8;

struct MatmulAlgo {  // cublasLtMatmulAlgo_t
  uint64_t data[8];
};
struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  MatmulAlgo algo;
  size_t workspaceSize;
  Status state;
  float wavesCount;
  int reserved[4];
};

// Opaque handles (pointers in the C API).
using Handle = void*;      // cublasLtHandle_t
using MatmulDesc = void*;  // cublasLtMatmulDesc_t
using Layout = void*;      // cublasLtMatrixLayout_t
using Preference = void*;  // cublasLtMatmulPreference_t

// The entry points, resolved with dlsym from libcublasLt.
struct Api {
  Status (*Create)(Handle*);
  Status (*MatmulDescCreate)(MatmulDesc*, int compute_type, cudaDataType_t scale_type);
  Status (*MatmulDescDestroy)(MatmulDesc);
  Status (*MatmulDescSetAttribute)(MatmulDesc, int attr, const void* buf, size_t size);
  Status (*MatrixLayoutCreate)(Layout*, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld);
  Status (*MatrixLayoutDestroy)(Layout);
  Status (*MatmulPreferenceCreate)(Preference*);
  Status (*MatmulPreferenceDestroy)(Preference);
  Status (*MatmulPreferenceSetAttribute)(Preference, int attr, const void* buf, size_t size);
  Status (*MatmulAlgoGetHeuristic)(Handle, MatmulDesc, Layout a, Layout b, Layout c, Layout d, Preference,
                                   int requested, HeuristicResult* results, int* returned);
  Status (*Matmul)(Handle, MatmulDesc, const void* alpha, const void* a, Layout a_desc, const void* b, Layout b_desc,
                   const void* beta, const void* c, Layout c_desc, void* d, Layout d_desc, const MatmulAlgo* algo,
                   void* workspace, size_t workspace_bytes, cudaStream_t stream);
  const char* (*GetStatusName)(Status);
  size_t (*GetVersion)(void);
};

}  // namespace onnxfuse::cublaslt
