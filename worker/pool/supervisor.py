"""The Celery task's body: claim a job, run its training child, record how it ended.

The supervisor never touches torch or CUDA (it lives in a forked Celery pool
process). Every write it makes is fenced by the attempt number its claim
returned, so a supervisor that lost its lease can change nothing.
"""

from __future__ import annotations

import logging
import signal
import time
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy.orm import Session, sessionmaker

from api.core import redis as amptrain_redis
from api.core.enums import JobStatus
from api.core.logs import bind, log_context
from api.core.redis import Keys
from api.core.settings import Settings
from api.store import jobs
from api.store.db import make_engine, make_session_factory
from trainer_core.contract.layout import job_checkpoint_url
from worker.child.protocol import ControlMessage, Failed, Finished, Launch, PrecisionChosen
from worker.pool.child_handle import ChildProcess
from worker.pool.events import LifecycleEvents
from worker.pool.slot import JobSlot, PoolSlot

log = logging.getLogger(__name__)

POLL_S = 0.25  # how quickly a cancel request reaches the child


@dataclass
class Outcome:
    """How the child ended, as learnt from its control messages and exit."""

    result: Finished | None = None
    failure: Failed | None = None
    stop_requested: str | None = None  # "cancel" | "preempt"
    lease_lost: bool = False
    exit_code: int | None = None


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        worker: str,
        pool_slot: PoolSlot,
        *,
        session_factory: sessionmaker[Session] | None = None,
        redis_client: redis.Redis | None = None,
    ) -> None:
        self.settings = settings
        self.worker = worker
        self.sessions = session_factory or make_session_factory(make_engine(settings.database_url))
        self.redis = redis_client or amptrain_redis.client(
            settings.redis_url, amptrain_redis.WORKER_TIMEOUT_S
        )
        # What this pool process runs, for GET /workers and the worker's /metrics.
        self.slot = JobSlot(self.redis, worker, pool_slot, settings.lease_seconds)
        self.events = LifecycleEvents(self.redis)
        self._renewed_at = 0.0  # monotonic time of the last successful lease renewal

    # -- the whole life of one attempt -------------------------------------------------

    def run(self, job_id: str) -> None:
        with log_context(job_id=job_id, worker=self.worker):
            self._run(job_id)

    def _run(self, job_id: str) -> None:
        with self.sessions.begin() as s:
            attempt = jobs.claim(s, job_id, self.worker, self.settings.lease_seconds)
            job = jobs.get_job(s, job_id)
            spec = dict(job.spec) if job else {}
        if attempt is None:
            # A duplicate delivery, or a job already finished/cancelled: harmless by design.
            log.info("job %s not claimable; nothing to do", job_id)
            return
        bind(attempt=attempt)
        log.info("job %s claimed as attempt %d by %s", job_id, attempt, self.worker)
        self.slot.start(job_id, attempt)
        try:
            child = ChildProcess(self._launch(job_id, attempt, spec), self.slot.pool_slot.gpu)
            try:
                outcome = self._watch(job_id, attempt, child)
            finally:
                child.close()
            self._conclude(job_id, attempt, spec, outcome)
        finally:
            self.slot.clear()

    def _launch(self, job_id: str, attempt: int, spec: dict[str, Any]) -> Launch:
        return Launch(
            job_id=job_id,
            attempt=attempt,
            spec=spec,
            checkpoint_dir=job_checkpoint_url(self.settings.checkpoint_url, job_id),
            redis_url=self.settings.redis_url,
            data_roots=[str(r) for r in self.settings.data_roots],
        )

    # -- while the child trains ------------------------------------------------------

    def _watch(self, job_id: str, attempt: int, child: ChildProcess) -> Outcome:
        out = Outcome()
        next_beat = time.monotonic() + self.settings.heartbeat_seconds
        status: str | None = JobStatus.RUNNING
        kill_at: float | None = None
        self._renewed_at = time.monotonic()
        while not child.finished():
            for msg in child.messages(POLL_S):
                self._on_message(job_id, attempt, msg, out)
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + self.settings.heartbeat_seconds
                status = self._heartbeat(job_id, attempt)
                self.slot.refresh()
            if status is None and not out.lease_lost:
                # Fenced out: a successor may already train this job. Stop at once, with
                # no final checkpoint that could overwrite the successor's.
                out.lease_lost = True
                log.warning("job %s attempt %d lost its lease; killing its child", job_id, attempt)
                child.proc.kill()
                continue
            wanted = self._stop_wanted(job_id, status)
            if wanted and not out.stop_requested:
                out.stop_requested = wanted
                child.signal(signal.SIGUSR1 if wanted == "cancel" else signal.SIGUSR2)
                kill_at = now + self.settings.cancel_grace_seconds
                log.info("job %s attempt %d: asked child to %s", job_id, attempt, wanted)
            if kill_at is not None and now >= kill_at and child.alive():
                log.warning("job %s: child ignored the stop request; terminating", job_id)
                child.kill(grace=self.settings.cancel_grace_seconds)
        out.exit_code = child.proc.returncode
        return out

    def _on_message(self, job_id: str, attempt: int, msg: ControlMessage, out: Outcome) -> None:
        match msg:
            case PrecisionChosen():
                with self.sessions.begin() as s:
                    current = jobs.set_precision(
                        s, job_id, attempt, msg.requested, msg.effective, msg.reason_on_device
                    )
                if not current:
                    return  # fenced out: this attempt no longer speaks for the job
                self.events.publish(
                    job_id,
                    attempt,
                    "started",
                    0,
                    {"worker": self.worker, "attempt": attempt, "precision": msg.event_data()},
                )
            case Finished():
                out.result = msg
            case Failed():
                out.failure = msg

    def _heartbeat(self, job_id: str, attempt: int) -> str | None:
        """Renew the lease; None once it is lost.

        A database blip is not a lost lease: training goes on and the renewal is
        retried. But a worker that could not renew for a whole lease must assume the
        reconciler gave the job to a successor (it cannot tell), so it fences itself.
        """
        try:
            with self.sessions.begin() as s:
                status = jobs.heartbeat(s, job_id, attempt, self.settings.lease_seconds)
        except Exception:
            log.exception("job %s: heartbeat failed; will retry", job_id)
            if time.monotonic() - self._renewed_at < self.settings.lease_seconds:
                return JobStatus.RUNNING
            return None
        if status is not None:
            self._renewed_at = time.monotonic()
        return status

    def _stop_wanted(self, job_id: str, status: str | None) -> str | None:
        """ "cancel" (the API asked), "preempt" (this worker is draining) or None."""
        if status == JobStatus.CANCELLING:
            return "cancel"  # seen by the heartbeat even if the Redis cancel key was lost
        try:
            cancel, draining = self.redis.mget(
                Keys.cancel(job_id), Keys.worker_draining(self.worker)
            )
        except redis.RedisError:
            return None  # a Redis blip: training goes on, the heartbeat still sees cancels
        if cancel:
            return "cancel"
        return "preempt" if draining else None

    # -- how it ended ----------------------------------------------------------------

    def _conclude(self, job_id: str, attempt: int, spec: dict[str, Any], out: Outcome) -> None:
        if out.lease_lost:
            log.warning(
                "job %s attempt %d lost its lease; another attempt owns it", job_id, attempt
            )
            return
        status, error = self._final_state(job_id, attempt, spec, out)
        step = (out.result.final_step if out.result else None) or (error or {}).get("step") or 0
        kind = "requeued" if status == JobStatus.QUEUED else str(status)
        data = {"error": error} if error else {}
        with self.sessions.begin() as s:
            if status == JobStatus.QUEUED:
                done = jobs.release(s, job_id, attempt)  # a retry: the error is in the event
            else:
                done = jobs.finish(s, job_id, attempt, status, error)
        if done:  # the status is the fenced truth; the event only tells it
            end = None if status == JobStatus.QUEUED else status
            self.events.conclude(job_id, attempt, kind, step, data, end_status=end)

    def _final_state(
        self, job_id: str, attempt: int, spec: dict[str, Any], out: Outcome
    ) -> tuple[JobStatus, dict[str, Any] | None]:
        if out.result is not None:
            return JobStatus.SUCCEEDED, None
        if out.stop_requested == "cancel":
            return JobStatus.CANCELLED, None
        if out.stop_requested == "preempt":
            return JobStatus.QUEUED, None
        failure = out.failure or Failed(
            code="internal",
            message=f"training process exited with code {out.exit_code} without a result",
            step=None,
            retryable=True,
        )
        if failure.retryable and attempt < int(spec.get("max_attempts", 3)):
            log.warning("job %s attempt %d failed (%s); re-queueing", job_id, attempt, failure.code)
            return JobStatus.QUEUED, failure.error()
        return JobStatus.FAILED, failure.error()
