"""The driver behind benchmarks/results/h100-2026-11-26/int4/ncu-int4.txt (issue 28): a Llama-2-7B layer's qkv, o and
down int4 projections (genai's MatMulNBits, block 32, fp16) fused to Int4Linear on the CUDA backend, three runs at each
row count given, for Nsight Compute to read the GEMV's and the tensor-core kernel's counters:

    ncu --clock-control none --kernel-name regex:"Int4Gemv|Int4Mma" --launch-skip 3 --launch-count 12 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \\
        --section LaunchStats python scripts/int4_ncu.py OUT_DIR 1,8
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python scripts/int4_ncu.py OUT_DIR ROWS (e.g. 1,8)", file=sys.stderr)
        return 2
    import int4_probe

    from onnxfuse import fuse, runtime
    out = pathlib.Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    projections = {"qkv": (4096, 12288), "o": (4096, 4096), "down": (11008, 4096)}
    int4_probe.nbits_model(out / "m.onnx", projections)
    fuse.fuse(out / "m.onnx", out / "f.onnx", ort=False, provider="cuda", force=True, backend="cuda")
    sess = runtime.session(str(out / "f.onnx"), "cuda")
    for m in [int(v) for v in argv[1].split(",")]:
        rng = np.random.default_rng(m)
        feeds = {f"x{k}": rng.standard_normal((m, k)).astype(np.float16) for k in (4096, 11008)}
        for _ in range(3):
            sess.run(None, feeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
