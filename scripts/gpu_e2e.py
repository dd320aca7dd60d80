"""End-to-end check on a GPU machine: export -> fuse -> verify on the CUDA EP with each backend, and a fused model
run under CUDA-graph capture. Writes e2e.json under --out and prints a table last.

    PYTHONPATH=<ort-gpu site>:$PWD ONNXFUSE_LIBRARY=<prebuilt .so> python scripts/gpu_e2e.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = {  # name -> (kind, spec overrides, dtype)
    "llama-1l-fp32": ("llama", dict(num_hidden_layers=1), "fp32"),
    "llama-1l-fp16": ("llama", dict(num_hidden_layers=1), "fp16"),
    "llama-1l-bf16": ("llama", dict(num_hidden_layers=1), "bf16"),
    "llama-1l-lora8-fp16": ("llama", dict(num_hidden_layers=1, lora_rank=8), "fp16"),
    "llama-1l-lora8-fp32": ("llama", dict(num_hidden_layers=1, lora_rank=8), "fp32"),
    "dlrm-fp32": ("dlrm", dict(), "fp32"),
    "dlrm-fp16": ("dlrm", dict(), "fp16"),
    "dlrm-lora4-fp16": ("dlrm", dict(lora_rank=4), "fp16"),
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--workdir", type=pathlib.Path, default=ROOT / "models" / "gpu")
    a = ap.parse_args()
    import torch  # loads CUDA libraries before onnxruntime's CUDA EP
    import onnxruntime as ort
    ort.preload_dlls()
    from onnxfuse import export, fuse, runtime, verify, zoo

    a.out.mkdir(parents=True, exist_ok=True)
    a.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.models:
        kind, over, dtype = MODELS[name]
        src, dst = a.workdir / f"{name}.onnx", a.workdir / f"{name}.fused.onnx"
        try:
            t0 = time.time()
            spec = (zoo.LlamaSpec.from_preset("seed", **over) if kind == "llama"
                    else zoo.DlrmSpec.from_preset("criteo-kaggle", **over))
            export.export(kind, spec, src, dtype=dtype, force=True)
            fr = fuse.fuse(src, dst, force=True)
            row = {"model": name, "fused_ops": {m.op: sum(1 for x in fr.matches if x.op == m.op) for m in fr.matches},
                   "export_fuse_s": round(time.time() - t0, 1)}
        except Exception as e:
            rows.append({"model": name, "error": f"export/fuse: {type(e).__name__}: {e}"})
            traceback.print_exc()
            continue
        for backend in ("unfused", "cuda", "triton", "auto"):
            try:
                if backend == "unfused":
                    res = verify.verify(src, provider="cuda")
                else:  # the nodes' backend attribute, set on an in-memory copy of the fused model
                    res = verify.verify(dst, provider="cuda", library=True, backend=backend)
                o = res.outputs[0]
                row[backend] = {"passed": res.passed, "max_rel_err": o.max_rel_err, "rel_l2_err": o.rel_l2_err,
                                "tolerance": o.tolerance}
            except Exception as e:
                row[backend] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        row["cuda_graph"] = _cuda_graph_check(dst, runtime, zoo, export)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (a.out / "e2e.json").write_text(json.dumps({"rows": rows, "device": _device()}, indent=1))
    print(f"{'model':24} {'unfused':10} {'cuda':10} {'triton':10} {'auto':10} cuda_graph")
    ok = True
    for r in rows:
        cells = []
        for b in ("unfused", "cuda", "triton", "auto"):
            v = r.get(b, {})
            cells.append("ERR" if "error" in v else ("PASS" if v.get("passed") else "FAIL") + f" {v.get('max_rel_err', 0):.0e}")
            ok &= bool(v.get("passed"))
        g = r.get("cuda_graph", {})
        ok &= bool(g.get("passed"))
        print(f"{r['model']:24} " + " ".join(f"{c:10}" for c in cells) + f" {g}" if "error" not in r else f"{r['model']:24} {r['error'][:200]}")
    return 0 if ok else 1


def _device() -> str:
    import torch
    return torch.cuda.get_device_name(0)


def _cuda_graph_check(path, runtime, zoo, export):
    """Run the fused model with enable_cuda_graph: replay with new inputs bound to the same buffers."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    try:
        model = onnx.load(str(path), load_external_data=False)
        recipe = export.read_recipe(model)
        spec = zoo.spec_from_dict(recipe["kind"], recipe["spec"])
        feeds = {k: v.numpy() for k, v in zoo.make_inputs(recipe["kind"], spec, recipe["seed"], recipe["dtype"]).items()}
        feeds2 = {k: v.numpy() for k, v in zoo.make_inputs(recipe["kind"], spec, recipe["seed"] + 7, recipe["dtype"]).items()}
        plain = runtime.session(str(path), "cuda", library=True)
        ref2 = plain.run(None, feeds2)[0]
        sess = runtime.session(str(path), "cuda", library=True, cuda_graph=True)
        io = sess.io_binding()
        vals = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in feeds.items()}
        for k, v in vals.items():
            io.bind_ortvalue_input(k, v)
        out_meta = sess.get_outputs()[0]
        ref1 = plain.run(None, feeds)[0]
        out = ort.OrtValue.ortvalue_from_shape_and_type(list(ref1.shape), ref1.dtype, "cuda", 0)
        io.bind_ortvalue_output(out_meta.name, out)
        for _ in range(3):
            sess.run_with_iobinding(io)
        first = out.numpy().copy()
        for k, v in vals.items():
            v.update_inplace(feeds2[k])
        sess.run_with_iobinding(io)
        second = out.numpy()
        scale = float(np.abs(ref2).max()) or 1.0
        e1 = float(np.abs(first.astype(np.float64) - ref1).max()) / (float(np.abs(ref1).max()) or 1.0)
        e2 = float(np.abs(second.astype(np.float64) - ref2).max()) / scale
        return {"passed": e1 < 1e-3 and e2 < 1e-3, "err_first": e1, "err_replay_new_inputs": e2}
    except Exception as e:
        return {"passed": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}


if __name__ == "__main__":
    sys.exit(main())
