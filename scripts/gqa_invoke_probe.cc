// Issue 27, CPU: can an onnxfuse op that replaces genai's GroupQueryAttention hand a call back to onnxruntime's own
// GroupQueryAttention (com.microsoft) through the C API's CreateOp / InvokeOp, e.g. a long prefill that its own
// kernel does not do faster? A lite custom op "InvGQA" (the node's inputs but the empty key and value, the same three
// outputs) invokes the contrib op on them; scripts/gqa_cpu_probe.py invoke builds this file and compares outputs and
// time with the session's own node. Build (onnxruntime's headers, as the kernel library finds them):
//   g++ -O2 -shared -fPIC -std=c++17 -I<onnxruntime headers> scripts/gqa_invoke_probe.cc -o libgqa_invoke.so
#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT
#include <memory>
#include <vector>

#include "onnxruntime_lite_custom_op.h"

namespace {

constexpr int kHeads = 9, kKvHeads = 3;  // SmolLM2-135M's, as the probe's models

struct InvGQA {
  InvGQA(const OrtApi*, const OrtKernelInfo* info) {
    const char* names[] = {"T", "M"};
    ONNXTensorElementDataType types[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32};
    int64_t h = kHeads, hkv = kKvHeads, rot = 1, inter = 0, window = -1;
    float scale = 0.125f, softcap = 0.f;
    std::vector<Ort::OpAttr> attrs;
    attrs.emplace_back("num_heads", &h, 1, OrtOpAttrType::ORT_OP_ATTR_INT);
    attrs.emplace_back("kv_num_heads", &hkv, 1, OrtOpAttrType::ORT_OP_ATTR_INT);
    attrs.emplace_back("do_rotary", &rot, 1, OrtOpAttrType::ORT_OP_ATTR_INT);
    attrs.emplace_back("rotary_interleaved", &inter, 1, OrtOpAttrType::ORT_OP_ATTR_INT);
    attrs.emplace_back("local_window_size", &window, 1, OrtOpAttrType::ORT_OP_ATTR_INT);
    attrs.emplace_back("scale", &scale, 1, OrtOpAttrType::ORT_OP_ATTR_FLOAT);
    attrs.emplace_back("softcap", &softcap, 1, OrtOpAttrType::ORT_OP_ATTR_FLOAT);
    op = std::make_unique<Ort::Op>(Ort::Op::Create(info, "GroupQueryAttention", "com.microsoft", 1, names, types, 2,
                                                   attrs.data(), attrs.size(), 9, 3));
  }

  Ort::Status Compute(OrtKernelContext* ctx, const Ort::Custom::Tensor<float>& Q, const Ort::Custom::Tensor<float>& PK,
                      const Ort::Custom::Tensor<float>& PV, const Ort::Custom::Tensor<int32_t>& SL,
                      const Ort::Custom::Tensor<int32_t>& TL, const Ort::Custom::Tensor<float>& Cos,
                      const Ort::Custom::Tensor<float>& Sin, Ort::Custom::Tensor<float>& Y,
                      Ort::Custom::Tensor<float>& OK, Ort::Custom::Tensor<float>& OV) {
    const auto qs = Q.Shape();
    auto ps = PK.Shape();
    const int64_t total = *TL.Data();
    const int64_t d = qs[2] / (kHeads + 2 * kKvHeads);
    std::vector<int64_t> ys{qs[0], qs[1], kHeads * d};
    std::vector<int64_t> present{ps[0], ps[1], std::max<int64_t>(total, ps[2]), ps[3]};
    float* y = Y.Allocate(ys);
    float* ok = OK.Allocate(present);
    float* ov = OV.Allocate(present);
    auto mi = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
    auto count = [](const std::vector<int64_t>& s) {
      size_t n = 1;
      for (auto v : s) n *= size_t(v);
      return n;
    };
    Ort::Value yv = Ort::Value::CreateTensor<float>(mi, y, count(ys), ys.data(), ys.size());
    Ort::Value kv = Ort::Value::CreateTensor<float>(mi, ok, count(present), present.data(), present.size());
    Ort::Value vv = Ort::Value::CreateTensor<float>(mi, ov, count(present), present.data(), present.size());
    Ort::KernelContext kc(ctx);
    const OrtValue* ins[] = {kc.GetInput(0), nullptr,        nullptr,        kc.GetInput(1), kc.GetInput(2),
                             kc.GetInput(3), kc.GetInput(4), kc.GetInput(5), kc.GetInput(6)};
    OrtValue* outs[] = {yv, kv, vv};
    op->Invoke(ctx, ins, 9, outs, 3);
    return Ort::Status{nullptr};
  }
  std::unique_ptr<Ort::Op> op;
};

}  // namespace

extern "C" OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  static Ort::CustomOpDomain domain("inv");
  static std::unique_ptr<Ort::Custom::OrtLiteCustomOp> op{
      Ort::Custom::CreateLiteCustomOp<InvGQA>("InvGQA", "CPUExecutionProvider")};
  domain.Add(op.get());
  Ort::UnownedSessionOptions(options).Add(domain);
  return nullptr;
}
