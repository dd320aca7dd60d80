"""Int4 projections of a Llama-2-7B layer on the GPU: onnxruntime's MatMulNBits against onnxfuse's Int4Linear (CUDA
GEMV, Triton GEMM, auto), per-kernel GPU time from torch.profiler, beside the same run's read bandwidth (issue 28).

One model holds the layer's five projections as genai's builder writes them with -p int4 (block 32, fp16, symmetric):
qkv 4096 -> 12288, o 4096 -> 4096, gate and up 4096 -> 11008, down 11008 -> 4096; a second model the lm_head
4096 -> 49152; a third the layer's MLP as genai writes it (gate and up MatMulNBits, SiLU as QuickGelu(alpha=1), the
product, down), which fuses to Int4SwiGLU + Int4Linear. The fused model is `onnxfuse fuse --provider cuda` of the
same file, run with each backend. Each variant's time is the sum of its GPU kernels per run (median of RUNS profiled
runs), so onnxruntime's host overhead is out of the comparison; the limit is the packed weights' and scales' bytes at
the same run's read rate.

    python scripts/int4_probe.py OUT_DIR [--rows 1,2,4,8,16,32,128,2048] [--zero-points] [--models layer,lm_head,mlp]
        [--vocab 49152,32000] [--block 32] [--tag TAG]

--zero-points quantizes every projection asymmetrically (MatMulNBits' packed uint8 zero points, as the builder writes
with int4_is_symmetric=false and AWQ/GPTQ checkpoints give) and writes int4-probe-zp.json; the limit then counts the
zero points' bytes too. --models picks the models; --vocab gives lm_head's output widths (one lm_head model each,
labelled lm_head-N past the first; the JSON is int4-probe-<models>.json when --models or --vocab is given).
--block quantizes with another block size (the builder's block_size; 32 is its default), named in the JSON's name
when not 32; --tag is appended to the JSON's name (e.g. the library's ONNXFUSE_INT4_CUTLASS setting of the run).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

LAYER = {"qkv": (4096, 12288), "o": (4096, 4096), "gate": (4096, 11008), "up": (4096, 11008), "down": (11008, 4096)}
LM_HEAD = {"lm_head": (4096, 49152)}
MLP = {"gate": (4096, 11008), "up": (4096, 11008), "down": (11008, 4096)}
BLOCK = 32
RUNS = 20


def nbits_model(path: pathlib.Path, projections: dict, seed: int = 0, gated: bool = False,
                zero_points: bool = False, block: int = BLOCK) -> int:
    """A model of MatMulNBits nodes (fp16) on inputs x<K>; gated: the MLP (down on act(gate) * up, the one output);
    zero_points: asymmetric, with MatMulNBits' packed zero points. Returns the bytes of its packed weights, scales and
    zero points."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from onnxfuse.ops.int4_linear import quantize
    rng = np.random.default_rng(seed)
    nodes, inits, outputs, inputs, nbytes = [], [], [], {}, 0
    for name, (k, n) in projections.items():
        wq, s, *z = quantize((rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k)), block,
                             symmetric=not zero_points)
        inits += [numpy_helper.from_array(wq, f"{name}.Wq"),
                  numpy_helper.from_array(s.astype(np.float16), f"{name}.s")]
        if zero_points:
            inits.append(numpy_helper.from_array(z[0].reshape(-1), f"{name}.z"))
        nbytes += wq.nbytes + s.size * 2 + (z[0].nbytes if zero_points else 0)
        x = "h" if gated and name == "down" else f"x{k}"
        if x != "h":
            inputs.setdefault(k, helper.make_tensor_value_info(x, TensorProto.FLOAT16, ["rows", k]))
        if x == "h":
            nodes += [helper.make_node("QuickGelu", ["gate"], ["act"], domain="com.microsoft", alpha=1.0),
                      helper.make_node("Mul", ["act", "up"], ["h"])]
        nodes.append(helper.make_node("MatMulNBits", [x, f"{name}.Wq", f"{name}.s"] + [f"{name}.z"] * zero_points,
                                      [name],
                                      domain="com.microsoft", K=k, N=n, bits=4, block_size=block, accuracy_level=4,
                                      name=f"/model/{name}/MatMul_Q4"))
        if not gated or name == "down":
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT16, ["rows", n]))
    g = helper.make_graph(nodes, "int4", list(inputs.values()), outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                          ir_version=10)
    onnx.save(m, str(path), save_as_external_data=True, location=path.name + ".data")
    return nbytes


def read_rate() -> float:
    """Bytes per second of a read-only pass over 4 GiB (torch x.sum()), best of 10."""
    import torch
    x = torch.ones(1 << 31, dtype=torch.float16, device="cuda")
    best = float("inf")
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x.sum()
        b.record()
        torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) / 1e3)
    del x
    return (1 << 32) / best


def kernel_us(sess, feeds: dict, outputs: list[str]) -> tuple[float, dict]:
    """Median over RUNS of the summed GPU kernel time of one run (us), and the kernels' names with their us per run."""
    import onnxruntime as ort
    import torch
    from torch.profiler import ProfilerActivity, profile
    binding = sess.io_binding()
    for k, v in feeds.items():
        binding.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0))
    for name in outputs:
        binding.bind_output(name, "cuda", 0)
    for _ in range(5):
        sess.run_with_iobinding(binding)
    torch.cuda.synchronize()
    per_run, names = [], {}
    for _ in range(RUNS):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            sess.run_with_iobinding(binding)
            torch.cuda.synchronize()
        total = 0.0
        for e in prof.events():
            if e.device_type.name == "CUDA" and "memcpy" not in e.name.lower() and "memset" not in e.name.lower():
                total += e.device_time
                names[e.name[:60]] = names.get(e.name[:60], 0.0) + e.device_time / RUNS
        per_run.append(total)
    return statistics.median(per_run), names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=pathlib.Path)
    ap.add_argument("--rows", default="1,2,4,8,16,32,128,2048")
    ap.add_argument("--zero-points", action="store_true", help="asymmetric weights with MatMulNBits' zero points")
    ap.add_argument("--models", default="layer,lm_head,mlp", help="of layer, lm_head, mlp")
    ap.add_argument("--vocab", default="49152", help="lm_head's output widths")
    ap.add_argument("--block", type=int, default=BLOCK, choices=[16, 32, 64, 128, 256])
    ap.add_argument("--tag", default="", help="appended to the JSON's name")
    args = ap.parse_args(argv)
    models = args.models.split(",")
    if not set(models) <= {"layer", "lm_head", "mlp"}:
        ap.error(f"--models: {args.models}: use layer, lm_head, mlp")
    vocab = [int(v) for v in args.vocab.split(",")]
    heads = [("lm_head" if i == 0 else f"lm_head-{n}", {"lm_head": (LM_HEAD["lm_head"][0], n)})
             for i, n in enumerate(vocab)]
    import onnx
    import onnxruntime as ort

    from onnxfuse import fuse, runtime
    args.out.mkdir(parents=True, exist_ok=True)
    rate = read_rate()
    print(f"read rate {rate / 1e12:.3f} TB/s", flush=True)
    result = {"read_tbs": rate / 1e12, "block": args.block, "dtype": "float16", "ort": ort.__version__,
              "zero_points": args.zero_points, "rows": {}}
    todo = ([("layer", LAYER)] if "layer" in models else []) + (heads if "lm_head" in models else []) + (
        [("mlp", MLP)] if "mlp" in models else [])
    for label, projections in todo:
        src = args.out / f"int4-{label}.onnx"
        gated = label == "mlp"
        nbytes = nbits_model(src, projections, gated=gated, zero_points=args.zero_points, block=args.block)
        dst = args.out / f"int4-{label}.fused.onnx"
        res = fuse.fuse(src, dst, ort=False, provider="cuda", force=True)
        want = ["Int4SwiGLU", "Int4Linear"] if gated else ["Int4Linear"] * len(projections)
        assert sorted(m.op for m in res.matches) == sorted(want), res.matches
        names = [o.name for o in onnx.load(str(src), load_external_data=False).graph.output]
        sessions = {"ort": runtime.session(str(src), "cuda", library=False)}
        sessions.update({f"fused-{b}": runtime.session(str(dst), "cuda", backend=b)
                         for b in ("cuda", "triton", "auto")})
        for m in [int(v) for v in args.rows.split(",")]:
            rng = np.random.default_rng(m)
            widths = {k for name, (k, _) in projections.items() if not (gated and name == "down")}
            feeds = {f"x{k}": rng.standard_normal((m, k)).astype(np.float16) for k in widths}
            ref = sessions["ort"].run(None, feeds)
            row = {"bytes": nbytes, "limit_us": nbytes / rate * 1e6}
            for name, sess in sessions.items():
                out = sess.run(None, feeds)
                err = max(float(np.abs(a.astype(np.float32) - b.astype(np.float32)).max() /
                                max(1.0, float(np.abs(b.astype(np.float32)).max()))) for a, b in zip(out, ref))
                us, kernels = kernel_us(sess, feeds, names)
                row[name] = {"us": us, "pct_limit": 100 * row["limit_us"] / us, "rel_err_vs_ort": err,
                             "kernels": {k: round(v, 2) for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:4]}}
            line = "  ".join(f"{n} {row[n]['us']:.1f}us ({row[n]['pct_limit']:.0f}%)" for n in sessions)
            print(f"{label} M={m}: limit {row['limit_us']:.1f}us  {line}", flush=True)
            result["rows"][f"{label}/{m}"] = row
    name = "int4-probe-zp" if args.zero_points else "int4-probe"
    if args.models != "layer,lm_head,mlp" or args.vocab != "49152":
        name += "-" + "-".join(models) + ("-" + "-".join(map(str, vocab)) if "lm_head" in models else "")
    if args.block != BLOCK:
        name += f"-block{args.block}"
    if args.tag:
        name += "-" + args.tag
    (args.out / (name + ".json")).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
