"""Whether a rule fires: pure decisions over (rule, window of values), like the worker's
``verdict``. The recorder gathers the values (one read per job and rule per batch) and
writes what these return; nothing here reads SQL or the clock.

A series is a list of ``(step, value)`` in step order, ``value`` None where it was not
finite (SQL keeps non-finite values as null).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

from amptrain.contract.alerts import (
    DeviationWhen,
    EarlyStopWhen,
    EventWhen,
    NoProgressWhen,
    ThresholdWhen,
    event_names,
)

Point = tuple[int, float | None]


class Hit(NamedTuple):
    """A firing: the step it is about and what the receiver is told."""

    step: int
    detail: dict[str, Any]


def event_hit(when: EventWhen, type_: str, data: Any) -> str | None:
    """The name the event matched the rule by, or None."""
    for name in event_names(type_, data):
        if name in when.events:
            return name
    return None


def threshold_hits(when: ThresholdWhen, before: float | None, new: Sequence[Point]) -> list[Hit]:
    """The new points where the series crosses the threshold: beyond it, while the point
    before (``before``: the last finite value before ``new``; None: none) was not. A
    series that starts beyond it fires at its first point."""
    hits: list[Hit] = []
    prev = before
    for step, value in new:
        if value is None:
            continue
        if _beyond(when, value) and (prev is None or not _beyond(when, prev)):
            limit = when.above if when.above is not None else when.below
            side = "above" if when.above is not None else "below"
            hits.append(Hit(step, {"series": when.series, "value": value, side: limit}))
        prev = value
    return hits


def _beyond(when: ThresholdWhen, value: float) -> bool:
    if when.above is not None:
        return value > when.above
    assert when.below is not None
    return value < when.below


def deviation_hits(when: DeviationWhen, before: Sequence[float], new: Sequence[Point]) -> list[Hit]:
    """The new points more than ``z`` standard deviations (population) from the mean of the
    ``window`` finite values before each; ``before``: the finite values preceding ``new``,
    oldest first. No decision until a whole window is there; a constant window fires on
    any other value.

    O(1) per point (the recorder runs this on every step): the window's sums slide with it,
    taken about a value of the window (``shift``) so that a series with a large mean and a
    small spread keeps its precision (the shifted-data variance)."""
    window: deque[float] = deque(list(before)[-when.window :])
    shift = window[0] if window else 0.0
    s1 = sum(v - shift for v in window)
    s2 = sum((v - shift) ** 2 for v in window)
    hits: list[Hit] = []
    for step, value in new:
        if value is None:
            continue
        n = len(window)
        if n >= when.window:
            mean = shift + s1 / n
            std = math.sqrt(max(0.0, (s2 - s1 * s1 / n) / n))
            far = abs(value - mean) > when.z * std if std > 0 else value != mean
            if far:
                z = abs(value - mean) / std if std > 0 else None
                detail = {"series": when.series, "value": value, "mean": mean, "std": std}
                hits.append(Hit(step, {**detail, "z": z, "z_limit": when.z}))
            old = window.popleft() - shift
            s1, s2 = s1 - old, s2 - old * old
        window.append(value)
        s1, s2 = s1 + (value - shift), s2 + (value - shift) ** 2
    return hits


def early_stop(when: EarlyStopWhen, series: Sequence[Point]) -> Hit | None:
    """Lightning's ``EarlyStopping`` over a whole evaluation series: the first evaluation
    that reaches ``target`` (``reason: target``), is not finite (``not_finite``), or
    ends ``patience`` evaluations in a row that did not improve on the best so far by more
    than ``min_delta`` (``patience``); None while training should go on."""
    sign = 1.0 if when.mode == "min" else -1.0  # compare as "lower is better"
    best = math.inf
    wait = 0
    for step, value in series:
        if value is None:
            return Hit(step, _stopped(when, step, None, "not_finite", best, sign))
        if when.target is not None and sign * value <= sign * when.target:
            return Hit(step, _stopped(when, step, value, "target", best, sign))
        if sign * value < best - when.min_delta:
            best, wait = sign * value, 0
            continue
        wait += 1
        if wait >= when.patience:
            return Hit(step, _stopped(when, step, value, "patience", best, sign))
    return None


def _stopped(
    when: EarlyStopWhen, step: int, value: float | None, reason: str, best: float, sign: float
) -> dict[str, Any]:
    return {
        "series": when.series,
        "step": step,
        "value": value,
        "reason": reason,
        "best": sign * best if math.isfinite(best) else None,
        "mode": when.mode,
        "patience": when.patience,
        "min_delta": when.min_delta,
    }


def stalled(when: NoProgressWhen, seconds_since_progress: float) -> bool:
    """A running job recorded no step for longer than the rule allows."""
    return seconds_since_progress > when.seconds
