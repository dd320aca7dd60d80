// Issue 27, CPU: how fast one decode step of GroupQueryAttention can be on this host, outside onnxruntime: SmolLM2's
// shapes (9 heads on 3 KV heads, head size 64, fp32), a KV cache of each of 30 layers in its own buffer ([Hkv, max
// positions, D], as genai shares past and present), one token a step: rotary on q and the new k, the new k and v
// written at the context's end, then each KV head's 3 query heads against its keys, the keys split into chunks over
// the threads (flash-decoding: each chunk's max, sum and weighted values, combined after). The layers are visited in
// turn, so each layer's cache comes from memory as in a decoder step (30 x 3.1 MB at context 2048). Prints us per
// layer (median of rounds) and the KV bytes' rate; scripts/gqa_cpu_probe.py chain times onnxruntime's node the same
// way. Build and run:
//   g++ -O3 -march=native -fopenmp -std=c++17 scripts/cpu_decode_attention_probe.cc -o /tmp/attn_probe
//   OMP_NUM_THREADS=2 /tmp/attn_probe 128 2048
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

constexpr int kH = 9, kHkv = 3, kD = 64, kGroup = kH / kHkv, kLayers = 30, kMaxPos = 4096;

struct Layer {
  std::vector<float> k, v;  // [kHkv, kMaxPos, kD]
};

void Rotate(float* x, const float* cos, const float* sin) {  // half split, rotary over all of D
  for (int i = 0; i < kD / 2; ++i) {
    const float a = x[i], b = x[i + kD / 2];
    x[i] = a * cos[i] - b * sin[i];
    x[i + kD / 2] = b * cos[i] + a * sin[i];
  }
}

// One layer's step: qkv [(kH + 2 kHkv) kD] of the new token at position `pos` (the cache holds pos keys before it).
void Step(Layer& L, const float* qkv, const float* cos_cache, const float* sin_cache, int pos, float* y, int chunks,
          std::vector<float>& part) {
  float q[kH][kD], knew[kHkv][kD];
  const float* c = cos_cache + size_t(pos) * (kD / 2);
  const float* s = sin_cache + size_t(pos) * (kD / 2);
  for (int h = 0; h < kH; ++h) {
    std::copy(qkv + h * kD, qkv + (h + 1) * kD, q[h]);
    Rotate(q[h], c, s);
  }
  for (int h = 0; h < kHkv; ++h) {
    std::copy(qkv + (kH + h) * kD, qkv + (kH + h + 1) * kD, knew[h]);
    Rotate(knew[h], c, s);
    std::copy(knew[h], knew[h] + kD, L.k.data() + (size_t(h) * kMaxPos + pos) * kD);
    const float* vn = qkv + (kH + kHkv + h) * kD;
    std::copy(vn, vn + kD, L.v.data() + (size_t(h) * kMaxPos + pos) * kD);
  }
  const int n = pos + 1;
  const float scale = 1.f / std::sqrt(float(kD));
  const int per = (n + chunks - 1) / chunks;
  // part: [kHkv][chunks][kGroup][2 + kD]: max, sum, weighted values
#pragma omp parallel for schedule(static) collapse(2)
  for (int h = 0; h < kHkv; ++h) {
    for (int ch = 0; ch < chunks; ++ch) {
      const int j0 = ch * per, j1 = std::min(n, j0 + per);
      float m[kGroup], l[kGroup], acc[kGroup][kD];
      for (int g = 0; g < kGroup; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.f;
        std::fill(acc[g], acc[g] + kD, 0.f);
      }
      const float* K = L.k.data() + size_t(h) * kMaxPos * kD;
      const float* V = L.v.data() + size_t(h) * kMaxPos * kD;
      for (int j = j0; j < j1; ++j) {
        const float* kr = K + size_t(j) * kD;
        float sc[kGroup];
        for (int g = 0; g < kGroup; ++g) {
          const float* qg = q[h * kGroup + g];
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int e = 0; e < kD; ++e) dot += qg[e] * kr[e];
          sc[g] = dot * scale;
        }
        const float* vr = V + size_t(j) * kD;
        for (int g = 0; g < kGroup; ++g) {
          float p;
          if (sc[g] > m[g]) {
            const float corr = std::exp(m[g] - sc[g]);
            l[g] *= corr;
#pragma omp simd
            for (int e = 0; e < kD; ++e) acc[g][e] *= corr;
            m[g] = sc[g];
            p = 1.f;
          } else {
            p = std::exp(sc[g] - m[g]);
          }
          l[g] += p;
#pragma omp simd
          for (int e = 0; e < kD; ++e) acc[g][e] += p * vr[e];
        }
      }
      for (int g = 0; g < kGroup; ++g) {
        float* out = part.data() + ((size_t(h) * chunks + ch) * kGroup + g) * (2 + kD);
        out[0] = m[g];
        out[1] = l[g];
        std::copy(acc[g], acc[g] + kD, out + 2);
      }
    }
  }
  for (int h = 0; h < kHkv; ++h)
    for (int g = 0; g < kGroup; ++g) {
      float mx = -INFINITY;
      for (int ch = 0; ch < chunks; ++ch) mx = std::max(mx, part[((size_t(h) * chunks + ch) * kGroup + g) * (2 + kD)]);
      float l = 0.f, o[kD] = {};
      for (int ch = 0; ch < chunks; ++ch) {
        const float* pc = part.data() + ((size_t(h) * chunks + ch) * kGroup + g) * (2 + kD);
        if (pc[1] == 0.f) continue;
        const float w = std::exp(pc[0] - mx);
        l += pc[1] * w;
        for (int e = 0; e < kD; ++e) o[e] += pc[2 + e] * w;
      }
      float* yr = y + (h * kGroup + g) * kD;
      for (int e = 0; e < kD; ++e) yr[e] = o[e] / l;
    }
}

// The reference of one head's output: softmax over every key, in double.
double CheckLayer(const Layer& L, const float* qkv, const float* cos_cache, const float* sin_cache, int pos,
                  const float* y) {
  double worst = 0;
  const float* c = cos_cache + size_t(pos) * (kD / 2);
  const float* s = sin_cache + size_t(pos) * (kD / 2);
  for (int h = 0; h < kH; ++h) {
    float q[kD];
    std::copy(qkv + h * kD, qkv + (h + 1) * kD, q);
    Rotate(q, c, s);
    const int kv = h / kGroup, n = pos + 1;
    std::vector<double> sc(n);
    double mx = -1e300;
    for (int j = 0; j < n; ++j) {
      double d = 0;
      for (int e = 0; e < kD; ++e) d += double(q[e]) * L.k[(size_t(kv) * kMaxPos + j) * kD + e];
      sc[j] = d / std::sqrt(double(kD));
      mx = std::max(mx, sc[j]);
    }
    double l = 0;
    for (auto& v : sc) l += (v = std::exp(v - mx));
    for (int e = 0; e < kD; ++e) {
      double o = 0;
      for (int j = 0; j < n; ++j) o += sc[j] * L.v[(size_t(kv) * kMaxPos + j) * kD + e];
      worst = std::max(worst, std::abs(o / l - y[h * kD + e]));
    }
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937 rng(0);
  std::normal_distribution<float> nd;
  std::vector<Layer> layers(kLayers);
  for (auto& L : layers) {
    L.k.resize(size_t(kHkv) * kMaxPos * kD);
    L.v.resize(L.k.size());
    for (auto& x : L.k) x = nd(rng);
    for (auto& x : L.v) x = nd(rng);
  }
  std::vector<float> cosc(size_t(kMaxPos) * kD / 2), sinc(cosc.size());
  for (int p = 0; p < kMaxPos; ++p)
    for (int i = 0; i < kD / 2; ++i) {
      const double a = p / std::pow(10000.0, double(i) / (kD / 2));
      cosc[size_t(p) * kD / 2 + i] = float(std::cos(a));
      sinc[size_t(p) * kD / 2 + i] = float(std::sin(a));
    }
  std::vector<float> qkv((kH + 2 * kHkv) * kD), y(kH * kD);
  for (auto& x : qkv) x = nd(rng);
  const int threads = omp_get_max_threads();
  std::printf("decode attention, H%d/%d D%d fp32, %d layers' caches visited in turn, %d threads\n", kH, kHkv, kD,
              kLayers, threads);
  for (int a = 1; a < argc; ++a) {
    const int ctx = std::atoi(argv[a]);
    const int chunks = std::max(1, std::min(4 * threads, (ctx + 255) / 256));  // 256 keys or more a chunk
    std::vector<float> part(size_t(kHkv) * chunks * kGroup * (2 + kD));
    Step(layers[0], qkv.data(), cosc.data(), sinc.data(), ctx, y.data(), chunks, part);
    const double err = CheckLayer(layers[0], qkv.data(), cosc.data(), sinc.data(), ctx, y.data());
    std::vector<double> rounds;
    for (int r = 0; r < 7; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      const int steps = 20;
      for (int st = 0; st < steps; ++st)
        for (auto& L : layers) Step(L, qkv.data(), cosc.data(), sinc.data(), ctx, y.data(), chunks, part);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      rounds.push_back(us / steps / kLayers);
    }
    std::sort(rounds.begin(), rounds.end());
    const double us = rounds[rounds.size() / 2];
    const double mb = 2.0 * kHkv * (ctx + 1) * kD * 4 / 1e6;
    std::printf("  context %5d: %7.1f us a layer (%2d chunks; KV %.2f MB, %.1f GB/s), max error %.1e\n", ctx, us,
                chunks, mb, mb / us * 1e3, err);
  }
  return 0;
}
