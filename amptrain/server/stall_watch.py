"""``no_progress`` rules: a running job that recorded no step for a while.

The absence of telemetry never reaches the recorder, so a loop in each API process (like
the dispatcher's) looks every ``AMPTRAIN_ALERT_STALL_POLL_SECONDS``: for the owners that
have such rules, their running jobs and when each last made progress (its current
attempt's newest recorded step, else that attempt's first event). A firing is unique per
(rule, job, attempt, ``stall:<step>``), so replicas looking at once, or the same stall
seen twice, fire once; a job that moves on and stalls again at a later step fires again.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract import alert_verdict as verdict
from amptrain.contract.alerts import NoProgressWhen
from amptrain.core.enums import JobStatus
from amptrain.core.redis import CANCEL_KEY_TTL_S, Keys
from amptrain.server.recorder.alerting import act
from amptrain.store import alert_rules
from amptrain.store.history import chunk_tail
from amptrain.store.models import AlertRule, Job, JobEvent

log = logging.getLogger(__name__)

MAX_JOBS = 1000
"""Running jobs looked at per round: bounded work whatever the fleet does."""


def last_progress(s: Session, job_id: str, attempt: int) -> float | None:
    """Unix seconds of the attempt's newest recorded step (its stream entry's time), else
    of its first recorded event (``started``); None before either."""
    ms = chunk_tail.newest_ms(s, job_id, attempt)
    if ms is not None:
        return float(ms) / 1000.0
    e = JobEvent
    first = s.scalar(sa.select(sa.func.min(e.time)).where(e.job_id == job_id, e.attempt == attempt))
    return float(first) if first is not None else None


def check(s: Session, now: float) -> list[str]:
    """Fire every ``no_progress`` rule whose job stalled; the jobs asked to stop."""
    owners = list(
        s.scalars(sa.select(AlertRule.owner).where(AlertRule.kind == "no_progress").distinct())
    )
    if not owners:
        return []
    running = s.scalars(
        sa.select(Job.id)
        .where(Job.owner.in_(owners), Job.status == JobStatus.RUNNING)
        .limit(MAX_JOBS)
    ).all()
    stopped = []
    for job_id, (job, watches) in alert_rules.rules_for_jobs(s, running, ["no_progress"]).items():
        since = last_progress(s, job_id, job.attempt)
        if since is None:
            continue
        step = s.scalar(sa.select(Job.step).where(Job.id == job_id)) or 0
        for watch in watches:
            when = watch.spec.when
            assert isinstance(when, NoProgressWhen)
            if not verdict.stalled(when, now - since):
                continue
            hit = verdict.Hit(step, {"stalled_s": round(now - since, 1), "seconds": when.seconds})
            if act(s, watch, job, job.attempt, f"stall:{step}", hit):
                stopped.append(job_id)
    return stopped


class StallWatch:
    def __init__(
        self, sessions: sessionmaker[Session], client: redis.Redis, interval_s: float
    ) -> None:
        self.sessions = sessions
        self.redis = client
        self.interval_s = interval_s

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            try:
                self.round()
            except Exception:
                log.exception("no-progress check failed; retrying")

    def round(self) -> None:
        with self.sessions.begin() as s:
            stopped = check(s, time.time())
        for job_id in stopped:
            self.redis.set(Keys.cancel(job_id), "1", ex=CANCEL_KEY_TTL_S)
