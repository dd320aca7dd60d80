"""GPU check of the onnxfuse kernel library on an H100/H200 (run by the lead; needs no network and no rebuild).

    PYTHONPATH=/path/to/ort-gpu:$PWD python scripts/gpu_check.py --lib libonnxfuse_ops.so --out gpu_check_out

1. Correctness: `onnxfuse.kernels.doctor.run_doctor` for every op x {cuda, triton} x {fp32, fp16, bf16} over the
   shapes below (M in {1, 16, 333, 2048}, odd K/N, Llama MLP 1024/11008 and 4096/11008, LoRA 4096^2 r16), in the
   modes plain, user stream and CUDA graph (large shapes: plain only, to stay within a few minutes).
2. Timing (fp16, median of >= 50 runs with CUDA events, IOBinding on torch tensors, ORT on torch's stream via
   user_compute_stream): fused op per backend vs torch eager, vs the plain GEMMs alone, vs ORT's unfused graph.
   Each ORT number includes ORT's per-run host overhead; `ort_floor` (an Identity on 4 floats) shows that floor.
3. Triton A/B variants (same timing method, one process; needs a library built with `onnxfuse build --experiments`,
   skipped otherwise): the node attributes small_cfg (decode tile config 0|1|2) and lora_onepass (0: two-phase
   LoRA, 1: one-pass), read when a session creates its kernels, so each variant is a fresh session of a model whose
   node carries them: LoRALinearRelu M=2048 two-phase vs one-pass, LoRALinear M=16 and SwiGLU M=16 under every
   small config (LoRA also one-pass); small_cfg=1 with lora_onepass=1 is the previous behaviour. Skipped with
   --no-variants. The MLPStack mode checks force stack_mode=fused|layers|grid per node, and the stack_cfg tile
   variants when the library has the experiments; then EmbeddingInteraction alone, Triton vs CUDA kernel.
4. SwiGLU per gate activation (issue 15; `--only-gated` runs this part alone): the doctor for every activation at
   the Llama MLP's shapes (M = 1, 16, 2048; K 4096, N 11008), then the fused kernel's time per activation and
   backend, with its ratio to silu's at the same shape (goal: gelu / gelu_tanh within 5 % of silu).
Writes doctor.json, timing.json, variants.json, gated.json and env.json under --out and prints compact tables last.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES_FULL = {
    "LinearRelu": [(1, 13, 512, 0), (16, 512, 256, 0), (333, 257, 129, 0), (2048, 512, 256, 0), (2048, 13, 512, 0)],
    "LinearSigmoid": [(1, 256, 1, 0), (16, 512, 256, 0), (333, 257, 129, 0), (2048, 256, 1, 0)],
    "SwiGLU": [(1, 1024, 11008, 0), (16, 4096, 11008, 0), (333, 77, 133, 0), (2048, 1024, 11008, 0),
               (2048, 4096, 11008, 0)],
    "LoRALinear": [(1, 4096, 4096, 16), (16, 4096, 4096, 16), (333, 129, 257, 7), (64, 96, 80, 64),
                   (2048, 4096, 4096, 16)],
    "LoRALinearRelu": [(1, 4096, 4096, 16), (16, 4096, 4096, 16), (333, 129, 257, 33), (2048, 4096, 4096, 16)],
    # (M, widths, activations); M=20000 takes the per-layer path under stack_mode=auto.
    "MLPStack": [(1, (13, 512, 256, 64, 16), "relu.relu.relu.relu"), (16, (367, 512, 256, 1), "relu.relu.sigmoid"),
                 (333, (129, 67, 33, 1), "relu.relu.sigmoid"), (2048, (13, 512, 256, 64, 16), "relu.relu.relu.relu"),
                 (2048, (367, 512, 256, 1), "relu.relu.sigmoid"), (20000, (13, 512, 256, 64, 16), "relu.relu.relu.relu"),
                 (64, (40, 24), "sigmoid")],
}
DLRM_STACKS = [((13, 512, 256, 64, 16), "relu.relu.relu.relu"), ((367, 512, 256, 1), "relu.relu.sigmoid")]
# Shapes at or above this many multiply-adds run in plain mode only.
BIG_MACS = 2 ** 31


def check_correctness(lib, out_dir, quick):
    from onnxfuse.kernels import doctor

    rows = []
    t0 = time.time()
    for op, shapes in SHAPES_FULL.items():
        for shp in shapes:
            m, k, n = (shp[0], shp[1][0], shp[1][-1]) if op == "MLPStack" else shp[:3]
            big = m * k * n >= BIG_MACS
            if quick and big:
                continue
            modes = ("plain",) if big else doctor.ALL_MODES
            rows += doctor.run_doctor(providers=("cuda",), backends=("cuda", "triton"), ops=[op],
                                      shapes={op: [shp]}, modes=modes, lib_path=lib,
                                      on_row=lambda r: (r["status"] != "PASS") and print(doctor.format_row(r),
                                                                                          flush=True))
        print(f"  {op}: done ({time.time() - t0:.0f} s)", flush=True)
    (out_dir / "doctor.json").write_text(json.dumps(rows, indent=1))
    return rows


def _native_model(op, dtype, shapes, backend, knobs=None):
    """The op alone with T-typed inputs (no Casts), for timing; `knobs` are extra node attributes (experiments)."""
    from onnx import helper

    from onnxfuse import schema
    from onnxfuse.kernels.doctor import _onnx_type

    t = _onnx_type(dtype)
    s = schema.OPS[op]
    attrs = {"backend": backend, **(knobs or {})}
    if "scale" in s.attr_names:
        attrs["scale"] = 0.5
    node = helper.make_node(op, list(s.inputs), ["Y"], domain=schema.DOMAIN, **attrs)
    m, n = shapes["X"][0], (shapes.get("W") or shapes["W_gate"])[1]
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info(k, t, v) for k, v in shapes.items()],
                          [helper.make_tensor_value_info("Y", t, [m, n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", schema.ONNX_OPSET),
                                               helper.make_opsetid(schema.DOMAIN, schema.DOMAIN_VERSION)],
                             ir_version=schema.IR_VERSION).SerializeToString()


def _unfused_model(op, dtype, shapes):
    """What the graph looked like before fusion (standard ONNX ops only)."""
    from onnx import helper

    from onnxfuse import schema
    from onnxfuse.kernels.doctor import _onnx_type

    t = _onnx_type(dtype)
    if op == "SwiGLU":
        nodes = [helper.make_node("MatMul", ["X", "W_gate"], ["g"]), helper.make_node("MatMul", ["X", "W_up"], ["u"]),
                 helper.make_node("Sigmoid", ["g"], ["sg"]), helper.make_node("Mul", ["g", "sg"], ["silu"]),
                 helper.make_node("Mul", ["silu", "u"], ["Y"])]
    elif op.startswith("LoRA"):
        nodes = [helper.make_node("MatMul", ["X", "W"], ["xw"]), helper.make_node("Add", ["xw", "bias"], ["base"]),
                 helper.make_node("MatMul", ["X", "A"], ["xa"]), helper.make_node("MatMul", ["xa", "B"], ["xab"]),
                 helper.make_node("Constant", [], ["s"], value=helper.make_tensor("s", t, [], [0.5])),
                 helper.make_node("Mul", ["xab", "s"], ["lora"]),
                 helper.make_node("Add", ["base", "lora"], ["Y" if op == "LoRALinear" else "z"])]
        if op == "LoRALinearRelu":
            nodes.append(helper.make_node("Relu", ["z"], ["Y"]))
    else:
        act = "Relu" if op == "LinearRelu" else "Sigmoid"
        nodes = [helper.make_node("MatMul", ["X", "W"], ["xw"]), helper.make_node("Add", ["xw", "bias"], ["z"]),
                 helper.make_node(act, ["z"], ["Y"])]
    m, n = shapes["X"][0], (shapes.get("W") or shapes["W_gate"])[1]
    g = helper.make_graph(nodes, "u", [helper.make_tensor_value_info(k, t, v) for k, v in shapes.items()],
                          [helper.make_tensor_value_info("Y", t, [m, n])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", schema.ONNX_OPSET)],
                             ir_version=schema.IR_VERSION).SerializeToString()


def _time_cuda(fn, iters, warmup=10):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    return statistics.median(times)


def _ort_runner(model, lib, tensors, y, np_dtype):
    import onnxruntime as ort
    import torch

    so = ort.SessionOptions()
    if lib:
        so.register_custom_ops_library(str(lib))
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    stream = torch.cuda.current_stream().cuda_stream
    sess = ort.InferenceSession(model, so, providers=[("CUDAExecutionProvider", {
        "has_user_compute_stream": "1", "user_compute_stream": str(stream), "use_tf32": "0"})])
    io = sess.io_binding()
    for name, t in tensors.items():
        io.bind_input(name, "cuda", 0, np_dtype, list(t.shape), t.data_ptr())
    io.bind_output("Y", "cuda", 0, np_dtype, list(y.shape), y.data_ptr())
    return lambda: sess.run_with_iobinding(io)


def timing(lib, out_dir, iters):
    import numpy as np
    import torch

    from onnxfuse import schema
    from onnxfuse.kernels.doctor import input_shapes, make_inputs

    cases = [("SwiGLU", (2048, 4096, 11008, 0)), ("SwiGLU", (16, 4096, 11008, 0)), ("SwiGLU", (2048, 1024, 11008, 0)),
             ("LoRALinearRelu", (2048, 4096, 4096, 16)), ("LoRALinear", (16, 4096, 4096, 16)),
             ("LinearRelu", (2048, 512, 256, 0)), ("LinearSigmoid", (2048, 512, 256, 0))]
    results = []
    x4 = torch.zeros(4, device="cuda")
    y4 = torch.zeros(4, device="cuda")
    from onnx import TensorProto, helper
    ident = helper.make_model(helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "i",
                                                [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
                                                [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])]),
                              opset_imports=[helper.make_opsetid("", 18)], ir_version=10).SerializeToString()
    floor = _time_cuda(_ort_runner(ident, None, {"X": x4}, y4, np.float32), iters)
    print(f"  ort_floor (Identity, per-run ORT overhead seen by CUDA events): {floor * 1e3:.1f} us", flush=True)
    for op, (m, k, n, r) in cases:
        shp = input_shapes(op, m, k, n, r)
        ins = make_inputs(op, "float16", shp, 0, "cuda")
        tensors = dict(zip(shp, ins))
        y = torch.empty(m, n, device="cuda", dtype=torch.float16)
        row = dict(op=op, M=m, K=k, N=n, r=r, dtype="float16", ort_floor_ms=floor)
        for backend in ("cuda", "triton"):
            try:
                row[f"onnxfuse_{backend}_ms"] = _time_cuda(
                    _ort_runner(_native_model(op, "float16", shp, backend), lib, tensors, y, np.float16), iters)
                ref = schema.reference(op, ins, {"scale": 0.5}).float()
                err = (y.float() - ref).abs().max().item()
                row[f"onnxfuse_{backend}_max_err"] = err
            except Exception as e:
                row[f"onnxfuse_{backend}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        try:
            row["ort_unfused_ms"] = _time_cuda(_ort_runner(_unfused_model(op, "float16", shp), None, tensors, y,
                                                           np.float16), iters)
        except Exception as e:
            row["ort_unfused_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        x = tensors["X"]
        with torch.no_grad():
            if op == "SwiGLU":
                wg, wu = tensors["W_gate"], tensors["W_up"]
                row["torch_eager_ms"] = _time_cuda(lambda: torch.nn.functional.silu(x @ wg) * (x @ wu), iters)
                row["torch_gemms_only_ms"] = _time_cuda(lambda: (x @ wg, x @ wu), iters)
                macs = 2 * m * k * n
            elif op.startswith("LoRA"):
                w, a, b, bias = tensors["W"], tensors["A"], tensors["B"], tensors["bias"]
                relu = op == "LoRALinearRelu"
                row["torch_eager_ms"] = _time_cuda(
                    lambda: (lambda z: torch.relu(z) if relu else z)(torch.addmm(bias, x, w) + 0.5 * ((x @ a) @ b)),
                    iters)
                row["torch_gemms_only_ms"] = _time_cuda(lambda: x @ w, iters)  # the base GEMM alone
                macs = m * k * n + m * k * r + m * r * n
            else:
                w, bias = tensors["W"], tensors["bias"]
                act = torch.relu if op == "LinearRelu" else torch.sigmoid
                row["torch_eager_ms"] = _time_cuda(lambda: act(torch.addmm(bias, x, w)), iters)
                row["torch_gemms_only_ms"] = _time_cuda(lambda: x @ w, iters)
                macs = m * k * n
        row["tflops_at_best"] = 2 * macs / (min(v for kk, v in row.items() if kk.startswith("onnxfuse_")
                                                 and kk.endswith("_ms")) * 1e-3) / 1e12 \
            if any(kk.startswith("onnxfuse_") and kk.endswith("_ms") for kk in row) else None
        results.append(row)
        print("  " + "  ".join(f"{kk}={v:.4g}" if isinstance(v, float) else f"{kk}={v}" for kk, v in row.items()),
              flush=True)
        del ins, tensors, y
        torch.cuda.empty_cache()
    (out_dir / "timing.json").write_text(json.dumps(results, indent=1))
    return results


VARIANT_CASES = [  # experiment node attributes (schema.EXPERIMENT_ATTRS) per case
    ("LoRALinearRelu", (2048, 4096, 4096, 16), [{"lora_onepass": 0}, {"lora_onepass": 1}]),
    ("LoRALinear", (16, 4096, 4096, 16), [{"small_cfg": c, "lora_onepass": o} for o in (0, 1) for c in (0, 1, 2)]),
    ("SwiGLU", (16, 4096, 11008, 0), [{"small_cfg": c} for c in (0, 1, 2)]),
    ("LinearRelu", (16, 4096, 4096, 0), [{"small_cfg": c} for c in (0, 1, 2)]),
]


GATED_SHAPES = [(2048, 4096, 11008), (16, 4096, 11008), (1, 4096, 11008)]


def gated_activations(lib, out_dir, iters):
    """SwiGLU per gate activation at the Llama MLP's shapes: correctness (doctor, plain and CUDA graph), then the
    fused op's time per activation and backend (fp16, a fresh session each), and its ratio to silu's."""
    import numpy as np
    import torch

    from onnxfuse import schema
    from onnxfuse.kernels import doctor
    from onnxfuse.kernels.doctor import input_shapes, make_inputs

    shapes = {"SwiGLU": [(m, k, n, 0, act) for act in schema.GATE_ACTIVATIONS for m, k, n in GATED_SHAPES]}
    rows = doctor.run_doctor(providers=("cuda",), backends=("cuda", "triton"), ops=["SwiGLU"], shapes=shapes,
                             modes=("plain", "cuda_graph"), lib_path=lib,
                             on_row=lambda r: (r["status"] != "PASS") and print(doctor.format_row(r), flush=True))
    results = []
    for m, k, n in GATED_SHAPES[:2]:
        shp = input_shapes("SwiGLU", m, k, n, 0)
        ins = make_inputs("SwiGLU", "float16", shp, 0, "cuda")
        tensors = dict(zip(shp, ins))
        y = torch.empty(m, n, device="cuda", dtype=torch.float16)
        for backend in ("triton", "cuda"):
            base = None
            for act in schema.GATE_ACTIVATIONS:
                row = dict(M=m, K=k, N=n, backend=backend, activation=act)
                try:
                    model = _native_model("SwiGLU", "float16", shp, backend, {"activation": act})
                    row["ms"] = _time_cuda(_ort_runner(model, lib, tensors, y, np.float16), iters)
                    ref = schema.reference("SwiGLU", ins, {"activation": act}).float()
                    row["max_err"] = (y.float() - ref).abs().max().item()
                    base = row["ms"] if act == "silu" else base
                    row["vs_silu"] = row["ms"] / base if base else None
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                results.append(row)
                print("  " + "  ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}"
                                       for a, b in row.items()), flush=True)
        del ins, tensors, y
        torch.cuda.empty_cache()
    (out_dir / "gated.json").write_text(json.dumps({"doctor": rows, "timing": results}, indent=1))
    return rows, results


def _has_experiments(lib) -> bool:
    from onnxfuse.kernels import build_info
    try:
        return bool(build_info(lib).get("experiments"))
    except Exception:
        return False


def variants(lib, out_dir, iters):
    """Triton backend under each experiment variant: a fresh session per variant, of a model whose node carries the
    knobs as attributes (read at kernel creation). Needs a library built with `onnxfuse build --experiments`."""
    import numpy as np
    import torch

    from onnxfuse import schema
    from onnxfuse.kernels.doctor import input_shapes, make_inputs

    if not _has_experiments(lib):
        print(f"  skipped: {lib} was built without experiments (onnxfuse build --experiments)", flush=True)
        return []
    results = []
    for op, (m, k, n, r), knob_sets in VARIANT_CASES:
        shp = input_shapes(op, m, k, n, r)
        ins = make_inputs(op, "float16", shp, 0, "cuda")
        tensors = dict(zip(shp, ins))
        y = torch.empty(m, n, device="cuda", dtype=torch.float16)
        ref = schema.reference(op, ins, {"scale": 0.5}).float()
        for knobs in knob_sets:
            model = _native_model(op, "float16", shp, "triton", knobs)
            row = dict(op=op, M=m, K=k, N=n, r=r, env=" ".join(f"{a}={b}" for a, b in knobs.items()))
            try:
                y.zero_()
                row["triton_ms"] = _time_cuda(_ort_runner(model, lib, tensors, y, np.float16), iters)
                row["max_err"] = (y.float() - ref).abs().max().item()
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            results.append(row)
            print("  " + "  ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}" for a, b in row.items()),
                  flush=True)
        del ins, tensors, y, ref
        torch.cuda.empty_cache()
    (out_dir / "variants.json").write_text(json.dumps(results, indent=1))
    return results


def stack_modes(lib, out_dir, iters):
    """MLPStack on the Triton backend forced to one kernel (node attribute stack_mode=fused, with each stack_cfg
    tile variant when the library has the experiments) and to a launch per layer (stack_mode=layers), on the CUDA
    backend, and the unfused chain in ORT: correctness (doctor, plain + CUDA graph) under each forced mode, then
    timings at DLRM's sizes. A fresh session per mode (attributes are read at kernel creation)."""
    import onnx
    from onnx import helper

    from onnxfuse import schema
    from onnxfuse.kernels import doctor

    cfgs = (0, 1, 2) if _has_experiments(lib) else (0,)
    rows, timings = [], []
    for mode, cfg in [("fused", c) for c in cfgs] + [("layers", 0), ("grid", 0)]:
        knobs = {"stack_mode": mode, **({"stack_cfg": cfg} if cfg else {})}
        shapes = {"MLPStack": [(m, w, a) for m in (1, 128, 333, 2048, 20000) for w, a in DLRM_STACKS]}
        rows += [dict(r, stack_mode=f"{mode} cfg{cfg}") for r in doctor.run_doctor(
            providers=("cuda",), backends=("triton",), ops=["MLPStack"], shapes=shapes,
            modes=("plain", "cuda_graph"), lib_path=lib, node_attrs=knobs,
            on_row=lambda r: (r["status"] != "PASS") and print(doctor.format_row(r), flush=True))]
    print(f"  forced-mode correctness: {sum(r['status'] == 'PASS' for r in rows)}/{len(rows)} pass", flush=True)
    from onnxfuse import bench
    import tempfile
    dev = bench.Device("cuda")
    tmp = pathlib.Path(tempfile.mkdtemp())
    variants_ = [(f"triton_fused_cfg{c}", "triton", {"stack_mode": "fused", **({"stack_cfg": c} if c else {})})
                 for c in cfgs]
    variants_ += [("triton_grid", "triton", {"stack_mode": "grid"}),
                  ("triton_layers", "triton", {"stack_mode": "layers"}),
                  ("triton_auto", "triton", {}),
                  ("cuda_layers", "cuda", {}),
                  ("ort_unfused", None, {})]
    for m in (128, 512, 2048, 8192, 16384):  # the grid / row-block / per-layer thresholds of triton/table.py
        for widths, acts in DLRM_STACKS:
            shp = doctor.stack_shapes(m, widths)
            ins = doctor.make_inputs("MLPStack", "float16", shp, 0, "cuda")
            tensors = dict(zip(shp, ins))
            ref = schema.reference("MLPStack", ins, {"activations": acts}).float()
            t = onnx.TensorProto.FLOAT16
            vi = [helper.make_tensor_value_info(k, t, v) for k, v in shp.items()]
            out = [helper.make_tensor_value_info("Y", t, [m, widths[-1]])]
            ops = [helper.make_opsetid("", schema.ONNX_OPSET),
                   helper.make_opsetid(schema.DOMAIN, schema.DOMAIN_VERSION)]
            unfused_path = tmp / "unfused.onnx"
            fused_paths = {}
            for name, _, knobs in variants_:  # one fused model per variant: its node carries the knobs
                node = helper.make_node("MLPStack", list(shp), ["Y"], domain=schema.DOMAIN, activations=acts,
                                        overload=acts, **knobs)
                fused_paths[name] = tmp / f"fused-{name}.onnx"
                onnx.save(helper.make_model(helper.make_graph([node], "s", vi, out), opset_imports=ops,
                                            ir_version=schema.IR_VERSION), str(fused_paths[name]))
            nodes, h = [], "X"
            for i, a in enumerate(acts.split("."), start=1):
                o = "Y" if i == len(acts.split(".")) else f"h{i}"
                nodes += [helper.make_node("MatMul", [h, f"W_{i}"], [f"m{i}"]),
                          helper.make_node("Add", [f"m{i}", f"bias_{i}"], [f"z{i}"]),
                          helper.make_node("Relu" if a == "relu" else "Sigmoid", [f"z{i}"], [o])]
                h = o
            onnx.save(helper.make_model(helper.make_graph(nodes, "u", vi, out), opset_imports=ops[:1],
                                        ir_version=schema.IR_VERSION), str(unfused_path))
            row = dict(M=m, layers="-".join(map(str, widths)), activations=acts)
            for name, backend, _ in variants_:
                for graph in (False, True):
                    key = name + ("+graph" if graph else "")
                    try:
                        r = bench.OrtRun(fused_paths[name] if backend else unfused_path, "cuda",
                                          lib if backend else None, backend, graph, tensors, [ref.half()], False)
                        row[f"{key}_ms"] = statistics.median(dev.measure(r, 20, iters))
                        row[f"{key}_max_err"] = (r.outputs[0].float() - ref).abs().max().item()
                    except Exception as e:
                        row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            timings.append(row)
            print("  " + "  ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}"
                                   for a, b in row.items() if not a.endswith("_max_err")), flush=True)
            bad = {a: b for a, b in row.items() if a.endswith("_max_err") and b > 0.05}
            if bad:
                print(f"  LARGE ERRORS: {bad}", flush=True)
    timings += embedding_timings(lib, dev, iters)
    (out_dir / "stack_modes.json").write_text(json.dumps({"correctness": rows, "timing": timings}, indent=1))
    return rows, timings


def embedding_timings(lib, dev, iters):
    """EmbeddingInteraction alone at DLRM's shape (26 features of 16, criteo-kaggle tables), Triton vs CUDA kernel,
    with and without CUDA graphs: what triton/table.py's EMBEDDING_AUTO_TRITON and aot.py's EMBED_CONFIGS decide."""
    import tempfile

    import onnx
    import torch
    from onnx import helper

    from onnxfuse import bench, schema, zoo
    spec = zoo.DlrmSpec.from_preset("criteo-kaggle")
    sizes = torch.tensor(spec.table_sizes, dtype=torch.int64)
    toff = torch.cumsum(sizes, 0) - sizes
    table = (torch.randn(int(sizes.sum()), spec.embedding_dim) * 0.3).half().cuda()
    tmp = pathlib.Path(tempfile.mkdtemp())
    rows = []
    for interaction in ("dot", "cat"):
        for batch in (128, 2048):
            width = schema.interaction_width(len(sizes) + 1, spec.embedding_dim, interaction)
            x = torch.randn(batch, spec.embedding_dim).half().cuda()
            ids = zoo.criteo_batch(spec, batch, 0)["sparse"].cuda()
            tensors = {"X": x, "ids": ids, "table": table, "table_offsets": toff.cuda(), "cardinality": sizes.cuda()}
            ref = schema.reference("EmbeddingInteraction", [t.cpu() for t in tensors.values()],
                                   {"interaction": interaction, "hash": "mod"}).float().cuda()
            t16, i64 = onnx.TensorProto.FLOAT16, onnx.TensorProto.INT64
            vi = [helper.make_tensor_value_info(k, t16 if v.is_floating_point() else i64, list(v.shape))
                  for k, v in tensors.items()]
            out = [helper.make_tensor_value_info("Y", t16, [batch, width])]
            row = dict(op="EmbeddingInteraction", batch=batch, interaction=interaction)
            for backend in ("triton", "cuda"):
                node = helper.make_node("EmbeddingInteraction", list(tensors), ["Y"], domain=schema.DOMAIN,
                                        interaction=interaction, hash="mod", backend=backend,
                                        overload=schema.embedding_overload("EmbeddingInteraction", interaction, "mod"))
                path = tmp / f"emb-{backend}.onnx"
                onnx.save(helper.make_model(helper.make_graph([node], "e", vi, out), ir_version=schema.IR_VERSION,
                                            opset_imports=[helper.make_opsetid("", schema.ONNX_OPSET),
                                                           helper.make_opsetid(schema.DOMAIN, schema.DOMAIN_VERSION)]),
                          str(path))
                for graph in (False, True):
                    key = backend + ("+graph" if graph else "")
                    try:
                        r = bench.OrtRun(path, "cuda", lib, backend, graph, tensors, [ref.half()], False)
                        row[f"{key}_ms"] = statistics.median(dev.measure(r, 20, iters))
                        row[f"{key}_max_err"] = (r.outputs[0].float() - ref).abs().max().item()
                    except Exception as e:
                        row[f"{key}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            rows.append(row)
            print("  " + "  ".join(f"{a}={b:.4g}" if isinstance(b, float) else f"{a}={b}" for a, b in row.items()),
                  flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", required=True, help="prebuilt libonnxfuse_ops.so (built on the CPU machine)")
    p.add_argument("--out", default="gpu_check_out", type=pathlib.Path)
    p.add_argument("--quick", action="store_true", help="skip the large shapes in the correctness part")
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--no-variants", action="store_true", help="skip the Triton experiment-variant timings")
    p.add_argument("--only-stack", action="store_true", help="only the MLPStack checks and its mode timings")
    p.add_argument("--only-gated", action="store_true",
                   help="only SwiGLU per gate activation: doctor at the Llama MLP's shapes and timings vs silu")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    import onnxruntime as ort
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    import torch

    from onnxfuse.kernels import build_info
    env = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "lib": args.lib}
    try:
        env["build_info"] = build_info(args.lib)
    except Exception as e:
        env["build_info_error"] = str(e)
    (args.out / "env.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env)[:600], flush=True)

    t0 = time.time()
    if args.only_stack:
        SHAPES_FULL.clear()
        SHAPES_FULL["MLPStack"] = [(1, (13, 512, 256, 64, 16), "relu.relu.relu.relu"),
                                   (333, (129, 67, 33, 1), "relu.relu.sigmoid"), (64, (40, 24), "sigmoid"),
                                   (2048, (13, 512, 256, 64, 16), "relu.relu.relu.relu"),
                                   (8192, (367, 512, 256, 1), "relu.relu.sigmoid")]
        args.no_timing = args.no_variants = True
    rows = []
    if not args.only_gated:
        print("== correctness (only non-PASS rows are printed as they come)", flush=True)
        rows = check_correctness(args.lib, args.out, args.quick)
        print("== MLPStack modes", flush=True)
        try:
            srows, _ = stack_modes(args.lib, args.out, args.iters)
            rows += srows
        except Exception as e:
            print(f"stack modes failed: {type(e).__name__}: {e}", flush=True)
            rows.append(dict(op="MLPStack", backend="triton", dtype="?", M=0, K=0, N=0, mode="modes",
                             status="ERROR", max_err=None, tol=None, detail=str(e)))
    gated = []
    if not args.only_stack:
        print("== SwiGLU per gate activation (correctness, then fp16 median ms and ratio to silu)", flush=True)
        try:
            grows, gated = gated_activations(args.lib, args.out, args.iters)
            rows += grows
        except Exception as e:
            print(f"gated activations failed: {type(e).__name__}: {e}", flush=True)
            rows.append(dict(op="SwiGLU", backend="?", dtype="?", M=0, K=0, N=0, mode="activations",
                             status="ERROR", max_err=None, tol=None, detail=str(e)))
    if args.only_gated:
        args.no_timing = args.no_variants = True
    t_correct = time.time() - t0
    tim = []
    if not args.no_timing:
        print("== timing (fp16, median ms)", flush=True)
        try:
            tim = timing(args.lib, args.out, args.iters)
        except Exception as e:
            print(f"timing failed: {type(e).__name__}: {e}", flush=True)
    var = []
    if not args.no_timing and not args.no_variants:
        print("== triton variants (fp16, median ms; fresh session per experiment-attribute set)", flush=True)
        try:
            var = variants(args.lib, args.out, args.iters)
        except Exception as e:
            print(f"variants failed: {type(e).__name__}: {e}", flush=True)

    # Compact table last: per op x backend x dtype, pass counts and worst error / tolerance ratio.
    print(f"\n== summary (correctness {t_correct:.0f} s, total {time.time() - t0:.0f} s)")
    groups = {}
    for r in rows:
        key = (r["op"], r["backend"], r["dtype"])
        g = groups.setdefault(key, {"pass": 0, "n": 0, "worst": 0.0, "bad": []})
        g["n"] += 1
        if r["status"] == "PASS":
            g["pass"] += 1
        else:
            g["bad"].append(f"M{r['M']}K{r['K']}N{r['N']}/{r['mode']}:{r['status']}")
        if r["max_err"] is not None and r["tol"]:
            g["worst"] = max(g["worst"], r["max_err"] / r["tol"])
    print(f"{'op':15} {'backend':7} {'dtype':9} {'pass':>7}  worst err/tol  failures")
    for (op, b, d), g in groups.items():
        print(f"{op:15} {b:7} {d:9} {g['pass']:>3}/{g['n']:<3}  {g['worst']:.3f}        {' '.join(g['bad'])[:200]}")
    if tim:
        print(f"\n{'op':15} {'M,K,N,r':22} {'cuda':>8} {'triton':>8} {'torch':>8} {'gemms':>8} {'ort-unf':>8}  ms")
        for t in tim:
            f = lambda k: f"{t[k]:8.3f}" if isinstance(t.get(k), float) else f"{'err':>8}"
            print(f"{t['op']:15} {str((t['M'], t['K'], t['N'], t['r'])):22} {f('onnxfuse_cuda_ms')} "
                  f"{f('onnxfuse_triton_ms')} {f('torch_eager_ms')} {f('torch_gemms_only_ms')} {f('ort_unfused_ms')}")
    if gated:
        print(f"\n{'SwiGLU':15} {'M,K,N':22} {'backend':7} {'activation':11} {'ms':>8} {'vs silu':>8}  max_err")
        for t in gated:
            ms = f"{t['ms']:8.3f}" if "ms" in t else f"{'err':>8}"
            ratio = f"{t['vs_silu']:8.3f}" if t.get("vs_silu") else f"{'-':>8}"
            er = f"{t['max_err']:.2g}" if "max_err" in t else t.get("error", "")[:60]
            print(f"{'':15} {str((t['M'], t['K'], t['N'])):22} {t['backend']:7} {t['activation']:11} {ms} {ratio}  "
                  f"{er}")
    if var:
        print(f"\n{'op':15} {'M,K,N,r':22} {'triton':>8}  {'max_err':>8}  env")
        for t in var:
            ms = f"{t['triton_ms']:8.3f}" if "triton_ms" in t else f"{'err':>8}"
            er = f"{t['max_err']:8.2g}" if "max_err" in t else t.get("error", "")[:60]
            print(f"{t['op']:15} {str((t['M'], t['K'], t['N'], t['r'])):22} {ms}  {er:>8}  {t['env']}")
    bad = sum(r["status"] in ("FAIL", "ERROR") for r in rows)
    print(f"\n{len(rows)} checks, {bad} FAIL/ERROR; JSON in {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
