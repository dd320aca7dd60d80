"""`run_doctor`: check every onnxfuse op on every backend this machine can run against the PyTorch reference.

For each op x backend x dtype x shape it builds a one-node model (float32 graph inputs and output, with Cast nodes
to and from the op's type T, because numpy has no bfloat16), runs it in onnxruntime and compares with
`onnxfuse.schema.reference` computed in fp32 from the same T-rounded inputs. Modes:

  * ``plain``       — CPU EP (backend cpu) or CUDA EP (backends cuda, triton) with `session.run`;
  * ``user_stream`` — CUDA EP on a user-created stream (provider option ``user_compute_stream``);
  * ``cuda_graph``  — CUDA EP with ``enable_cuda_graph``: IOBinding of device OrtValues, a few runs (ORT captures
                      the graph), then new X values written into the same device buffer and the replay checked
                      against the reference for the new X.

CUDA sessions are created with ``session.disable_cpu_ep_fallback`` so a node ORT could not place on the GPU fails
loudly instead of silently running on the CPU. GPU rows say ``SKIP`` with the reason when onnxruntime-gpu, a GPU or
the library's CUDA kernels are missing. The backend under test is each node's `backend` attribute (nothing in the
environment overrides it); `node_attrs` adds more attributes, e.g. MLPStack's stack_mode.

`onnxfuse doctor` is the command line (cli/kernels.py): --providers, --backends, --ops, --dtypes, --modes and --lib
choose what run_doctor checks, -v prints each row as it finishes.
"""
from __future__ import annotations

import time

from . import schema, testing
from .ops import embedding_interaction, mlp_stack
from .ops._family import gemm_input_shapes

# Default shapes per op, from its family (onnxfuse/ops/<family>.py `doctor_shapes`): for the GEMM ops (M, K, N, r),
# r only for the LoRA ops, small, odd and one realistic each plus aligned shapes of every size class of
# triton/table.py (so that every tuned Triton config runs here: onnxfuse.tune.doctor_coverage checks); SwiGLU
# (M, K, N, r, activation), a 4-tuple meaning silu; MLPStack (M, layer widths, activations); RotaryEmbedding (X
# shape, cos/sin shape); Embedding (table [V, D], ids shape); the embedding-interaction ops (B, d, features,
# interaction, hash or mean bag length).
DEFAULT_SHAPES = {op: list(schema.op_def(op).doctor_shapes) for op in schema.OPS}
# Integer inputs (fed as int64, not cast to the op's type): Embedding's ids (drawn in [-V, V) to cover negatives)
# and the embedding-interaction ops' ids, bags and table layout.
INT_INPUTS = testing.INT_INPUTS
embedding_table_sizes = embedding_interaction.embedding_table_sizes
stack_shapes = mlp_stack.stack_shapes


ALL_MODES = ("plain", "user_stream", "cuda_graph")


def shape_entry(op: str, entry) -> tuple[dict[str, list[int]], dict, tuple]:
    """(input shapes, extra node attributes, (M, K, N, r, layers) for the report) of one DEFAULT_SHAPES entry; for
    SwiGLU the last field names the activation."""
    return schema.op_def(op).doctor_entry(entry)


def input_shapes(op: str, m: int, k: int, n: int, r: int) -> dict[str, list[int]]:
    return gemm_input_shapes(schema.OPS[op], m, k, n, r)


def make_model(op: str, dtype: str, shapes: dict[str, list[int]], backend: str, scale: float | None = None,
               extra_attrs: dict | None = None, constants: dict | None = None) -> bytes:
    """One onnxfuse node between Casts: float32 inputs -> T -> op -> float32 output (testing.op_model). `shapes`
    lists the node's inputs in order (for MLPStack: X, W_1, bias_1, ...); `constants` ({name: T tensor}) makes those
    inputs initializers instead (the CPU kernels' prepacked path: oneDNN where the library and the CPU have it)."""
    attrs = {"backend": backend, **(extra_attrs or {})}
    if "scale" in schema.OPS[op].attr_names and scale is not None:
        attrs["scale"] = float(scale)
    graph_inputs = {k: v for k, v in shapes.items() if k not in (constants or {})}
    model = testing.op_model(op, dtype, graph_inputs, attrs, cast=True, initializers=constants,
                             out_shape=out_shape(op, shapes, extra_attrs))
    return model.SerializeToString()


# Ops whose inputs after X are weights (every op but the embedding ones and RotaryEmbedding): with special=True the
# CPU rows run them both as graph inputs (the built-in GEMM) and as initializers (prepacked: oneDNN's post-ops where
# the library has oneDNN for the type on this CPU).
WEIGHTED_OPS = tuple(op for op in schema.OPS if schema.op_def(op).weighted)


def out_shape(op: str, shapes: dict[str, list[int]], attrs: dict | None = None) -> list[int]:
    """Y's shape: X's for RotaryEmbedding, ids.shape + [D] for Embedding, [B, interaction width] for the
    embedding-interaction ops (`attrs` names the interaction), else [M, N] (2-D X)."""
    return schema.op_def(op).out_shape(shapes, dict(attrs or {}))


def make_inputs(op: str, dtype: str, shapes: dict[str, list[int]], seed: int, device: str = "cpu"):
    """Random inputs already rounded to T (returned as T tensors); weights scaled so outputs stay O(1) (the op's
    family: schema.op_def(op).make_doctor_inputs)."""
    return schema.op_def(op).make_doctor_inputs(testing.torch_type(dtype), shapes, seed, device)


def compare(y, ref, dtype: str) -> tuple[bool, float, float]:
    """(ok, max |y - ref|, its bound) under testing.TOLERANCES[dtype]["doctor"]."""
    c = testing.check_close(y, ref, dtype, "doctor")
    return c.ok, c.err, c.bound


def _cuda_ep() -> bool:
    from .kernels.toolchain import onnxruntime_has_cuda
    return onnxruntime_has_cuda()


def gpu_status(lib_path) -> tuple[bool, str]:
    """(usable, reason) for the CUDA EP rows: onnxruntime-gpu, a GPU, and CUDA kernels in the library."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False, f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (needs onnxruntime-gpu)"
    try:
        import torch
        if not torch.cuda.is_available():
            return False, "no CUDA GPU visible to torch"
    except ImportError:
        return False, "torch not installed (the doctor uses it for references and streams)"
    try:
        from .kernels import build_info
        info = build_info(lib_path)
        if "cuda" not in info.get("backends", []):
            return False, f"library {lib_path} was built without CUDA kernels (backends {info.get('backends')})"
    except Exception as e:  # an old library without build info: let the sessions tell
        return True, f"could not read build info ({e})"
    return True, ""


def library_notes(lib_path=None) -> list[str]:
    """What the rows do not say: the host the CPU rows ran on (its CPU, vector ISA and what the kernels run there:
    host.summary) and the checked library's Triton tile table (the tuned configs of triton/tuned.json and --configs,
    all of which the default shapes run: tune.doctor_coverage)."""
    from . import host
    try:
        from .kernels import build_info, library_path
        lib = lib_path or library_path()
        info = build_info(lib)
    except Exception:  # noqa: BLE001 - no library or no build info: the host alone
        return [f"host: {host.summary(host.describe())}"]
    notes = [f"host: {host.summary(host.describe(lib))}"]
    if "triton" not in info.get("backends", []):
        return notes
    tuned = info.get("triton_tuned") or {}
    if not tuned:
        return notes + ["Triton tile configs: aot.py's built-in CONFIGS (no tuned table in this build)"]
    parts = [f"sm_{arch}: " + ", ".join(f"{k}/{size} {tuple(cfg)}" for k, groups in kernels.items()
                                        for classes in groups.values() for size, cfg in classes.items())
             for arch, kernels in tuned.items()]
    return notes + ["Triton tile configs tuned (triton/tuned.json, every one run by the checks above): "
                    + "; ".join(parts)]


class _Runner:
    """Creates sessions and runs one model in one mode; keeps the stream alive for user_stream runs."""

    def __init__(self, lib_path):
        import onnxruntime as ort

        self.ort = ort
        self.lib_path = str(lib_path)
        self._stream = None

    def session(self, model: bytes, provider: str, cuda_opts: dict | None = None):
        """A session of `model` with the doctor's library; on "cuda" without the CPU EP (fallback off)."""
        import onnx

        from . import runtime
        return runtime.session(onnx.load_from_string(model), provider, library=self.lib_path,
                               provider_options=cuda_opts, cpu_fallback=False)

    def user_stream(self):
        import torch
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        return self._stream

    def run(self, model, provider, mode, feeds, feeds2=None, out_shapes=None, cpu_inputs=()):
        """Returns (ys, ys2), every output of the model: ys for `feeds`; ys2 (cuda_graph only) after X is rewritten in
        place with feeds2['X']. `out_shapes`: every output's shape (cuda_graph binds them); `cpu_inputs`: inputs
        bound in host memory there (what the op reads on the host: OpDef.cpu_inputs)."""
        import numpy as np

        if mode == "plain":
            return self.session(model, provider).run(None, feeds), None
        if mode == "user_stream":
            s = self.user_stream()
            opts = {"has_user_compute_stream": "1", "user_compute_stream": str(s.cuda_stream)}
            return self.session(model, "cuda", opts).run(None, feeds), None
        if mode == "cuda_graph":
            sess = self.session(model, "cuda", {"enable_cuda_graph": "1"})
            vals = {k: self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v), *(
                ("cpu", 0) if k in cpu_inputs else ("cuda", 0))) for k, v in feeds.items()}
            names = [o.name for o in sess.get_outputs()]
            outs = [self.ort.OrtValue.ortvalue_from_shape_and_type(list(shape), np.float32, "cuda", 0)
                    for shape in out_shapes]
            io = sess.io_binding()
            for k, v in vals.items():
                io.bind_ortvalue_input(k, v)
            for name, v in zip(names, outs):
                io.bind_ortvalue_output(name, v)
            for _ in range(3):  # warm-up, capture, replay
                sess.run_with_iobinding(io)
            ys = [v.numpy().copy() for v in outs]
            for name, value in feeds2.items():  # the first float input, rewritten in place
                vals[name].update_inplace(np.ascontiguousarray(value))
            sess.run_with_iobinding(io)
            return ys, [v.numpy().copy() for v in outs]
        raise ValueError(f"unknown mode {mode!r}")


def run_doctor(providers=("cpu", "cuda"), backends=None, *, ops=None, dtypes=schema.TYPES, shapes=None,
               modes=ALL_MODES, lib_path=None, seed=0, verbose=False, on_row=None,
               node_attrs: dict | None = None, special: bool = False) -> list[dict]:
    """Check ops against `schema.reference`; returns one dict per (op, provider, backend, dtype, shape, mode).

    providers: subset of ("cpu", "cuda"). backends: subset of ("cpu", "cuda", "triton") (default: all that apply;
    cpu runs on the CPU EP, cuda and triton on the CUDA EP). shapes: {op: [(M, K, N, r), ...]}, for MLPStack
    [(M, widths, activations), ...], for SwiGLU optionally (M, K, N, r, activation) (DEFAULT_SHAPES).
    modes apply to the CUDA EP; the CPU EP runs plain only. node_attrs: attributes added to every node under test
    (e.g. {"stack_mode": "fused"}). Row keys: op, provider, backend, dtype, M, K, N, r,
    mode, status (PASS / FAIL / ERROR / SKIP), max_err, tol, seconds, detail; `layers` describes an MLPStack's
    layers and a SwiGLU's activation.

    special=True checks IEEE semantics instead of random data: X's rows (or the first float input's) hold NaN,
    +-Inf, -0, the type's max and subnormals (testing.with_special_rows), and the output must have NaN and +-Inf
    exactly where the reference has them (testing.check_special); on the CPU the weighted ops run with their
    weights as graph inputs and as initializers (row key `weights`). Rows carry `values`: "special" or "random".
    """

    from .kernels import library_path

    ops = list(ops or schema.OPS)
    shapes = shapes or DEFAULT_SHAPES
    backends = list(backends or ("cpu", "cuda", "triton"))
    lib = lib_path or library_path(provider="cuda" if "cuda" in providers and _cuda_ep() else "cpu")
    rows: list[dict] = []

    plan, gpu_ok, gpu_reason = _plan(providers, backends, modes, lib)
    torch_device = "cuda" if gpu_ok else "cpu"
    runner = _Runner(lib)

    def emit(row):
        rows.append(row)
        if on_row:
            on_row(row)
        elif verbose:
            print(format_row(row), flush=True)

    for op in ops:
        for entry in shapes.get(op, []):
            shp, extra, (m, k, n, r, layers) = shape_entry(op, entry)
            scale = 0.5 if "scale" in schema.OPS[op].attr_names else None
            attrs = {"scale": scale} if scale is not None else dict(extra)
            for dtype in dtypes:
                cache = {}

                def data():
                    if not cache:
                        cache.update(_doctor_data(op, dtype, shp, attrs, seed, torch_device, special))
                    return cache

                for provider, backend, pmodes in plan:
                    weight_modes = ("inputs", "constants") if special and provider == "cpu" and op in WEIGHTED_OPS \
                        else ("inputs",)
                    for mode in pmodes:
                        for weights in weight_modes:
                            row = dict(op=op, provider=provider, backend=backend, dtype=dtype, M=m, K=k, N=n, r=r,
                                       layers=layers, mode=mode, status="SKIP", max_err=None, tol=None, seconds=0.0,
                                       detail="", values="special" if special else "random", weights=weights)
                            if provider == "cuda" and not gpu_ok:
                                row["detail"] = "skipped: " + gpu_reason
                                emit(row)
                                continue
                            t0 = time.time()
                            try:
                                row.update(_check(runner, data(), op, dtype, shp, backend, scale,
                                                  {**extra, **(node_attrs or {})}, provider, mode, weights, special))
                            except Exception as e:  # report, keep going
                                row.update(status="ERROR", detail=f"{type(e).__name__}: {str(e)[:500]}")
                            row["seconds"] = round(time.time() - t0, 3)
                            emit(row)
    return rows


def _plan(providers, backends, modes, lib) -> tuple[list, bool, str]:
    """([(provider, backend, modes)] to run, whether the GPU rows can run, why not)."""
    plan = []
    if "cpu" in providers and "cpu" in backends:
        plan.append(("cpu", "cpu", ("plain",)))
    gpu_ok, gpu_reason = (False, "")
    if "cuda" in providers:
        gpu_ok, gpu_reason = gpu_status(lib)
        if gpu_ok:
            import onnxruntime as ort
            if hasattr(ort, "preload_dlls"):
                ort.preload_dlls()
        for b in ("cuda", "triton"):
            if b in backends:
                plan.append(("cuda", b, tuple(modes)))
    return plan, gpu_ok, gpu_reason


def _doctor_data(op, dtype, shp, attrs, seed, torch_device, special) -> dict:
    """Inputs (as T tensors and as float32/int64 feeds), a second X for the CUDA-graph rebind, and both references;
    with `special`, the first float input (X; the table for Embedding) holds special values in its rows."""
    import torch
    ins = make_inputs(op, dtype, shp, seed, torch_device)
    # the CUDA-graph check rebinds the first float input in place (X; the table for Embedding)
    first = next(n for n in shp if (op, n) not in INT_INPUTS)
    x2 = make_inputs(op, dtype, {first: shp[first]}, seed + 1, torch_device)[0]
    if special:
        at = list(shp).index(first)
        type_max = schema.op_def(op).special_type_max  # (see OpDef.special_type_max)
        ins[at] = testing.with_special_rows(ins[at], type_max=type_max)[0]
        x2 = testing.with_special_rows(x2, first=1, type_max=type_max)[0]  # other rows hold them after the rebind
    ref = _outputs(schema.reference(op, ins, attrs))
    ref2 = _outputs(schema.reference(op, [x2 if n == first else t for n, t in zip(shp, ins)], attrs))
    feeds = {name: (t if (op, name) in INT_INPUTS else t.float()).cpu().numpy() for name, t in zip(shp, ins)}
    out = dict(feeds=feeds, feeds2={first: x2.float().cpu().numpy()}, ref=ref, ref2=ref2,
               tensors={name: t.cpu() for name, t in zip(shp, ins)}, first=first)
    del ins, x2
    if torch_device == "cuda":
        torch.cuda.empty_cache()
    return out


def _outputs(ref) -> list:
    """A reference's outputs as fp32 numpy arrays: [Y], or every output of a multi-output op (a tuple)."""
    return [t.float().cpu().numpy() for t in (ref if isinstance(ref, (tuple, list)) else (ref,))]


def _compare_all(ys, refs, dtype: str, special: bool):
    """The worst of the outputs' comparisons (testing.check_close, or check_special), naming the output that failed
    where there are several."""
    check = testing.check_special if special else testing.check_close
    worst = None
    for i, (y, ref) in enumerate(zip(ys, refs)):
        c = check(y, ref, dtype, "doctor")
        if not c.ok and len(refs) > 1:
            c.reason = f"output {i}: {c.reason}"
        if worst is None or (worst.ok and not c.ok) or (worst.ok == c.ok and c.err > worst.err):
            worst = c
    return worst


def _check(runner, d, op, dtype, shp, backend, scale, attrs, provider, mode, weights, special) -> dict:
    """One row's run and comparison: status, max_err, tol, detail."""
    constants = None
    feeds = d["feeds"]
    if weights == "constants":  # every input but the first float one as an initializer in T
        constants = {n: t for n, t in d["tensors"].items() if n != d["first"] and (op, n) not in INT_INPUTS}
        feeds = {n: v for n, v in feeds.items() if n not in constants}
    model = make_model(op, dtype, shp, backend, scale, attrs, constants)
    definition = schema.op_def(op)
    ys, ys2 = runner.run(model, provider, mode, feeds, d["feeds2"], definition.all_out_shapes(shp, dict(attrs)),
                         definition.cpu_inputs)
    c = _compare_all(ys, d["ref"], dtype, special)
    ok, err, tol, detail = c.ok, c.err, c.bound, ""
    reasons = [] if c.ok else [c.reason]
    if ys2 is not None:
        c2 = _compare_all(ys2, d["ref2"], dtype, special)
        detail = f"rebound X: max_err {c2.err:.3g} (tol {c2.bound:.3g})"
        ok, err, tol = ok and c2.ok, max(err, c2.err), max(tol, c2.bound)
        reasons += [] if c2.ok else [f"after the rebind: {c2.reason}"]
    if special and reasons:  # which special value went wrong
        detail = "; ".join(([detail] if detail else []) + reasons)
    return dict(status="PASS" if ok else "FAIL", max_err=err, tol=tol, detail=detail)


def format_row(r: dict) -> str:
    err = "" if r["max_err"] is None else f"err {r['max_err']:.3g} / tol {r['tol']:.3g}"
    shape = f"M{r['M']} K{r['K']} N{r['N']}" + (f" r{r['r']}" if r["r"] else "") + \
        (f" {r['layers']}" if r.get("layers") else "")
    return (f"{r['status']:5} {r['op']:15} {r['provider']:4} {r['backend']:6} {r['dtype']:8} {shape:26} "
            f"{mode_label(r):11} {err} {r['detail']}")


def mode_label(r: dict) -> str:
    """A row's mode with its kind of data: 'plain', 'plain+special', 'plain+special+const' (weights initializers)."""
    return r["mode"] + ("+special" if r.get("values") == "special" else "") + \
        ("+const" if r.get("weights") == "constants" else "")
