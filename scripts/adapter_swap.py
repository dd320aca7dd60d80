"""Adapter swap time on a fused LoRA model under IOBinding and a CUDA graph (issue 30).

Exports onnxfuse's Llama decoder stack (the llama2-7b preset: hidden 4096, MLP 11008, 32 heads; --layers of them)
with rank-R peft adapters on q/k/v/o/gate/up/down as graph inputs (`--lora-as-inputs`), fuses it for the provider,
opens one session (CUDA graph on cuda), binds the inputs, the output and the adapter inputs once
(adapters.AdapterSlots: views into one device buffer), preloads a second adapter of the same shapes, and times, per
swap, `activate` (one device-to-device copy of the whole adapter, synchronized) and `load` (one host-to-device copy
of it); each swapped run's output is checked against a session without a binding fed that adapter as plain inputs.
Writes JSON.

    python scripts/adapter_swap.py OUT_DIR [--layers 32] [--rank 16] [--provider cuda] [--swaps 30] [--seq 1]
                                   [--stage all|export|swap]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--provider", default="cuda", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default=None, help="default fp16 on cuda, fp32 on cpu")
    ap.add_argument("--swaps", type=int, default=30)
    ap.add_argument("--seq", type=int, default=1, help="tokens per run (1: a decode step's shapes)")
    ap.add_argument("--stage", choices=["all", "export", "swap"], default="all",
                    help="export: only export and fuse into OUT_DIR (with export.json); swap: only time the swaps "
                         "on what an earlier export stage left there (a 7B model's 32 layers take ~9 minutes to "
                         "export, so that one device call need not hold both)")
    args = ap.parse_args(argv)
    import onnxruntime as ort

    from onnxfuse import adapters, export, fuse, runtime, zoo
    dtype = args.dtype or ("fp16" if args.provider == "cuda" else "fp32")
    args.out.mkdir(parents=True, exist_ok=True)
    spec = zoo.LlamaSpec.from_preset("llama2-7b", num_hidden_layers=args.layers, lora_rank=args.rank,
                                     lora_targets=TARGETS, batch=1, seq=args.seq)
    src, dst = args.out / "lora.onnx", args.out / "lora.fused.onnx"
    stage_file = args.out / "export.json"
    if args.stage == "swap":
        if not stage_file.is_file():
            raise SystemExit(f"{stage_file}: no export stage in {args.out}; run --stage export there first")
        done = json.loads(stage_file.read_text())
        if {k: done[k] for k in ("layers", "rank", "dtype", "provider", "seq")} != \
                {"layers": args.layers, "rank": args.rank, "dtype": dtype, "provider": args.provider, "seq": args.seq}:
            raise SystemExit(f"{stage_file}: exported for {done}, not for these arguments; run --stage export again")
    else:
        t0 = time.perf_counter()
        def progress(i, total, stage, detail):  # each export stage as it starts, with the seconds so far
            print(f"[{time.perf_counter() - t0:6.1f} s] export {i}/{total} {stage}: {detail}", flush=True)
        res = export.export("llama", spec, src, dtype=dtype, lora_as_inputs=True, force=True, progress=progress)
        t_export = time.perf_counter() - t0
        fr = fuse.fuse(src, dst, provider=args.provider, force=True)
        done = {"layers": args.layers, "rank": args.rank, "dtype": dtype, "provider": args.provider, "seq": args.seq,
                "adapter_path": str(res.adapter_path), "fused_ops": sorted({m.op for m in fr.matches}),
                "lora_linear_nodes": sum(1 for m in fr.matches if m.op == "LoRALinear"),
                "export_s": round(t_export, 1), "fuse_s": round(time.perf_counter() - t0 - t_export, 1)}
        stage_file.write_text(json.dumps(done, indent=1) + "\n")
        if args.stage == "export":
            print(json.dumps(done, indent=1))
            return 0
    first = adapters.read_adapter(pathlib.Path(done["adapter_path"]))
    rng = np.random.default_rng(1)
    second = {k: (rng.standard_normal(v.shape) * float(np.std(v.astype(np.float32)) or 0.02)).astype(v.dtype)
              for k, v in first.items()}
    nbytes = sum(v.nbytes for v in first.values())
    feeds = {k: v.numpy() for k, v in zoo.make_inputs("llama", spec, 0, dtype).items()}  # input_ids, attention_mask
    graph = args.provider == "cuda"
    sess = runtime.session(str(dst), args.provider, library=True, cuda_graph=graph)
    plain = runtime.session(str(dst), args.provider, library=True)
    refs = {"first": plain.run(None, {**feeds, **first})[0], "second": plain.run(None, {**feeds, **second})[0]}
    out_meta = sess.get_outputs()[0]
    io = sess.io_binding()
    bound = {k: ort.OrtValue.ortvalue_from_numpy(v, args.provider, 0) for k, v in feeds.items()}
    yv = ort.OrtValue.ortvalue_from_shape_and_type(list(refs["first"].shape), refs["first"].dtype, args.provider, 0)
    for k, v in bound.items():
        io.bind_ortvalue_input(k, v)
    io.bind_ortvalue_output(out_meta.name, yv)
    slots = adapters.AdapterSlots(sess, io, first, device=args.provider)
    for _ in range(3):  # warm-up; the CUDA graph is captured
        sess.run_with_iobinding(io)
    slots.preload("first", first)
    slots.preload("second", second)
    tol = 2e-2 if dtype != "fp32" else 1e-5
    activate_ms, load_ms, run_ms, worst = [], [], [], 0.0
    for i in range(args.swaps):
        name = ("second", "first")[i % 2]
        t = time.perf_counter()
        slots.activate(name)
        activate_ms.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        sess.run_with_iobinding(io)
        run_ms.append((time.perf_counter() - t) * 1e3)
        ref = refs[name]
        err = float(np.abs(yv.numpy().astype(np.float32) - ref.astype(np.float32)).max() /
                    max(1.0, float(np.abs(ref.astype(np.float32)).max())))
        worst = max(worst, err)
    for i in range(min(args.swaps, 10)):
        t = time.perf_counter()
        slots.load(first if i % 2 else second)
        load_ms.append((time.perf_counter() - t) * 1e3)
    ok = worst <= tol
    result = {"provider": args.provider, "dtype": dtype, "layers": args.layers, "rank": args.rank,
              "targets": list(TARGETS), "adapter_inputs": len(first), "adapter_bytes": nbytes, "seq": args.seq,
              "cuda_graph": graph, "onnxruntime": ort.__version__,
              **{k: done[k] for k in ("fused_ops", "lora_linear_nodes", "export_s", "fuse_s")},
              "activate_ms_median": round(statistics.median(activate_ms), 4),
              "activate_ms_max": round(max(activate_ms), 4),
              "activate_gbs": round(nbytes / (statistics.median(activate_ms) / 1e3) / 1e9, 1),
              "load_ms_median": round(statistics.median(load_ms), 3),
              "run_ms_median": round(statistics.median(run_ms), 3),
              "worst_rel_err_vs_plain_feed": worst, "tolerance": tol, "outputs_match": ok}
    if graph:
        import subprocess
        result["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip().splitlines()[0]
    (args.out / "adapter-swap.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
