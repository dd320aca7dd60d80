"""The benchmark goals and their evaluation on a results dict.

The goals are data: goals.json beside this module (each a case, a size, a ratio of the case's "ratios", the
threshold it must reach and the sentence the table prints; and SAME_SHAPES_AS, the cases compared with another
case's fused time). evaluate_goals gives each case's rows (pass | miss | unmeasured | n/a), cross_case_ratios the
ratios between cases of the same shapes, goals_failed what fails --check-goals.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

from .cases import CASES
from .ratios import best
from .variants import FUSED_GPU

GOALS_FILE = pathlib.Path(__file__).with_name("goals.json")


@dataclasses.dataclass(frozen=True)
class Goal:
    """One goal: the case's ratio `metric` at `size` must be >= `threshold`; `text` says it in words."""
    case: str            # a case name, or "*" for every case that has a fused model
    size: int | None     # tokens / batch the goal is stated at; None: any size
    metric: str          # a key of the case's "ratios"
    threshold: float     # goal: ratio >= threshold
    text: str


def load_goals(path: str | pathlib.Path = GOALS_FILE) -> tuple[tuple[Goal, ...], dict[str, str]]:
    """The goals of a goals file (default goals.json here), in file order, and its same_shapes_as cases."""
    data = json.loads(pathlib.Path(path).read_text())
    fields = [f.name for f in dataclasses.fields(Goal)]
    goals = tuple(Goal(**{k: g[k] for k in fields}) for group in data["groups"] for g in group["goals"])
    return goals, dict(data["same_shapes_as"]["cases"])


# GPU fp16 targets at the issues' sizes (goals.json says which issue set each). Ratios are speedups: baseline median /
# fused median. SAME_SHAPES_AS: cases whose fused op should run at the speed of another case's (same GEMM shapes;
# only the activation or the projections' spelling differ): ratio `fused_vs_<other>` = other's best fused median /
# this case's, computed when both ran in the same run (cross_case_ratios).
GOALS, SAME_SHAPES_AS = load_goals()


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
            row.update(status="unmeasured",
                       reason=f"{g.metric} could not be computed (a variant was skipped or failed)")
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
