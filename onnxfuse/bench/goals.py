"""The benchmark goals and their evaluation on a results dict.

GOALS: each a case, a size, a ratio of the case's "ratios", the threshold it must reach and the sentence the table
prints; SAME_SHAPES_AS: the cases compared with another case's fused time. evaluate_goals gives each case's rows
(pass | miss | unmeasured | n/a), cross_case_ratios the ratios between cases of the same shapes, goals_failed what
fails --check-goals.
"""
from __future__ import annotations

import dataclasses

from .cases import CASES
from .ratios import best
from .variants import FUSED_GPU


@dataclasses.dataclass(frozen=True)
class Goal:
    """One goal: the case's ratio `metric` at `size` must be >= `threshold`; `text` says it in words."""
    case: str            # a case name, or "*" for every case that has a fused model
    size: int | None     # tokens / batch the goal is stated at; None: any size
    metric: str          # a key of the case's "ratios"
    threshold: float     # goal: ratio >= threshold
    text: str


# Issue 7's goals (fp16 on the GPU, the issue's sizes). Ratios are speedups: baseline median / fused median.
GOALS: tuple[Goal, ...] = (
    Goal("llama-mlp", 2048, "fused_vs_unfused", 1.04, "Llama MLP h4096/i11008, 2048 tokens: fused ORT >= 1.04x unfused ORT"),
    Goal("llama-mlp", 16, "fused_vs_unfused", 1.5, "Llama MLP h4096/i11008, 16 tokens: fused ORT >= 1.5x unfused ORT"),
    Goal("seed-mlp", 2048, "fused_vs_unfused", 1.4, "Llama MLP h1024/i11008, 2048 tokens: fused ORT >= 1.4x unfused ORT"),
    Goal("lora-linear", 2048, "fused_vs_unfused", 1.8, "LoRA linear 4096^2 r16 + relu, 2048 tokens: fused >= 1.8x unfused"),
    Goal("dlrm", 128, "fused_vs_unfused", 2.0, "whole DLRM, batch 128: fused >= 2x unfused"),
    Goal("dlrm", 2048, "fused_vs_unfused", 1.5, "whole DLRM, batch 2048: fused >= 1.5x unfused"),
    Goal("llama-7b", 2048, "fused_vs_ort_optimized", 1.15,
         "Llama-2-7B shapes, 1 layer, 1x2048 tokens: fused >= 1.15x ORT-optimized (ORT's own fusions)"),
    Goal("llama-7b", 2048, "fused_vs_unfused", 1.75, "Llama-2-7B shapes, 1 layer, 1x2048 tokens: fused >= 1.75x unfused"),
    Goal("llama", 2048, "fused_vs_ort_optimized", 1.25,
         "seed Llama, 1 layer, 2x1024 tokens: fused >= 1.25x ORT-optimized (ORT's own fusions)"),
    Goal("dlrm-bottom", 128, "unfused_over_fused_above_floor", 3.0,
         "DLRM bottom MLP, batch 128: fused time above the ORT floor <= 1/3 of unfused"),
    Goal("dlrm-bottom", 2048, "unfused_over_fused_above_floor", 3.0,
         "DLRM bottom MLP, batch 2048: fused time above the ORT floor <= 1/3 of unfused"),
    Goal("dlrm-top", 128, "unfused_over_fused_above_floor", 3.0,
         "DLRM top MLP, batch 128: fused time above the ORT floor <= 1/3 of unfused"),
    Goal("dlrm-top", 2048, "unfused_over_fused_above_floor", 3.0,
         "DLRM top MLP, batch 2048: fused time above the ORT floor <= 1/3 of unfused"),
    Goal("dlrm", 128, "kernel_us_goal", 1.0, "whole DLRM, batch 128: GPU kernel time per run <= 30 us (--profile)"),
    Goal("llama-mlp", 2048, "gemms_over_fused", 1.0, "Llama MLP, 2048 tokens: fused MLP no slower than its GEMMs alone"),
    Goal("llama-mlp", 2048, "roofline_pct", 85.0, "Llama MLP, 2048 tokens: >= 85% of the GEMM peak of the same run"),
    Goal("llama-mlp", 16, "roofline_pct", 85.0, "Llama MLP, 16 tokens: >= 85% of the bandwidth of the same run"),
    Goal("lora-linear", 2048, "gemms_over_fused", round(1 / 1.15, 4),
         "LoRA linear, 2048 tokens: <= 1.15x the time of the base GEMM alone"),
    Goal("*", None, "fused_vs_compile", 1.0, "every fused case at least as fast as torch.compile"),
    # Issue 15: the gated-MLP family at the SwiGLU kernel's speed (same shapes, same run; see SAME_SHAPES_AS).
    *(Goal(case, size, "fused_vs_llama_mlp", round(1 / 1.05, 4),
           f"{what}, {size} tokens: fused within 5% of the fused Llama MLP (same shapes, same run)")
      for case, what in (("geglu-mlp", "GeGLU MLP h4096/i11008"), ("phi3-mlp", "Phi-3 MLP (merged gate_up) "
                                                                              "h4096/i11008"))
      for size in (2048, 16)),
)
# Cases whose fused op should run at the speed of another case's (same GEMM shapes; only the activation or the
# projections' spelling differ): ratio `fused_vs_<other>` = other's best fused median / this case's, computed when
# both ran in the same run (cross_case_ratios).
SAME_SHAPES_AS = {"geglu-mlp": "llama-mlp", "phi3-mlp": "llama-mlp"}


def goal_applies(goal: Goal, case: dict, run: dict) -> str | None:
    """None if the goal applies to this case result; else why not (the goals are GPU fp16 targets at the issue's
    sizes)."""
    if goal.case != "*" and goal.case != case["case"]:
        return "other case"
    if goal.size is not None and goal.size != case.get("size"):
        return "other size"
    if goal.case == "*" and case["case"] not in CASES:
        return "other case"
    if run.get("device_type") != "cuda":
        return "goals are GPU targets"
    if run.get("dtype") != "fp16":
        return "goals are fp16 targets"
    if case.get("quick"):
        return "shrunk sizes (--quick)"
    return None


def evaluate_goals(case: dict, run: dict, goals=GOALS) -> list[dict]:
    """Goal rows for one case result: status pass | miss | unmeasured (applies, but a variant is missing) | n/a."""
    rows = []
    for g in goals:
        why = goal_applies(g, case, run)
        if why in ("other case", "other size"):
            continue
        row = {"goal": g.text, "case": case["case"], "size": case.get("size"), "metric": g.metric,
               "threshold": g.threshold}
        value = (case.get("ratios") or {}).get(g.metric)
        row["value"] = None if value is None else round(float(value), 4)
        if why is None and value is None and g.metric.startswith("fused_vs_") and g.metric not in \
                ("fused_vs_unfused", "fused_vs_compile", "fused_vs_ort_optimized"):
            why = f"needs case {SAME_SHAPES_AS.get(case['case'], '?')} at the same size in the same run"
        if why is not None:
            row.update(status="n/a", reason=why)
        elif value is None:
            row.update(status="unmeasured", reason=f"{g.metric} could not be computed (a variant was skipped or failed)")
        else:
            row["status"] = "pass" if value >= g.threshold else "miss"
        rows.append(row)
    return rows


def cross_case_ratios(result: dict) -> None:
    """For the cases of SAME_SHAPES_AS: `fused_vs_<other>` = the other case's best fused median over this case's, at
    the same size in the same run (None when the other case did not run); goals re-evaluated."""
    by_key = {(c.get("case"), c.get("size")): c for c in result.get("cases", [])}
    for c in result.get("cases", []):
        other = SAME_SHAPES_AS.get(c.get("case"))
        if other is None:
            continue
        ref = by_key.get((other, c.get("size")))
        names = FUSED_GPU + ("fused-cpu",)
        mine = best(c.get("variants", {}), names)[1]
        theirs = best(ref.get("variants", {}), names)[1] if ref else None
        c.setdefault("ratios", {})[f"fused_vs_{other.replace('-', '_')}"] = \
            None if mine is None or theirs is None else round(theirs / mine, 4)
        c["goals"] = evaluate_goals(c, result)


def goals_failed(result: dict) -> list[dict]:
    """Goal rows that fail --check-goals: misses, and goals that apply but could not be measured."""
    return [g for c in result["cases"] for g in c.get("goals", []) if g["status"] in ("miss", "unmeasured")]
