// Registering kernels in the onnxfuse domain: the lite ops (one struct template per op, created for float,
// float16 and bfloat16 under one name) and the variadic ops (MLPStack) written against Ort::CustomOpBase.
//
// onnxruntime keeps raw pointers to the op objects after the session options are gone, so they live for the
// process. One name registered three times (one per type) in one domain is merged by onnxruntime into one schema
// whose type constraint lists the three types; it picks the kernel by the node's input types. The same name may be
// registered for the CPU and the CUDA EP; onnxruntime picks by node placement.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"

namespace onnxfuse {

// Keeps every created op alive for the process. Safe to call from several RegisterCustomOps calls.
inline void KeepAlive(std::unique_ptr<Ort::Custom::OrtLiteCustomOp> op, Ort::CustomOpDomain& domain) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<Ort::Custom::OrtLiteCustomOp>>* ops =
      new std::vector<std::unique_ptr<Ort::Custom::OrtLiteCustomOp>>();  // never destroyed: ORT may run at exit
  std::lock_guard<std::mutex> lock(mu);
  domain.Add(op.get());
  ops->push_back(std::move(op));
}

// Registers Kernel<float>, Kernel<Ort::Float16_t>, Kernel<Ort::BFloat16_t> under one op name for one EP.
template <template <typename> class Kernel>
void AddOpAllTypes(Ort::CustomOpDomain& domain, const char* op_name, const char* ep) {
  KeepAlive(std::unique_ptr<Ort::Custom::OrtLiteCustomOp>(Ort::Custom::CreateLiteCustomOp<Kernel<float>>(op_name, ep)),
            domain);
  KeepAlive(std::unique_ptr<Ort::Custom::OrtLiteCustomOp>(
                Ort::Custom::CreateLiteCustomOp<Kernel<Ort::Float16_t>>(op_name, ep)),
            domain);
  KeepAlive(std::unique_ptr<Ort::Custom::OrtLiteCustomOp>(
                Ort::Custom::CreateLiteCustomOp<Kernel<Ort::BFloat16_t>>(op_name, ep)),
            domain);
}

// ------------------------------------------------------------------------------------------------ variadic ops
// MLPStack has a variable number of inputs (X, then W_i, bias_i per layer). The lite API's Variadic cannot carry
// float16/bfloat16 tensors (its TensorArray knows no 16-bit float types), so these ops use Ort::CustomOpBase
// directly: input 0 is X of type T, input 1 a homogeneous variadic list of T (at least one W, bias pair), output
// 0 is Y of type T. Kernel<T> has a constructor (const OrtApi*, const OrtKernelInfo*) that may throw, and
// `OrtStatusPtr ComputeV2(OrtKernelContext*)`.

// Inputs of a variadic-op call: shapes and raw data pointers of all inputs, in order.
struct VariadicInputs {
  std::vector<std::vector<int64_t>> shapes;
  std::vector<const void*> data;
  explicit VariadicInputs(Ort::KernelContext& ctx) {
    const size_t n = ctx.GetInputCount();
    for (size_t i = 0; i < n; ++i) {
      Ort::ConstValue v = ctx.GetInput(i);
      shapes.push_back(v.GetTensorTypeAndShapeInfo().GetShape());
      data.push_back(v.GetTensorRawData());
    }
  }
};

// A CustomOpBase op's CreateKernelV2: a new Kernel(&api, info), or its constructor's error as a status (the
// attribute checks throw) instead of an exception through onnxruntime's C API.
template <typename Kernel>
OrtStatusPtr CreateKernelOrStatus(const OrtApi& api, const OrtKernelInfo* info, void** kernel) {
  try {
    *kernel = new Kernel(&api, info);
    return nullptr;
  } catch (const Ort::Exception& e) {
    return api.CreateStatus(e.GetOrtErrorCode(), e.what());
  } catch (const std::exception& e) {
    return api.CreateStatus(ORT_FAIL, e.what());
  }
}

// onnxruntime's com.microsoft GroupQueryAttention as an Ort::Op a kernel runs through InvokeOp (CachedAttention's
// CPU kernel hands it fp32 first prompts, its CUDA one every prompt): element type `type`, rotary on, no local
// window or softcap; null where this onnxruntime has no such op. The attributes keep the names of the op's schema
// where they match (the op's qk_scale is GroupQueryAttention's scale: 0 means 1 / sqrt(D) in both), so no name is
// written twice.
inline std::unique_ptr<Ort::Op> GroupQueryAttentionOp(const OrtKernelInfo* info, ONNXTensorElementDataType type,
                                                      int64_t heads, int64_t kv_heads, bool interleaved, float scale) {
  try {
    const char* names[] = {"T", "M"};
    ONNXTensorElementDataType types[] = {type, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32};
    int64_t rotary = 1, inter = interleaved ? 1 : 0, window = -1;
    float softcap = 0.f;
    std::vector<Ort::OpAttr> a;
    a.emplace_back(schema::attr::kNumHeads, &heads, 1, OrtOpAttrType::ORT_OP_ATTR_INT);
    a.emplace_back(schema::attr::kKvNumHeads, &kv_heads, 1, OrtOpAttrType::ORT_OP_ATTR_INT);
    a.emplace_back("do_rotary", &rotary, 1, OrtOpAttrType::ORT_OP_ATTR_INT);
    a.emplace_back(schema::attr::kRotaryInterleaved, &inter, 1, OrtOpAttrType::ORT_OP_ATTR_INT);
    a.emplace_back("local_window_size", &window, 1, OrtOpAttrType::ORT_OP_ATTR_INT);
    a.emplace_back(schema::attr::kScale, &scale, 1, OrtOpAttrType::ORT_OP_ATTR_FLOAT);
    a.emplace_back("softcap", &softcap, 1, OrtOpAttrType::ORT_OP_ATTR_FLOAT);
    // 9 inputs (query .. sin_cache), 3 outputs (output, present_key, present_value)
    return std::make_unique<Ort::Op>(
        Ort::Op::Create(info, "GroupQueryAttention", "com.microsoft", 1, names, types, 2, a.data(), a.size(), 9, 3));
  } catch (const std::exception&) {
    return nullptr;
  }
}

template <template <typename> class Kernel, typename T>
struct VariadicOp : Ort::CustomOpBase<VariadicOp<Kernel, T>, Kernel<T>, true> {
  VariadicOp(const char* name, const char* ep) : name_(name), ep_(ep) {}
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    return CreateKernelOrStatus<Kernel<T>>(api, info, kernel);
  }
  const char* GetName() const { return name_; }
  const char* GetExecutionProviderType() const { return ep_; }
  size_t GetInputTypeCount() const { return 2; }
  ONNXTensorElementDataType GetInputType(size_t) const { return DTypeOf<T>::onnx; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return i == 0 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_VARIADIC;
  }
  int GetVariadicInputMinArity() const { return schema::MLPStack::kInputsPerLayer; }
  bool GetVariadicInputHomogeneity() const { return true; }
  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return DTypeOf<T>::onnx; }

 private:
  const char* name_;
  const char* ep_;
};

// Registers VariadicOp<Kernel, T> for the three element types; the op objects are never freed.
template <template <typename> class Kernel>
void AddVariadicOpAllTypes(Ort::CustomOpDomain& domain, const char* op_name, const char* ep) {
  domain.Add(new VariadicOp<Kernel, float>(op_name, ep));
  domain.Add(new VariadicOp<Kernel, Ort::Float16_t>(op_name, ep));
  domain.Add(new VariadicOp<Kernel, Ort::BFloat16_t>(op_name, ep));
}

}  // namespace onnxfuse
