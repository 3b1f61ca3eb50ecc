"""Alert rules evaluated in the recorder's batch transaction.

The rules watching a batch's jobs are read once per batch (two queries, however many
points), each rule's window once per job; the decisions are the pure functions of
:mod:`amptrain.contract.alert_verdict`. A firing and its deliveries are inserted in the
same transaction as the points and events that caused them, so nothing is lost and a
replayed batch (at-least-once delivery) fires nothing twice. A ``stop`` action asks the
job to stop in that transaction too; the Redis cancel key is set after the commit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract import alert_verdict as verdict
from amptrain.contract.alerts import (
    ALERT_STOP,
    EARLY_STOPPED,
    DeviationWhen,
    EarlyStopWhen,
    EventWhen,
    ThresholdWhen,
    finite_or_none,
    is_step_series,
)
from amptrain.contract.metrics import EVAL_KIND
from amptrain.server.event_view import owner_view
from amptrain.server.recorder.entries import Batch
from amptrain.store import alert_rules, deliveries, stops
from amptrain.store.alert_rules import Watch, WatchedJob
from amptrain.store.models import MetricPoint, MetricValue

BATCH_KINDS = ("event", "threshold", "deviation", "early_stop")
"""The rule kinds a batch can fire; ``no_progress`` is the absence of batches
(:mod:`amptrain.server.stall_watch`)."""


def evaluate(s: Session, batches: Mapping[str, Batch]) -> list[str]:
    """Fire every rule the batch matches; the jobs asked to stop (for their cancel key)."""
    busy = [j for j, b in batches.items() if b.points or b.values or b.events]
    watched = alert_rules.rules_for_jobs(s, busy, BATCH_KINDS)
    stopped: list[str] = []
    for job_id, (job, watches) in watched.items():
        batch = batches[job_id]
        for watch in watches:
            for attempt, key, hit in _hits(s, watch, job, batch):
                if act(s, watch, job, attempt, key, hit):
                    stopped.append(job_id)
    return stopped


def _hits(
    s: Session, watch: Watch, job: WatchedJob, batch: Batch
) -> list[tuple[int, str, verdict.Hit]]:
    """(attempt, firing key, hit) of everything this rule matches in the batch."""
    when = watch.spec.when
    if isinstance(when, EventWhen):
        found = []
        for ev in batch.events:
            name = verdict.event_hit(when, ev["type"], ev.get("data"))
            if name is not None:
                key = f"event:{ev['type']}:{ev['step']}:{ev['time']!r}"
                # The owner's view: where it ran (hosts, pids) is an admin's detail, and
                # the receiver is the rule owner's.
                data = owner_view(ev.get("data") or {})
                detail = {"event": name, "type": ev["type"], "data": data}
                found.append((ev["attempt"], key, verdict.Hit(ev["step"] or 0, detail)))
        return found
    if isinstance(when, EarlyStopWhen):
        if not any(v["kind"] == EVAL_KIND and v["name"] == when.series for v in batch.values):
            return []
        hit = verdict.early_stop(when, _eval_series(s, job.id, when.series))
        return [(job.attempt, "early_stop", hit)] if hit is not None else []
    assert isinstance(when, ThresholdWhen | DeviationWhen)
    new = _new_points(batch, job, when.series)
    if not new:
        return []
    first = new[0][0]
    if isinstance(when, ThresholdWhen):
        before = _before(s, job, when.series, first, 1)
        hits = verdict.threshold_hits(when, before[-1] if before else None, new)
    else:
        hits = verdict.deviation_hits(when, _before(s, job, when.series, first, when.window), new)
    return [(job.attempt, f"step:{h.step}", h) for h in hits]


def _new_points(batch: Batch, job: WatchedJob, series: str) -> list[verdict.Point]:
    """This batch's values of ``series`` for the job's current attempt, in step order."""
    if is_step_series(series):
        rows = [(p["step"], p.get(series)) for p in batch.points if p["attempt"] == job.attempt]
    else:
        rows = [
            (v["step"], v["value"])
            for v in batch.values
            if v["attempt"] == job.attempt and v["kind"] == EVAL_KIND and v["name"] == series
        ]
    return sorted((step, finite_or_none(value)) for step, value in rows)


def _before(s: Session, job: WatchedJob, series: str, step: int, count: int) -> list[float]:
    """The ``count`` finite values of ``series`` before ``step`` in the current attempt,
    oldest first (one indexed read)."""
    if is_step_series(series):
        col = MetricPoint.__table__.c[series]
        p = MetricPoint
        query = sa.select(col).where(p.job_id == job.id, p.attempt == job.attempt, p.step < step)
        query = query.where(col.is_not(None)).order_by(p.step.desc())
    else:
        v = MetricValue
        query = sa.select(v.value).where(
            v.job_id == job.id,
            v.kind == EVAL_KIND,
            v.name == series,
            v.attempt == job.attempt,
            v.step < step,
            v.value.is_not(None),
        )
        query = query.order_by(v.step.desc())
    values = [finite_or_none(x) for x in s.scalars(query.limit(count))]
    return [x for x in reversed(values) if x is not None]


def _eval_series(s: Session, job_id: str, series: str) -> list[verdict.Point]:
    """The job's effective evaluation series: per step the newest attempt's value (a
    resumed attempt re-evaluates steps after its checkpoint)."""
    v = MetricValue
    rows = s.execute(
        sa.select(v.step, v.attempt, v.value)
        .where(v.job_id == job_id, v.kind == EVAL_KIND, v.name == series)
        .order_by(v.step, v.attempt)
    )
    newest: dict[int, float | None] = {}
    for step, _attempt, value in rows:
        newest[step] = finite_or_none(value)
    return sorted(newest.items())


def act(
    s: Session, watch: Watch, job: WatchedJob, attempt: int, key: str, hit: verdict.Hit
) -> bool:
    """Store the firing (and its delivery); request the stop the rule asks for. True when
    the job was asked to stop now."""
    spec = watch.spec
    data: dict[str, Any] = {"rule": {"id": watch.id, "name": watch.name}, **hit.detail}
    notify = spec.notify.model_dump(mode="json") if spec.notify is not None else None
    firing = deliveries.fire(s, watch.id, job.id, attempt, key, hit.step, data, notify)
    if firing is None or not spec.stops:
        return False  # stored before (a replay), or nothing to stop
    early = spec.when.kind == "early_stop"
    reason = {**data, "firing": firing, "kind": "early_stop" if early else "alert"}
    event = EARLY_STOPPED if early else ALERT_STOP
    return stops.request_stop(s, job.id, attempt, reason, event, hit.step, succeed=early)
