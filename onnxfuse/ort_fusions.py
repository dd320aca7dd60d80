"""Stage 1 of `onnxfuse fuse`: onnxruntime's own transformer fusions, before onnxfuse's rules.

These are the fusions of `onnxscript.rewriter.ort_fusions.optimize_for_ort` (onnxscript is pinned: its module
paths move between releases, and this is the only onnxfuse module that imports them): RMSNorm and SkipRMSNorm,
rotary embeddings, SDPA into com.microsoft MultiHeadAttention / GroupQueryAttention, GELU forms, FusedMatMul, ...
They turn the ~60 small ops of a decoder layer's attention and norms into a handful of onnxruntime contrib ops (the
1.55x a Llama-2-7B layer gains on an H100), and onnxfuse's rules then take the MLP, LoRA and Linear layers they
leave alone.

`apply()` runs them step by step, so that the report names each fusion and its count, and so that one fusion can
be left out: `check()` compares the stage-1 model with the original in onnxruntime (CPU EP, seeded random inputs,
the dtype's tolerance) and, when they differ, `fuse` re-runs stage 1 leaving out each applied fusion in turn and
keeps the first run that passes, saying which fusion it left out.

Two deliberate differences from `optimize_for_ort`: initializers listed among the graph inputs stay inputs (its
RemoveInitializersFromInputsPass would silently turn a value a caller may feed into a constant), and nothing here
clears metadata (the recipe that `verify` needs is model metadata).
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np
import onnx
from onnxscript import ir

from . import testing
from .errors import OnnxfuseError

_MISSING = ("this onnxscript has no ort_fusions API onnxfuse knows ({}); install the pinned version "
            "(pip install 'onnxscript==0.7.2') or pass --no-ort-fusions")


def _core():
    try:
        from onnxscript.rewriter.ort_fusions import _core
        for name in ("_pre_optimize", "fuse_rms_normalization", "fuse_sdpa", "replace_sdpa_by_mha",
                     "ORT_PATTERN_REWRITE_RULES", "_gemm_to_matmul_add", "common_passes", "optimize"):
            getattr(_core, name)
    except (ImportError, AttributeError) as e:
        raise OnnxfuseError(_MISSING.format(e)) from None
    return _core


def _rule_set(rules):
    from onnxscript.rewriter import RewriteRuleSet
    return rules if isinstance(rules, RewriteRuleSet) else RewriteRuleSet(list(rules))


def _steps():
    """(name, function(model, applied so far) -> count) in optimize_for_ort's order. Names are the keys its
    fusion_count uses."""
    c = _core()
    cp = c.common_passes

    def fusion(fn, **kw):
        return lambda m, applied: fn(m, **kw)

    def rules(rs):
        def apply(m, applied):
            count = _rule_set(rs).apply_to_model(m)
            cp.RemoveUnusedNodesPass()(m)
            return count
        return apply

    def cse(m, applied):
        cp.CommonSubexpressionEliminationPass()(m)
        return 0

    def optimizer(m, applied):
        # inline the intermediate fusion functions no later fusion consumed, fold, drop what is unused
        c.optimize(m)
        return 0

    def mha_dependent(fn):
        # optimize_for_ort applies these only when an MHA fusion happened (they refine MHA nodes)
        return lambda m, applied: fn(m) if applied.get("mha1") or applied.get("mha2") else 0

    from onnxscript.rewriter.ort_fusions import fused_matmul_rule_sets, instance_to_group_normalization, softmax

    return [
        ("gemm_to_matmul_add", rules([c._gemm_to_matmul_add.gemm_to_matmul_add_rule])),
        ("erf_gelu", fusion(c.fuse_erfgelu)),
        ("rms_normalization", fusion(c.fuse_rms_normalization)),
        ("skip_layer_normalization", fusion(c.fuse_skip_layer_normalization)),
        ("skip_rms_normalization", fusion(c.fuse_skip_rms_normalization)),
        ("rotary_embedding", fusion(c.fuse_rotary_embedding)),
        ("cos_sin_cache", fusion(c.fuse_cos_sin_cache)),
        ("common_subexpressions", cse),
        ("partial_rotary_embedding", fusion(c.fuse_partial_rotary_embedding)),
        ("sdpa", fusion(c.fuse_sdpa, apply_shape_inference=True)),
        ("gqa", fusion(c.fuse_gqa)),
        ("packed_qkv_for_gqa", fusion(c.fuse_qkv_gqa)),
        ("mha1", fusion(c.fuse_mha1)),
        ("mha2", fusion(c.fuse_mha2)),
        ("mha_scale", fusion(c.fuse_mha_scale)),
        ("mha_bias", mha_dependent(c.fuse_mha_bias)),
        ("attention", mha_dependent(c.fuse_attention)),
        ("gelu", fusion(c.fuse_gelu)),
        ("bias_gelu", fusion(c.fuse_bias_gelu)),
        ("sdpa_via_mha", fusion(c.replace_sdpa_by_mha)),
        ("optimizer", optimizer),
        ("softmax", rules(softmax.rules)),
        ("instance_to_group_normalization", rules(instance_to_group_normalization.rules)),
        ("fused_matmul", rules(fused_matmul_rule_sets.fused_matmul_rule_sets())),
    ]


# Steps that rewrite nothing a user would name as a fusion (they are never reported or left out on their own).
_HOUSEKEEPING = {"common_subexpressions", "optimizer"}


@dataclasses.dataclass
class Stage1:
    """What stage 1 did: fusions applied (name -> count, nonzero only), fusions left out and why, and whether the
    result was checked against the original in onnxruntime (and, if not, why not)."""
    applied: dict[str, int]
    left_out: list[dict]
    checked: bool
    note: str = ""
    # fusions that matched but whose ops did not survive stage 1: consumed by a later fusion (sdpa into attention)
    # or given back by the final optimizer (rotary without a cos/sin cache); not counted as applied
    intermediate: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _custom_ops(model: ir.Model) -> collections.Counter:
    return collections.Counter((n.domain, n.op_type) for n in model.graph if n.domain not in ("", "ai.onnx"))


def apply(model: ir.Model, skip: set[str] = frozenset()) -> tuple[dict[str, int], dict[str, int]]:
    """Apply onnxruntime's fusions in place (all but `skip`). Returns (applied, intermediate): the count per fusion
    whose ops are in the result (or that rewrote into standard ops), and the count per fusion that matched but whose
    ops were consumed by a later fusion or inlined back by the final optimizer.

    onnxscript's patterns and constant folding read an initializer's value whether or not it is also a graph input,
    so a fusion would bake a default that a caller may override (a GELU's 0.5 or a Pow's exponent into
    com.microsoft Gelu/FastGelu). While the fusions run, those initializers show no value: to them they are inputs."""
    c = _core()
    hidden = {v: v.const_value for v in model.graph.inputs if v.const_value is not None}
    for v in hidden:
        v.const_value = None
    counts: dict[str, int] = {}
    produced: dict[str, set] = {}
    try:
        c._pre_optimize(model)
        for name, fn in _steps():
            if name in skip:
                continue
            before = _custom_ops(model)
            count = fn(model, counts)
            if count and name not in _HOUSEKEEPING:
                counts[name] = int(count)
                after = _custom_ops(model)
                produced[name] = {k for k, v in after.items() if v > before.get(k, 0)}
    finally:
        for v, value in hidden.items():
            v.const_value = value
    # What optimize_for_ort ends with: lift small constants, infer shapes (the com.microsoft ops' outputs keep the
    # types of the values they replace).
    c.common_passes.LiftConstantsToInitializersPass(lift_all_constants=False, size_limit=1)(model)
    c.common_passes.ShapeInferencePass()(model)
    final = _custom_ops(model)
    applied = {n: k for n, k in counts.items() if not produced[n] or produced[n] & final.keys()}
    return applied, {n: k for n, k in counts.items() if n not in applied}


# ----------------------------------------------------------------------------------------------- the numeric check

# The CPU check runs the model twice; past this many MatMul/Gemm FLOPs (about 2 s per run on two cores) it is left
# to `onnxfuse verify`, which checks the final model against PyTorch anyway.
CHECK_FLOP_LIMIT = 4e11
CHECK_BYTE_LIMIT = 2 << 30
TOLERANCE = {onnx.TensorProto.FLOAT: 1e-4, onnx.TensorProto.FLOAT16: 1e-2}


def _session(proto: onnx.ModelProto):
    """A CPU session through runtime.session: no kernel library (the models have no onnxfuse nodes), fatal errors
    only in the log, and onnxruntime's own graph optimisations off (they would only cost session time here: both
    models run as written)."""
    from . import runtime
    so = runtime.ort().SessionOptions()
    so.log_severity_level = 4
    return runtime.session(proto, "cpu", library=False, graph_optimization=False, sess_options=so)


def _feeds(sess, seed: int = 0) -> dict[str, np.ndarray]:
    from .runtime import random_feeds
    feeds = random_feeds(sess, seed)
    for arg in sess.get_inputs():  # integer inputs (token ids, masks, categorical ids) stay small and valid
        if np.issubdtype(feeds[arg.name].dtype, np.integer):
            feeds[arg.name] = np.random.default_rng(seed).integers(0, 2 if "mask" in arg.name else 64,
                                                                  size=feeds[arg.name].shape).astype(feeds[arg.name].dtype)
    return feeds


def _override_initializers(source: onnx.ModelProto, sess, feeds: dict) -> dict | None:
    """`feeds` plus a new value for every float initializer that is also a graph input (a default a caller may
    override), or None when the model has none. A fusion that baked such a default into a constant (onnxscript's
    patterns match an initializer whether or not it is also an input) gives other outputs for these feeds. The new
    value doubles the default (1 where it is 0), so integral defaults stay integral (an exponent 3 becomes 6, not a
    power that makes negative bases NaN)."""
    names = {arg.name for arg in sess.get_overridable_initializers()}
    if not names:
        return None
    from onnx import numpy_helper
    out = dict(feeds)
    for init in source.graph.initializer:
        if init.name in names:
            value = numpy_helper.to_array(init)
            if np.issubdtype(value.dtype, np.floating):
                out[init.name] = np.where(value != 0, value * 2, 1).astype(value.dtype)
    return out if len(out) > len(feeds) else None


def reference(source: onnx.ModelProto) -> tuple[list, list] | str:
    """The original model's outputs on seeded inputs (and, where it has initializers that are also graph inputs, on
    inputs that override them too), or why the check cannot run: ([feeds, ...], [outputs, ...])."""
    elem = {o.type.tensor_type.elem_type for o in source.graph.output}
    if not elem <= set(TOLERANCE):
        return "outputs are not float32/float16 (onnxruntime's CPU provider cannot run this model's type)"
    if source.ByteSize() > CHECK_BYTE_LIMIT:
        return "the model is too large for a CPU check"
    from .flops import model_flops
    flops = model_flops(ir.serde.deserialize_model(source))
    if flops is not None and flops > CHECK_FLOP_LIMIT:
        return f"the model's {flops / 1e9:.0f} GFLOP are too many for a CPU check"
    try:
        sess = _session(source)
        feeds = [_feeds(sess)]
        overridden = _override_initializers(source, sess, feeds[0])
        outputs = [sess.run(None, feeds[0])]
        if overridden is not None:
            out = sess.run(None, overridden)
            if all(np.isfinite(np.asarray(o, np.float64)).all() for o in out):  # a value the model can take
                feeds.append(overridden)
                outputs.append(out)
        return feeds, outputs
    except Exception as e:  # the CPU provider lacks a kernel for this model, say
        return f"onnxruntime's CPU provider cannot run the model ({str(e).splitlines()[0][:160]})"


def compare(candidate: onnx.ModelProto, feeds: list, refs: list) -> str | None:
    """None when `candidate` gives the reference outputs for every feed within the dtype's tolerance; else what
    differs."""
    try:
        sess = _session(candidate)
    except Exception as e:
        return f"onnxruntime cannot run it ({str(e).splitlines()[0][:160]})"
    for i, (f, ref) in enumerate(zip(feeds, refs)):
        diff = _compare_one(sess, candidate, f, ref)
        if diff is not None:
            return diff + (" with the overridable initializers fed new values" if i else "")
    return None


def _compare_one(sess, candidate: onnx.ModelProto, feeds: dict, ref: list) -> str | None:
    try:
        out = sess.run(None, feeds)
    except Exception as e:
        return f"onnxruntime cannot run it ({str(e).splitlines()[0][:160]})"
    for o, r, info in zip(out, ref, candidate.graph.output):
        tol = TOLERANCE.get(info.type.tensor_type.elem_type, 1e-2)
        r64, o64 = np.asarray(r, np.float64), np.asarray(o, np.float64)
        if r64.shape != o64.shape:
            return f"output {info.name} has shape {list(o64.shape)}, not {list(r64.shape)}"
        special = testing.special_mismatch(o64, r64)  # NaN and +-Inf where the original has them (weights of NaN)
        if special is not None:
            return f"output {info.name}: {special}"
        finite = np.isfinite(r64)
        scale = max(float(np.max(np.abs(r64[finite]), initial=0.0)), 1e-30)
        err = float(np.max(np.abs(o64[finite] - r64[finite]), initial=0.0)) / scale
        if not np.isfinite(err) or err > tol:
            return f"output {info.name} differs by {err:.2e} (max |d| / max |ref|; tolerance {tol:g})"
    return None
