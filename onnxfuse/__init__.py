"""onnxfuse: export PyTorch models to ONNX, fuse subgraphs into custom ops, run them with CPU/CUDA/Triton kernels."""
__version__ = "0.1.0"
