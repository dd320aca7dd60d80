"""Run `onnxfuse bench` on the GPU machine (H100/H200): every named case by default, one process, one run.

    PYTHONPATH=/path/to/ort-gpu:$PWD python scripts/bench_gpu.py --lib /path/to/libonnxfuse_ops.so \
        -o $OUT/bench.json [--check-goals] [CASE ...] [any other `onnxfuse bench` flag]

A thin wrapper over `python -m onnxfuse.bench`: it puts the repository on sys.path, loads the CUDA libraries
(onnxruntime.preload_dlls) before anything creates a session, checks that the CUDA EP and a GPU are there (exit 2
with the fix otherwise), and passes every argument through. The table is printed last; the JSON (and, where
matplotlib is installed, the PNG) is written where -o says. Without matplotlib (the GPU image has none) make the
plot afterwards on the CPU machine: `python -m onnxfuse.bench plot bench.json`.
"""
from __future__ import annotations

import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    import onnxruntime as ort
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    import torch

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print(f"bench_gpu: onnxruntime {ort.__version__} from {ort.__file__} has no CUDAExecutionProvider; put "
              "onnxruntime-gpu first on PYTHONPATH (see /work/shared/GPU.md)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("bench_gpu: torch sees no CUDA device", file=sys.stderr)
        return 2
    print(f"bench_gpu: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, onnxruntime {ort.__version__}",
          file=sys.stderr, flush=True)
    from onnxfuse import cli

    t0 = time.time()
    rc = cli.main(["bench", *argv])
    print(f"bench_gpu: exit {rc} after {time.time() - t0:.0f} s", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
