"""The Celery task's body: claim a job, run its training child, record how it ended.

The supervisor never touches torch or CUDA (it lives in a forked Celery pool
process). Every write it makes is fenced by the attempt number its claim
returned, so a supervisor that lost its lease can change nothing. While the
child trains, :class:`amptrain.worker.pool.watch.AttemptWatch` keeps the lease and relays
stop requests.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.data_access import PathRefused, user_roots
from amptrain.contract.errors import TimeLimitError
from amptrain.contract.layout import job_checkpoint_url
from amptrain.core import redis as amptrain_redis
from amptrain.core.enums import JobStatus
from amptrain.core.logs import bind, log_context
from amptrain.core.settings import Settings
from amptrain.store import jobs
from amptrain.store.db import make_engine, make_session_factory
from amptrain.worker.child.protocol import Failed, Launch, PrecisionChosen
from amptrain.worker.main import devices
from amptrain.worker.pool import shape
from amptrain.worker.pool.child_handle import ChildProcess
from amptrain.worker.pool.events import LifecycleEvents
from amptrain.worker.pool.ranks import RankGroup, devices_of, slot_gpus
from amptrain.worker.pool.slot import JobSlot, PoolSlot
from amptrain.worker.pool.spare import SpareKeeper
from amptrain.worker.pool.watch import AttemptWatch, Outcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    """The attempt this supervisor took, and what it needs of the job."""

    job_id: str
    attempt: int
    spec: dict[str, Any]
    max_attempts: int
    owner: str


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
            self._run(claim)

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
            claim = Claim(job_id, attempt, dict(job.spec), job.max_attempts, job.owner)
        bind(attempt=attempt)
        log.info("job %s claimed as attempt %d by %s", job_id, attempt, self.worker)
        return claim

    def _run(self, claim: Claim) -> None:
        self.slot.start(claim.job_id, claim.attempt)
        try:
            child = self._child(self._launch(claim))
            watch = AttemptWatch(
                self.settings,
                self.sessions,
                self.redis,
                self.slot,
                claim.job_id,
                claim.attempt,
                on_precision=lambda msg: self._started(claim, msg, child),
                runtime_limit_s=self._runtime_limit(claim),
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

    def _launch(self, claim: Claim) -> Launch:
        return Launch(
            job_id=claim.job_id,
            attempt=claim.attempt,
            spec=claim.spec,
            checkpoint_dir=job_checkpoint_url(self.settings.checkpoint_url, claim.job_id),
            redis_url=self.settings.redis_url,
            data_roots=self._data_roots(claim),
            cpu_bf16_probe=devices.cpu_bf16_probe(devices.known_report()),
        )

    def _data_roots(self, claim: Claim) -> list[str]:
        """The roots this job's owner may read (``ROOT/<owner>`` with per-user roots)."""
        roots = [str(r) for r in self.settings.data_roots]
        try:
            return user_roots(roots, claim.owner, self.settings.data_roots_per_user)
        except PathRefused:
            log.warning("job %s: owner %r cannot have data roots", claim.job_id, claim.owner)
            return []

    def _runtime_limit(self, claim: Claim) -> float:
        asked = claim.spec.get("max_runtime_s") or self.settings.job_runtime_default_seconds
        return float(min(asked, self.settings.job_runtime_limit_seconds))

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
        status, error = self._final_state(claim, out)
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

    def _final_state(self, claim: Claim, out: Outcome) -> tuple[JobStatus, dict[str, Any] | None]:
        if out.result is not None:
            return JobStatus.SUCCEEDED, None
        if out.stop_requested == "cancel":
            return JobStatus.CANCELLED, None
        if out.stop_requested == "preempt":
            return JobStatus.QUEUED, None
        if out.stop_requested == "timeout":
            return JobStatus.FAILED, self._timed_out(claim, out)
        failure = out.failure or Failed(
            code="internal",
            message=f"training process exited with code {out.exit_code} without a result",
            step=None,
            retryable=True,
        )
        if failure.retryable and claim.attempt < claim.max_attempts:
            log.warning(
                "job %s attempt %d failed (%s); re-queueing",
                claim.job_id,
                claim.attempt,
                failure.code,
            )
            return JobStatus.QUEUED, failure.error()
        return JobStatus.FAILED, failure.error()

    def _timed_out(self, claim: Claim, out: Outcome) -> dict[str, Any]:
        step = out.failure.step if out.failure else None
        where = f"; checkpointed at step {step}" if step is not None else ""
        error = TimeLimitError(
            f"stopped after {self._runtime_limit(claim):g} s, the wall-clock limit of one "
            f"attempt (max_runtime_s){where}",
            step=step,
        )
        return error.to_dict()
