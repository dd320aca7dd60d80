// The table row an embedding op looks up (onnxfuse/schema.py, EmbeddingInteraction): shared by the CPU kernel, the
// CUDA kernels (as a device function) and, in spirit, the Triton kernel and the ONNX function body, which spell the
// same steps. Plain C (no ORT, no CUDA headers), so g++ and nvcc both compile it.
#pragma once
#include <stdint.h>

#include "onnxfuse_ops.h"

#ifdef __CUDACC__
#define ONNXFUSE_ROW_FN __host__ __device__ __forceinline__
#else
#define ONNXFUSE_ROW_FN static inline
#endif

// The hash (ONNXFUSE_HASH_MOD: (id + 1) mod card, Python's modulus, wrapping at INT64_MAX like torch and
// onnxruntime), then a negative id counted from the end of its table (ONNX Gather), then the row in the
// concatenated table; -1 (a zero vector) for an id outside [0, card) or a row outside [0, rows). Never overflows.
ONNXFUSE_ROW_FN int64_t onnxfuse_embedding_row(int64_t id, int hash, int64_t card, int64_t table_offset, int64_t rows) {
  if (card <= 0) return -1;
  if (hash == ONNXFUSE_HASH_MOD) {
    const int64_t v = (int64_t)((uint64_t)id + 1u);
    // 32-bit division where both fit (the usual hashed id): the same remainder, several times faster than 64-bit
    if ((uint64_t)v <= 0xffffffffu && card <= 0xffffffff) {
      id = (int64_t)((uint32_t)v % (uint32_t)card);
    } else {
      const int64_t h = v % card;
      id = h < 0 ? h + card : h;
    }
  } else if (id < 0) {
    id += card;  // id < 0 < card: no overflow
  }
  if (id < 0 || id >= card) return -1;
  // row = table_offset + id without overflow (id >= 0 here)
  if (table_offset > 0 && id > INT64_MAX - table_offset) return -1;
  const int64_t row = table_offset + id;
  return row >= 0 && row < rows ? row : -1;
}
