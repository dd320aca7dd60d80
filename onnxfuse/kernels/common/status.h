// Errors as statuses, and diagnostics through onnxruntime's logger: the library prints nothing itself.
#pragma once

#include <exception>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "common/ort_api.h"

namespace onnxfuse {

// Throws an Ort::Exception; kernels throw only inside GuardCompute or a kernel constructor, both of which turn it
// into a status for onnxruntime.
[[noreturn]] inline void Fail(std::string message, OrtErrorCode code = ORT_INVALID_ARGUMENT) {
  ORT_CXX_API_THROW(std::move(message), code);
}

// Runs a kernel body and turns whatever it throws into an Ort::Status, so no exception crosses into onnxruntime.
template <typename Body>
Ort::Status GuardCompute(Body&& body) noexcept {
  try {
    body();
    return Ort::Status{nullptr};
  } catch (const Ort::Exception& e) {
    return Ort::Status(e.what(), e.GetOrtErrorCode());
  } catch (const std::bad_alloc&) {
    return Ort::Status("onnxfuse: out of memory", ORT_FAIL);
  } catch (const std::exception& e) {
    return Ort::Status(e.what(), ORT_FAIL);
  } catch (...) {
    return Ort::Status("onnxfuse: unknown exception in kernel", ORT_FAIL);
  }
}

inline std::string ShapeStr(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// One line to the session's logger (OrtApi::KernelInfo_GetLogger / KernelContext_GetLogger): shown when the
// session's log severity admits `severity`. Never throws; a logging failure is dropped.
inline void LogTo(const OrtLogger* logger, OrtLoggingLevel severity, const std::string& message) noexcept {
  if (logger == nullptr) return;
  const OrtApi& api = Ort::GetApi();
  OrtLoggingLevel level = ORT_LOGGING_LEVEL_FATAL;
  OrtStatus* st = api.Logger_GetLoggingSeverityLevel(logger, &level);
  if (st != nullptr) {
    api.ReleaseStatus(st);
    return;
  }
  if (severity < level) return;
  st = api.Logger_LogMessage(logger, severity, message.c_str(), ORT_FILE, __LINE__, schema::kDomain);
  if (st != nullptr) api.ReleaseStatus(st);
}

inline const OrtLogger* LoggerOf(const OrtApi* api, const OrtKernelInfo* info) noexcept {
  const OrtLogger* logger = nullptr;
  if (OrtStatus* st = api->KernelInfo_GetLogger(info, &logger)) {
    api->ReleaseStatus(st);
    return nullptr;
  }
  return logger;
}

inline const OrtLogger* LoggerOf(const OrtKernelContext* ctx) noexcept {
  const OrtApi& api = Ort::GetApi();
  const OrtLogger* logger = nullptr;
  if (OrtStatus* st = api.KernelContext_GetLogger(ctx, &logger)) {
    api.ReleaseStatus(st);
    return nullptr;
  }
  return logger;
}

}  // namespace onnxfuse
