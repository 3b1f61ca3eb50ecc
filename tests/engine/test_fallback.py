"""Precision fallback (``health.fallback``): an unhealthy fp16 attempt ends, leaves its
newest healthy checkpoint as the newest, and the next attempt resumes from it in the
fallback precision."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from amptrain.contract.errors import DivergedError, PrecisionFallbackError, PreemptedError
from amptrain.contract.layout import checkpoint_name
from amptrain.engine import RunContext, Trainer
from amptrain.engine.checkpoint import CheckpointStore
from amptrain.engine.fallback import fallback_target
from amptrain.engine.precision import PrecisionChoice
from tests.engine.test_amp import TinyNet, components, spec
from tests.support.sinks import ListSink

pytestmark = pytest.mark.usefixtures("read_mode")

OVERFLOW_FROM = 7
"""Steps 1-6 train cleanly; from step 7 on, fc2.bias's gradient is inf (the injected fault)."""


def fp16_spec(**health: Any) -> Any:
    return spec(
        precision="fp16",
        max_steps=40,
        loss_scale={"init_scale": 1024, "growth_interval": 1000},
        checkpoint={"every_steps": 2, "keep_last": 2},
        health={"diverge_loss_scale_floor": 0.5, "fallback": "bf16", **health},
    )


def overflowing_trainer(tmp_path: Path, sink: ListSink, **health: Any) -> Trainer:
    trainer = Trainer(
        fp16_spec(**health), RunContext(str(tmp_path), sink=sink, attempt=1), components()
    )
    assert isinstance(trainer.model, TinyNet)
    trainer.model.fc2.bias.register_hook(
        lambda g: torch.full_like(g, math.inf) if trainer.step >= OVERFLOW_FROM - 1 else g
    )
    return trainer


def test_an_unhealthy_fp16_attempt_keeps_its_newest_healthy_checkpoint(tmp_path: Path) -> None:
    sink = ListSink()
    with pytest.raises(PrecisionFallbackError) as info:
        overflowing_trainer(tmp_path, sink).train()
    error = info.value
    # Step 7 overflows at scale 1024, step n at 1024 / 2**(n-7): 0.25 < 0.5 at step 19.
    assert (error.step, error.trigger, error.fallback_to) == (19, "loss_scale_floor", "bf16")
    assert error.param == "fc2.bias"  # the first non-finite gradient in backward order
    # Every checkpoint from step 8 on was written while steps were being skipped; the one of
    # step 6 outlived keep_last 2 because it is the newest healthy one, and is now the newest.
    assert CheckpointStore(str(tmp_path), keep_last=2).steps() == [6]
    (event,) = [e for e in sink.items if e.get("type") == "precision_fallback"]
    assert event["step"] == 19 and event["data"] == {
        "trigger": "loss_scale_floor",
        "trigger_step": 19,
        "from": "fp16",
        "to": "bf16",
        "resume_from": 6,
        "checkpoint": checkpoint_name(6),
        "param": "fc2.bias",
        "message": event["data"]["message"],
    }
    assert "falling back to bf16" in event["data"]["message"]
    assert max(sink.metrics()) == 19  # nothing recorded after the step that triggered it


def test_the_next_attempt_resumes_in_the_fallback_precision(tmp_path: Path) -> None:
    with pytest.raises(PrecisionFallbackError):
        overflowing_trainer(tmp_path, ListSink()).train()
    sink = ListSink()
    ctx = RunContext(str(tmp_path), sink=sink, attempt=2, precision_override="bf16")
    result = Trainer(fp16_spec(), ctx, components()).train()
    assert result.resumed_from == 6 and result.final_step == 40
    assert result.precision.effective == "bf16" and result.precision.requested == "fp16"
    assert "health.fallback" in result.precision.reason
    assert result.skipped_steps == 0
    metrics = sink.metrics()
    assert sorted(metrics) == list(range(7, 41)) and metrics[40]["loss_scale"] is None


def test_more_consecutive_skips_than_allowed_is_a_trigger(tmp_path: Path) -> None:
    with pytest.raises(PrecisionFallbackError) as info:
        overflowing_trainer(tmp_path, ListSink(), max_consecutive_skips=4).train()
    assert (info.value.step, info.value.trigger) == (OVERFLOW_FROM + 4, "consecutive_skips")


def test_without_a_fallback_the_trigger_fails_the_job_naming_the_step(tmp_path: Path) -> None:
    with pytest.raises(DivergedError) as info:
        overflowing_trainer(tmp_path, ListSink(), fallback="none", max_consecutive_skips=4).train()
    assert info.value.step == OVERFLOW_FROM + 4
    assert f"diverged at step {OVERFLOW_FROM + 4}" in info.value.message
    assert "health.fallback" in info.value.message


def test_features_beyond_fp16s_range_trigger_on_the_nonfinite_loss() -> None:
    # 1e6 is finite in bf16 and fp32 but inf in fp16: the loss is non-finite from step 1.
    job = spec(
        precision="fp16",
        max_steps=20,
        dataset={"name": "synthetic-classification", "args": {"feature_scale": 1e6}},
        health={"fallback": "auto"},
    )
    sink = ListSink()
    with pytest.raises(PrecisionFallbackError) as info:
        Trainer(job, RunContext(None, sink=sink)).train()
    assert (info.value.step, info.value.trigger) == (3, "nonfinite_loss")  # diverge_nonfinite_steps
    assert info.value.fallback_to == "bf16"  # a CPU runs bf16 autocast
    (event,) = [e for e in sink.items if e.get("type") == "precision_fallback"]
    assert event["data"]["resume_from"] == 0 and event["data"]["checkpoint"] is None


def _choice(requested: str, effective: str) -> PrecisionChoice:
    return PrecisionChoice(requested, effective, "test", "cpu")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("precision", "fallback", "effective", "target"),
    [
        ("auto", None, "fp16", "bf16"),  # auto chose fp16: it may leave it
        ("fp16", None, "fp16", None),  # asked for fp16 explicitly: it fails as before
        ("fp16", "fp32", "fp16", "fp32"),
        ("auto", "auto", "bf16", None),  # only ever from fp16
    ],
)
def test_the_default_policy_follows_who_chose_fp16(
    precision: str, fallback: str | None, effective: str, target: str | None
) -> None:
    job = spec(precision=precision, health={"fallback": fallback})
    assert fallback_target(job, _choice(precision, effective), torch.device("cpu")) == target


def test_a_fallback_on_a_precision_other_than_fp16_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"health\.fallback 'bf16' needs precision fp16 or auto"):
        spec(precision="fp32", health={"fallback": "bf16"})


def test_the_newest_healthy_checkpoint_outlives_pruning_across_attempts(tmp_path: Path) -> None:
    """Gradients inf from step 3, checkpoints every 2 steps, keep_last 2: attempt 1 is
    preempted at 4 (healthy: step 2; unhealthy: 4). Attempt 2 resumes from the unhealthy 4,
    so nothing in it ever marked step 2 as the one to keep: pruning removed it, and its
    fallback restarted the job from step 0. The keep is decided from every checkpoint's
    sidecar now, whichever attempt wrote it."""

    def attempt(n: int, stop_at: int | None) -> Trainer:
        ref: list[Trainer] = []
        stop = lambda: "preempt" if stop_at is not None and ref[0].step == stop_at else None  # noqa: E731
        ctx = RunContext(str(tmp_path), sink=sinks[n], attempt=n, should_stop=stop)
        trainer = Trainer(fp16_spec(), ctx, components())
        ref.append(trainer)
        assert isinstance(trainer.model, TinyNet)
        trainer.model.fc2.bias.register_hook(
            lambda g: torch.full_like(g, math.inf) if trainer.step >= 2 else g
        )
        return trainer

    sinks = {1: ListSink(), 2: ListSink()}
    with pytest.raises(PreemptedError):
        attempt(1, stop_at=4).train()
    assert CheckpointStore(str(tmp_path)).steps() == [2, 4]
    second = attempt(2, stop_at=None)
    with pytest.raises(PrecisionFallbackError) as info:
        second.train()
    assert second.state.resumed_from == 4
    (event,) = sinks[2].events("precision_fallback")
    assert (event["data"]["resume_from"], event["data"]["checkpoint"]) == (2, checkpoint_name(2))
    assert CheckpointStore(str(tmp_path)).steps() == [2]
    assert max(sinks[2].metrics()) == info.value.step  # nothing after the step that ended it


def test_a_diverged_run_publishes_nothing_after_the_step_it_names() -> None:
    """The loss is NaN from step 10 (diverge_nonfinite_steps 2: diverged at 11), flushes
    every 2 steps. On one GPU the flush of step 12 reads 9-10 and queues 11-12; the run then
    ended at 11 while the flushes after it published 12 too (its history ran past the step
    its error names)."""
    job = spec(precision="fp32", max_steps=40, health={"diverge_nonfinite_steps": 2})
    sink = ListSink()
    trainer = Trainer(job, RunContext(None, sink=sink), components())
    trainer.model.register_forward_hook(
        lambda module, inputs, out: out * math.nan if trainer.step >= 9 else out
    )
    with pytest.raises(DivergedError) as info:
        trainer.train()
    assert info.value.step == 11 and "diverged at step 11" in info.value.message
    assert trainer.publisher.wait_delivered(30)
    steps = [r["step"] for r in sink.items if r["kind"] == "metric"]
    assert steps == list(range(1, 12))
