"""The timing harness of `onnxfuse bench` (the method is in the package docstring, onnxfuse.bench).

Device.measure times a callable (CUDA events around every run and a synchronize after it, or time.perf_counter on
the CPU) after warm-up runs; stats gives the median, p10 and p90; rates the TFLOP/s, GB/s and % of the roofline
against the ceilings measured in the same run (measure_ceilings: peak GEMM rate and copy bandwidth). OrtRun is an
onnxruntime session (runtime.session) with its inputs and outputs bound to torch tensors by IOBinding, with or
without CUDA graphs; measure_ort_floor times the smallest model through it (onnxruntime's floor). poison_check and
rel_err check a variant's output against the reference; profile_kernels sums the GPU kernel time per run.
"""
from __future__ import annotations

import pathlib
import statistics
import time
from typing import Callable

from ..errors import OnnxfuseError


class Device:
    """Where the bench runs ("cuda" or "cpu"): synchronising and timing there."""

    def __init__(self, kind: str):
        self.kind = kind  # "cuda" | "cpu"

    def sync(self):
        if self.kind == "cuda":
            import torch
            torch.cuda.synchronize()

    def measure(self, fn: Callable, warmup: int, runs: int) -> list[float]:
        """Milliseconds of `runs` runs after `warmup` runs; each run synchronised (see the package docstring)."""
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        if self.kind == "cuda":
            import torch
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
            for s, e in zip(starts, ends):
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        else:
            for _ in range(runs):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return times


def stats(times: list[float]) -> dict:
    """Median, p10 and p90 (ms) and the number of runs."""
    q = statistics.quantiles(times, n=10, method="inclusive") if len(times) >= 2 else [times[0]] * 9
    return {"median_ms": round(statistics.median(times), 5), "p10_ms": round(q[0], 5), "p90_ms": round(q[-1], 5),
            "runs": len(times)}


def rates(flops, nbytes, median_ms, result) -> dict:
    """TFLOP/s, GB/s and % of the roofline (against the run's peak_tflops and bandwidth_gbs) at a median."""
    s = median_ms * 1e-3
    out = {"tflops": None if flops is None else round(flops / s / 1e12, 3),
           "gbs": None if nbytes is None else round(nbytes / s / 1e9, 2), "roofline_pct": None}
    peak, bw = result.get("peak_tflops"), result.get("bandwidth_gbs")
    floors = []
    if flops is not None and peak:
        floors.append(flops / (peak * 1e12))
    if nbytes is not None and bw:
        floors.append(nbytes / (bw * 1e9))
    if floors:
        out["roofline_pct"] = round(100 * max(floors) / s, 2)
    return out


def measure_ceilings(dev: Device, dtype: str, quick: bool) -> dict:
    """Peak GEMM rate and device copy bandwidth, measured now. The peak is torch.matmul's in the benchmark dtype;
    on the CPU also onnxruntime's MatMul (MLAS) on the same square, the faster of the two being the peak: on some
    hosts (an AMD EPYC without AVX-512) MLAS runs fp32 GEMMs 1.5x faster than torch, so torch alone would put the
    limit below what onnxruntime reaches."""
    import torch
    from .. import zoo
    on = dev.kind
    n = 8192 if on == "cuda" and not quick else (4096 if on == "cuda" else 1024)
    tdt = zoo.DTYPES[dtype]
    g = torch.Generator(device=on).manual_seed(1)
    a = torch.randn(n, n, device=on, dtype=tdt, generator=g)
    b = torch.randn(n, n, device=on, dtype=tdt, generator=g)
    runs = 20 if on == "cuda" else 10
    t = min(dev.measure(lambda a=a, b=b: torch.matmul(a, b), 5, runs))  # ceilings: the best run
    rates_ = {"torch.matmul": 2 * n ** 3 / (t * 1e-3) / 1e12}
    if on == "cpu":
        rates_["onnxruntime MatMul"] = _ort_matmul_tflops(dev, a, b, runs)
    del a, b
    best = max(rates_, key=rates_.get)
    numel = (1 << 28) if on == "cuda" else (1 << 24)  # 1 GiB / 64 MiB of fp32
    x = torch.rand(numel, device=on, generator=g)
    y = torch.empty_like(x)
    t = min(dev.measure(lambda x=x, y=y: y.copy_(x), 5, runs))
    bw = 2 * numel * 4 / (t * 1e-3) / 1e9
    del x, y
    return {"peak_tflops": _digits(rates_[best]), "peak_gemm": f"{best} {n}x{n}x{n} {dtype}, best of {runs}",
            "peak_by_library": {k: _digits(v) for k, v in rates_.items()},
            "bandwidth_gbs": round(bw, 1),
            "bandwidth_copy": f"copy_ of {numel * 4 >> 20} MiB (read + write counted), best of {runs}"}


def _digits(tflops: float) -> float:
    """Three significant digits (a CPU's 0.0733 TFLOP/s must not round to 0.07)."""
    return float(f"{tflops:.3g}")


def _ort_matmul_tflops(dev: Device, a, b, runs: int) -> float:
    """onnxruntime's CPU MatMul of a @ b (b a constant, as a model's weight), the best of `runs` runs, TFLOP/s."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper
    n = a.shape[0]
    elem = helper.np_dtype_to_tensor_dtype(a.numpy().dtype)
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "B"], ["C"])], "peak",
                              [helper.make_tensor_value_info("A", elem, [n, n])],
                              [helper.make_tensor_value_info("C", elem, [n, n])],
                              [numpy_helper.from_array(b.numpy(), "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"A": a.numpy()}
    t = min(dev.measure(lambda: sess.run(None, feeds), 3, runs))
    return 2 * n ** 3 / (t * 1e-3) / 1e12


def measure_ort_floor(dev: Device, opts) -> dict:
    """The smallest time one onnxruntime run can take here: an Identity on 4 floats through the same IOBinding
    harness, without and with CUDA graphs. Every ORT variant's median contains this floor (host work per run and,
    with the synchronising timer, the launch latency), so a fused model can never beat unfused by more than
    unfused / floor."""
    import tempfile

    import onnx
    import torch
    from onnx import TensorProto, helper
    out = {}
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "identity.onnx"
        g = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "floor",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4])])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))
        x = torch.zeros(4, device=dev.kind)
        for graph in ((False, True) if dev.kind == "cuda" else (False,)):
            try:
                r = OrtRun(path, dev.kind, None, None, graph, {"X": x}, [x], False)
                out["graph" if graph else "plain"] = stats(dev.measure(r, opts.warmup, opts.runs))["median_ms"]
            except Exception as e:  # reported, not fatal
                out["graph" if graph else "plain"] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    return out


_NP = {}


def _np_dtype(tdt):
    import numpy as np
    import torch
    if not _NP:
        _NP.update({torch.float16: np.float16, torch.float32: np.float32, torch.int64: np.int64,
                    torch.int32: np.int32, torch.float64: np.float64, torch.bool: np.bool_})
    if tdt not in _NP:
        raise OnnxfuseError(f"dtype {tdt} cannot be bound to onnxruntime from Python; use --dtype fp16 or fp32")
    return _NP[tdt]


_TORCH_OF_ORT = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64",
                 "tensor(int32)": "int32", "tensor(double)": "float64", "tensor(bool)": "bool"}


class OrtRun:
    """An IOBinding session on torch tensors: inputs bound once, outputs preallocated."""

    def __init__(self, path, device: str, lib, backend: str | None, cuda_graph: bool, inputs: dict, ref_outputs,
                 tf32: bool):
        import torch
        opts = {}
        self.stream = "cpu"
        if device == "cuda":
            opts["use_tf32"] = "1" if tf32 else "0"
            if not cuda_graph:
                opts.update(has_user_compute_stream="1",
                            user_compute_stream=str(torch.cuda.current_stream().cuda_stream))
                self.stream = "torch"
            else:
                self.stream = "ort"
        from .. import runtime
        # lib (--lib) replaces the cached build; backend None: an unfused model (library only if it has onnxfuse nodes)
        self.sess = runtime.session(str(path), device, library=(lib or True) if backend is not None else None,
                                    cuda_graph=cuda_graph, provider_options=opts, backend=backend)
        self.io = self.sess.io_binding()
        dev_id = 0
        # the inputs, and the overridable initializers the workload feeds (adapters as inputs: zero defaults)
        names = [i.name for i in self.sess.get_inputs()]
        names += [i.name for i in self.sess.get_overridable_initializers() if i.name in inputs]
        missing = [n for n in names if n not in inputs]
        if missing:
            raise OnnxfuseError(f"{path}: model inputs {missing} not among the workload inputs {list(inputs)}")
        for name in names:
            t = inputs[name]
            self.io.bind_input(name, device, dev_id, _np_dtype(t.dtype), list(t.shape), t.data_ptr())
        self.outputs = []
        for i, o in enumerate(self.sess.get_outputs()):
            if ref_outputs is not None and i < len(ref_outputs):
                shape, dt = list(ref_outputs[i].shape), ref_outputs[i].dtype
            else:
                shape = [d if isinstance(d, int) else None for d in o.shape]
                if any(d is None for d in shape):
                    shape = self._probe_shape(o.name, device, names, inputs)
                dt = getattr(torch, _TORCH_OF_ORT.get(o.type, "float32"))
            y = torch.empty(shape, dtype=dt, device=device)
            self.io.bind_output(o.name, device, dev_id, _np_dtype(dt), shape, y.data_ptr())
            self.outputs.append(y)

    def _probe_shape(self, name, device, names, inputs):
        io = self.sess.io_binding()
        for n in names:
            t = inputs[n]
            io.bind_input(n, device, 0, _np_dtype(t.dtype), list(t.shape), t.data_ptr())
        io.bind_output(name, device)
        self.sess.run_with_iobinding(io)
        return list(io.get_outputs()[0].shape())

    def __call__(self):
        self.sess.run_with_iobinding(self.io)


def rel_err(out, ref) -> float | None:
    """||out - ref|| / ||ref|| in float64 (NaN if out is not finite; None if a side is missing or shapes differ)."""
    import torch
    if out is None or ref is None or out.shape != ref.shape:
        return None
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("nan")
    den = torch.linalg.vector_norm(r).item()
    return float(torch.linalg.vector_norm(o - r).item() / den) if den > 0 else float(torch.linalg.vector_norm(o).item())


def poison_check(fn, outputs, ref_outputs, dev: Device) -> float | None:
    """Fill the outputs with NaN, run once, return ||out - ref|| / ||ref|| of the first output (NaN: unwritten)."""
    for y in outputs:
        if y.is_floating_point():
            y.fill_(float("nan"))
    fn()
    dev.sync()
    if not ref_outputs:
        return None
    return rel_err(outputs[0], ref_outputs[0])


def profile_kernels(fn, dev: Device, runs: int = 20, top: int = 25) -> dict:
    """GPU kernel time per run of `fn` (the sum of every CUDA kernel's device time, from torch.profiler: CUPTI is
    process-wide, so onnxruntime's and the library's kernels are seen too), kernels per run, and the kernels that
    take the most time per run. onnxruntime's own node profiling only times the host side of CUDA kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        fn()
    dev.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        dev.sync()
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA:
            dur = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
            kernels.setdefault(e.name, []).append(float(dur))
    total = sum(sum(v) for v in kernels.values())
    rows = sorted(((name, sum(v) / runs, len(v) / runs) for name, v in kernels.items()), key=lambda r: -r[1])
    return {"gpu_kernel_us": round(total / runs, 2),
            "kernels_per_run": round(sum(len(v) for v in kernels.values()) / runs, 1),
            "top_kernels": [{"name": n[:120], "us_per_run": round(t, 2), "calls_per_run": round(c, 2)}
                            for n, t, c in rows[:top]]}
