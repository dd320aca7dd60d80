"""Old opsets are upgraded, not refused: a model whose default-domain opset is below what the selected rules' ops need
(their function bodies' `min_opset`, onnxfuse/ops/) is converted with onnx's version converter to UPGRADE_TO before
the stages run, checked against the original in onnxruntime as stage 1 is (seeded inputs, the dtype's tolerance), and
fused from there. A model the converter cannot convert, or whose converted form computes something else, is left as
it was, and the reason is reported (fuse --explain prints it). `fuse --keep-opset` skips this.
"""
from __future__ import annotations

import dataclasses

import onnx

from . import ort_fusions, soundness
from .rewrites import _base

# The opset old models are converted to: the one the torch exporter writes and stage 1's fusions are written for.
UPGRADE_TO = 18


@dataclasses.dataclass
class Upgrade:
    """What happened to an old opset: `source` the model's, `target` what it was converted to (None: left as it
    was), `checked` whether the converted model was compared with the original, `reason` why it was left as it was
    or why it was not checked ('' when converted and checked)."""
    source: int
    target: int | None
    checked: bool
    reason: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def line(self) -> str:
        """One line for the CLI."""
        if self.target is None:
            return f"opset {self.source} kept: {self.reason}"
        check = ("checked against the original in onnxruntime" if self.checked else self.reason)
        return f"opset {self.source} -> {self.target} (onnx's version converter; {check})"


def model_opset(proto: onnx.ModelProto) -> int | None:
    """The model's default-domain (ai.onnx) opset, None when it imports none."""
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)


def needed_opset(patterns: list[str]) -> int:
    """The lowest opset in which every op of the given pattern families has its function body."""
    from .ops import FAMILIES
    ops = [op.name for family in FAMILIES if family.name in patterns for op in family.ops]
    return max((_base.MIN_OPSET[op] for op in ops), default=0)


def upgrade(proto: onnx.ModelProto) -> tuple[onnx.ModelProto | None, Upgrade]:
    """`proto` (weights loaded) converted to UPGRADE_TO and checked against itself in onnxruntime: (the converted
    model, what happened), or (None, why it stays as it was)."""
    source = model_opset(proto) or 0
    try:
        from onnx import version_converter
        converted = version_converter.convert_version(proto, UPGRADE_TO)
        # the IR version the new opset needs (an opset-11 export carries IR 6), within what onnxruntime reads
        converted.ir_version = max(converted.ir_version, onnx.helper.find_min_ir_version_for(
            list(converted.opset_import), ignore_unknown=True))
        onnx.checker.check_model(converted)
    except Exception as e:
        return None, Upgrade(source, None, False, f"onnx's version converter cannot convert it to opset {UPGRADE_TO} "
                                                  f"({soundness.first_line(e)[:200]}); the rules that need a newer "
                                                  "opset refuse, as --explain says")
    ref = ort_fusions.reference(proto)
    if isinstance(ref, str):
        return converted, Upgrade(source, UPGRADE_TO, False, f"not checked: {ref}; onnxfuse verify checks the result")
    diff = ort_fusions.compare(converted, *ref)
    if diff is not None:
        return None, Upgrade(source, None, True, f"the model converted to opset {UPGRADE_TO} fails the check against "
                                                 f"the original ({diff}); the rules that need a newer opset refuse")
    return converted, Upgrade(source, UPGRADE_TO, True)
