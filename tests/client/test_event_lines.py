"""Events as one short line each (no server needed)."""

from __future__ import annotations

from rich.text import Text

from amptrain.client.event_lines import event_line


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
    assert "precision_fallback step 3 fp16 -> bf16, fp16 became unhealthy at step 3" in line
    assert len(Text.from_markup(event_line(ev, width=80)).plain) <= 80


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
