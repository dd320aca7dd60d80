"""CPU kernels of the onnxfuse custom-op library against onnxfuse.schema.reference, run through onnxruntime.

Every GEMM op of schema.OPS x {float, float16, bfloat16} as a single-node model on the CPU EP (the embedding ops are in
tests/rewrites/test_embedding_interaction.py), plus hypothesis property
tests over shapes (M=1, odd K/N, 3-D X, LoRA ranks 1/4/16, scales). ONNXFUSE_HYPOTHESIS_PROFILE=nightly runs
thousands of examples instead of the quick default.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import onnxruntime as ort
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from onnxfuse import kernels, schema, testing
from onnxfuse.testing import assert_close, input_names

# The package re-exports the build() function under the module's name; take the module itself.
kbuild = importlib.import_module("onnxfuse.kernels.build")

settings.register_profile("quick", max_examples=25, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.register_profile("nightly", max_examples=3000, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
settings.load_profile(os.environ.get("ONNXFUSE_HYPOTHESIS_PROFILE", "quick"))

TORCH_TYPE = {d: testing.torch_type(d) for d in schema.TYPES}


@pytest.fixture(scope="module")
def lib() -> pathlib.Path:
    return kernels.build(backends=["cpu"], quiet=True).path


# ------------------------------------------------------------------------------------------------ helpers
# The ops tested here (the embedding-interaction ops have their own tests in
# tests/rewrites/test_embedding_interaction.py: other inputs, no weights).
OPS_UNDER_TEST = [op for op in schema.OPS if op not in schema.EMBEDDING_OPS]

# MLPStack under test: three layers K -> N -> N//2+1 -> N, so relu and sigmoid each appear, a narrow odd hidden
# width, and an intermediate that must stay in the op's type between layers.
STACK_ACTS = "relu.sigmoid.relu"


def op_attrs(op: str, scale: float = 0.5) -> dict:
    names = schema.OPS[op].attr_names
    attrs = {"scale": float(scale)} if "scale" in names else {}
    if op == "MLPStack":
        attrs["activations"] = STACK_ACTS
    if "scale_gate" in names:  # LoRASwiGLU: a scale per adapter, the up one different
        attrs.update(scale_gate=float(scale), scale_up=0.5 * float(scale) + 1.0)
    if "scale_down" in names:  # LoRAGatedMLP: the down adapter's, different again
        attrs["scale_down"] = 0.75 - float(scale)
    if "num_heads" in names:  # FlashAttention: two heads of K (random_inputs)
        attrs["num_heads"] = 2
    if "kv_num_heads" in names:  # CachedAttention: four query heads on two KV heads (random_inputs)
        attrs.update(num_heads=4, kv_num_heads=2)
    return attrs


# Ops with weights the CPU kernels prepack when they are constants (RotaryEmbedding has none: cos/sin are
# activations; Embedding copies rows of its table as they are; FlashAttention's and CachedAttention's inputs are all
# activations).
WEIGHTED_OPS = [op for op in OPS_UNDER_TEST if op not in ("RotaryEmbedding", "Embedding", "FlashAttention",
                                                          "CachedAttention")]
# The int4 ops read their packed weights as they are (no prepacking): their constant weights are checked, not logged.
# LoRASwiGLU's CPU kernel packs its operands per call (a fused model has it on the CPU only where a CPU table fuses
# both swiglu and lora_linear, which no measured host's does: cpu_policy.py).
INT4_OPS = ("Int4Linear", "Int4SwiGLU", "SkipRMSNormInt4Linear", "SkipRMSNormInt4SwiGLU")
# The mixed-adapter ops gather each row's adapter per call (nothing to prepack).
MULTI_OPS = ("MultiLoRALinear", "MultiLoRASwiGLU", "MultiLoRAGatedMLP")
# LoRAGatedMLP's CPU kernel is LoRASwiGLU's pass and LoRALinear's built-in GEMM on the activation, per call.
PREPACKED_OPS = [op for op in WEIGHTED_OPS if op not in INT4_OPS + MULTI_OPS + ("LoRASwiGLU", "LoRAGatedMLP")]


def run_op(lib, op: str, inputs: list[torch.Tensor], attrs: dict | None = None) -> torch.Tensor:
    """Run one onnxfuse node on the CPU EP with the library `lib` (testing.run_op)."""
    return testing.run_op(op, inputs, attrs, library=lib)


def random_inputs(op: str, lead: tuple[int, ...], K: int, N: int, r: int, dtype: str, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(TORCH_TYPE[dtype])

    if op == "Embedding":  # table [K, N] (K rows of N), ids of shape lead in [-K, K): negatives count from the end
        return [rnd(K, N), torch.randint(-K, K, lead, generator=g)]
    if op in INT4_OPS:  # block 16 / 32 / 64 by r; every packed byte random, the padding past K too; silu; the norm
        # ops' residual of X's shape
        definition = schema.op_def(op)
        entry = (1, K, N, {1: 16, 4: 32, 16: 64}.get(r, 32)) + (("silu",) if op.endswith("SwiGLU") else ())
        shapes = definition.doctor_entry(entry)[0]
        shapes["X"] = [*lead, K]
        if "skip" in shapes:
            shapes["skip"] = [*lead, K]
        return definition.make_doctor_inputs(TORCH_TYPE[dtype], shapes, seed)
    if op in MULTI_OPS:  # a stack of 3 adapters (up's rank r + 3), an index per row of X's first axis in [-1, 3)
        definition = schema.op_def(op)
        b, s = lead[0], math.prod(lead[1:])
        entry = {"MultiLoRALinear": (b, s, K, N, r, 3), "MultiLoRASwiGLU": (b, s, K, N, r, r + 3, 3, "silu"),
                 "MultiLoRAGatedMLP": (b, s, K, N, r, r + 3, r + 1, 3, "silu")}[op]
        shapes = definition.doctor_entry(entry)[0]
        shapes["X"] = [*lead, K]
        return definition.make_doctor_inputs(TORCH_TYPE[dtype], shapes, seed)
    if op == "LoRAGatedMLP":  # three ranks (gate r, up r + 3, down r + 1), the down projection back to K
        definition = schema.op_def(op)
        shapes = definition.doctor_entry((1, K, N, r, r + 3, r + 1, "silu"))[0]
        shapes["X"] = [*lead, K]
        return definition.make_doctor_inputs(TORCH_TYPE[dtype], shapes, seed)
    if op == "FlashAttention":  # B = lead[0] (1 for a 1-D lead) and S the rest, 2 heads of K, N keys, a causal bias
        b, s = (1, lead[0]) if len(lead) == 1 else (lead[0], math.prod(lead[1:]))
        shapes = {"Q": [b, s, 2 * K], "K": [b, N, 2 * K], "V": [b, N, 2 * K], "bias": [b, 1, s, N]}
        return schema.op_def(op).make_doctor_inputs(TORCH_TYPE[dtype], shapes, seed)
    if op == "CachedAttention":  # B = lead[0] (1 for a 1-D lead), S the rest; 4 heads on 2 of D = K rounded up to
        # even (at most 256), N keys of past (a first prompt where N % 3 == 0), rotary on D or half of it by seed
        b, s = (1, lead[0]) if len(lead) == 1 else (lead[0], math.prod(lead[1:]))
        d = min(256, K + K % 2)
        rdim = d if seed % 2 == 0 or d < 4 else 2 * (d // 4)
        entry = (b, s, None if N % 3 == 0 else N, 4, 2, d, rdim, K % 2)
        definition = schema.op_def(op)
        return definition.make_doctor_inputs(TORCH_TYPE[dtype], definition.doctor_entry(entry)[0], seed)
    if op == "RotaryEmbedding":  # X [*lead, D] (D even), cos/sin broadcast over every leading dim but the last
        d = K + K % 2
        cs_shape = (1,) * (len(lead) - 1) + (lead[-1], d)
        return [rnd(*lead, d), rnd(*cs_shape), rnd(*cs_shape)]
    x = rnd(*lead, K)
    w_scale = 1.0 / math.sqrt(K)
    if op == "SwiGLU":
        return [x, rnd(K, N, scale=w_scale), rnd(K, N, scale=w_scale)]
    if op == "LoRASwiGLU":  # the up adapter of another rank than the gate's
        ru = r + 3
        return [x, rnd(K, N, scale=w_scale), rnd(K, N, scale=w_scale), rnd(K, r, scale=w_scale),
                rnd(r, N, scale=1.0 / math.sqrt(r)), rnd(K, ru, scale=w_scale), rnd(ru, N, scale=1.0 / math.sqrt(ru))]
    if op.startswith("LoRA"):
        return [x, rnd(K, N, scale=w_scale), rnd(K, r, scale=w_scale), rnd(r, N, scale=1.0 / math.sqrt(r)), rnd(N)]
    if op == "LinearSkipRMSNorm":  # the residual of X's leading dims, gamma [N]
        return [x, rnd(K, N, scale=w_scale), rnd(*lead, N), rnd(N)]
    if op == "MLPStack":
        widths = [K, N, N // 2 + 1, N]
        out = [x]
        for k, n in zip(widths[:-1], widths[1:]):
            out += [rnd(k, n, scale=1.0 / math.sqrt(k)), rnd(n)]
        return out
    return [x, rnd(K, N, scale=w_scale), rnd(N)]


def first_output(ref):
    """Y of a reference: the first of a multi-output op's (LinearSkipRMSNorm's Y and sum), which the sessions that
    bind Y alone return."""
    return ref[0] if isinstance(ref, (tuple, list)) else ref


def check(lib, op, lead, K, N, r, dtype, scale=1.0, seed=0):
    inputs = random_inputs(op, lead, K, N, r, dtype, seed)
    attrs = op_attrs(op, scale)
    if op == "CachedAttention":
        attrs["rotary_interleaved"] = K % 2
    out = run_op(lib, op, inputs, attrs)
    ref = schema.reference(op, inputs, attrs)
    outs, refs = (out, ref) if isinstance(out, list) else ([out], [ref])  # every output of a multi-output op
    for i, (o, want) in enumerate(zip(outs, refs)):
        assert_close(o, want, dtype, f"{op}[{dtype}] X{(*lead, K)} N={N} r={r} scale={scale} output {i}")


# ------------------------------------------------------------------------------------------------ correctness
@pytest.mark.parametrize("dtype", schema.TYPES)
@pytest.mark.parametrize("op", OPS_UNDER_TEST)
def test_op_matches_reference(lib, op, dtype):
    check(lib, op, (2, 9), 70, 45, 4, dtype, scale=0.5)


@pytest.mark.parametrize("op", OPS_UNDER_TEST)
def test_crosses_every_block_boundary(lib, op):
    # M > MB (240), K > KC (256), N > NC (512), none a multiple of the micro-tile: every edge path runs.
    check(lib, op, (251,), 601, 530, 16, "float", scale=0.25, seed=1)


@given(op=st.sampled_from(OPS_UNDER_TEST), dtype=st.sampled_from(schema.TYPES),
       lead=st.one_of(st.tuples(st.integers(1, 40)), st.tuples(st.integers(1, 3), st.integers(1, 17))),
       K=st.integers(1, 300), N=st.integers(1, 200), r=st.sampled_from([1, 4, 16]),
       scale=st.sampled_from([0.0, 0.125, 1.0, -2.0, 3.5]), seed=st.integers(0, 2**16))
def test_property_matches_reference(lib, op, dtype, lead, K, N, r, scale, seed):
    check(lib, op, lead, K, N, r, dtype, scale=scale, seed=seed)


@pytest.mark.parametrize("op", ["LinearSigmoid", "SwiGLU", "LoRALinearRelu"])
def test_single_row(lib, op):
    for dtype in schema.TYPES:
        check(lib, op, (1,), 1024, 33, 4, dtype, seed=3)


_THREADS_SCRIPT = r"""
import sys, pathlib
sys.path[:0] = [sys.argv[2], str(pathlib.Path(sys.argv[2]) / "tests" / "kernels")]
import torch
import test_kernels_cpu as t
inputs = t.random_inputs("SwiGLU", (97,), 300, 700, 0, "float", 5)
torch.save(t.run_op(pathlib.Path(sys.argv[1]), "SwiGLU", inputs), sys.argv[3])
"""


def test_thread_count_does_not_change_results(lib, tmp_path):
    """ONNXFUSE_CPU_THREADS is read once per process (on the first GEMM), so each count runs in its own process."""
    root = pathlib.Path(__file__).resolve().parents[2]
    outs = []
    for threads in ("1", "3"):
        out = tmp_path / f"y{threads}.pt"
        p = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, str(lib), str(root), str(out)],
                           env={**os.environ, "ONNXFUSE_CPU_THREADS": threads}, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        outs.append(torch.load(out))
    assert torch.equal(outs[0], outs[1])  # same per-element accumulation order whatever the tiling


# ------------------------------------------------------------------------------------------------ constant weights
def _weights_session(lib, op: str, inputs: list[torch.Tensor], attrs: dict, mode: str,
                     log_severity: int = 2) -> ort.InferenceSession:
    """One-node session whose weights (every input but X) are: 'const' initializers, 'input' graph inputs, or
    'overridable' initializers that are also graph inputs (ORT does not treat those as constant)."""
    dtype = testing.dtype_name(inputs[0].dtype)
    names = input_names(op, len(inputs))
    graph_inputs = {names[0]: [None] * (inputs[0].dim() - 1) + [inputs[0].shape[-1]]}
    if mode in ("input", "overridable"):
        graph_inputs.update((name, list(t.shape)) for name, t in zip(names[1:], inputs[1:]))
    inits = dict(zip(names[1:], inputs[1:])) if mode in ("const", "overridable") else {}
    model = testing.op_model(op, dtype, graph_inputs, attrs, initializers=inits)
    so = ort.SessionOptions()
    so.log_severity_level = log_severity
    return ort.InferenceSession(model.SerializeToString(), kernels.session_options(so, path=lib),
                                providers=["CPUExecutionProvider"])


_run_session = testing.run_session


@pytest.mark.parametrize("dtype", ["float", "bfloat16"])
@pytest.mark.parametrize("op", PREPACKED_OPS)
def test_constant_weights_are_prepacked_once_and_match(lib, op, dtype, capfd):
    """Initializer weights take the prepacked path (the kernel says so at INFO level on the session's logger, shown
    with log_severity_level=1), graph-input weights the per-call path; both match the reference, and one session
    run twice with different X (and, for the non-constant cases, different weights) is right both times: the cache
    holds weights only, never X."""
    lead, K, N, r = (37,), 300, 70, 4  # K > KC (256): prepacked panels are entered at k0 > 0
    attrs = op_attrs(op)
    names = input_names(op, len(random_inputs(op, lead, K, N, r, dtype, seed=11)))
    out_shape = lead + (N,)
    for mode in ("const", "input", "overridable"):
        base = random_inputs(op, lead, K, N, r, dtype, seed=11)
        capfd.readouterr()
        sess = _weights_session(lib, op, base, attrs, mode, log_severity=1)
        created = capfd.readouterr().err
        if mode == "const":
            assert f"onnxfuse[cpu] {op}: prepacked " in created and "nothing" not in created, created
        else:
            assert f"onnxfuse[cpu] {op}: prepacked nothing" in created, created
        for run in range(2):
            inputs = random_inputs(op, lead, K, N, r, dtype, seed=100 + run)  # new X every run
            weights = base[1:] if mode == "const" else inputs[1:]  # non-constant weights change too
            feeds = {names[0]: inputs[0]}
            if mode != "const":
                feeds.update(zip(names[1:], weights))
            out = _run_session(sess, op, feeds, out_shape)
            ref = first_output(schema.reference(op, [inputs[0], *weights], attrs))
            assert_close(out, ref, dtype, f"{op}[{dtype}] weights={mode} run {run}")
        used = capfd.readouterr().err
        assert ("computing with prepacked weights" in used) == (mode == "const"), (mode, used)
        if mode == "const":  # the engine this host has for the type (oneDNN's bf16/fp16 need AVX-512 / AMX)
            engine = "oneDNN" if onednn_matmul(lib, dtype) else "built-in GEMM"
            assert f"({engine}" in created and f"computing with prepacked weights ({engine})" in used, (created, used)


def onednn_matmul(lib, dtype: str) -> str | None:
    """The oneDNN matmul the library's prepacked weights of `dtype` get on this host (None: the built-in GEMM), as
    the library reports it (kernels.host_info probes it with the kernels' own OnednnMatmul::Init)."""
    dnnl = kernels.host_info(lib)["onednn"]
    assert (dnnl is not None) == kernels.build_info(lib).get("cpu_gemm", "").startswith("onednn "), dnnl
    return dnnl["matmul"][dtype] if dnnl else None


def check_const(lib, op, lead, K, N, r, dtype, scale=1.0, seed=0):
    """Like check(), with every input but X a constant initializer: the prepacked (oneDNN, where built) path."""
    inputs = random_inputs(op, lead, K, N, r, dtype, seed)
    attrs = op_attrs(op, scale)
    sess = _weights_session(lib, op, inputs, attrs, "const")
    out = _run_session(sess, op, {input_names(op, len(inputs))[0]: inputs[0]}, testing.default_out_shape(op, inputs))
    assert_close(out, first_output(schema.reference(op, inputs, attrs)), dtype,
                 f"{op}[{dtype}] const weights X{(*lead, K)} N={N} r={r} scale={scale}")


# Shapes for the prepacked path: the usual one, 3-D X, one row, N < 8 (the narrow dot-product path), N = 1, N past
# one column block (128) with a tail, M past a row block with a tail, K past 256.
CONST_SHAPES = [((2, 9), 70, 45, 4), ((3, 5), 33, 7, 1), ((1,), 1024, 33, 4), ((37,), 300, 1, 4), ((70,), 64, 300, 16),
                ((251,), 601, 530, 16), ((129,), 13, 512, 8)]


@pytest.mark.parametrize("dtype", schema.TYPES)
@pytest.mark.parametrize("op", WEIGHTED_OPS)
def test_constant_weights_match_reference(lib, op, dtype):
    for lead, K, N, r in CONST_SHAPES:
        if dtype != "float" and lead[0] * K * N > 2e6:
            continue  # the big shape once, in fp32
        check_const(lib, op, lead, K, N, r, dtype, scale=0.5, seed=K + N)


@given(op=st.sampled_from(WEIGHTED_OPS), dtype=st.sampled_from(schema.TYPES),
       lead=st.one_of(st.tuples(st.integers(1, 80)), st.tuples(st.integers(1, 3), st.integers(1, 17))),
       K=st.integers(1, 300), N=st.integers(1, 300), r=st.sampled_from([1, 4, 16]),
       scale=st.sampled_from([0.0, 0.125, 1.0, -2.0]), seed=st.integers(0, 2**16))
def test_property_constant_weights_match_reference(lib, op, dtype, lead, K, N, r, scale, seed):
    check_const(lib, op, lead, K, N, r, dtype, scale=scale, seed=seed)


# The ISA tests' subprocess scripts: argv = [library, checkout root]; this module imported as `t`.
_ISA_PRELUDE = r"""
import sys, pathlib
sys.path[:0] = [sys.argv[2], str(pathlib.Path(sys.argv[2]) / "tests" / "kernels")]
import test_kernels_cpu as t
from onnxfuse import schema
lib = pathlib.Path(sys.argv[1])
"""

_CONST_ISA_SCRIPT = _ISA_PRELUDE + r"""
for op in t.WEIGHTED_OPS:
    for dtype in schema.TYPES:
        t.check_const(lib, op, (13,), 37, 29, 4, dtype, scale=0.5, seed=7)
        t.check_const(lib, op, (70,), 64, 300, 16, dtype, scale=0.5, seed=9)
print("ok")
"""


@pytest.mark.parametrize("isa", ["AVX2", "AVX512_CORE"])
def test_constant_weights_on_older_instruction_sets(lib, isa):
    """oneDNN capped at AVX2 (no fp16/bf16 matmul there: those kernels keep the built-in GEMM) or AVX-512 without
    BF16/FP16/AMX (bf16 emulated, fp16 falls back): every op and type still matches the reference."""
    if not kernels.build_info(lib).get("cpu_gemm", "").startswith("onednn "):  # "builtin (why not oneDNN)"
        pytest.skip("library built without oneDNN")
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "DNNL_MAX_CPU_ISA": isa}
    p = subprocess.run([sys.executable, "-c", _CONST_ISA_SCRIPT, str(lib), str(root)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr


def test_library_prints_nothing_at_the_default_log_level(lib, capfd):
    """Diagnostics go through onnxruntime's logger only: at the default severity nothing reaches stdout/stderr."""
    inputs = random_inputs("LinearRelu", (37,), 300, 70, 0, "float", seed=11)
    capfd.readouterr()
    sess = _weights_session(lib, "LinearRelu", inputs, {}, "const")
    _run_session(sess, "LinearRelu", {"X": inputs[0]}, (37, 70))
    out = capfd.readouterr()
    assert out.out == "" and out.err == "", out


def test_concurrent_sessions_share_the_pool(lib):
    """Two threads running multi-threaded GEMMs at once: one gets the pool, the other runs inline; both right."""
    import threading

    cases = [random_inputs("SwiGLU", (300,), 300, 600, 0, "float", seed) for seed in (1, 2)]
    refs = [schema.reference("SwiGLU", c) for c in cases]
    errors = []

    def work(i):
        try:
            for _ in range(5):
                assert_close(run_op(lib, "SwiGLU", cases[i]), refs[i], "float", f"thread {i}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


_ISA_SCRIPT = _ISA_PRELUDE + r"""
for op in t.OPS_UNDER_TEST:
    for dtype in schema.TYPES:
        t.check(lib, op, (13,), 37, 29, 4, dtype, scale=0.5, seed=7)
    t.check(lib, op, (251,), 300, 530, 16, "float", scale=0.5, seed=8)
print("ok")
"""


@pytest.mark.parametrize("isa", ["generic", "avx2"])
def test_other_instruction_sets(lib, isa):
    """The AVX2 and baseline micro-kernels (normally shadowed by AVX-512 here) give the same answers."""
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "ONNXFUSE_CPU_ISA": isa}
    p = subprocess.run([sys.executable, "-c", _ISA_SCRIPT, str(lib), str(root)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout + p.stderr


# ------------------------------------------------------------------------------------------------ errors, attributes
def test_k_mismatch_is_an_ort_error_naming_the_op(lib):
    x = torch.randn(4, 8)
    w = torch.randn(9, 5)
    b = torch.randn(5)
    with pytest.raises(Exception) as info:
        run_op(lib, "LinearRelu", [x, w, b])
    msg = str(info.value)
    assert "LinearRelu" in msg and "[4,8]" in msg and "[9,5]" in msg, msg


def test_lora_rank_mismatch_is_an_error(lib):
    x, w, a, bm, b = torch.randn(3, 8), torch.randn(8, 5), torch.randn(8, 4), torch.randn(3, 5), torch.randn(5)
    with pytest.raises(Exception, match="LoRALinear: B must be"):
        run_op(lib, "LoRALinear", [x, w, a, bm, b])


def test_mlp_stack_bad_inputs_are_errors_naming_the_layer(lib):
    x, w1, b1, w2, b2 = torch.randn(3, 8), torch.randn(8, 6), torch.randn(6), torch.randn(5, 4), torch.randn(4)
    with pytest.raises(Exception, match=r"MLPStack: layer 2: W must be \[K, N\] with K = the previous width 6"):
        run_op(lib, "MLPStack", [x, w1, b1, w2, b2], {"activations": "relu.relu"})
    w2 = torch.randn(6, 4)
    with pytest.raises(Exception, match="MLPStack: 5 inputs, but the 'activations' attribute names 3 layers"):
        run_op(lib, "MLPStack", [x, w1, b1, w2, b2], {"activations": "relu.relu.relu"})
    with pytest.raises(Exception, match="MLPStack: activation 'gelu' in 'relu.gelu' is not relu or sigmoid"):
        run_op(lib, "MLPStack", [x, w1, b1, w2, b2], {"activations": "relu.gelu"})
    with pytest.raises(Exception, match="MLPStack: missing attribute 'activations'"):
        run_op(lib, "MLPStack", [x, w1, b1, w2, b2])
    out = run_op(lib, "MLPStack", [x, w1, b1, w2, b2], {"activations": "sigmoid.relu"})
    assert_close(out, schema.reference("MLPStack", [x, w1, b1, w2, b2], {"activations": "sigmoid.relu"}), "float",
                 "sigmoid.relu")


def test_backend_attribute_accepted_on_cpu(lib):
    inputs = random_inputs("LinearRelu", (5,), 16, 8, 0, "float", 0)
    for backend in schema.BACKENDS:
        out = run_op(lib, "LinearRelu", inputs, {"backend": backend})
        assert_close(out, schema.reference("LinearRelu", inputs), "float", backend)


def test_bad_backend_fails_session_creation(lib):
    inputs = random_inputs("LinearRelu", (5,), 16, 8, 0, "float", 0)
    with pytest.raises(Exception, match=r"LinearRelu: unknown backend 'gpu' .*expected auto\|cpu\|cuda\|triton"):
        run_op(lib, "LinearRelu", inputs, {"backend": "gpu"})


def test_environment_does_not_choose_kernels(lib, monkeypatch):
    """The node attributes decide; the retired environment knobs are not read (a bogus value changes nothing)."""
    for name in ("ONNXFUSE_BACKEND", "ONNXFUSE_MLP_STACK", "ONNXFUSE_TRITON_SMALL_CFG", "ONNXFUSE_LORA_ONEPASS",
                 "ONNXFUSE_MLP_STACK_CFG"):
        monkeypatch.setenv(name, "bogus")
    for op in ("LinearRelu", "MLPStack"):
        inputs = random_inputs(op, (5,), 16, 8, 0, "float", 0)
        assert_close(run_op(lib, op, inputs, op_attrs(op)), schema.reference(op, inputs, op_attrs(op)), "float", op)


def test_stack_mode_attribute_is_checked(lib):
    inputs = random_inputs("MLPStack", (5,), 16, 8, 0, "float", 0)
    ref = schema.reference("MLPStack", inputs, op_attrs("MLPStack"))
    for mode in schema.STACK_MODES:  # every mode is accepted; the CPU kernel runs the layers either way
        assert_close(run_op(lib, "MLPStack", inputs, {**op_attrs("MLPStack"), "stack_mode": mode}), ref, "float", mode)
    with pytest.raises(Exception, match=r"MLPStack: unknown stack_mode 'one' \(expected auto\|fused\|layers\|grid\)"):
        run_op(lib, "MLPStack", inputs, {**op_attrs("MLPStack"), "stack_mode": "one"})


# ------------------------------------------------------------------------------------------------ build
def test_build_info_is_json_and_cpu_only(lib):
    info = kernels.build_info(lib)
    json.dumps(info)
    assert info["backends"] == ["cpu"]
    assert info["ort_headers"].startswith("api")
    assert info["cache_key"] == lib.parent.name


def test_build_is_cached(lib):
    again = kernels.build(backends=["cpu"], quiet=True)
    assert again.cached and again.path == lib and again.backends == ["cpu"]


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils nm")
def test_exports_only_the_entry_points(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    symbols = sorted(line.split()[-1] for line in out.splitlines() if line.strip())
    assert symbols == ["RegisterCustomOps", "onnxfuse_build_info", "onnxfuse_host_info"], symbols


def test_header_discovery_honours_ort_include_dir(lib, monkeypatch, tmp_path):
    good, _ = kbuild.find_ort_headers(fetch=False)
    copy = tmp_path / "include"
    shutil.copytree(good, copy)
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(copy))
    monkeypatch.setenv("ONNXFUSE_BUILD_DIR", str(tmp_path / "cache"))
    found, source = kbuild.find_ort_headers(fetch=False)
    assert found == copy and "ORT_INCLUDE_DIR" in source
    # a later shell without the variable finds the same headers (the cache keeps a copy), so the same cache key
    # and the library built with them
    monkeypatch.delenv("ORT_INCLUDE_DIR")
    toolchain = importlib.import_module("onnxfuse.kernels.toolchain")
    again, source = kbuild.find_ort_headers(fetch=False)
    assert again.parent == tmp_path / "cache" and "earlier ORT_INCLUDE_DIR" in source
    assert toolchain.headers_digest(again) == toolchain.headers_digest(copy)


def test_header_discovery_bad_dir_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(tmp_path))
    with pytest.raises(kbuild.BuildError, match="ORT_INCLUDE_DIR=.*onnxruntime_lite_custom_op.h"):
        kbuild.find_ort_headers(fetch=False)


def test_no_headers_anywhere_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("ORT_INCLUDE_DIR", raising=False)
    monkeypatch.setenv("ONNXFUSE_BUILD_DIR", str(tmp_path))
    if importlib.import_module("onnxfuse.kernels.toolchain").has_headers(pathlib.Path("/usr/include/onnxruntime")):
        pytest.skip("system headers installed")
    with pytest.raises(kbuild.BuildError, match="set ORT_INCLUDE_DIR"):
        kbuild.find_ort_headers(fetch=False)


def test_unknown_backend_and_arch_rejected():
    with pytest.raises(kbuild.BuildError, match="unknown backend"):
        kbuild.build(backends=["cpu", "metal"], quiet=True)
    with pytest.raises(kbuild.BuildError, match="bad CUDA arch"):
        kbuild.parse_archs("90,hopper")
    assert kbuild.parse_archs("sm_80;90") == ["80", "90"]


def test_onednn_discovery(monkeypatch, tmp_path):
    """ONNXFUSE_ONEDNN_ROOT=off builds with the built-in GEMM (a note says so); a prefix without oneDNN is a loud
    error naming the fix; otherwise the installed packages are found, and the build info says which GEMM runs."""
    monkeypatch.setenv("ONNXFUSE_ONEDNN_ROOT", "off")
    assert kbuild.find_onednn() == (None, "disabled by ONNXFUSE_ONEDNN_ROOT=off")
    p = kbuild.plan(backends=["cpu"], fetch_headers=False)
    assert p.cpu_gemm.startswith("builtin") and any("oneDNN not found" in n for n in p.notes)
    monkeypatch.setenv("ONNXFUSE_ONEDNN_ROOT", str(tmp_path))
    with pytest.raises(kbuild.BuildError, match="ONNXFUSE_ONEDNN_ROOT=.*pip install 'onnxfuse\\[cpu\\]'"):
        kbuild.find_onednn()
    monkeypatch.delenv("ONNXFUSE_ONEDNN_ROOT")
    found, why = kbuild.find_onednn()
    if found is None:
        pytest.skip(f"oneDNN packages not installed: {why}")
    assert (found.include_dir / "oneapi/dnnl/dnnl.hpp").is_file() and found.lib.name.startswith("libdnnl.so.3")


def test_build_info_names_the_cpu_gemm(lib):
    info = kernels.build_info(lib)
    assert info["cpu_gemm"].startswith(("onednn ", "builtin ("))
