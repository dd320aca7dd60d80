// Issue 27: cuda/cached_attention.cu's kernels with the probe's extras, for scripts/decode_attention_probe.py: the
// decode step's largest cluster and block size as macros (-DONNXFUSE_DECODE_MAX_CLUSTER=4, 8 or 16,
// -DONNXFUSE_DECODE_BLOCK=128 or 256; unset: the library's choice), and how many clusters of a size the device holds
// at once (probe_max_clusters: the fp16 head-of-128 build's, lanes 16). Built here, from onnxfuse/kernels:
//   nvcc -O3 -DNDEBUG -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -I. -Icuda -IGENERATED \
//       ../../scripts/decode_attention_probe.cu cuda/gemm.cu -o ca_c8.so -DONNXFUSE_DECODE_MAX_CLUSTER=8
#include "cuda/cached_attention.cu"

extern "C" int probe_max_clusters(int cluster, int threads) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return -1;
  return threads == 256 ? HeldClusters<__half, 256, 16>(device, cluster)
                        : HeldClusters<__half, 128, 16>(device, cluster);
}
