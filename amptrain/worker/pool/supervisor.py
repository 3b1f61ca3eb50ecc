"""The Celery task's body: claim a job, run its training child, record how it ended.

The supervisor never touches torch or CUDA (it lives in a forked Celery pool
process). Every write it makes is fenced by the attempt number its claim
returned, so a supervisor that lost its lease can change nothing. While the
child trains, :class:`amptrain.worker.pool.watch.AttemptWatch` keeps the lease and relays
stop requests.
"""

from __future__ import annotations

import logging
from typing import Any

import redis
from sqlalchemy.orm import Session, sessionmaker

from amptrain.core import redis as amptrain_redis
from amptrain.core.enums import JobStatus
from amptrain.core.logs import bind, log_context
from amptrain.core.settings import Settings
from amptrain.store import jobs, stops
from amptrain.store.db import make_engine, make_session_factory
from amptrain.worker.child.protocol import Launch, PrecisionChosen
from amptrain.worker.pool import shape
from amptrain.worker.pool.child_handle import ChildProcess
from amptrain.worker.pool.claim import Claim, launch, runtime_limit
from amptrain.worker.pool.events import LifecycleEvents
from amptrain.worker.pool.leader import Leader
from amptrain.worker.pool.placement import SendJoin
from amptrain.worker.pool.ranks import (
    RankGroup,
    devices_of,
    slot_gpus,
)
from amptrain.worker.pool.resume_bound import resume_bound
from amptrain.worker.pool.slot import JobSlot, PoolSlot
from amptrain.worker.pool.spare import SpareKeeper
from amptrain.worker.pool.verdict import final_state
from amptrain.worker.pool.watch import AttemptWatch, Outcome

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        worker: str,
        pool_slot: PoolSlot,
        *,
        session_factory: sessionmaker[Session] | None = None,
        redis_client: redis.Redis | None = None,
        spares: SpareKeeper | None = None,
        send_join: SendJoin,
    ) -> None:
        self.settings = settings
        self.spares = spares  # None: every attempt starts a fresh (cold) training process
        self.worker = worker
        self.sessions = session_factory or make_session_factory(make_engine(settings.database_url))
        self.redis = redis_client or amptrain_redis.client(
            settings.redis_url, amptrain_redis.WORKER_TIMEOUT_S
        )
        # What this pool process runs, for GET /workers and the worker's /metrics.
        self.slot = JobSlot(self.redis, worker, pool_slot, settings.lease_seconds)
        self.events = LifecycleEvents(self.redis)
        # Node 0 of a multi-node job; send_join asks the job's queue for the other nodes.
        self.leader = Leader(settings, self.sessions, self.redis, self.slot, self.events, send_join)

    # -- the whole life of one attempt -------------------------------------------------

    def run(self, job_id: str) -> None:
        with log_context(job_id=job_id, worker=self.worker):
            claim = self._claim(job_id)
            if claim is None:
                return
            mismatch = shape.devices_mismatch(claim.spec, self.slot.pool_slot, self.worker)
            if mismatch is not None:  # before any training process starts
                self.events.publish(
                    claim.job_id, claim.attempt, shape.DEVICES_MISMATCH, 0, mismatch.event
                )
                self._conclude(claim, Outcome(failure=mismatch.failure))
                return
            if claim.nodes == 1:
                self._run(claim)
            elif isinstance(placed := self.leader.place(claim), Outcome):
                self._conclude(claim, placed)
            elif placed:
                self._run(claim, self.leader)

    def _claim(self, job_id: str) -> Claim | None:
        with self.sessions.begin() as s:
            attempt = jobs.claim(s, job_id, self.worker, self.settings.lease_seconds)
            job = jobs.get_job(s, job_id)
            if job is None or attempt is None:
                # A duplicate delivery, a job already finished or cancelled, or an id that
                # names no job: harmless by design.
                why = "no such job" if job is None else f"it is {job.status}"
                log.info("job %s not claimable (%s); message dropped", job_id, why)
                return None
            claim = Claim.of_job(job, attempt)
        bind(attempt=attempt)
        log.info("job %s claimed as attempt %d by %s", job_id, attempt, self.worker)
        return claim

    def _run(self, claim: Claim, leader: Leader | None = None) -> None:
        self.slot.start(claim.job_id, claim.attempt)
        try:
            this = launch(self.settings, claim, self._resume_bound(claim))
            child = leader.start(claim, this) if leader else self._child(this)
            if child is None:
                return  # the reservation expired before go: given back, nothing trained
            watch = AttemptWatch(
                self.settings,
                self.sessions,
                self.redis,
                self.slot,
                claim.job_id,
                claim.attempt,
                on_precision=lambda msg: self._started(claim, msg, child),
                runtime_limit_s=runtime_limit(self.settings, claim),
            )
            try:
                outcome = watch.run(child)
            finally:
                child.close()
            self._conclude(claim, outcome)
        finally:
            self.slot.clear()
            if self.spares is not None:
                self.spares.refill()  # if "started" never came (a failed attempt)

    def _resume_bound(self, claim: Claim) -> dict[int, int] | None:
        """A first attempt has no checkpoint to resume from; a later one resumes only within
        the job's recorded history (waiting at most a third of the lease, unrenewed
        meanwhile, for the recorder to catch up)."""
        if claim.attempt == 1:
            return None
        wait_s = self.settings.lease_seconds / 3
        return claim.with_fork_step(resume_bound(self.sessions, self.redis, claim.job_id, wait_s))

    def _child(self, launch: Launch) -> ChildProcess:
        """The process that trains this attempt: the warm spare when one takes the launch,
        else a fresh one. A spare that is gone, or exits before accepting, never fails the
        job: it costs the cold start it was meant to save."""
        gpu, passthrough = self.slot.pool_slot.gpu, self.settings.child_env_passthrough
        if (count := devices_of(launch)) > 1:  # data-parallel: torchrun's ranks, never a spare
            return RankGroup(launch, count, slot_gpus(self.slot.pool_slot), passthrough)
        spare = self.spares.take() if self.spares is not None else None
        if spare is not None:
            # Accepted comes once its imports are done; waiting for it (at most a third
            # of the lease, which nobody renews meanwhile) tells a live spare from one
            # that died just now.
            if spare.hand(launch) and spare.wait_accepted(self.settings.lease_seconds / 3):
                return spare
            spare.proc.wait()
            spare.close()
            log.warning(
                "job %s: warm spare %d exited (code %s) before taking the launch; starting "
                "a fresh training process",
                launch.job_id,
                spare.pid,
                spare.proc.returncode,
            )
        return ChildProcess.cold(launch, gpu, passthrough)

    def _started(self, claim: Claim, msg: PrecisionChosen, child: ChildProcess) -> None:
        """The child chose its precision: record it (fenced) and tell watchers it started."""
        if self.spares is not None:
            self.spares.refill()  # this job's start is done: the next spare may import now
        with self.sessions.begin() as s:
            current = jobs.set_precision(
                s, claim.job_id, claim.attempt, msg.requested, msg.effective, msg.reason_on_device
            )
        if not current:
            return  # fenced out: this attempt no longer speaks for the job
        self.events.publish(
            claim.job_id,
            claim.attempt,
            "started",
            0,
            {
                "worker": self.worker,
                "attempt": claim.attempt,
                "precision": msg.event_data(),
                "process": self._process(claim, child),
            },
        )

    def _process(self, claim: Claim, child: ChildProcess) -> dict[str, Any]:
        """The training process, as the ``started`` event shows it."""
        if isinstance(child, RankGroup):
            return child.describe()
        took = child.accepted
        # A child says Accepted before anything else, and a batch of messages is read whole
        # before any is handled: the precision it chose never comes first.
        assert took is not None, "the training child chose its precision before accepting"
        log.info(
            "job %s: training in %s process %d (CUDA untouched before the launch: %s)",
            claim.job_id,
            "a warm" if took.warm else "a fresh",
            took.pid,
            not took.cuda_initialized,
        )
        return {
            "pid": took.pid,
            "warm": took.warm,
            "cuda_initialized_before_launch": took.cuda_initialized,
        }

    # -- how it ended ----------------------------------------------------------------

    def _conclude(self, claim: Claim, out: Outcome) -> None:
        job_id, attempt = claim.job_id, claim.attempt
        if out.lease_lost:
            log.warning(
                "job %s attempt %d lost its lease; another attempt owns it", job_id, attempt
            )
            return
        status, error = final_state(claim, out, runtime_limit(self.settings, claim))
        step = _end_step(out, error)
        kind = "requeued" if status == JobStatus.QUEUED else str(status)
        data = {"error": error} if error else {}
        with self.sessions.begin() as s:
            if status == JobStatus.QUEUED:
                # A retry (the error is in the event), or a precision fallback.
                fallback = out.failure.fallback_to if out.failure else None
                done = jobs.release(s, job_id, attempt, fallback_to=fallback)
            elif status == JobStatus.CANCELLED:
                # A stop on request ends as the request said: an alert rule's early stop
                # ends succeeded, and the event names the rule that stopped it.
                stopped = stops.finish_stopped(s, job_id, attempt)
                done = stopped is not None
                if stopped is not None:
                    status, kind = stopped.status, str(stopped.status)
                    data = {"stopped_by": stopped.reason} if stopped.reason else data
            else:
                done = jobs.finish(s, job_id, attempt, status, error)
        if done:  # the status is the fenced truth; the event only tells it
            end = None if status == JobStatus.QUEUED else status
            self.events.conclude(job_id, attempt, kind, step, data, end_status=end)
            if end is not None:
                claim.release_pin(self.settings)


def _end_step(out: Outcome, error: dict[str, Any] | None) -> int:
    """The step the attempt ended at, as its concluding event records it: the result's,
    the error's, or the step a stop request (cancel, preempt) stopped the child at."""
    if out.result is not None:
        return out.result.final_step
    for step in ((error or {}).get("step"), out.failure.step if out.failure else None):
        if step is not None:
            return int(step)
    return 0
