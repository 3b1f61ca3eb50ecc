"""The values an alert rule's decision needs, read in the recorder's batch transaction:
the points before a batch's new ones (a threshold's last value, a deviation's window) and
an evaluation series whole (early stopping). Reads only; the caller owns the transaction.

Both read the series' chunks (:mod:`~amptrain.store.history.chunk_tail`: without numpy, as
the recorder runs): a window newest first from the step asked for, so its cost follows its
length, not the run's; an evaluation series in one range of the primary key."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.orm import Session

from amptrain.contract.alerts import finite_or_none, is_step_series
from amptrain.contract.metrics import EVAL_KIND
from amptrain.store.history import chunk_tail
from amptrain.store.history.chunk_parts import STEP_KIND

Key = tuple[str, str]
"""(job id, series)."""
Point = tuple[int, float | None]


def before(s: Session, needs: Mapping[Key, tuple[int, int, int]]) -> dict[Key, list[float]]:
    """Per (job, series): the finite values among its ``count`` points before the given
    step in the given attempt, oldest first. Non-finite (null) values count as points and
    are dropped after the read: a series that is null at every step (``loss_scale``
    outside fp16) must not make the read walk the job's whole history looking for a
    value. One statement for the usual windows (:func:`chunk_tail.windows`)."""
    keys = list(needs)
    wants: list[chunk_tail.Want] = []
    for job_id, series in keys:
        attempt, step, count = needs[(job_id, series)]
        kind = STEP_KIND if is_step_series(series) else EVAL_KIND
        wants.append((job_id, kind, series, attempt, step, count))
    found: dict[Key, list[float]] = {}
    for key, points in zip(keys, chunk_tail.windows(s, wants), strict=True):
        finite = [x for _, v in points if (x := finite_or_none(v)) is not None]
        if finite:
            found[key] = finite[::-1]
    return found


def eval_series(s: Session, job_id: str, series: str) -> list[Point]:
    """The job's effective evaluation series: per step the newest attempt's value (a
    resumed attempt re-evaluates steps after its checkpoint)."""
    points = chunk_tail.effective_series(s, job_id, EVAL_KIND, series)
    return [(step, finite_or_none(v)) for step, v in points]
