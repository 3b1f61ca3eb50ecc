"""The verdict's reasons read as the numbers they judge, however small the difference."""

from __future__ import annotations

from typing import Any

from amptrain.store import accuracy


def arm(precision: str, accuracy_value: float, eval_loss: float) -> dict[str, Any]:
    return {
        "precision": precision,
        "status": "succeeded",
        "eval": {"accuracy": accuracy_value, "eval_loss": eval_loss},
    }


def test_a_tiny_eval_loss_difference_is_not_printed_as_zero() -> None:
    base = arm("fp32", 0.9638, 0.125914)
    fp16 = arm("fp16", 0.9638, 0.125946)  # 0.025% more eval loss
    fp16["eval_diff"] = accuracy.differences(fp16, base)
    strict = accuracy.verdict(fp16, base, {"accuracy_points": 0, "eval_loss_relative": 0})
    assert strict["kept_accuracy"] is False
    assert strict["reasons"][1] == "eval loss +0.0254% vs fp32 (beyond +0%)"
    default = accuracy.verdict(fp16, base, accuracy.DEFAULT_TOLERANCE)
    assert default["kept_accuracy"] is True
    assert default["reasons"] == [
        "accuracy +0.00 points vs fp32 (within -0.5)",
        "eval loss +0.0254% vs fp32 (within +2%)",
    ]


def test_a_non_finite_eval_loss_is_not_kept_whatever_the_accuracy() -> None:
    base = arm("fp32", 0.9638, 0.125914)
    fp16: dict[str, Any] = {
        "precision": "fp16",
        "status": "succeeded",
        # A NaN eval loss is stored as null (amptrain.contract.jsonsafe).
        "eval": {"accuracy": 0.9640, "eval_loss": None},
    }
    fp16["eval_diff"] = accuracy.differences(fp16, base)
    result = accuracy.verdict(fp16, base, accuracy.DEFAULT_TOLERANCE)
    assert result["kept_accuracy"] is False
    assert result["reasons"][0] == "eval_loss is not finite (NaN or infinite) in fp16"
    assert "accuracy +0.02 points vs fp32 (within -0.5)" in result["reasons"]
    infinite = arm("bf16", 0.9638, float("inf"))
    infinite["eval_diff"] = accuracy.differences(infinite, base)
    assert accuracy.verdict(infinite, base, accuracy.DEFAULT_TOLERANCE)["kept_accuracy"] is False


def test_a_succeeded_run_whose_last_evaluation_is_not_recorded_yet_gets_no_verdict() -> None:
    """The worker marks a job succeeded while its last points are still on their way to
    the recorder: a mid-run evaluation (worse) must not be judged as the final one."""
    base = {
        "precision": "fp32",
        "status": "succeeded",
        **accuracy.final_eval(
            {"step": 50, "values": {"accuracy": 0.93, "eval_loss": 0.30}}, due_at=50
        ),
    }
    fp16 = {
        "precision": "fp16",
        "status": "succeeded",
        **accuracy.final_eval(
            {"step": 25, "values": {"accuracy": 0.4575, "eval_loss": 0.165}}, due_at=50
        ),
    }
    fp16["eval_diff"] = accuracy.differences(fp16, base)
    assert fp16["eval_pending"] and not base["eval_pending"]
    waiting = accuracy.verdict(fp16, base, accuracy.DEFAULT_TOLERANCE)
    assert waiting == {
        "kept_accuracy": None,
        "reasons": ["fp16's final evaluation is not recorded yet"],
    }
    # Recorded: judged. A run that evaluates only mid-run (no evaluation due at the end) is
    # judged by its newest one.
    fp16.update(accuracy.final_eval({"step": 50, "values": {"accuracy": 0.915}}, due_at=50))
    assert accuracy.verdict(fp16, base, accuracy.DEFAULT_TOLERANCE)["kept_accuracy"] is False
    fp16.update(accuracy.final_eval({"step": 25, "values": {"accuracy": 0.93}}, due_at=None))
    fp16["eval_diff"] = accuracy.differences(fp16, base)
    assert accuracy.verdict(fp16, base, accuracy.DEFAULT_TOLERANCE)["kept_accuracy"] is True
