// OnednnMatmul (see onednn_gemm.h): oneDNN matmul primitives over prepacked column blocks of a constant weight.
#include "cpu/onednn_gemm.h"

#include "common/gate_act.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

#ifdef ONNXFUSE_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

extern "C" {  // libgomp, the OpenMP runtime libdnnl.so.3 (the onednn-cpu-gomp build) runs on
int omp_get_max_threads(void);
void omp_set_num_threads(int);
}
#endif

namespace onnxfuse {
namespace cpu {

#ifdef ONNXFUSE_WITH_ONEDNN
namespace {

constexpr int64_t kNarrowN = 8;  // blocks narrower than this run as dot products (see the header)

float LoadAs(Format f, const void* p, int64_t i) {
  switch (f) {
    case Format::F32:
      return static_cast<const float*>(p)[i];
    case Format::F16:
      return F16BitsToF32(static_cast<const uint16_t*>(p)[i]);
    default:
      return Bf16BitsToF32(static_cast<const uint16_t*>(p)[i]);
  }
}

void StoreAs(Format f, void* p, int64_t i, float v) {
  switch (f) {
    case Format::F32:
      static_cast<float*>(p)[i] = v;
      break;
    case Format::F16:
      static_cast<uint16_t*>(p)[i] = F32ToF16Bits(v);
      break;
    default:
      static_cast<uint16_t*>(p)[i] = F32ToBf16Bits(v);
      break;
  }
}

size_t ElemSize(Format f) { return f == Format::F32 ? 4 : 2; }

// The post-ops in plain C++ for the narrow path; the same math oneDNN's eltwise/binary post-ops compute.
float ApplyPost(const std::vector<PostOp>& post, float scale, float z, float t) {
  for (PostOp p : post) {
    switch (p) {
      case PostOp::Relu:
        z = z > 0.f ? z : (z == z ? 0.f : z);
        break;
      case PostOp::Sigmoid:
        z = 1.0f / (1.0f + std::exp(-z));
        break;
      case PostOp::Swish:
        z = GateAct<ONNXFUSE_GATE_SILU>(z);
        break;
      case PostOp::QuickGelu:
        z = GateAct<ONNXFUSE_GATE_QUICK_GELU>(z);
        break;
      case PostOp::GeluTanh:
        z = GateAct<ONNXFUSE_GATE_GELU_TANH>(z);
        break;
      case PostOp::Scale:
        z *= scale;
        break;
      case PostOp::Add:
        z += t;
        break;
      case PostOp::Mul:
        z *= t;
        break;
    }
  }
  return z;
}

// ReLU that keeps NaN (x > 0 ? x : NaN stays NaN : 0) over an [m, width] tile of row stride ld, in its format.
void ReluInPlace(Format f, void* p, int64_t m, int64_t width, int64_t ld) {
  if (f == Format::F32) {
    for (int64_t i = 0; i < m; ++i) {
      float* row = static_cast<float*>(p) + i * ld;
      for (int64_t j = 0; j < width; ++j) row[j] = row[j] > 0.f ? row[j] : (row[j] == row[j] ? 0.f : row[j]);
    }
    return;
  }
  // Half types by their bits: a set sign bit on a non-NaN (negative, -0, -inf) becomes +0.
  const uint16_t nan_above = f == Format::F16 ? 0x7c00u : 0x7f80u;
  for (int64_t i = 0; i < m; ++i) {
    uint16_t* row = static_cast<uint16_t*>(p) + i * ld;
    for (int64_t j = 0; j < width; ++j) {
      const uint16_t h = row[j];
      row[j] = (h & 0x8000u) && (h & 0x7fffu) <= nan_above ? uint16_t(0) : h;
    }
  }
}

using dt = dnnl::memory::data_type;

dt DnnlType(Format f) { return f == Format::F32 ? dt::f32 : f == Format::F16 ? dt::f16 : dt::bf16; }

dnnl::engine& Engine() {
  static dnnl::engine* engine = new dnnl::engine(dnnl::engine::kind::cpu, 0);  // never destroyed (exit order)
  return *engine;
}

// A stream per thread (streams are not thread-safe); leaked on thread exit rather than destroyed after libdnnl.
dnnl::stream& ThreadStream() {
  static thread_local dnnl::stream* stream = nullptr;
  if (stream == nullptr) stream = new dnnl::stream(Engine());
  return *stream;
}

// Per-thread scratchpad for user-mode scratchpads: each thread runs one tile at a time.
void* ThreadScratch(size_t bytes) {
  struct Buf {
    void* p = nullptr;
    size_t n = 0;
    ~Buf() { std::free(p); }
  };
  static thread_local Buf buf;
  if (buf.n < bytes) {
    std::free(buf.p);
    buf.n = 0;
    buf.p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (buf.p == nullptr) throw std::bad_alloc();
    buf.n = bytes;
  }
  return buf.p;
}

// oneDNN (OpenMP runtime) parallelises a primitive over omp_get_max_threads() threads, decided when it is created
// and run. The kernels run tiles on onnxruntime's pool instead, so each primitive is planned and executed for one
// thread; the caller's setting is restored (the Python thread's OpenMP team may be torch's).
struct SequentialOmp {
  int prev;
  SequentialOmp() : prev(omp_get_max_threads()) {
    if (prev != 1) omp_set_num_threads(1);
  }
  ~SequentialOmp() {
    if (prev != 1) omp_set_num_threads(prev);
  }
};

// Per-thread dense output tile (see LdPrim).
void* TileBuffer(size_t bytes) {
  static thread_local std::vector<char> buf;
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}

// The memory objects of one primitive's execution, per thread, kept between calls: creating them costs about as
// much as a small layer's arithmetic (a few us per call), so a repeated call only swaps the data pointers.
struct RunArgs {
  uint64_t id = 0;
  std::unordered_map<int, dnnl::memory> args;
};
RunArgs& ThreadArgs(uint64_t id, bool* fresh) {
  static thread_local std::vector<RunArgs> slots(16);
  static thread_local size_t next = 0;
  for (RunArgs& a : slots)
    if (a.id == id) {
      *fresh = false;
      return a;
    }
  RunArgs& a = slots[next++ % slots.size()];
  a.id = id;
  a.args.clear();
  *fresh = true;
  return a;
}

[[noreturn]] void Rethrow(const dnnl::error& e, const char* what) {
  throw std::runtime_error(std::string("oneDNN ") + what + ": " + e.what());
}

}  // namespace

struct OnednnMatmul::Impl {
  MatmulSpec spec;
  int64_t bn = 0, blocks = 0;
  bool narrow = false;
  // oneDNN path
  std::vector<dnnl::memory> packed;  // per column block, in the layout chosen for typical_m rows
  std::vector<float> bias;           // [N] fp32 (empty: no bias)
  // narrow path
  std::vector<float> w_f32;  // [K, N]
  struct Entry {
    int64_t m, width;
    std::shared_ptr<dnnl::matmul> prim;
    std::string impl;
    size_t scratch = 0;
    uint64_t id = 0;  // unique in the process: the key of the per-thread argument cache (RunArgs)
  };
  mutable std::mutex mu;
  // A few (m, width) pairs: the row block, the tail block, the tail column block. Entries are shared so that a
  // thread running one keeps it while another thread adds to (or clears) the cache.
  mutable std::vector<std::shared_ptr<const Entry>> cache;

  int64_t Width(int64_t j) const { return std::min(bn, spec.N - j * bn); }
  int64_t LdTile(int64_t width) const { return width; }
  // Row stride of Y the caller asked for, and the one the primitive writes with: oneDNN 3.2's brgemm matmul takes a
  // dst with a row stride wider than the block only without binary post-ops (and then not always), else it runs a
  // reference kernel ~1000x slower. So with several column blocks each tile is written dense and copied into Y.
  int64_t LdY(int64_t width) const { return spec.ldy > 0 ? spec.ldy : spec.ldy < 0 ? width : spec.N; }
  int64_t LdPrim(int64_t width) const { return blocks > 1 ? width : LdY(width); }

  // A trailing ReLU is applied by ReluInPlace after the primitive, not as oneDNN's eltwise_relu: that one is a max
  // with 0, which turns NaN into 0 where ONNX's and PyTorch's relu keep it (a NaN must reach the output).
  bool TrailingRelu() const { return !spec.post.empty() && spec.post.back() == PostOp::Relu; }

  dnnl::primitive_attr Attr(int64_t m, int64_t width) const {
    dnnl::post_ops po;
    for (size_t i = 0; i < spec.post.size() - (TrailingRelu() ? 1 : 0); ++i) {
      const PostOp p = spec.post[i];
      switch (p) {
        case PostOp::Relu:
          throw std::logic_error("OnednnMatmul: ReLU must be the last post-op");
        case PostOp::Sigmoid:
          po.append_eltwise(dnnl::algorithm::eltwise_logistic, 0.f, 0.f);
          break;
        case PostOp::Swish:
          po.append_eltwise(dnnl::algorithm::eltwise_swish, 1.f, 0.f);
          break;
        case PostOp::QuickGelu:
          po.append_eltwise(dnnl::algorithm::eltwise_swish, ONNXFUSE_QUICK_GELU_ALPHA, 0.f);
          break;
        case PostOp::GeluTanh:
          po.append_eltwise(dnnl::algorithm::eltwise_gelu_tanh, 0.f, 0.f);
          break;
        case PostOp::Scale:
          po.append_eltwise(dnnl::algorithm::eltwise_linear, spec.scale, 0.f);
          break;
        case PostOp::Add:
        case PostOp::Mul:
          po.append_binary(p == PostOp::Add ? dnnl::algorithm::binary_add : dnnl::algorithm::binary_mul,
                           dnnl::memory::desc({m, width}, dt::f32, dnnl::memory::dims{LdTile(width), 1}));
          break;
      }
    }
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
  }

  dnnl::matmul::primitive_desc Desc(int64_t m, int64_t width, const dnnl::memory::desc& wmd) const {
    const int64_t ldx = spec.ldx > 0 ? spec.ldx : spec.K, ldy = LdPrim(width);
    dnnl::memory::desc src({m, spec.K}, DnnlType(spec.src), dnnl::memory::dims{ldx, 1});
    dnnl::memory::desc dst({m, width}, DnnlType(spec.dst), dnnl::memory::dims{ldy, 1});
    dnnl::memory::desc bmd =
        bias.empty() ? dnnl::memory::desc() : dnnl::memory::desc({1, width}, dt::f32, dnnl::memory::dims{width, 1});
    return dnnl::matmul::primitive_desc(Engine(), src, wmd, bmd, dst, Attr(m, width));
  }

  std::shared_ptr<const Entry> Get(int64_t m, int64_t j) const {
    const int64_t width = Width(j);
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& e : cache)
      if (e->m == m && e->width == width) return e;
    if (cache.size() >= 32) cache.clear();  // calls with ever new batch sizes: start over rather than grow
    SequentialOmp one;
    try {
      auto pd = Desc(m, width, packed[j].get_desc());
      static std::atomic<uint64_t> next_id{1};
      cache.push_back(
          std::make_shared<const Entry>(Entry{m, width, std::make_shared<dnnl::matmul>(pd), pd.impl_info_str(),
                                              pd.scratchpad_desc().get_size(), next_id.fetch_add(1)}));
    } catch (const dnnl::error& e) {
      Rethrow(e, "matmul creation");
    }
    return cache.back();
  }
};

bool OnednnBuilt() { return true; }

bool OnednnMatmul::Init(const MatmulSpec& spec, const void* w, const float* bias, std::string* why) {
  auto im = std::make_unique<Impl>();
  im->spec = spec;
  const int64_t K = spec.K, N = spec.N;
  im->bn = spec.block_n > 0 && spec.block_n < N ? spec.block_n : N;
  im->blocks = N > 0 ? (N + im->bn - 1) / im->bn : 0;
  if (bias != nullptr) im->bias.assign(bias, bias + N);
  if (N < kNarrowN) {  // a dot product per row: fp32 weights, no primitive
    im->narrow = true;
    im->bn = std::max<int64_t>(N, 1);
    im->blocks = N > 0 ? 1 : 0;
    im->w_f32.resize(size_t(K * N));
    for (int64_t i = 0; i < K * N; ++i) im->w_f32[size_t(i)] = LoadAs(spec.src, w, i);
    impl_ = std::move(im);
    return true;
  }
  SequentialOmp one;
  try {
    for (int64_t j = 0; j < im->blocks; ++j) {
      const int64_t width = im->Width(j);
      dnnl::memory::desc any({K, width}, DnnlType(spec.src), dnnl::memory::format_tag::any);
      auto pd = im->Desc(std::max<int64_t>(spec.typical_m, 1), width, any);
      dnnl::memory plain(dnnl::memory::desc({K, width}, DnnlType(spec.src), dnnl::memory::dims{N, 1}), Engine(),
                         const_cast<char*>(static_cast<const char*>(w)) + j * im->bn * ElemSize(spec.src));
      dnnl::memory dst(pd.weights_desc(), Engine());
      dnnl::reorder(plain, dst).execute(ThreadStream(), plain, dst);
      ThreadStream().wait();
      im->packed.push_back(std::move(dst));
    }
  } catch (const dnnl::error& e) {
    if (why != nullptr)
      *why = e.status == dnnl_unimplemented ? "oneDNN has no matmul for these types on this CPU"
                                            : std::string("oneDNN: ") + e.what();
    return false;
  }
  impl_ = std::move(im);
  return true;
}

void OnednnMatmul::Run(int64_t m, const void* x, void* y, int64_t j, const float* tile) const {
  const Impl& im = *impl_;
  const MatmulSpec& s = im.spec;
  if (m <= 0) return;
  const int64_t n0 = j * im.bn, width = im.Width(j), ld_tile = im.LdTile(width);
  const int64_t ldx = s.ldx > 0 ? s.ldx : s.K, ldy = im.LdY(width);
  if (im.narrow) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t c = 0; c < width; ++c) {
        float acc = 0.f;
        for (int64_t k = 0; k < s.K; ++k) acc += LoadAs(s.src, x, i * ldx + k) * im.w_f32[size_t(k * s.N + n0 + c)];
        if (!im.bias.empty()) acc += im.bias[size_t(n0 + c)];
        StoreAs(s.dst, y, i * ldy + c, ApplyPost(s.post, s.scale, acc, tile ? tile[i * ld_tile + c] : 0.f));
      }
    }
    return;
  }
  const std::shared_ptr<const Impl::Entry> entry = im.Get(m, j);
  const Impl::Entry& e = *entry;
  SequentialOmp one;
  try {
    dnnl::engine& eng = Engine();
    bool fresh = false;
    RunArgs& ra = ThreadArgs(e.id, &fresh);
    auto& args = ra.args;
    if (fresh) {
      args.emplace(DNNL_ARG_SRC, dnnl::memory(dnnl::memory::desc({m, s.K}, DnnlType(s.src), dnnl::memory::dims{ldx, 1}),
                                              eng, nullptr));
      args.emplace(DNNL_ARG_WEIGHTS, im.packed[size_t(j)]);
      if (!im.bias.empty())
        args.emplace(DNNL_ARG_BIAS,
                     dnnl::memory(dnnl::memory::desc({1, width}, dt::f32, dnnl::memory::dims{width, 1}), eng, nullptr));
      args.emplace(DNNL_ARG_DST, dnnl::memory(dnnl::memory::desc({m, width}, DnnlType(s.dst),
                                                                 dnnl::memory::dims{im.LdPrim(width), 1}),
                                              eng, nullptr));
      for (size_t p = 0; p < s.post.size(); ++p)
        if (s.post[p] == PostOp::Add || s.post[p] == PostOp::Mul)
          args.emplace(
              DNNL_ARG_ATTR_MULTIPLE_POST_OP(int(p)) | DNNL_ARG_SRC_1,
              dnnl::memory(dnnl::memory::desc({m, width}, dt::f32, dnnl::memory::dims{ld_tile, 1}), eng, nullptr));
      if (e.scratch > 0)
        args.emplace(
            DNNL_ARG_SCRATCHPAD,
            dnnl::memory(dnnl::memory::desc({int64_t(e.scratch)}, dt::u8, dnnl::memory::dims{1}), eng, nullptr));
    }
    // The entry is keyed by (m, width), not by block: the weights of block j go in every call.
    args[DNNL_ARG_WEIGHTS] = im.packed[size_t(j)];
    args[DNNL_ARG_SRC].set_data_handle(const_cast<void*>(x));
    if (!im.bias.empty()) args[DNNL_ARG_BIAS].set_data_handle(const_cast<float*>(im.bias.data() + n0));
    const size_t es = ElemSize(s.dst);
    const bool copy = im.LdPrim(width) != ldy;  // dense tile first, then its rows into Y
    void* dst = copy ? TileBuffer(size_t(m * width) * es) : y;
    args[DNNL_ARG_DST].set_data_handle(dst);
    for (size_t p = 0; p < s.post.size(); ++p) {
      if (s.post[p] != PostOp::Add && s.post[p] != PostOp::Mul) continue;
      if (tile == nullptr) throw std::runtime_error("OnednnMatmul: post-op tile missing");
      args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(int(p)) | DNNL_ARG_SRC_1].set_data_handle(const_cast<float*>(tile));
    }
    if (e.scratch > 0) args[DNNL_ARG_SCRATCHPAD].set_data_handle(ThreadScratch(e.scratch));
    e.prim->execute(ThreadStream(), args);
    if (im.TrailingRelu()) ReluInPlace(s.dst, dst, m, width, im.LdPrim(width));
    if (copy)
      for (int64_t i = 0; i < m; ++i)
        std::memcpy(static_cast<char*>(y) + size_t(i * ldy) * es, static_cast<char*>(dst) + size_t(i * width) * es,
                    size_t(width) * es);
  } catch (const dnnl::error& err) {
    Rethrow(err, "matmul");
  }
}

std::string OnednnMatmul::Describe(int64_t m) const {
  if (!impl_) return "not initialised";
  if (impl_->narrow) return "narrow";
  return impl_->Get(m, 0)->impl;
}

namespace {

const char* IsaName(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx2_vnni_2:
      return "avx2_vnni_2";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_fp16:
      return "avx512_core_fp16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    case dnnl::cpu_isa::avx512_core_amx_fp16:
      return "avx512_core_amx_fp16";
    default:
      return "default";
  }
}

}  // namespace

std::string OnednnHostJson() {
  // A weight of the shape class the kernels prepack (K and N past kNarrowN, a bias and an activation post-op).
  constexpr int64_t kProbe = 64;
  const std::vector<float> bias(kProbe, 0.0f);
  const std::vector<float> w(kProbe * kProbe, 0.0f);  // all-zero bits are 0 in every format
  std::string out = std::string("{\"isa\": \"") + IsaName(dnnl::get_effective_cpu_isa()) + "\", \"matmul\": {";
  const std::pair<const char*, Format> types[] = {
      {"float", Format::F32}, {"float16", Format::F16}, {"bfloat16", Format::BF16}};
  bool first = true;
  for (const auto& [name, format] : types) {
    MatmulSpec spec;
    spec.src = spec.dst = format;
    spec.K = spec.N = kProbe;
    spec.post = {PostOp::Relu};
    OnednnMatmul mm;
    const bool ok = mm.Init(spec, w.data(), bias.data(), nullptr);
    out += std::string(first ? "" : ", ") + "\"" + name + "\": " + (ok ? "\"" + mm.Describe(kProbe) + "\"" : "null");
    first = false;
  }
  return out + "}}";
}

#else  // built without oneDNN

std::string OnednnHostJson() { return "null"; }

struct OnednnMatmul::Impl {};
bool OnednnBuilt() { return false; }
bool OnednnMatmul::Init(const MatmulSpec&, const void*, const float*, std::string* why) {
  if (why != nullptr) *why = "this library was built without oneDNN (see the build info's cpu_gemm)";
  return false;
}
void OnednnMatmul::Run(int64_t, const void*, void*, int64_t, const float*) const {
  throw std::runtime_error("OnednnMatmul: built without oneDNN");
}
std::string OnednnMatmul::Describe(int64_t) const { return "not built"; }

#endif

std::string HostInfoJson() {
  return std::string("{\"gemm_isa\": \"") + GemmIsa() + "\", \"onednn\": " + OnednnHostJson() + "}";
}

OnednnMatmul::OnednnMatmul() = default;
OnednnMatmul::~OnednnMatmul() = default;
OnednnMatmul::OnednnMatmul(OnednnMatmul&&) noexcept = default;
OnednnMatmul& OnednnMatmul::operator=(OnednnMatmul&&) noexcept = default;
bool OnednnMatmul::Valid() const { return impl_ != nullptr; }
int64_t OnednnMatmul::Blocks() const {
#ifdef ONNXFUSE_WITH_ONEDNN
  return impl_ ? impl_->blocks : 0;
#else
  return 0;
#endif
}
int64_t OnednnMatmul::BlockStart(int64_t j) const {
#ifdef ONNXFUSE_WITH_ONEDNN
  return j * impl_->bn;
#else
  return j;
#endif
}
int64_t OnednnMatmul::BlockWidth(int64_t j) const {
#ifdef ONNXFUSE_WITH_ONEDNN
  return impl_->Width(j);
#else
  return j;
#endif
}

}  // namespace cpu
}  // namespace onnxfuse
