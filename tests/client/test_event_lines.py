"""Events as one short line each (no server needed)."""

from __future__ import annotations

from typing import Any

import pytest
from rich.text import Text

from amptrain.client.event_lines import collapsed, event_line


def test_a_precision_fallback_reads_as_one_line_naming_both_precisions_and_why() -> None:
    message = (
        "fp16 became unhealthy at step 3: the loss was non-finite for 3 consecutive steps; "
        "falling back to bf16 from the newest healthy checkpoint (step 20)"
    )
    ev = {
        "type": "precision_fallback",
        "step": 3,
        "time": 1_700_000_000,
        "data": {"from": "fp16", "to": "bf16", "trigger": "nonfinite_loss", "message": message},
    }
    line = Text.from_markup(event_line(ev)).plain
    assert "precision_fallback step 3 fp16 -> bf16, fp16 became unhealthy: the loss" in line
    assert line.count("step 3") == 1 and "(step 20)" in line  # another step's number stays
    assert_wrapped(event_line(ev, width=80), line)


def assert_wrapped(markup: str, whole: str) -> None:
    """Every line fits 80 columns, continuation lines are indented under the type, and
    nothing was cut: the words are the one-line version's."""
    lines = Text.from_markup(markup).plain.splitlines()
    assert len(lines) > 1 and all(len(x) <= 80 for x in lines), lines
    assert all(x.startswith(" " * 9) and x[9] != " " for x in lines[1:]), lines
    assert "…" not in markup and " ".join(x.strip() for x in lines) == whole


@pytest.mark.parametrize(
    ("ev", "shown"),
    [
        (
            {"type": "warning", "step": 1, "data": {"message": "step 1 skipped for inf/NaN gradients: the first non-finite gradient was net.0.weight (inf)"}},
            "warning step 1 skipped for inf/NaN gradients: the first non-finite",
        ),
        (
            {"type": "requeued", "step": 3, "data": {"error": {"code": "precision_fallback", "message": "fp16 became unhealthy at step 3: the loss was non-finite for 3 consecutive steps"}}},
            "requeued step 3 precision_fallback: fp16 became unhealthy: the loss was",
        ),
        (
            {"type": "failed", "step": 32, "data": {"error": {"code": "diverged", "message": "diverged at step 32: the fp16 loss scale fell to 3.05e-05, below the floor 6.1e-05, so gradients overflow"}}},
            "failed step 32 diverged: the fp16 loss scale fell to 3.05e-05, below",
        ),
    ],
)  # fmt: skip
def test_the_step_is_said_once_and_a_long_reason_wraps_instead_of_being_cut(
    ev: dict[str, Any], shown: str
) -> None:
    ev = {**ev, "time": 1_700_000_000}
    whole = Text.from_markup(event_line(ev)).plain
    assert whole.count(f"step {ev['step']}") == 1, whole
    assert_wrapped(event_line(ev, width=80), whole)
    assert Text.from_markup(event_line(ev, width=80)).plain.splitlines()[0].endswith(shown)


def test_a_weights_event_says_what_was_loaded_and_what_was_left_out() -> None:
    data = {
        "path": "base.safetensors",
        "loaded": 4,
        "strict": False,
        "cast_from": ["float16"],
        "shape": {"net.9.weight": [[10, 16], [4, 16]], "net.9.bias": [[10], [4]]},
        "shape_count": 2,
    }
    ev = {"type": "weights", "step": 0, "time": 1_700_000_000, "data": data}
    line = Text.from_markup(event_line(ev)).plain
    assert line.endswith(
        "weights 4 tensors from base.safetensors (cast from float16); left out: 2 reshaped"
    )


def test_a_job_waiting_for_its_nodes_prints_the_reason() -> None:
    message = "needs 2 workers with a free cpu slot (queue cpu); 1 has one; waited 60 s"
    ev = {
        "type": "waiting_for_nodes",
        "step": 0,
        "time": 1_700_000_000,
        "data": {"message": message, "nodes": 2, "available": 1, "queue": "cpu"},
    }
    line = Text.from_markup(event_line(ev)).plain
    assert line.endswith(f"waiting_for_nodes {message}")


def test_a_run_of_skipped_steps_reads_as_one_line() -> None:
    """30 fp16 overflows in a row were 30 (wrapped: 60) lines of `logs` saying one thing."""
    data = {"code": "gradient_overflow", "param": "net.9.weight", "norm": "nan"}
    skipped = [
        {"type": "warning", "step": i, "time": 1_700_000_000 + i, "data": {**data, "message": f"step {i} skipped"}}
        for i in range(1, 31)
    ]  # fmt: skip
    started = {"type": "started", "step": 0, "time": 1_700_000_000, "data": {"attempt": 1}}
    other = {"type": "warning", "step": 31, "time": 1_700_000_100, "data": {"message": "slow"}}
    shown = [Text.from_markup(event_line(ev)).plain for ev in collapsed([started, *skipped, other])]
    assert len(shown) == 3, shown
    assert shown[1].endswith(
        "warning 30 steps skipped for inf/NaN gradients (steps 1, 2, 3, …, 28, 29, 30); "
        "the first non-finite gradient: net.9.weight (nan)"
    )
    assert shown[2].endswith("warning step 31 slow")
