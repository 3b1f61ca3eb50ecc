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
from amptrain.store import alert_rules, alert_windows, deliveries, stops
from amptrain.store.alert_rules import Watch, WatchedJob
from amptrain.store.alert_windows import Key

BATCH_KINDS = ("event", "threshold", "deviation", "early_stop")
"""The rule kinds a batch can fire; ``no_progress`` is the absence of batches
(:mod:`amptrain.server.stall_watch`)."""


def evaluate(s: Session, batches: Mapping[str, Batch]) -> list[str]:
    """Fire every rule the batch matches; the jobs asked to stop (for their cancel key)."""
    busy = [j for j, b in batches.items() if b.point_count() or b.values or b.events]
    watched = alert_rules.rules_for_jobs(s, busy, BATCH_KINDS)
    series = _SeriesView(s, batches, watched)
    stopped: list[str] = []
    for job_id, (job, watches) in watched.items():
        batch = batches[job_id]
        for watch in watches:
            for attempt, key, hit in _hits(s, watch, job, batch, series):
                if act(s, watch, job, attempt, key, hit):
                    stopped.append(job_id)
    return stopped


class _SeriesView:
    """The batch's new values of each watched (job, series) of the current attempt, and
    the finite values before them that the rules need (a threshold the last one, a
    deviation its window): all read in ONE query for the batch, each part by index."""

    def __init__(
        self,
        s: Session,
        batches: Mapping[str, Batch],
        watched: Mapping[str, tuple[WatchedJob, list[Watch]]],
    ) -> None:
        self.new: dict[Key, list[verdict.Point]] = {}
        needs: dict[Key, tuple[int, int, int]] = {}  # -> (attempt, first new step, count)
        for job_id, (job, watches) in watched.items():
            for watch in watches:
                when = watch.spec.when
                if not isinstance(when, ThresholdWhen | DeviationWhen):
                    continue
                key = (job_id, when.series)
                new = self.new.setdefault(key, _new_points(batches[job_id], job, when.series))
                if new:
                    count = when.window if isinstance(when, DeviationWhen) else 1
                    _, _, had = needs.get(key, (0, 0, 0))
                    needs[key] = (job.attempt, new[0][0], max(had, count))
        self.before = alert_windows.before(s, needs)


def _hits(
    s: Session, watch: Watch, job: WatchedJob, batch: Batch, series: _SeriesView
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
        hit = verdict.early_stop(when, alert_windows.eval_series(s, job.id, when.series))
        return [(job.attempt, "early_stop", hit)] if hit is not None else []
    assert isinstance(when, ThresholdWhen | DeviationWhen)
    new = series.new.get((job.id, when.series), [])
    if not new:
        return []
    before = series.before.get((job.id, when.series), [])
    if isinstance(when, ThresholdWhen):
        hits = verdict.threshold_hits(when, before[-1] if before else None, new)
    else:
        hits = verdict.deviation_hits(when, before[-when.window :], new)
    return [(job.attempt, f"step:{h.step}", h) for h in hits]


def _new_points(batch: Batch, job: WatchedJob, series: str) -> list[verdict.Point]:
    """This batch's values of ``series`` for the job's current attempt, in step order."""
    if is_step_series(series):
        at = zip(batch.column("step"), batch.column("attempt"), batch.column(series), strict=True)
        rows = [(step, value) for step, attempt, value in at if attempt == job.attempt]
    else:
        rows = [
            (v["step"], v["value"])
            for v in batch.values
            if v["attempt"] == job.attempt and v["kind"] == EVAL_KIND and v["name"] == series
        ]
    return sorted((step, finite_or_none(value)) for step, value in rows)


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
