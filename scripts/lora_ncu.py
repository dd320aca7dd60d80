"""The driver behind benchmarks/results/h100-2026-11-26/lora/ncu-lora-swiglu.txt (issue 30): one-node SwiGLU,
LoRASwiGLU (rank 16 on both projections, 16 rows) and MultiLoRASwiGLU (8 rows, 8 rank-16 adapters) models at the
Llama-2-7B MLP's gate/up shapes (K 4096, N 11008, fp16, backend triton), three runs each, for Nsight Compute to set
the rank-r epilogue's kernels beside SwiGLU's:

    ncu --clock-control none --kernel-name regex:"swiglu_kernel" --launch-count 9 --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats --section LaunchStats python scripts/lora_ncu.py OUT_DIR
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

CASES = (("SwiGLU", (16, 4096, 11008, 0, "silu")), ("LoRASwiGLU", (16, 4096, 11008, 16, 16, "silu")),
         ("MultiLoRASwiGLU", (8, 1, 4096, 11008, 16, 16, 8, "silu")))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python scripts/lora_ncu.py OUT_DIR", file=sys.stderr)
        return 2
    import onnx
    import torch

    from onnxfuse import runtime, schema, testing
    out = pathlib.Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for op, entry in CASES:
        definition = schema.op_def(op)
        shapes, attrs, _ = definition.doctor_entry(entry)
        inputs = definition.make_doctor_inputs(torch.float16, shapes, 0)
        path = out / f"{op}.onnx"
        onnx.save(testing.op_model(op, "float16", shapes, {**attrs, "backend": "triton"}), str(path))
        sess = runtime.session(str(path), "cuda")
        feeds = {name: t.numpy() for name, t in zip(shapes, inputs)}
        for _ in range(3):
            sess.run(None, feeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
