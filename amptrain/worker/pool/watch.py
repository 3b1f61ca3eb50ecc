"""One attempt while its training child runs: lease, stop requests, and how the child ended.

:class:`AttemptWatch` polls the child's control pipe, renews the attempt's
:class:`Lease` every heartbeat, relays a cancel (the API asked) or a drain (this
worker shuts down) to the child, escalates to SIGTERM and SIGKILL when the
child ignores it, and kills the child at once when the lease is lost. It
writes nothing about the job's outcome: the supervisor does, from the
:class:`Outcome` it returns.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import redis
from sqlalchemy.orm import Session, sessionmaker

from amptrain.core.enums import JobStatus
from amptrain.core.redis import Keys
from amptrain.core.settings import Settings
from amptrain.store import jobs
from amptrain.worker.child.protocol import ControlMessage, Failed, Finished, PrecisionChosen
from amptrain.worker.main import drain
from amptrain.worker.pool.child_handle import ChildProcess
from amptrain.worker.pool.slot import JobSlot

log = logging.getLogger(__name__)

POLL_S = 0.25  # how quickly a cancel request reaches the child

StopRequest = Literal["cancel", "preempt", "timeout"]
"""``cancel``: the API asked; ``preempt``: this worker drains (checkpoint, then re-queue);
``timeout``: the attempt ran past its wall-clock limit (checkpoint, then fail)."""


@dataclass
class Outcome:
    """How the child ended, as learnt from its control messages and exit."""

    result: Finished | None = None
    failure: Failed | None = None
    stop_requested: StopRequest | None = None
    lease_lost: bool = False
    exit_code: int | None = None


class Lease:
    """The attempt's lease in SQL, renewed every heartbeat.

    A database blip is not a lost lease: training goes on and the renewal is
    retried. But a worker that could not renew for a whole lease must assume the
    reconciler gave the job to a successor (it cannot tell), so it fences itself.
    """

    def __init__(
        self, sessions: sessionmaker[Session], job_id: str, attempt: int, lease_s: float
    ) -> None:
        self.sessions = sessions
        self.job_id = job_id
        self.attempt = attempt
        self.lease_s = lease_s
        self.renewed_at = time.monotonic()

    def renew(self) -> JobStatus | None:
        """The job's status (``running`` or ``cancelling``); None once the lease is lost."""
        try:
            with self.sessions.begin() as s:
                status = jobs.heartbeat(s, self.job_id, self.attempt, self.lease_s)
        except Exception:
            log.exception("job %s: heartbeat failed; will retry", self.job_id)
            if time.monotonic() - self.renewed_at < self.lease_s:
                return JobStatus.RUNNING
            return None
        if status is None:
            return None
        self.renewed_at = time.monotonic()
        return JobStatus(status)


class AttemptWatch:
    """Watches one attempt's child until it has exited and said everything it had to say."""

    def __init__(
        self,
        settings: Settings,
        sessions: sessionmaker[Session],
        client: redis.Redis,
        slot: JobSlot,
        job_id: str,
        attempt: int,
        on_precision: Callable[[PrecisionChosen], None],
        runtime_limit_s: float | None = None,
    ) -> None:
        self.settings = settings
        self.deadline = time.monotonic() + runtime_limit_s if runtime_limit_s else None
        self.redis = client
        self.slot = slot
        self.job_id = job_id
        self.attempt = attempt
        self.on_precision = on_precision
        self.lease = Lease(sessions, job_id, attempt, settings.lease_seconds)
        self.out = Outcome()

    def run(self, child: ChildProcess) -> Outcome:
        next_beat = time.monotonic() + self.settings.heartbeat_seconds
        status: JobStatus | None = JobStatus.RUNNING
        kill_at: float | None = None
        while not child.finished():
            for msg in child.messages(POLL_S):
                self._on_message(msg)
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + self.settings.heartbeat_seconds
                status = self.lease.renew()
                self.slot.refresh()
            if status is None:
                if not self.out.lease_lost:
                    self._fence(child)
                continue
            if self.out.stop_requested is None and (wanted := self._stop_wanted(status)):
                self._ask_to_stop(child, wanted)
                kill_at = now + self.settings.cancel_grace_seconds
            if kill_at is not None and now >= kill_at and child.alive():
                log.warning("job %s: child ignored the stop request; terminating", self.job_id)
                child.kill(grace=self.settings.cancel_grace_seconds)
        self.out.exit_code = child.proc.returncode
        return self.out

    def _on_message(self, msg: ControlMessage) -> None:
        match msg:
            case PrecisionChosen():
                self.on_precision(msg)
            case Finished():
                self.out.result = msg
            case Failed():
                self.out.failure = msg

    def _fence(self, child: ChildProcess) -> None:
        """Fenced out: a successor may already train this job. Stop at once, with no final
        checkpoint that could overwrite the successor's."""
        self.out.lease_lost = True
        log.warning(
            "job %s attempt %d lost its lease; killing its child", self.job_id, self.attempt
        )
        child.abort()

    def _stop_wanted(self, status: JobStatus) -> StopRequest | None:
        if status == JobStatus.CANCELLING:
            return "cancel"  # seen by the heartbeat even if the Redis cancel key was lost
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return "timeout"
        if drain.draining():
            return "preempt"
        try:
            cancel = self.redis.get(Keys.cancel(self.job_id))
        except redis.RedisError:
            return None  # a Redis blip: training goes on, the heartbeat still sees cancels
        return "cancel" if cancel else None

    def _ask_to_stop(self, child: ChildProcess, wanted: StopRequest) -> None:
        """The child stops at its next step boundary: SIGUSR1 checkpoints and ends the run
        (cancel, timeout), SIGUSR2 checkpoints for a resume elsewhere (preempt)."""
        self.out.stop_requested = wanted
        child.signal(signal.SIGUSR2 if wanted == "preempt" else signal.SIGUSR1)
        log.info("job %s attempt %d: asked child to %s", self.job_id, self.attempt, wanted)
