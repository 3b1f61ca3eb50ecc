"""The guardian's decision table (``guardian.verdict.decide``) and checks, with no model:
records and situations in, one verdict out."""

from __future__ import annotations

import math
from typing import Any

import pytest

from amptrain.contract.spec import HealthSpec
from amptrain.engine.guardian import (
    Continue,
    Diverged,
    FallBack,
    Guardian,
    Reading,
    RollBack,
    Situation,
    sooner,
)
from amptrain.engine.guardian.verdict import SpikePolicy, Trigger, decide
from amptrain.engine.step_records import Spike

WARNING = {"kind": "event", "type": "warning", "step": 3}


def situation(
    at: int = 30,
    rollbacks: int = 0,
    rolled_back_at: int | None = None,
    healthy: tuple[int, ...] = (20,),
) -> Situation:
    newest = lambda step: max((s for s in healthy if s <= step), default=None)  # noqa: E731
    return Situation(at, rollbacks, rolled_back_at, newest)


def table(**kw: Any) -> Any:
    args: dict[str, Any] = {
        "ended": None,
        "trigger": None,
        "spike": None,
        "warnings": (),
        "situation": situation(),
        "fallback_to": None,
        "rollback": SpikePolicy("loss", 2),
    }
    return decide(**{**args, **kw})


FP16_FLOOR = Trigger(19, "loss_scale_floor", "the fp16 loss scale fell", fp16=True)
FP32_NAN = Trigger(11, "nonfinite_loss", "the loss was non-finite (fp32)", fp16=False)


def test_nothing_found_goes_on_and_warnings_go_with_it() -> None:
    assert table() == Continue()
    assert table(warnings=(WARNING,)) == Continue(warnings=(WARNING,))


def test_an_fp16_trigger_falls_back_where_a_fallback_is_set_and_fails_where_not() -> None:
    verdict = table(trigger=FP16_FLOOR, fallback_to="bf16", last_param="fc2.bias")
    assert isinstance(verdict, FallBack)
    assert (verdict.step, verdict.fallback_to, verdict.param) == (19, "bf16", "fc2.bias")
    assert verdict.ends_at == 19 and verdict.error().fallback_to == "bf16"
    failed = table(trigger=FP16_FLOOR)
    assert isinstance(failed, Diverged) and failed.ends_at == 19
    assert "health.fallback" in failed.message and "bf16" in failed.message
    other = table(trigger=FP32_NAN, fallback_to="bf16")  # only fp16 falls back
    assert isinstance(other, Diverged) and "learning rate" in other.message


def test_a_trigger_wins_over_a_spike_in_the_same_flush() -> None:
    assert isinstance(table(trigger=FP32_NAN, spike=5), Diverged)


def test_a_spike_rolls_back_to_the_newest_healthy_checkpoint_at_or_before_it() -> None:
    assert table(spike=25, situation=situation(healthy=(10, 20, 30))) == RollBack(
        spike_step=25, checkpoint=20
    )
    assert table(spike=25, situation=situation(healthy=())) == RollBack(
        spike_step=25, checkpoint=None
    )
    assert table(spike=25, rollback=None) == Continue()  # action warn or skip


def test_a_spike_at_or_before_the_latest_rollback_asks_for_none_of_its_own() -> None:
    after_rollback = situation(at=30, rolled_back_at=30)
    assert table(spike=27, situation=after_rollback, warnings=(WARNING,)) == Continue(
        warnings=(WARNING,)
    )
    assert isinstance(table(spike=31, situation=after_rollback), RollBack)


def test_past_max_rollbacks_the_run_diverges_at_the_step_acted_on() -> None:
    verdict = table(spike=25, situation=situation(at=40, rollbacks=2))
    assert isinstance(verdict, Diverged) and verdict.step == 40
    assert "spike at step 25" in verdict.message and "max_rollbacks 2" in verdict.message
    # With nowhere to go back to, it is no rollback, so it is not counted against the bound.
    assert table(spike=25, situation=situation(rollbacks=2, healthy=())) == RollBack(
        spike_step=25, checkpoint=None
    )


def test_an_ended_run_stays_ended_and_warns_no_more() -> None:
    ended = Diverged(step=11, message="diverged", warnings=(WARNING,))
    assert table(ended=ended, spike=25) == Diverged(step=11, message="diverged")


def test_the_first_verdict_that_asks_for_something_is_acted_on() -> None:
    rollback = RollBack(spike_step=3, checkpoint=None)
    assert sooner(Continue(warnings=(WARNING,)), rollback) is rollback
    assert sooner(rollback, Continue()) is rollback


def record(step: int, loss: float = 1.0, **kw: Any) -> dict[str, Any]:
    return {"step": step, "time": 0.0, "loss": loss, "skipped": False, "loss_scale": None, **kw}


def test_the_guardian_names_the_step_a_non_finite_loss_diverged_at_and_then_repeats_it() -> None:
    guardian = Guardian(HealthSpec(diverge_nonfinite_steps=2), "fp32")
    records = [record(s, math.nan if s >= 10 else 1.0) for s in range(8, 14)]
    verdict = guardian.judge(Reading(records), situation())
    assert isinstance(verdict, Diverged) and verdict.step == 11
    assert not guardian.healthy
    again = guardian.judge(Reading([record(14)]), situation())
    assert again == Diverged(step=11, message=verdict.message)


def test_the_guardian_asks_for_one_rollback_for_the_first_spike_of_a_flush() -> None:
    spec = HealthSpec.model_validate(
        {"spike": {"action": "rollback", "window": 16, "warmup_steps": 8}}
    )
    guardian = Guardian(spec, "fp32")
    spikes = {s: Spike(s, 9.0, 1.0, 0.1) for s in (22, 27)}
    verdict = guardian.judge(Reading([record(s) for s in range(21, 31)], {}, spikes), situation())
    assert isinstance(verdict, RollBack) and (verdict.spike_step, verdict.checkpoint) == (22, 20)
    # Both spikes in one warning (issue 37), at the first, which alone drives the rollback.
    [warning] = verdict.warnings
    assert warning["step"] == 22
    assert {k: warning["data"][k] for k in ("count", "first_step", "last_step")} == {
        "count": 2,
        "first_step": 22,
        "last_step": 27,
    }


@pytest.mark.parametrize("fallback", ["bf16", None])
def test_the_guardian_marks_unhealthy_while_fp16_skips_build_up(fallback: str | None) -> None:
    guardian = Guardian(HealthSpec(max_consecutive_skips=2), "fp16", fallback)
    skipped = [record(s, skipped=True, loss_scale=2.0**-s) for s in (1, 2)]
    assert isinstance(guardian.judge(Reading(skipped), situation()), Continue)
    assert not guardian.healthy
    verdict = guardian.judge(Reading([record(3, skipped=True, loss_scale=1.0)]), situation())
    assert isinstance(verdict, FallBack if fallback else Diverged) and verdict.ends_at == 3
