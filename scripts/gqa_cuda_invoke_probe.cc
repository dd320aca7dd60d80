// Issue 27, GPU: can a CUDA-EP custom op hand a call to onnxruntime's own CUDA GroupQueryAttention through the C API's
// CreateOp / InvokeOp (the native op is created on the custom op's execution provider), so that an onnxfuse
// replacement could run its own decode kernel and leave prompts to onnxruntime's flash kernels? A CustomOpBase op
// "InvGQA" on the CUDA EP (the node's inputs but the empty key and value, total_sequence_length in host memory as
// onnxruntime's op wants it, the same three outputs, fp16) invokes the contrib op on them;
// scripts/gqa_cuda_invoke_probe.py compares its outputs and time with the session's own node, plain and under a
// CUDA graph. Build (onnxruntime's headers, as the kernel library finds them; no CUDA code here):
//   g++ -O2 -shared -fPIC -std=c++17 -I<onnxruntime headers> scripts/gqa_cuda_invoke_probe.cc -o libgqa_cuda_invoke.so
#define ORT_API_MANUAL_INIT
#include "onnxruntime_cxx_api.h"
#undef ORT_API_MANUAL_INIT
#include <memory>
#include <vector>

namespace {

struct InvGQAKernel {
  InvGQAKernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo ki(info);
    int64_t h = ki.GetAttribute<int64_t>("num_heads"), hkv = ki.GetAttribute<int64_t>("kv_num_heads");
    heads = h, kv_heads = hkv;
    const char* names[] = {"T", "M"};
    ONNXTensorElementDataType types[] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32};
    int64_t rot = 1, inter = 0, window = -1;
    float scale = 0.f, softcap = 0.f;
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
  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    try {
      Ort::KernelContext ctx(context);
      const auto qs = ctx.GetInput(0).GetTensorTypeAndShapeInfo().GetShape();
      const auto ps = ctx.GetInput(1).GetTensorTypeAndShapeInfo().GetShape();
      const int64_t total = *ctx.GetInput(4).GetTensorData<int32_t>();
      const int64_t d = qs[2] / (heads + 2 * kv_heads);
      std::vector<int64_t> ys{qs[0], qs[1], heads * d}, present{ps[0], ps[1], std::max<int64_t>(total, ps[2]), ps[3]};
      Ort::UnownedValue y = ctx.GetOutput(0, ys), k = ctx.GetOutput(1, present), v = ctx.GetOutput(2, present);
      const OrtValue* ins[] = {ctx.GetInput(0), nullptr,         nullptr,         ctx.GetInput(1), ctx.GetInput(2),
                               ctx.GetInput(3), ctx.GetInput(4), ctx.GetInput(5), ctx.GetInput(6)};
      OrtValue* outs[] = {y, k, v};
      op->Invoke(context, ins, 9, outs, 3);
      return nullptr;
    } catch (const Ort::Exception& e) {
      return Ort::GetApi().CreateStatus(e.GetOrtErrorCode(), e.what());
    }
  }
  int64_t heads = 0, kv_heads = 0;
  std::unique_ptr<Ort::Op> op;
};

struct InvGQA : Ort::CustomOpBase<InvGQA, InvGQAKernel, true> {
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new InvGQAKernel(api, info);
      return nullptr;
    } catch (const Ort::Exception& e) {
      return api.CreateStatus(e.GetOrtErrorCode(), e.what());
    }
  }
  const char* GetName() const { return "InvGQA"; }
  const char* GetExecutionProviderType() const { return "CUDAExecutionProvider"; }
  size_t GetInputTypeCount() const { return 7; }
  ONNXTensorElementDataType GetInputType(size_t i) const {
    return i == 3 || i == 4 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  }
  OrtMemType GetInputMemoryType(size_t i) const { return i == 4 ? OrtMemTypeCPUInput : OrtMemTypeDefault; }
  size_t GetOutputTypeCount() const { return 3; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16; }
};

}  // namespace

extern "C" OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  static Ort::CustomOpDomain domain("inv");
  static InvGQA op;
  domain.Add(&op);
  Ort::UnownedSessionOptions(options).Add(domain);
  return nullptr;
}
