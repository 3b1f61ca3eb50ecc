"""Rule decisions as pure functions: (rule, window) -> firing or not."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from amptrain.contract import alert_verdict as v
from amptrain.contract.alerts import (
    ALERT_EVENTS,
    DIVERGED,
    DeviationWhen,
    EarlyStopWhen,
    EventWhen,
    NoProgressWhen,
    RuleSpec,
    ThresholdWhen,
    event_names,
)
from amptrain.contract.records import (
    OVERFLOW_WARNING,
    PRECISION_FALLBACK,
    ROLLBACK_EVENT,
    SPIKE_WARNING,
)
from amptrain.contract.spec import parse_spec
from tests.support.specs import mlp_job


def test_event_names_map_recorded_events_to_rule_names() -> None:
    assert event_names("failed", {"error": {"code": "diverged"}}) == ("failed", "diverged")
    assert event_names("failed", {"error": {"code": "oom"}}) == ("failed",)
    assert event_names("warning", {"code": "loss_spike"}) == ("loss_spike",)
    assert event_names("warning", {"code": "something_else"}) == ()
    assert event_names("precision_fallback", {}) == ("precision_fallback",)
    assert event_names("checkpoint", {}) == ()
    when = EventWhen(kind="event", events=["diverged"])
    assert v.event_hit(when, "failed", {"error": {"code": "diverged"}}) == "diverged"
    assert v.event_hit(when, "failed", {"error": {"code": "internal"}}) is None
    assert set(EventWhen.model_json_schema()["properties"]["events"]["items"]["enum"]) == set(
        ALERT_EVENTS
    )
    records = {DIVERGED, PRECISION_FALLBACK, ROLLBACK_EVENT, SPIKE_WARNING, OVERFLOW_WARNING}
    assert records <= set(ALERT_EVENTS)  # the names the records use


def test_threshold_fires_on_crossing_only() -> None:
    when = ThresholdWhen(kind="threshold", series="loss", above=2.0)
    pts = [(1, 1.0), (2, 3.0), (3, 4.0), (4, 1.0), (5, None), (6, 2.5)]
    assert [h.step for h in v.threshold_hits(when, None, pts)] == [2, 6]
    # The value before the batch was already above: no new crossing at its first point.
    assert [h.step for h in v.threshold_hits(when, 5.0, [(7, 3.0)])] == []
    below = ThresholdWhen(kind="threshold", series="eval_loss", below=0.5)
    (hit,) = v.threshold_hits(below, 0.7, [(10, 0.4)])
    assert hit.detail == {"series": "eval_loss", "value": 0.4, "below": 0.5}


def test_deviation_needs_a_full_window_and_uses_z() -> None:
    when = DeviationWhen(kind="deviation", series="grad_norm", window=4, z=3.0)
    assert v.deviation_hits(when, [1.0, 1.0], [(3, 50.0)]) == []  # window not full
    base = [1.0, 1.2, 0.8, 1.0]
    (hit,) = v.deviation_hits(when, base, [(5, 1.1), (6, 9.0)])
    assert hit.step == 6 and hit.detail["z"] > 3.0
    # A constant window fires on any other value (its deviation is 0).
    assert [h.step for h in v.deviation_hits(when, [2.0] * 4, [(7, 2.0), (8, 2.1)])] == [8]


@pytest.mark.parametrize(
    ("values", "patience", "min_delta", "stop_at", "reason"),
    [
        ([1.0, 0.9, 0.95, 0.93, 0.92], 3, 0.0, 5, "patience"),
        ([1.0, 0.9, 0.85, 0.8], 2, 0.0, None, None),
        # Improvements smaller than min_delta do not reset the wait (Lightning).
        ([1.0, 0.99, 0.98, 0.97], 3, 0.05, 4, "patience"),
        ([1.0, None], 5, 0.0, 2, "not_finite"),
    ],
)
def test_early_stop_is_lightnings(
    values: list[float | None],
    patience: int,
    min_delta: float,
    stop_at: int | None,
    reason: str | None,
) -> None:
    when = EarlyStopWhen(
        kind="early_stop", series="eval_loss", patience=patience, min_delta=min_delta
    )
    hit = v.early_stop(when, list(enumerate(values, start=1)))
    assert (hit.step if hit else None) == stop_at
    assert (hit.detail["reason"] if hit else None) == reason


def test_early_stop_target_and_max_mode() -> None:
    when = EarlyStopWhen(kind="early_stop", series="accuracy", mode="max", target=0.9, patience=9)
    hit = v.early_stop(when, [(10, 0.5), (20, 0.91), (30, 0.95)])
    assert hit is not None and hit.step == 20 and hit.detail["reason"] == "target"


def test_stalled() -> None:
    when = NoProgressWhen(kind="no_progress", seconds=60)
    assert not v.stalled(when, 59.0) and v.stalled(when, 61.0)


def _rule(**overrides: object) -> dict[str, object]:
    return {"name": "r", "when": {"kind": "event", "events": ["failed"]}, "stop": True, **overrides}


@pytest.mark.parametrize(
    ("rule", "field"),
    [
        (
            _rule(when={"kind": "threshold", "series": "loss", "above": math.nan}),
            "when.threshold.above",
        ),
        (
            _rule(when={"kind": "threshold", "series": "loss", "above": math.inf}),
            "when.threshold.above",
        ),
        (
            _rule(when={"kind": "deviation", "series": "loss", "window": 10**6}),
            "when.deviation.window",
        ),
        (_rule(when={"kind": "deviation", "series": "loss", "z": math.inf}), "when.deviation.z"),
        (
            _rule(when={"kind": "threshold", "series": "no such!", "above": 1}),
            "when.threshold.series",
        ),
        (_rule(when={"kind": "threshold", "series": "time", "above": 1}), "when.threshold.series"),
        (_rule(when={"kind": "early_stop", "series": "loss"}), "when.early_stop"),
        (_rule(when={"kind": "no_progress", "seconds": 10**9}), "when.no_progress.seconds"),
        (_rule(name="x" * 101), "name"),
        (_rule(notify={"url": "ftp://example.com/x"}), "notify.url"),
        (_rule(notify={"url": "https://user:pw@example.com/x"}), "notify.url"),
        (_rule(notify={"url": "https://example.com/" + "a" * 3000}), "notify.url"),
        (_rule(notify={"url": "https://example.com/x", "max_retries": 11}), "notify.max_retries"),
        (_rule(scope={"name": "*a*b*c*d*e"}), "scope.name"),
        (_rule(stop=False), ""),
    ],
)
def test_rule_bounds_name_the_field(rule: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        RuleSpec.model_validate(rule)
    locs = {".".join(map(str, e["loc"])) for e in err.value.errors()}
    assert any(loc.startswith(field) for loc in locs), locs


def test_job_spec_alerts_are_checked_against_its_eval_metrics() -> None:
    alert = {"name": "es", "when": {"kind": "early_stop", "series": "perplexity"}}
    with pytest.raises(ValidationError, match=r"not among eval\.metrics"):
        parse_spec(mlp_job(alerts=[alert], eval={"metrics": ["eval_loss", "accuracy"]}))
    spec = parse_spec(
        mlp_job(alerts=[{**alert, "when": {"kind": "early_stop", "series": "eval_loss"}}])
    )
    assert spec.alerts[0].stops
    with pytest.raises(ValidationError):
        parse_spec(mlp_job(alerts=[alert] * 11))


def test_deviation_keeps_its_precision_on_a_large_mean() -> None:
    """The sliding sums are shifted: a series near 1e6 with a spread of 1e-3 still gives
    the spread, not the rounding error of 1e12-sized squares."""
    when = DeviationWhen(kind="deviation", series="loss", window=20, z=4.0)
    base = [1e6 + (0.001 if i % 2 else -0.001) for i in range(40)]
    pts = [(i, v) for i, v in enumerate(base[20:], start=21)]
    assert v.deviation_hits(when, base[:20], pts) == []
    (hit,) = v.deviation_hits(when, base[:20], [*pts, (99, 1e6 + 0.01)])
    assert hit.step == 99 and abs(hit.detail["std"] - 0.001) < 1e-6


def test_deviation_matches_the_plain_window_statistics() -> None:
    import random
    import statistics

    rng = random.Random(4)
    series = [rng.gauss(3.0, 1.0) for _ in range(300)]
    when = DeviationWhen(kind="deviation", series="loss", window=25, z=2.0)
    got = [h.step for h in v.deviation_hits(when, series[:25], list(enumerate(series[25:], 25)))]
    expected = [
        i
        for i in range(25, 300)
        if abs(series[i] - statistics.fmean(series[i - 25 : i]))
        > 2.0 * statistics.pstdev(series[i - 25 : i])
    ]
    assert got == expected
