"""The accuracy verdict of a precision comparison: did each arm keep the fp32 baseline's
held-out quality, within a tolerance?

Per run the final evaluation is the job's newest (``jobs.eval_summary``: for a finished
job, its last). Against the baseline's: ``accuracy_points``, the difference in accuracy
in percentage points (negative: worse), and ``eval_loss_relative``, the relative
difference in eval loss (positive: worse). An arm keeps the accuracy when every
comparable metric is within the tolerance (:data:`DEFAULT_TOLERANCE`, or the request's);
the verdict waits (null) until both runs have succeeded and evaluated. A metric the arm
evaluated to a non-finite value (NaN or infinity, stored as null) means the arm did not
keep the accuracy, whatever its other metrics say.
"""

from __future__ import annotations

import math
from typing import Any

COMPARED = ("accuracy", "eval_loss")
"""The evaluation metrics the verdict compares."""

DEFAULT_TOLERANCE = {"accuracy_points": 0.5, "eval_loss_relative": 0.02}
"""An arm may lose at most half a point of accuracy and have at most 2% more eval loss."""


def final_eval(eval_summary: dict[str, Any] | None, due_at: int | None = None) -> dict[str, Any]:
    """A run's final evaluation as the report shows it: ``eval_step`` and ``eval``; and
    ``eval_pending``, whether the evaluation due after the run's last step (``due_at``: that
    step, for a finished run that evaluates at the end) is not recorded yet. The worker
    marks a job succeeded as soon as its points are on their way to the recorder, so for a
    moment the newest recorded evaluation can still be a mid-run one."""
    step = eval_summary.get("step") if eval_summary else None
    values = dict(eval_summary.get("values") or {}) if eval_summary else None
    pending = due_at is not None and (step is None or step < due_at)
    return {"eval_step": step, "eval": values, "eval_pending": pending}


def differences(run: dict[str, Any], base: dict[str, Any] | None) -> dict[str, float | None]:
    """``accuracy_points`` and ``eval_loss_relative`` of ``run`` against ``base``."""
    mine, theirs = run.get("eval") or {}, (base or {}).get("eval") or {}
    acc, base_acc = mine.get("accuracy"), theirs.get("accuracy")
    loss, base_loss = mine.get("eval_loss"), theirs.get("eval_loss")
    return {
        "accuracy_points": (acc - base_acc) * 100
        if acc is not None and base_acc is not None
        else None,
        "eval_loss_relative": (loss - base_loss) / abs(base_loss)
        if loss is not None and base_loss
        else None,
    }


def verdict(
    run: dict[str, Any], base: dict[str, Any] | None, tolerance: dict[str, float]
) -> dict[str, Any]:
    """``{"kept_accuracy": true | false | null, "reasons": [...]}`` for one arm."""
    if base is None:
        return {"kept_accuracy": None, "reasons": ["no fp32 baseline to compare with"]}
    if run is base:
        return {"kept_accuracy": True, "reasons": ["the fp32 baseline"]}
    waiting = [
        f"{r['precision']} has not {'succeeded' if r['status'] != 'succeeded' else 'evaluated'}"
        for r in (run, base)
        if r["status"] != "succeeded" or not r.get("eval")
    ] or [
        f"{r['precision']}'s final evaluation is not recorded yet"
        for r in (run, base)
        if r.get("eval_pending")
    ]
    if waiting:
        return {"kept_accuracy": None, "reasons": waiting}
    diff = run["eval_diff"]
    reasons, kept = [], True
    for name in non_finite(run["eval"]):
        kept = False
        reasons.append(f"{name} is not finite (NaN or infinite) in {run['precision']}")
    points, allowed = diff["accuracy_points"], tolerance["accuracy_points"]
    if points is not None:
        ok = -points <= allowed
        kept &= ok
        reasons.append(
            f"accuracy {points:+.2f} points vs fp32 ({'within' if ok else 'beyond'} -{allowed:g})"
        )
    relative, allowed = diff["eval_loss_relative"], tolerance["eval_loss_relative"]
    if relative is not None:
        ok = relative <= allowed
        kept &= ok
        # Three significant digits, not one decimal: real arms differ by hundredths of a
        # percent, and "+0.0% (beyond +0.0%)" read as a contradiction.
        reasons.append(
            f"eval loss {relative * 100:+.3g}% vs fp32 "
            f"({'within' if ok else 'beyond'} +{allowed * 100:.3g}%)"
        )
    if not reasons:
        return {"kept_accuracy": None, "reasons": ["no accuracy or eval loss in both runs"]}
    return {"kept_accuracy": kept, "reasons": reasons}


def non_finite(values: dict[str, Any]) -> list[str]:
    """The compared metrics present in ``values`` with a null or non-finite value."""
    return [
        name
        for name in COMPARED
        if name in values
        and not (isinstance(values[name], int | float) and math.isfinite(values[name]))
    ]
