// The CUDA backend's GEMM on cuBLASLt (cuda/gemm.h): loading libcublasLt, one handle per device and host thread,
// one cached plan (descriptors + the heuristic's algorithm) per problem, and the K = 0 case. Also the launchers'
// error strings (onnxfuse_cuda_error_string), the switch for programmatic dependent launches (ONNXFUSE_PDL) and the
// current device's compute capability (onnxfuse_cuda_current_arch).
//
// Loading: dlopen of libcublasLt.so.13, .so.12, then .so, first among the libraries already in the process
// (RTLD_NOLOAD: the one onnxruntime-gpu's CUDA EP linked), then by the loader's search path. Nothing links it, so
// the library still loads where no cuBLAS is installed; a CUDA-backend GEMM then fails with ONNXFUSE_ERR_NO_CUBLASLT.
//
// CUDA graphs: cublasLtMatmul only enqueues work on the stream it is given; the workspace is the caller's (from
// onnxruntime's allocator). The heuristic query and the descriptors are host work, done on a plan's first use (in
// ORT's warm-up run, before any capture) and cached.
//
// Threads: a cuBLASLt handle and the plans (whose descriptor holds the bias pointer, set per call) are per host
// thread, so concurrent Run() calls on one session share nothing mutable. Handles are deliberately never
// destroyed: their count is bounded by onnxruntime's threads, and destroying one at process exit can run after the
// CUDA driver has shut down.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "cublaslt_api.h"
#include "gemm.h"

namespace onnxfuse::cuda_kernels {
namespace {

namespace lt = onnxfuse::cublaslt;

// The last cuBLASLt failure of this thread, for onnxfuse_cuda_error_string(ONNXFUSE_ERR_CUBLAS).
thread_local char g_cublas_error[160] = "onnxfuse: cuBLASLt call failed";

const lt::Api* LoadApi() {
  static lt::Api api{};
  static const lt::Api* loaded = []() -> const lt::Api* {
    static const char* kNames[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    void* lib = nullptr;
    for (int flags : {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL})
      for (const char* name : kNames)
        if (lib == nullptr) lib = dlopen(name, flags);
    if (lib == nullptr) return nullptr;
    bool ok = true;
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      ok = ok && fn != nullptr;
    };
    sym(api.Create, "cublasLtCreate");
    sym(api.MatmulDescCreate, "cublasLtMatmulDescCreate");
    sym(api.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
    sym(api.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    sym(api.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    sym(api.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    sym(api.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    sym(api.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    sym(api.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    sym(api.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(api.Matmul, "cublasLtMatmul");
    sym(api.GetStatusName, "cublasLtGetStatusName");
    sym(api.GetVersion, "cublasLtGetVersion");
    return ok ? &api : nullptr;
  }();
  return loaded;
}

int CublasFail(const lt::Api* api, const char* call, lt::Status st) {
  std::snprintf(g_cublas_error, sizeof g_cublas_error, "onnxfuse: cuBLASLt %s failed: %s (cuBLASLt %zu)", call,
                api->GetStatusName(st), api->GetVersion());
  return ONNXFUSE_ERR_CUBLAS;
}

cudaDataType_t LtType(int dtype) {
  return dtype == ONNXFUSE_FP32 ? CUDA_R_32F : dtype == ONNXFUSE_FP16 ? CUDA_R_16F : CUDA_R_16BF;
}

// The largest power of two (<= 256) dividing the address: cuBLASLt's heuristic picks by the operands' alignment.
uint32_t AlignmentOf(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al) al /= 2;
  return al;
}

// A problem: what the descriptors and the heuristic's choice depend on.
using PlanKey = std::tuple<int, int, int64_t, int64_t, int64_t, uint32_t, bool, uint32_t, uint32_t, uint32_t, uint32_t,
                           uint32_t, int64_t, bool>;

struct Plan {
  lt::MatmulDesc desc = nullptr;
  lt::Layout a = nullptr, b = nullptr, c = nullptr;  // W, X, Y (C and D share a layout)
  lt::MatmulAlgo algo{};
  size_t workspace = 0;
};

struct ThreadState {
  std::map<int, lt::Handle> handles;  // per device
  std::map<PlanKey, Plan> plans;      // never erased: one per distinct problem this thread ran
};
thread_local ThreadState t_state;

int MakePlan(const lt::Api* api, lt::Handle h, const GemmArgs& g, uint32_t epilogue, const uint32_t align[4],
             int64_t workspace_bytes, Plan* plan) {
  const cudaDataType_t t = LtType(g.dtype);
  lt::Status st = api->MatmulDescCreate(&plan->desc, lt::kCompute32F, CUDA_R_32F);
  if (st != lt::kStatusSuccess) return CublasFail(api, "MatmulDescCreate", st);
  const int32_t op_n = lt::kOpN, op_a = g.trans_w ? lt::kOpT : lt::kOpN;
  api->MatmulDescSetAttribute(plan->desc, lt::kDescTransA, &op_a, sizeof op_a);
  api->MatmulDescSetAttribute(plan->desc, lt::kDescTransB, &op_n, sizeof op_n);
  api->MatmulDescSetAttribute(plan->desc, lt::kDescEpilogue, &epilogue, sizeof epilogue);
  if (g.bias != nullptr) api->MatmulDescSetAttribute(plan->desc, lt::kDescBiasPointer, &g.bias, sizeof g.bias);
  // W^T [N, K] row-major is the column-major [K, N] (ld K), transposed by the op.
  const lt::Status st_a = g.trans_w ? api->MatrixLayoutCreate(&plan->a, t, uint64_t(g.k), uint64_t(g.n), g.k)
                                    : api->MatrixLayoutCreate(&plan->a, t, uint64_t(g.n), uint64_t(g.k), g.n);
  if ((st = st_a) != lt::kStatusSuccess ||
      (st = api->MatrixLayoutCreate(&plan->b, t, uint64_t(g.k), uint64_t(g.m), g.k)) != lt::kStatusSuccess ||
      (st = api->MatrixLayoutCreate(&plan->c, t, uint64_t(g.n), uint64_t(g.m), g.n)) != lt::kStatusSuccess)
    return CublasFail(api, "MatrixLayoutCreate", st);
  lt::Preference pref = nullptr;
  if ((st = api->MatmulPreferenceCreate(&pref)) != lt::kStatusSuccess)
    return CublasFail(api, "MatmulPreferenceCreate", st);
  const uint64_t ws = uint64_t(workspace_bytes);
  api->MatmulPreferenceSetAttribute(pref, lt::kPrefMaxWorkspaceBytes, &ws, sizeof ws);
  api->MatmulPreferenceSetAttribute(pref, lt::kPrefMinAlignmentABytes, &align[0], sizeof align[0]);
  api->MatmulPreferenceSetAttribute(pref, lt::kPrefMinAlignmentBBytes, &align[1], sizeof align[1]);
  api->MatmulPreferenceSetAttribute(pref, lt::kPrefMinAlignmentCBytes, &align[2], sizeof align[2]);
  api->MatmulPreferenceSetAttribute(pref, lt::kPrefMinAlignmentDBytes, &align[3], sizeof align[3]);
  lt::HeuristicResult result{};
  int found = 0;
  st = api->MatmulAlgoGetHeuristic(h, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &found);
  api->MatmulPreferenceDestroy(pref);
  if (st != lt::kStatusSuccess) return CublasFail(api, "MatmulAlgoGetHeuristic", st);
  if (found < 1) return CublasFail(api, "MatmulAlgoGetHeuristic (no algorithm)", lt::kStatusNotSupported);
  plan->algo = result.algo;
  plan->workspace = result.workspaceSize;
  return 0;
}

template <typename T>
struct BiasFill {  // Y[i] = [relu](beta * C[i] + bias[i % n]) for K = 0
  const T* bias;
  const T* c;
  T* y;
  int64_t n;
  float beta;
  bool relu;
  __device__ void operator()(int64_t i) const {
    float v = (bias != nullptr ? to_f(bias[i % n]) : 0.f) + (c != nullptr ? beta * to_f(c[i]) : 0.f);
    if (relu) v = v > 0.f ? v : (v != v ? v : 0.f);
    y[i] = from_f<T>(v);
  }
};

template <typename T>
struct ReluKeepingNan {  // Y[i] = relu(Y[i]); NaN stays NaN
  T* y;
  __device__ void operator()(int64_t i) const {
    const float v = to_f(y[i]);
    if (!(v > 0.f) && v == v) y[i] = from_f<T>(0.f);
  }
};

}  // namespace

int64_t ElemBytes(int dtype) { return dtype == ONNXFUSE_FP32 ? 4 : 2; }

int Gemm(const GemmArgs& g, void* workspace, int64_t workspace_bytes, cudaStream_t stream) {
  if (g.m <= 0 || g.n <= 0) return 0;
  if (g.k == 0) {
    return ByDtype(g.dtype, [&](auto tag) {
      using T = decltype(tag);
      const BiasFill<T> f{static_cast<const T*>(g.bias),
                          g.beta != 0.f ? static_cast<const T*>(g.c) : nullptr,
                          static_cast<T*>(g.y),
                          g.n,
                          g.beta,
                          g.relu};
      return LaunchElementwise(g.m * g.n, f, stream);
    });
  }
  const lt::Api* api = LoadApi();
  if (api == nullptr) return ONNXFUSE_ERR_NO_CUBLASLT;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device)) return int(e);
  ThreadState& ts = t_state;
  lt::Handle& h = ts.handles[device];
  if (h == nullptr) {
    if (lt::Status st = api->Create(&h)) {
      h = nullptr;
      return CublasFail(api, "Create", st);
    }
  }
  // cuBLASLt's fp16 ReLU epilogue turns NaN into 0 (onnxfuse doctor --special-values on an H100: LinearRelu and
  // MLPStack fp16 lost every NaN row; its fp32 and bf16 epilogues kept them), so fp16 takes the bias epilogue and a
  // NaN-keeping ReLU pass over Y after the GEMM.
  const bool relu_after = g.relu && g.dtype == ONNXFUSE_FP16;
  const bool relu_epi = g.relu && !relu_after;
  const uint32_t epilogue = g.bias != nullptr ? (relu_epi ? lt::kEpilogueReluBias : lt::kEpilogueBias)
                                              : (relu_epi ? lt::kEpilogueRelu : lt::kEpilogueDefault);
  const void* c = g.beta != 0.f ? g.c : g.y;
  const uint32_t align[4] = {AlignmentOf(g.w), AlignmentOf(g.x), AlignmentOf(c), AlignmentOf(g.y)};
  const PlanKey key{
      device,          g.dtype,  g.m,      g.k,      g.n,      epilogue,
      g.beta != 0.f,   align[0], align[1], align[2], align[3], g.bias != nullptr ? AlignmentOf(g.bias) : 0,
      workspace_bytes, g.trans_w};
  auto it = ts.plans.find(key);
  if (it == ts.plans.end()) {
    Plan plan;
    const int err = MakePlan(api, h, g, epilogue, align, workspace_bytes, &plan);
    if (err != 0) {
      if (plan.desc) api->MatmulDescDestroy(plan.desc);
      for (lt::Layout l : {plan.a, plan.b, plan.c})
        if (l) api->MatrixLayoutDestroy(l);
      return err;
    }
    it = ts.plans.emplace(key, plan).first;
  }
  Plan& p = it->second;
  if (g.bias != nullptr) api->MatmulDescSetAttribute(p.desc, lt::kDescBiasPointer, &g.bias, sizeof g.bias);
  if (p.workspace > uint64_t(workspace_bytes) || (p.workspace > 0 && workspace == nullptr))
    return ONNXFUSE_ERR_BAD_ARGUMENT;
  const lt::Status st = api->Matmul(h, p.desc, &g.alpha, g.w, p.a, g.x, p.b, &g.beta, c, p.c, g.y, p.c, &p.algo,
                                    workspace, p.workspace, stream);
  if (st != lt::kStatusSuccess) return CublasFail(api, "Matmul", st);
  if (relu_after) return LaunchElementwise(g.m * g.n, ReluKeepingNan<__half>{static_cast<__half*>(g.y)}, stream);
  return 0;
}

int LoRAGemm(GemmArgs g, const void* a, const void* b, float scale, int64_t r, void* t, void* workspace,
             int64_t workspace_bytes, cudaStream_t stream) {
  const bool low_rank = r > 0 && g.k > 0 && scale != 0.f;  // else the LoRA term is exactly zero
  if (low_rank) {
    GemmArgs ta;  // T = scale * X @ A   [M, r]
    ta.dtype = g.dtype, ta.x = g.x, ta.w = a, ta.y = t, ta.m = g.m, ta.k = g.k, ta.n = r, ta.alpha = scale;
    if (int err = Gemm(ta, workspace, workspace_bytes, stream)) return err;
    GemmArgs tb;  // Y = T @ B           [M, N]
    tb.dtype = g.dtype, tb.x = t, tb.w = b, tb.y = g.y, tb.m = g.m, tb.k = r, tb.n = g.n;
    if (int err = Gemm(tb, workspace, workspace_bytes, stream)) return err;
    g.c = g.y, g.beta = 1.f;  // Y = [relu](X @ W + Y + bias)
  }
  return Gemm(g, workspace, workspace_bytes, stream);
}

namespace {
constexpr int kShrinkThreads = 256, kExpandThreads = 128, kExpandCols = 2;  // columns per expand thread

// Slices of K for the shrink kernel: about 512 blocks over M rows (a decode batch's few rows need many slices to
// have their A rows' loads in flight: with 256 blocks the 7B down projection's 8 rows took 11.7 us on an H100), each
// slice at least 64 long.
int64_t ShrinkSplit(int64_t m, int64_t k) {
  const int64_t most = (k + 63) / 64;
  int64_t split = (512 + m - 1) / (m > 0 ? m : 1);
  split = split < most ? split : most;
  return split < 1 ? 1 : split;
}

// t[s, row, :] = X[row, slice s] @ A[j, slice s, :] in fp32 (zeros for a row without an adapter). Block (row, s);
// thread (q = tid % r, lane = tid / r) sums lane, lane + lanes, ... of the slice: consecutive threads read
// consecutive elements of A's [K, r] rows.
template <typename T>
__global__ void MultiShrinkKernel(const T* __restrict__ x, const T* __restrict__ a, const int64_t* __restrict__ index,
                                  float* __restrict__ t, int64_t m, int64_t k, int64_t r, int64_t adapters,
                                  int64_t rows_per_index, int64_t k_per_split) {
  __shared__ float red[kShrinkThreads];
  const int64_t row = blockIdx.x, split = blockIdx.y;
  const int64_t j = index[row / rows_per_index];
  float* out = t + (split * m + row) * r;
  const int tid = threadIdx.x, lanes = kShrinkThreads / int(r);
  float acc = 0.f;
  if (j >= 0 && j < adapters && tid < lanes * r) {
    const int64_t q = tid % r, k0 = split * k_per_split, k1 = k0 + k_per_split < k ? k0 + k_per_split : k;
    const T* xr = x + row * k;
    const T* aj = a + j * k * r;
#pragma unroll 4
    for (int64_t kk = k0 + tid / r; kk < k1; kk += lanes) acc += to_f(xr[kk]) * to_f(aj[kk * r + q]);
  }
  red[tid] = acc;
  __syncthreads();
  if (tid < r) {
    float s = 0.f;
    for (int l = 0; l < lanes; ++l) s += red[l * r + tid];
    out[tid] = s;
  }
}

// Y[row, col] += scales[j] * sum_q T[row, q] * B[j, q, col] for ROWS rows a block (T summed over the shrink's
// slices into shared memory), kExpandCols adjacent columns a thread (the q loop unrolled: several B rows' loads in
// flight); rows without an adapter untouched, rows with j >= adapters NaN.
template <typename T, int ROWS>
__global__ void MultiExpandKernel(const float* __restrict__ t, int64_t split, const T* __restrict__ b,
                                  const T* __restrict__ scales, const int64_t* __restrict__ index, T* __restrict__ y,
                                  int64_t m, int64_t n, int64_t r, int64_t adapters, int64_t rows_per_index) {
  __shared__ float ts[ROWS][ONNXFUSE_MAX_LORA_RANK];
  __shared__ int64_t js[ROWS];
  __shared__ float ss[ROWS];
  const int64_t row0 = int64_t(blockIdx.y) * ROWS;
  const int rows = int(m - row0 < ROWS ? m - row0 : ROWS);
  // T's rows: the shrink's split partials summed, several lanes per element where the block has threads to spare
  // (each lane a strided share of the partials, then the lanes in order: deterministic), so the split partials'
  // loads are in flight together instead of one after another.
  __shared__ float red[kExpandThreads];
  const int elems = rows * int(r), lanes = elems < kExpandThreads ? kExpandThreads / elems : 1;
  for (int e0 = 0; e0 < elems; e0 += kExpandThreads / lanes) {
    const int e = e0 + threadIdx.x % (kExpandThreads / lanes), lane = threadIdx.x / (kExpandThreads / lanes);
    float s = 0.f;
    if (e < elems && lane < lanes)
      for (int64_t p = lane; p < split; p += lanes) s += t[(p * m + row0 + e / r) * r + e % r];
    red[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x < kExpandThreads / lanes && e < elems) {
      float sum = 0.f;
      for (int l = 0; l < lanes; ++l) sum += red[l * (kExpandThreads / lanes) + threadIdx.x];
      ts[e / r][e % r] = sum;
    }
    __syncthreads();
  }
  if (threadIdx.x < rows) {
    const int64_t j = index[(row0 + threadIdx.x) / rows_per_index];
    js[threadIdx.x] = j;
    ss[threadIdx.x] = j >= 0 && j < adapters ? to_f(scales[j]) : 0.f;
  }
  __syncthreads();
  const int64_t col = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kExpandCols;
  if (col >= n) return;
  const int cols = int(n - col < kExpandCols ? n - col : kExpandCols);
  for (int i = 0; i < rows; ++i) {
    const int64_t j = js[i];
    if (j < 0) continue;
    T* yp = y + (row0 + i) * n + col;
    if (j >= adapters) {
      for (int c = 0; c < cols; ++c) yp[c] = from_f<T>(__int_as_float(0x7fc00000));
      continue;
    }
    const T* bj = b + j * r * n + col;
    float acc[kExpandCols] = {};
    if (cols == kExpandCols) {
#pragma unroll 8
      for (int q = 0; q < r; ++q) {
        const float tq = ts[i][q];
#pragma unroll
        for (int c = 0; c < kExpandCols; ++c) acc[c] += tq * to_f(bj[q * n + c]);
      }
    } else {
      for (int q = 0; q < r; ++q)
        for (int c = 0; c < cols; ++c) acc[c] += ts[i][q] * to_f(bj[q * n + c]);
    }
    for (int c = 0; c < cols; ++c) yp[c] = from_f<T>(to_f(yp[c]) + ss[i] * acc[c]);
  }
}
}  // namespace

int64_t MultiLoRAPartialsBytes(int64_t m, int64_t k, int64_t r) {
  return ShrinkSplit(m, k) * m * r * int64_t(sizeof(float));
}

int MultiLoRAGemm(GemmArgs g, const void* a, const void* b, const void* scales, const int64_t* index, int64_t r,
                  int64_t adapters, int64_t rows_per_index, float* t, void* workspace, int64_t workspace_bytes,
                  cudaStream_t stream) {
  if (int err = Gemm(g, workspace, workspace_bytes, stream)) return err;
  const int64_t m = g.m, k = g.k, n = g.n;
  if (r == 0 || m == 0 || n == 0) return 0;
  const int64_t split = ShrinkSplit(m, k), k_per_split = (k + split - 1) / split;
  const int64_t rows = m <= 64 ? 1 : 16;
  return ByDtype(g.dtype, [&](auto zero) {
    using T = decltype(zero);
    MultiShrinkKernel<T><<<dim3(unsigned(m), unsigned(split)), kShrinkThreads, 0, stream>>>(
        static_cast<const T*>(g.x), static_cast<const T*>(a), index, t, m, k, r, adapters, rows_per_index, k_per_split);
    const int64_t per_block = int64_t(kExpandThreads) * kExpandCols;
    const dim3 grid(unsigned((n + per_block - 1) / per_block), unsigned((m + rows - 1) / rows));
    const T *bp = static_cast<const T*>(b), *sp = static_cast<const T*>(scales);
    T* yp = static_cast<T*>(g.y);
    if (rows == 1)
      MultiExpandKernel<T, 1>
          <<<grid, kExpandThreads, 0, stream>>>(t, split, bp, sp, index, yp, m, n, r, adapters, rows_per_index);
    else
      MultiExpandKernel<T, 16>
          <<<grid, kExpandThreads, 0, stream>>>(t, split, bp, sp, index, yp, m, n, r, adapters, rows_per_index);
    return int(cudaGetLastError());
  });
}

bool PdlOn() {
  int device = 0;
  return onnxfuse_cuda_pdl_enabled() && onnxfuse_cuda_current_arch(&device) >= 90;
}

}  // namespace onnxfuse::cuda_kernels

extern "C" int onnxfuse_cuda_current_arch(int* device_out) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> arch_of[kMaxDevices] = {};
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return -int(e);
  if (device < 0 || device >= kMaxDevices) return -int(cudaErrorInvalidDevice);
  *device_out = device;
  int arch = arch_of[device].load(std::memory_order_relaxed);
  if (arch == 0) {
    int major = 0, minor = 0;
    if ((e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess) return -int(e);
    if ((e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) != cudaSuccess) return -int(e);
    arch = major * 10 + minor;
    arch_of[device].store(arch, std::memory_order_relaxed);
  }
  return arch;
}

extern "C" int onnxfuse_cuda_sm_count(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sms_of[kMaxDevices] = {};
  if (device < 0 || device >= kMaxDevices) return 132;
  int sms = sms_of[device].load(std::memory_order_relaxed);
  if (sms == 0) {
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) sms = 132;
    sms_of[device].store(sms, std::memory_order_relaxed);
  }
  return sms;
}

extern "C" int onnxfuse_cuda_pdl_enabled(void) {
  static const bool enabled = [] {
    const char* env = std::getenv("ONNXFUSE_PDL");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return enabled ? 1 : 0;
}

extern "C" int onnxfuse_cuda_pdl_in_graph(void) {
  static const bool enabled = [] {
    const char* env = std::getenv("ONNXFUSE_PDL_GRAPH");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return enabled ? 1 : 0;
}

extern "C" const char* onnxfuse_cuda_error_string(int code) {
  switch (code) {
    case ONNXFUSE_OK:
      return "no error";
    case ONNXFUSE_ERR_BAD_ARGUMENT:
      return "onnxfuse: bad argument (negative size, null pointer or unknown dtype)";
    case ONNXFUSE_ERR_RANK_TOO_LARGE:
      return "onnxfuse: LoRA rank larger than " ONNXFUSE_STRINGIFY(
          ONNXFUSE_MAX_LORA_RANK) " is not supported on the GPU";
    case ONNXFUSE_ERR_NO_TRITON:
      return "onnxfuse: library built without Triton kernels (ONNXFUSE_WITH_TRITON=OFF)";
    case ONNXFUSE_ERR_NO_KERNEL_FOR_ARCH:
      return "onnxfuse: no kernel for this GPU's compute capability (rebuild with its arch in ONNXFUSE_CUDA_ARCHS)";
    case ONNXFUSE_ERR_TOO_LARGE:
      return "onnxfuse: tensor dimension too large for the kernel's indexing";
    case ONNXFUSE_ERR_NO_KERNEL_FOR_SHAPE:
      return "onnxfuse: no Triton kernel compiled for this shape (backend cuda serves it; auto falls back to it)";
    case ONNXFUSE_ERR_NO_CUBLASLT:
      return "onnxfuse: the CUDA backend's GEMMs need libcublasLt.so.13 or .so.12 (CUDA's cuBLAS, also needed by "
             "onnxruntime-gpu's CUDA EP): install it or put its folder on LD_LIBRARY_PATH, or use backend=triton";
    case ONNXFUSE_ERR_CUBLAS:
      return onnxfuse::cuda_kernels::g_cublas_error;
    default:
      return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "onnxfuse: unknown error";
  }
}
