// Blocked fp32-accumulating GEMM behind cpu/gemm.h. See the header for the blocking scheme.
#include "cpu/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>
#include <thread>

#define ONNXFUSE_INLINE inline __attribute__((always_inline))

namespace onnxfuse {
namespace cpu {

int NumThreads() {
  // Decided once, on the first GEMM of the process: ONNXFUSE_CPU_THREADS (> 0), else the hardware's thread count
  // (hardware_concurrency() reads /sys, several system calls; the environment is not re-read per call either).
  static const int threads = [] {
    if (const char* env = std::getenv("ONNXFUSE_CPU_THREADS")) {
      const int n = std::atoi(env);
      if (n > 0) return n;
    }
    const unsigned n = std::thread::hardware_concurrency();
    return n > 0 ? static_cast<int>(n) : 1;
  }();
  return threads;
}

namespace {

// ------------------------------------------------------------------------------------------------ buffers
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using FloatBuffer = std::unique_ptr<float, FreeDeleter>;

// 64-byte aligned so packed panels start on cache lines.
FloatBuffer AllocFloats(size_t n) {
  size_t bytes = (std::max<size_t>(n, 1) * sizeof(float) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return FloatBuffer(static_cast<float*>(p));
}

// Per-thread scratch kept between calls: fresh multi-MB allocations are mmap'd and page-faulted in on every call,
// which costs as much as a small GEMM. Slot 0: the calling thread's packed X; 1-4: a tile worker's accumulators
// and B blocks. A request above kKeepFloats is served by a buffer that is dropped after the call (Release).
constexpr size_t kKeepFloats = size_t(4) << 20;  // 16 MiB
struct ThreadScratch {
  FloatBuffer buf[5];
  size_t cap[5] = {0, 0, 0, 0, 0};
  float* Get(int slot, size_t n) {
    n = std::max<size_t>(n, 1);
    if (cap[slot] < n) {
      buf[slot].reset();
      cap[slot] = 0;
      buf[slot] = AllocFloats(n);
      cap[slot] = n;
    }
    return buf[slot].get();
  }
  void Release(int slot) {
    if (cap[slot] > kKeepFloats) {
      buf[slot].reset();
      cap[slot] = 0;
    }
  }
};
ThreadScratch& LocalScratch() {
  static thread_local ThreadScratch scratch;
  return scratch;
}

// ------------------------------------------------------------------------------------------------ threads
// f(item) for item in [0, n): on `pool` (onnxruntime's intra-op pool, cpu/ops.h OrtPool), or on the calling
// thread when there is no pool, one thread is asked for, or there is one item.
template <typename F>
void ParallelFor(const ParallelRunner* pool, int64_t n, int threads, F&& f) {
  if (pool == nullptr || threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  pool->For(n, f);
}

// ------------------------------------------------------------------------------------------------ conversions
template <Format F>
ONNXFUSE_INLINE float Load(const void* base, int64_t i);
template <>
ONNXFUSE_INLINE float Load<Format::F32>(const void* base, int64_t i) {
  return static_cast<const float*>(base)[i];
}
template <>
ONNXFUSE_INLINE float Load<Format::F16>(const void* base, int64_t i) {
  return F16BitsToF32(static_cast<const uint16_t*>(base)[i]);
}
template <>
ONNXFUSE_INLINE float Load<Format::BF16>(const void* base, int64_t i) {
  uint32_t u = uint32_t(static_cast<const uint16_t*>(base)[i]) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ------------------------------------------------------------------------------------------------ ISA variants
// The micro-kernel: C[MR x NR] += A_panel[kc x MR] * B_panel[kc x NR], NR = NV vectors of W floats. GCC keeps the
// MR*NV accumulators in registers once the constant loops are unrolled; ISA comes from the caller's target.
template <int W>
struct Vec;
template <>
struct Vec<4> {
  typedef float type __attribute__((vector_size(16)));
};
template <>
struct Vec<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct Vec<16> {
  typedef float type __attribute__((vector_size(64)));
};

template <int MR, int NV, int W>
ONNXFUSE_INLINE void MicroKernel(int64_t kc, const float* __restrict a, const float* __restrict b, float* __restrict c,
                                 int64_t ldc) {
  using V = typename Vec<W>::type;
  constexpr int NR = NV * W;
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = V{};
  for (int64_t k = 0; k < kc; ++k) {
    V bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) std::memcpy(&bv[j], b + k * NR + j * W, sizeof(V));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      // vector * scalar: GCC splats the scalar (a broadcast load). `V{} + x` would add 0.0 first (x may be -0.0),
      // an extra dependent instruction per row in the hot loop.
      const float ai = a[k * MR + i];
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] += bv[j] * ai;
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      V cv;
      std::memcpy(&cv, c + i * ldc + j * W, sizeof(V));
      cv += acc[i][j];
      std::memcpy(c + i * ldc + j * W, &cv, sizeof(V));
    }
}

// All micro-panels of one (MB x KC) x (KC x NC) block. B's micro-panel (kc x NR) stays in L1 across the M panels.
// B panel jp starts at b + jp * b_panel_stride (kc * NR when packed per call, K_total * NR when prepacked).
template <int MR, int NV, int W>
ONNXFUSE_INLINE void BlockImpl(const float* a, int64_t a_panel_stride, const float* b, int64_t b_panel_stride, float* c,
                               int64_t ldc, int64_t m_panels, int64_t n_panels, int64_t kc) {
  constexpr int NR = NV * W;
  for (int64_t jp = 0; jp < n_panels; ++jp) {
    const float* bp = b + jp * b_panel_stride;
    for (int64_t ip = 0; ip < m_panels; ++ip)
      MicroKernel<MR, NV, W>(kc, a + ip * a_panel_stride, bp, c + ip * MR * ldc + jp * NR, ldc);
  }
}

// Packs rows [k0, k0+kc) x columns [n0, n0+nc) of a B operand into [n_panels][kc][NR] fp32, zero-padding columns.
template <Format F>
ONNXFUSE_INLINE void PackBImpl(int NR, const BOperand& src, int64_t N, int64_t k0, int64_t kc, int64_t n0, int64_t nc,
                               float* __restrict dst) {
  const int64_t n_panels = (nc + NR - 1) / NR;
  for (int64_t jp = 0; jp < n_panels; ++jp) {
    const int64_t j0 = n0 + jp * NR;
    const int64_t valid = std::min<int64_t>(NR, n0 + nc - j0);
    float* d = dst + jp * kc * NR;
    for (int64_t k = 0; k < kc; ++k, d += NR) {
      const int64_t kk = k0 + k;
      const void* base = kk < src.k_main ? src.main : src.extra;
      const int64_t row = (kk < src.k_main ? kk : kk - src.k_main) * N + j0;
      for (int64_t c = 0; c < valid; ++c) d[c] = Load<F>(base, row + c);
      for (int64_t c = valid; c < NR; ++c) d[c] = 0.f;
    }
  }
}

// Packs rows [m0, m0+rows) of X (K columns) into MR-row panels [panel][k_total][MR]; padding rows are zero. The
// LoRA columns [K, k_total) are filled later.
template <Format F>
ONNXFUSE_INLINE void PackAImpl(int MR, const void* x, int64_t M, int64_t K, int64_t k_total, int64_t panel,
                               float* __restrict dst) {
  float* d = dst + panel * k_total * MR;
  if (F == Format::F32 && MR <= 8 && (panel + 1) * MR <= M) {
    // fp32, a full panel: 8 columns of each row at a time into a small block, then out k-major, so the loads are
    // whole row segments and the stores contiguous (a transposing copy the compiler vectorises; the element by
    // element loop below costs about a tenth of a small GEMM's time)
    const float* xf = static_cast<const float*>(x) + panel * MR * K;
    int64_t k0 = 0;
    for (; k0 + 8 <= K; k0 += 8) {
      float blk[8][8];
      for (int i = 0; i < MR; ++i) std::memcpy(blk[i], xf + i * K + k0, sizeof(blk[i]));
      for (int j = 0; j < 8; ++j)
        for (int i = 0; i < MR; ++i) d[(k0 + j) * MR + i] = blk[i][j];
    }
    for (; k0 < K; ++k0)
      for (int i = 0; i < MR; ++i) d[k0 * MR + i] = xf[i * K + k0];
    return;
  }
  for (int i = 0; i < MR; ++i) {
    const int64_t row = panel * MR + i;
    if (row < M) {
      for (int64_t k = 0; k < K; ++k) d[k * MR + i] = Load<F>(x, row * K + k);
    } else {
      for (int64_t k = 0; k < k_total; ++k) d[k * MR + i] = 0.f;
    }
  }
}

using BlockFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, int64_t, int64_t);
using PackBFn = void (*)(int, const BOperand&, int64_t, int64_t, int64_t, int64_t, int64_t, float*);
using PackAFn = void (*)(int, const void*, int64_t, int64_t, int64_t, int64_t, float*);

struct Isa {
  const char* name;
  int MR, NR;
  BlockFn block;
  PackBFn pack_b[3];  // indexed by Format
  PackAFn pack_a[3];
};

// One set of entry points per instruction set; the bodies are the inline templates above, compiled for the target.
#define ONNXFUSE_ISA_FUNCTIONS(SUFFIX, TARGET, MR, NV, W)                                                             \
  TARGET void Block##SUFFIX(const float* a, int64_t s, const float* b, int64_t bs, float* c, int64_t ldc, int64_t mp, \
                            int64_t np, int64_t kc) {                                                                 \
    BlockImpl<MR, NV, W>(a, s, b, bs, c, ldc, mp, np, kc);                                                            \
  }                                                                                                                   \
  TARGET void PackBF32##SUFFIX(int nr, const BOperand& s, int64_t N, int64_t k0, int64_t kc, int64_t n0, int64_t nc,  \
                               float* d) {                                                                            \
    PackBImpl<Format::F32>(nr, s, N, k0, kc, n0, nc, d);                                                              \
  }                                                                                                                   \
  TARGET void PackBF16##SUFFIX(int nr, const BOperand& s, int64_t N, int64_t k0, int64_t kc, int64_t n0, int64_t nc,  \
                               float* d) {                                                                            \
    PackBImpl<Format::F16>(nr, s, N, k0, kc, n0, nc, d);                                                              \
  }                                                                                                                   \
  TARGET void PackBBF16##SUFFIX(int nr, const BOperand& s, int64_t N, int64_t k0, int64_t kc, int64_t n0, int64_t nc, \
                                float* d) {                                                                           \
    PackBImpl<Format::BF16>(nr, s, N, k0, kc, n0, nc, d);                                                             \
  }                                                                                                                   \
  TARGET void PackAF32##SUFFIX(int mr, const void* x, int64_t M, int64_t K, int64_t kt, int64_t p, float* d) {        \
    PackAImpl<Format::F32>(mr, x, M, K, kt, p, d);                                                                    \
  }                                                                                                                   \
  TARGET void PackAF16##SUFFIX(int mr, const void* x, int64_t M, int64_t K, int64_t kt, int64_t p, float* d) {        \
    PackAImpl<Format::F16>(mr, x, M, K, kt, p, d);                                                                    \
  }                                                                                                                   \
  TARGET void PackABF16##SUFFIX(int mr, const void* x, int64_t M, int64_t K, int64_t kt, int64_t p, float* d) {       \
    PackAImpl<Format::BF16>(mr, x, M, K, kt, p, d);                                                                   \
  }                                                                                                                   \
  const Isa kIsa##SUFFIX = {#SUFFIX,                                                                                  \
                            MR,                                                                                       \
                            NV * W,                                                                                   \
                            Block##SUFFIX,                                                                            \
                            {PackBF32##SUFFIX, PackBF16##SUFFIX, PackBBF16##SUFFIX},                                  \
                            {PackAF32##SUFFIX, PackAF16##SUFFIX, PackABF16##SUFFIX}};

// AVX-512: 8 x 32 tile = 16 zmm accumulators of 32. AVX2: 6 x 16 = 12 ymm of 16 (the BLIS Haswell shape).
// Baseline x86-64 (SSE2): 4 x 8 = 8 xmm of 16.
ONNXFUSE_ISA_FUNCTIONS(avx512, __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c"))), 8, 2, 16)
ONNXFUSE_ISA_FUNCTIONS(avx2, __attribute__((target("avx2,fma,f16c"))), 6, 2, 8)
ONNXFUSE_ISA_FUNCTIONS(generic, , 4, 2, 4)

const Isa& SelectIsa() {
  static const Isa* isa = [] {
    __builtin_cpu_init();
    // ONNXFUSE_CPU_ISA=generic|avx2|avx512 forces a lower family (for testing the other code paths); read once,
    // on the first GEMM or prepack of the process.
    std::string forced = std::getenv("ONNXFUSE_CPU_ISA") ? std::getenv("ONNXFUSE_CPU_ISA") : "";
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
    if (forced == "generic") return &kIsageneric;
    if (forced == "avx2" && avx2) return &kIsaavx2;
    if (avx512 && (forced.empty() || forced == "avx512")) return &kIsaavx512;
    if (avx2) return &kIsaavx2;
    return &kIsageneric;
  }();
  return *isa;
}

int FormatIndex(Format f) { return f == Format::F32 ? 0 : f == Format::F16 ? 1 : 2; }

// Blocking sizes (fp32 elements). KC x NC packed B block = 512 KiB per operand (L2); MB x KC packed A = 240 KiB;
// MB is a multiple of every MR (4, 6, 8).
constexpr int64_t kKC = 256;
constexpr int64_t kNC = 512;
constexpr int64_t kMB = 240;
// Below this many multiply-adds a call runs on one thread: starting threads would cost more than it saves.
constexpr int64_t kMinWorkPerThread = int64_t(1) << 21;

}  // namespace

const char* GemmIsa() { return SelectIsa().name; }

void ParallelRanges(const ParallelRunner& pool, int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t chunks = (n + grain - 1) / grain;
  auto chunk = [&](int64_t c) { fn(c * grain, std::min(n, (c + 1) * grain)); };
  if (chunks == 1) return chunk(0);
  pool.For(chunks, chunk);
}

PackedB PackB(Format fmt, const BOperand& src, int64_t k_total, int64_t n) {
  const Isa& isa = SelectIsa();
  PackedB p;
  p.k = k_total;
  p.n = n;
  p.nr = isa.NR;
  const int64_t n_panels = (n + isa.NR - 1) / isa.NR;
  p.data.reset(AllocFloats(size_t(n_panels) * size_t(std::max<int64_t>(k_total, 1)) * isa.NR).release());
  if (n > 0 && k_total > 0) isa.pack_b[FormatIndex(fmt)](isa.NR, src, n, 0, k_total, 0, n, p.data.get());
  return p;
}

void Gemm(const GemmArgs& g) {
  const Isa& isa = SelectIsa();
  const int MR = isa.MR, NR = isa.NR;
  const int64_t M = g.M, K = g.K, N = g.N, KT = g.K + g.r;
  if (M == 0 || N == 0) return;
  const int fi = FormatIndex(g.fmt);
  const int max_threads = g.threads > 0 ? g.threads : NumThreads();
  const int64_t work = M * N * std::max<int64_t>(KT, 1) * g.num_b;
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(max_threads, work / kMinWorkPerThread)));
  // 1. X -> fp32 MR-row panels, once per call (shared read-only by all workers).
  const int64_t a_panels = (M + MR - 1) / MR;
  ThreadScratch& caller_scratch = LocalScratch();
  struct ReleaseA {
    ThreadScratch& s;
    ~ReleaseA() { s.Release(0); }
  } release_a{caller_scratch};
  float* const a_pack = caller_scratch.Get(0, size_t(a_panels) * KT * MR);
  const void* x = g.x;
  float* ap = a_pack;
  ParallelFor(g.pool, a_panels, threads, [&](int64_t p) { isa.pack_a[fi](MR, x, M, K, KT, p, ap); });

  // 2. LoRA: columns [K, K+r) of the packed A = scale * (X @ A), computed in fp32 from the packed (fp32) X.
  if (g.r > 0) {
    const int64_t r = g.r;
    std::vector<float> a_conv;
    const float* a_f32 = g.lora_a_f32;
    if (a_f32 == nullptr) {
      a_conv.resize(size_t(K * r));
      for (int64_t i = 0; i < K * r; ++i)
        a_conv[i] = g.fmt == Format::F32   ? static_cast<const float*>(g.lora_a)[i]
                    : g.fmt == Format::F16 ? F16BitsToF32(static_cast<const uint16_t*>(g.lora_a)[i])
                                           : Bf16BitsToF32(static_cast<const uint16_t*>(g.lora_a)[i]);
      a_f32 = a_conv.data();
    }
    const float scale = g.lora_scale;
    ParallelFor(g.pool, a_panels, threads, [&](int64_t p) {
      std::vector<float> t(size_t(MR * r), 0.f);
      float* panel = ap + p * KT * MR;
      for (int64_t k = 0; k < K; ++k) {
        const float* arow = a_f32 + k * r;
        for (int i = 0; i < MR; ++i) {
          const float xv = panel[k * MR + i];
          float* ti = t.data() + i * r;
          for (int64_t c = 0; c < r; ++c) ti[c] += xv * arow[c];
        }
      }
      for (int64_t c = 0; c < r; ++c)
        for (int i = 0; i < MR; ++i) panel[(K + c) * MR + i] = scale * t[i * r + c];
    });
  }

  // 3. Output tiles. Shrink NC when there are too few tiles to keep every thread busy (small M).
  int64_t nc_max = std::min<int64_t>(kNC, (N + NR - 1) / NR * NR);
  int64_t m_tiles = (M + kMB - 1) / kMB;
  while (nc_max > 4 * NR && m_tiles * ((N + nc_max - 1) / nc_max) < 4 * threads)
    nc_max = (nc_max / 2 + NR - 1) / NR * NR;
  const int64_t n_tiles = (N + nc_max - 1) / nc_max;
  // With several threads and M spanning a few MB row blocks, halve MB (keeping it a multiple of 24, so of every
  // MR) until there are >= 8 tiles per thread: 9 tiles on 2 threads would leave one idle for a ninth of the run.
  int64_t mb_max = kMB;
  while (threads > 1 && m_tiles >= threads && m_tiles * n_tiles < 8 * threads && mb_max > 48) {
    mb_max = (mb_max / 2 + 23) / 24 * 24;
    m_tiles = (M + mb_max - 1) / mb_max;
  }
  const int64_t acc_ld = nc_max;
  const int64_t acc_size = ((std::min<int64_t>(mb_max, M) + MR - 1) / MR * MR) * acc_ld;
  const int64_t b_size = std::min<int64_t>(kKC, std::max<int64_t>(KT, 1)) * nc_max;

  // Prepacked operands (constant weights) are read in place; the others are packed per tile into scratch.
  const PackedB* packed[2] = {nullptr, nullptr};
  for (int b = 0; b < g.num_b; ++b) {
    const PackedB* p = g.b[b].packed;
    if (p != nullptr && p->data && p->nr == NR && p->k == KT && p->n == N) packed[b] = p;
  }

  ParallelFor(g.pool, m_tiles * n_tiles, threads, [&](int64_t tile) {
    ThreadScratch& s = LocalScratch();  // per executing thread (pool worker or caller), reused across calls
    float* accs[2] = {nullptr, nullptr};
    float* bpack[2] = {nullptr, nullptr};
    for (int b = 0; b < g.num_b; ++b) {
      accs[b] = s.Get(1 + b, acc_size);
      if (packed[b] == nullptr) bpack[b] = s.Get(3 + b, b_size);
    }
    // Consecutive tiles walk down M for one column block, so a thread's successive B blocks overlap in L3.
    const int64_t tm = tile % m_tiles, tn = tile / m_tiles;
    const int64_t m0 = tm * mb_max, mb = std::min<int64_t>(mb_max, M - m0);
    const int64_t n0 = tn * nc_max, nc = std::min<int64_t>(nc_max, N - n0);
    const int64_t m_panels = (mb + MR - 1) / MR, n_panels = (nc + NR - 1) / NR;
    const float* a_tile = ap + (m0 / MR) * KT * MR;
    for (int b = 0; b < g.num_b; ++b) std::memset(accs[b], 0, sizeof(float) * m_panels * MR * acc_ld);
    for (int64_t k0 = 0; k0 < KT; k0 += kKC) {
      const int64_t kc = std::min<int64_t>(kKC, KT - k0);
      for (int b = 0; b < g.num_b; ++b) {
        if (packed[b] != nullptr) {  // n0 is a multiple of NR (nc_max is), so the tile starts on a panel
          const float* bp = packed[b]->data.get() + ((n0 / NR) * KT + k0) * NR;
          isa.block(a_tile + k0 * MR, KT * MR, bp, KT * NR, accs[b], acc_ld, m_panels, n_panels, kc);
        } else {
          isa.pack_b[fi](NR, g.b[b], N, k0, kc, n0, nc, bpack[b]);
          isa.block(a_tile + k0 * MR, KT * MR, bpack[b], kc * NR, accs[b], acc_ld, m_panels, n_panels, kc);
        }
      }
    }
    g.epilogue->Apply(m0, mb, n0, nc, accs, acc_ld);
  });
}

}  // namespace cpu
}  // namespace onnxfuse
