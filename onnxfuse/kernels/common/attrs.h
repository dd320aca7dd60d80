// Node attributes, read once when onnxruntime creates a kernel (once per node and session). Names and defaults come
// from the generated onnxfuse_ops.h (onnxfuse/schema.py). A missing attribute takes the schema default; a bad value
// fails kernel creation with ORT_INVALID_ARGUMENT naming the op. Lite ops register no attribute schema, so
// onnxruntime passes every attribute through unchecked: the checks are here.
//
// backend: on the CPU EP every value is accepted and the CPU kernel runs (a model fused for CUDA still runs on a
// CPU-only session); on the CUDA EP it picks the kernel family (cuda/ops_cuda.h Dispatch). Nothing in the environment
// overrides it: set it in the model (onnxfuse fuse --backend, runtime.session(backend=)).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace onnxfuse {

using schema::Backend;

inline const char* BackendName(Backend b) { return schema::kBackendNames[static_cast<int>(b)]; }

inline Backend ParseBackend(std::string_view s, const char* op, const char* where) {
  std::string expected;
  for (int i = 0; i < schema::kNumBackends; ++i) {
    if (s == schema::kBackendNames[i]) return static_cast<Backend>(i);
    expected += std::string(i ? "|" : "") + schema::kBackendNames[i];
  }
  Fail(std::string(op) + ": unknown backend '" + std::string(s) + "' from " + where + " (expected " + expected + ")");
}

namespace detail {
// Optional attributes through the C API: the C++ wrapper's GetAttribute throws when an attribute is absent, and
// absent means "schema default" here.
inline bool TryGetString(const OrtApi* api, const OrtKernelInfo* info, const char* name, std::string& out) {
  size_t size = 0;
  OrtStatus* st = api->KernelInfoGetAttribute_string(info, name, nullptr, &size);
  if (st != nullptr) {
    api->ReleaseStatus(st);
    return false;
  }
  std::string buf(size, '\0');
  st = api->KernelInfoGetAttribute_string(info, name, buf.data(), &size);
  if (st != nullptr) {
    api->ReleaseStatus(st);
    return false;
  }
  buf.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  out = std::move(buf);
  return true;
}
inline bool TryGetFloat(const OrtApi* api, const OrtKernelInfo* info, const char* name, float& out) {
  OrtStatus* st = api->KernelInfoGetAttribute_float(info, name, &out);
  if (st != nullptr) {
    api->ReleaseStatus(st);
    return false;
  }
  return true;
}
}  // namespace detail

// The attributes every op may carry: backend, and scale (LoRA ops; ignored by the others).
struct OpAttrs {
  Backend backend = ParseBackend(schema::attr::kBackendDefault, "schema", "the schema default");
  const char* backend_source = "default";  // "attribute" or "default": for error messages
  float scale = schema::attr::kScaleDefault;
  float scale_gate = schema::attr::kScaleGateDefault, scale_up = schema::attr::kScaleUpDefault;  // LoRASwiGLU
  float scale_down = schema::attr::kScaleDownDefault;                                            // LoRAGatedMLP
};

inline OpAttrs ReadOpAttrs(const OrtApi* api, const OrtKernelInfo* info, const char* op) {
  OpAttrs a;
  std::string s;
  if (detail::TryGetString(api, info, schema::attr::kBackend, s)) {
    a.backend = ParseBackend(s, op, "node attribute 'backend'");
    a.backend_source = "attribute";
  }
  detail::TryGetFloat(api, info, schema::attr::kScale, a.scale);
  detail::TryGetFloat(api, info, schema::attr::kScaleGate, a.scale_gate);
  detail::TryGetFloat(api, info, schema::attr::kScaleUp, a.scale_up);
  detail::TryGetFloat(api, info, schema::attr::kScaleDown, a.scale_down);
  return a;
}

// FlashAttention's `num_heads` (> 0; absent: the schema default) and `qk_scale` (0: 1 / sqrt(D)).
inline int64_t ReadNumHeads(const OrtApi* api, const OrtKernelInfo* info, const char* op) {
  int64_t h = schema::attr::kNumHeadsDefault;
  OrtStatus* st = api->KernelInfoGetAttribute_int64(info, schema::attr::kNumHeads, &h);
  if (st != nullptr) api->ReleaseStatus(st);
  if (h <= 0) Fail(std::string(op) + ": " + schema::attr::kNumHeads + " must be positive, got " + std::to_string(h));
  return h;
}
// An int attribute, or `fallback` (the schema default) where the node has none (CachedAttention's kv_num_heads and
// rotary_interleaved).
inline int64_t ReadIntAttr(const OrtApi* api, const OrtKernelInfo* info, const char* name, int64_t fallback) {
  int64_t v = fallback;
  OrtStatus* st = api->KernelInfoGetAttribute_int64(info, name, &v);
  if (st != nullptr) {
    api->ReleaseStatus(st);
    return fallback;
  }
  return v;
}
// LinearSkipRMSNorm's epsilon: the schema default where the node has none; a negative or non-finite one fails.
inline float ReadEpsilon(const OrtApi* api, const OrtKernelInfo* info, const char* op) {
  float e = schema::attr::kEpsilonDefault;
  detail::TryGetFloat(api, info, schema::attr::kEpsilon, e);
  if (!(e >= 0.f && e < 1e30f))
    Fail(std::string(op) + ": " + schema::attr::kEpsilon + " must be finite and >= 0, got " + std::to_string(e));
  return e;
}
inline float ReadQkScale(const OrtApi* api, const OrtKernelInfo* info) {
  float s = schema::attr::kQkScaleDefault;
  detail::TryGetFloat(api, info, schema::attr::kQkScale, s);
  return s;
}

// MLPStack's `activations` ("relu.relu.sigmoid"): one activation code (onnxfuse_act) per layer.
inline std::vector<int> ReadStackActivations(const OrtApi* api, const OrtKernelInfo* info, const char* op) {
  std::string s;
  if (!detail::TryGetString(api, info, schema::attr::kActivations, s) || s.empty())
    Fail(std::string(op) + ": missing attribute '" + schema::attr::kActivations +
         "' (the layers' activations joined by dots, e.g. relu.relu.sigmoid)");
  std::vector<int> acts;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t dot = std::min(s.find(schema::kActivationSeparator, start), s.size());
    const std::string a = s.substr(start, dot - start);
    int code = 0;
    for (int c = 1; c < schema::kNumActivations; ++c)
      if (a == schema::kActivationNames[c]) code = c;
    if (code == 0) {
      std::string names;
      for (int c = 1; c < schema::kNumActivations; ++c)
        names += std::string(c > 1 ? " or " : "") + schema::kActivationNames[c];
      Fail(std::string(op) + ": activation '" + a + "' in '" + s + "' is not " + names);
    }
    acts.push_back(code);
    start = dot + 1;
  }
  return acts;
}

// SwiGLU's `activation` (silu|gelu|gelu_tanh|quick_gelu|relu|sigmoid) as an onnxfuse_gate_act code; absent means
// the schema default (silu: SwiGLU nodes written before the attribute existed).
inline int ReadGateActivation(const OrtApi* api, const OrtKernelInfo* info, const char* op) {
  std::string s = schema::attr::kActivationDefault;
  detail::TryGetString(api, info, schema::attr::kActivation, s);
  std::string expected;
  for (int i = 0; i < ONNXFUSE_NUM_GATE_ACTIVATIONS; ++i) {
    if (s == schema::kGateActivationNames[i]) return i;
    expected += std::string(i ? "|" : "") + schema::kGateActivationNames[i];
  }
  Fail(std::string(op) + ": unknown " + schema::attr::kActivation + " '" + s + "' (expected " + expected + ")");
}

// MLPStack's `stack_mode` (auto|fused|layers) as an onnxfuse_stack_mode code.
inline int ReadStackMode(const OrtApi* api, const OrtKernelInfo* info, const char* op) {
  std::string s = schema::attr::kStackModeDefault;
  detail::TryGetString(api, info, schema::attr::kStackMode, s);
  std::string expected;
  for (int i = 0; i < schema::kNumStackModes; ++i) {
    if (s == schema::kStackModeNames[i]) return i;
    expected += std::string(i ? "|" : "") + schema::kStackModeNames[i];
  }
  Fail(std::string(op) + ": unknown " + schema::attr::kStackMode + " '" + s + "' (expected " + expected + ")");
}

// A string attribute naming one of `names` (schema default `fallback`), as its code; a bad value fails with the
// choices.
inline int ReadChoice(const OrtApi* api, const OrtKernelInfo* info, const char* op, const char* attr,
                      const char* const* names, int n, const char* fallback) {
  std::string s = fallback;
  detail::TryGetString(api, info, attr, s);
  std::string expected;
  for (int i = 0; i < n; ++i) {
    if (s == names[i]) return i;
    expected += std::string(i ? "|" : "") + names[i];
  }
  Fail(std::string(op) + ": unknown " + attr + " '" + s + "' (expected " + expected + ")");
}

// The embedding ops' `interaction` (onnxfuse_interaction code) and EmbeddingInteraction's `hash` (onnxfuse_hash).
inline int ReadInteraction(const OrtApi* api, const OrtKernelInfo* info, const char* op) {
  return ReadChoice(api, info, op, schema::attr::kInteraction, schema::kInteractionNames, schema::kNumInteractions,
                    schema::attr::kInteractionDefault);
}
inline int ReadHash(const OrtApi* api, const OrtKernelInfo* info, const char* op) {
  return ReadChoice(api, info, op, schema::attr::kHash, schema::kHashNames, schema::kNumHashes,
                    schema::attr::kHashDefault);
}

}  // namespace onnxfuse
