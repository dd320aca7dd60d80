"""The soundness gate: what `onnxfuse fuse` proves about a rewritten model before it writes it.

1. onnx.checker's full check passes (it runs strict shape inference, which also types every onnxfuse node through
   its model-local function body and fails where that disagrees with the shapes recorded in the graph);
2. the graph outputs keep their signature: names and order, element types, ranks and static dims, as shape
   inference gives them for the input model and for the fused one;
3. onnxruntime loads it (CPU EP, no kernel library, so the function bodies are what is loaded).

Any failure raises `OnnxfuseError` with one line, and `fuse` writes nothing. When the input model itself fails the
same check, the message says so (onnxfuse only writes models it can check). Step 3 is skipped past
`ORT_LOAD_LIMIT` bytes of weights (onnxruntime would allocate them; `onnxfuse verify` loads the model anyway) and
where onnxruntime's CPU provider cannot load the input model either (bfloat16 models, say).

All three run on a *skeleton* of the model: the same graph, functions and small tensors, with every large tensor
pointing into a sparse file of zeros. Types, shapes and loading do not depend on weight values, so the gate costs
about what the graph costs (0.3 s for a 280 MB Llama layer instead of 6 s), whatever the size of the weights.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import numpy as np
import onnx

from .errors import OnnxfuseError

ORT_LOAD_LIMIT = 4 << 30
_SMALL = 4096  # tensors up to this many bytes stay in the skeleton (shape inputs and scalars that inference reads)
_BUG = "nothing was written; this is an onnxfuse bug: narrow it with --patterns and report it"


def first_line(e: Exception) -> str:
    text = str(e).strip() or type(e).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # onnx's C++ errors start with a generic line ("[ShapeInferenceError] Inference error(s): "): keep the detail
    return " ".join(lines[:3])[:400]


def _copy_except(dst, src, skip: set[str]) -> None:
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if field.is_repeated:
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


class Skeleton:
    """`model` written into a temporary folder with its large tensors in a sparse file of zeros (a context
    manager). `.path` is the model file onnxruntime loads; `.proto` and `.checked_path` are the same with ops ONNX
    has no schema for made opaque, for the checker and shape inference."""

    def __init__(self, model: onnx.ModelProto | str | os.PathLike):
        self.source = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)

    def __enter__(self) -> "Skeleton":
        src = self.source
        proto = onnx.ModelProto()
        _copy_except(proto, src, {"graph"})
        _copy_except(proto.graph, src.graph, {"initializer"})
        offset = 0
        for t in src.graph.initializer:
            new = proto.graph.initializer.add()
            external = t.data_location == onnx.TensorProto.EXTERNAL
            if not external and t.ByteSize() <= _SMALL:
                new.CopyFrom(t)
                continue
            new.name, new.data_type = t.name, t.data_type
            new.dims.extend(t.dims)
            length = int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            for key, value in (("location", "skeleton.data"), ("offset", str(offset)), ("length", str(length))):
                entry = new.external_data.add()
                entry.key, entry.value = key, value
            new.data_location = onnx.TensorProto.EXTERNAL
            offset += (length + 4095) // 4096 * 4096
        self.weight_bytes = offset
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="onnxfuse-gate-"))
        with open(self.dir / "skeleton.data", "wb") as f:
            f.truncate(offset)  # sparse: no disk space, reads as zeros
        self.path = self.dir / "model.onnx"  # what onnxruntime loads
        onnx.save(proto, str(self.path))
        _opaque_unknown_ops(proto)
        self.proto = proto  # what the checker and shape inference see
        self.checked_path = self.dir / "checked.onnx"
        onnx.save(proto, str(self.checked_path))
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


OPAQUE_DOMAIN = "onnxfuse.unchecked"


def _opaque_unknown_ops(proto: onnx.ModelProto) -> None:
    """Move default-domain ops that ONNX has no schema for into a domain of their own, in the skeleton only.
    onnxruntime registers a few of its contrib ops in the ONNX domain (SimplifiedLayerNormalization, which its own
    RMSNorm fusion emits); onnx.checker would reject them, so they are checked like any custom-domain op: opaque to
    the checker, and loaded by onnxruntime in step 3."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        return
    moved = False

    def visit(nodes):
        nonlocal moved
        for node in nodes:
            if node.domain in ("", "ai.onnx") and not onnx.defs.has(node.op_type, opset, ""):
                node.domain = OPAQUE_DOMAIN
                moved = True
            for attr in node.attribute:
                for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    visit(g.node)

    visit(proto.graph.node)
    for f in proto.functions:
        visit(f.node)
    if moved:
        proto.opset_import.add(domain=OPAQUE_DOMAIN, version=1)
        for f in proto.functions:
            if any(n.domain == OPAQUE_DOMAIN for n in f.node):
                f.opset_import.add(domain=OPAQUE_DOMAIN, version=1)


def _full_check(skeleton: Skeleton) -> None:
    onnx.checker.check_model(str(skeleton.checked_path), full_check=True)


def check_model(model: onnx.ModelProto | str | os.PathLike) -> None:
    """onnx.checker's full check of a fused model, on its skeleton: ops onnxruntime registers in the ONNX domain
    (stage 1's SimplifiedLayerNormalization) are treated like custom-domain ops, which plain onnx.checker rejects.
    Raises onnx's ValidationError / InferenceError like onnx.checker.check_model."""
    with Skeleton(model) as sk:
        _full_check(sk)


def signature(model: onnx.ModelProto, strict: bool) -> list[tuple]:
    """(name, element type, rank or None, dims) of each graph output after shape inference; dims are ints where
    static, None elsewhere."""
    inferred = onnx.shape_inference.infer_shapes(model, check_type=strict, strict_mode=strict)
    out = []
    for o in inferred.graph.output:
        t = o.type.tensor_type
        if not t.HasField("shape"):
            out.append((o.name, t.elem_type, None, None))
            continue
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim)
        out.append((o.name, t.elem_type, len(dims), dims))
    return out


def _describe(sig: tuple) -> str:
    name, et, rank, dims = sig
    t = onnx.helper.tensor_dtype_to_np_dtype(et).name if et else "?"
    shape = "?" if rank is None else "[" + ",".join("?" if d is None else str(d) for d in dims) + "]"
    return f"{name} {t}{shape}"


def compare(before: list[tuple], after: list[tuple]) -> str | None:
    """Why two output signatures differ, or None when the fused one keeps the source's."""
    if [s[0] for s in before] != [s[0] for s in after]:
        return f"graph outputs {[s[0] for s in before]} became {[s[0] for s in after]}"
    for b, a in zip(before, after):
        if b[1] != a[1] or (b[2] is not None and a[2] is not None and b[2] != a[2]) or \
                (b[2] is not None and a[2] is None):
            return f"output {_describe(b)} became {_describe(a)}"
        if b[3] is not None and a[3] is not None and any(x is not None and y is not None and x != y
                                                         for x, y in zip(b[3], a[3])):
            return f"output {_describe(b)} became {_describe(a)}"
    return None


def _ort_loads(path: pathlib.Path) -> str | None:
    """None when onnxruntime's CPU provider loads the model without the kernel library (runtime.session with
    library=False, no graph optimisations, nothing logged); else its error."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    from . import runtime
    so = ort.SessionOptions()
    so.log_severity_level = 4
    try:
        runtime.session(path, "cpu", library=False, graph_optimization=False, sess_options=so)
    except Exception as e:  # OnnxfuseError with onnxruntime's reason
        return first_line(e)
    return None


def source_signature(source: onnx.ModelProto | str | os.PathLike) -> list[tuple]:
    """The input model's output signature (taken before fusing; inference that fails falls back on what the
    graph declares)."""
    with Skeleton(source) as sk:
        try:
            return signature(sk.proto, strict=False)
        except Exception:
            return [(o.name, o.type.tensor_type.elem_type, None, None) for o in sk.proto.graph.output]


def check(fused: onnx.ModelProto | str | os.PathLike, source: str | os.PathLike, before: list[tuple]) -> None:
    """Raise OnnxfuseError (one line) unless `fused` is as sound as `source`, whose output signature is `before`
    (see the module docstring)."""
    source = pathlib.Path(source)
    with Skeleton(fused) as sk:
        try:
            _full_check(sk)
            after = signature(sk.proto, strict=True)
        except Exception as e:  # onnx raises ValidationError / InferenceError / ValueError
            with Skeleton(source) as src:
                try:
                    _full_check(src)
                except Exception as e_src:
                    raise OnnxfuseError(f"{source}: the input model fails onnx.checker's full check "
                                        f"({first_line(e_src)}); onnxfuse only writes models it can check: fix the "
                                        "input model first (soundness gate)") from None
            raise OnnxfuseError(f"soundness gate: the fused model fails onnx.checker ({first_line(e)}); {_BUG}") \
                from None
        diff = compare(before, after)
        if diff is not None:
            raise OnnxfuseError(f"soundness gate: fusing changed the model's outputs ({diff}); {_BUG}")
        if sk.weight_bytes > ORT_LOAD_LIMIT:
            return
        err = _ort_loads(sk.path)
        if err is not None:
            with Skeleton(source) as src:
                if _ort_loads(src.path) is None:
                    raise OnnxfuseError(f"soundness gate: onnxruntime cannot load the fused model ({err}); {_BUG}")
