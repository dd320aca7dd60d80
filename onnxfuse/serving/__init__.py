"""Serving a fused model with NVIDIA's Triton Inference Server (issue 32).

* `repository`: the model's signature read from the ONNX file and the model repositories: the one `onnxfuse serve`
  runs (Triton's Python backend running onnxruntime with the kernel library, one session per instance) and the one
  `onnxfuse triton-repo` writes for a production Triton's onnxruntime backend (`model_operations` names the library).
* `server`: the Triton server binary that PyTriton (`nvidia-pytriton`) ships, started on loopback with such a
  repository, its readiness, and a clean stop (no process left behind).
* `triton_model`: the Python-backend model itself (copied into the repository as `1/model.py`).
* `load`: the load test: tritonclient over HTTP on 127.0.0.1, bounded in requests and time, every response checked
  against a direct onnxruntime run of the same input.
"""
