"""Hand committed jobs to the Celery broker; the jobs table is the outbox.

The API never imports the worker: it sends ``amptrain.run_job`` by name, with
the job id as the only argument, to the job's queue (:func:`queue_for`). A request
only *queues* the send (:meth:`Dispatcher.submit`, after its transaction
committed), so a dead broker never slows a request. One thread per API
process does the sending, and the process holding the Redis leader lock also
sweeps the table for queued jobs the broker never got (broker down, process
killed between commit and send, job released back to the queue) and re-sends
them, after running the :mod:`~amptrain.server.reconciler`. A duplicate send is
harmless: the worker's guarded claim runs a job once.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from functools import partial

import redis
import sqlalchemy as sa
from celery import Celery
from redis.exceptions import LockError
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.spec import JobSpec
from amptrain.core import presence
from amptrain.core.enums import TaskName
from amptrain.core.queue_order import send_priority
from amptrain.core.redis import Keys
from amptrain.core.settings import Settings, shape_queue
from amptrain.server import reconciler
from amptrain.server.broker import make_celery
from amptrain.store import jobs, outbox, queue_waits
from amptrain.store.models import utcnow

__all__ = ["Dispatcher", "make_celery", "queue_for"]

log = logging.getLogger(__name__)

SWEEP_BATCH = 200


def queue_for(spec: JobSpec, cpu_only: bool = False) -> str:
    """The Celery queue a job goes to: the spec's ``queue`` if it names one, else the queue
    of its shape: ``cpu`` when it asks for the CPU (or, with ``device: auto``, when
    ``cpu_only``: the live workers have no GPU, so it trains on the CPU: see
    :func:`amptrain.server.web.admission.job_queue`), else ``gpu``, for one device, and
    ``cpu-x{N}`` / ``gpu-x{N}`` for ``devices: N``, which only workers started with
    ``--devices-per-job N`` consume (routing by queue, as Celery fleets do: each pool
    process owns its N devices before it takes a message)."""
    if spec.queue:
        return spec.queue
    on_cpu = spec.device == "cpu" or (cpu_only and spec.device == "auto")
    return shape_queue("cpu" if on_cpu else "gpu", spec.devices)


class Dispatcher:
    """Sends queued jobs to the broker; one instance (and one sending thread) per API process."""

    def __init__(
        self,
        settings: Settings,
        session_factory: sessionmaker[Session],
        redis_client: redis.Redis,
        celery_app: Celery | None = None,
    ) -> None:
        self.settings = settings
        self.sessions = session_factory
        self.redis = redis_client
        self.celery = celery_app or make_celery(settings)
        self.interval = settings.dispatch_interval_seconds
        # A job newer than this is still being sent by the process that created it.
        self.sweep_min_age = timedelta(seconds=max(2.0, self.interval))
        self._pending: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._lock = redis_client.lock(
            Keys.DISPATCHER_LEADER,
            timeout=max(10.0, 3 * self.interval),
            blocking=False,
            thread_local=False,
        )
        self._leader = False

    # -- called by request handlers (after commit) -------------------------------------

    def submit(self, job_id: str, queue_name: str) -> None:
        """Send this committed job soon; never blocks."""
        self._pending.put_nowait((job_id, queue_name))

    def wake(self) -> None:
        """Wake the loop (used on shutdown)."""
        self._pending.put_nowait(None)

    # -- the loop -------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Send submitted jobs as they come; every ``interval`` seconds, sweep if leader."""
        next_sweep = time.monotonic()
        while not stop.is_set():
            wait = max(0.0, next_sweep - time.monotonic())
            try:
                item = self._pending.get(timeout=wait)
            except queue.Empty:
                item = None
            if item is not None:
                self.send(*item)
            if stop.is_set():
                break
            if time.monotonic() >= next_sweep:
                if self.lead():
                    self._leader_pass()
                next_sweep = time.monotonic() + self.interval
        self._resign()

    def send(self, job_id: str, queue_name: str, attempt: int = 0) -> bool:
        """Publish one job (ahead of the jobs that never ran when it ran before: ``attempt``,
        :mod:`amptrain.core.queue_order`) and mark it dispatched; False when the broker
        refused."""
        allowed = self.settings.routable_queues
        if queue_name not in allowed:
            # The API checked the queue against the settings of its day; an operator may
            # have removed it since while the job waited (the sweep re-sends released jobs
            # too). kombu would use the name as a Redis key: never hand it one unchecked.
            self._reject(job_id, f"queue {queue_name!r} is not one of {allowed}")
            return True
        try:
            self.celery.send_task(
                TaskName.RUN_JOB,
                args=[job_id],
                queue=queue_name,
                priority=send_priority(attempt),
                ignore_result=True,
            )
        except Exception as exc:  # kombu raises many kinds; all mean "not sent, retry later"
            log.warning("dispatch of %s to %s failed (will retry): %s", job_id, queue_name, exc)
            return False
        try:
            self._mark_dispatched(job_id)
        except sa.exc.SQLAlchemyError:
            # Sent but not marked: the sweep sends it again, the claim makes that harmless.
            log.exception("could not mark %s dispatched", job_id)
        self._say_if_unserved(job_id, queue_name)
        return True

    def _say_if_unserved(self, job_id: str, queue_name: str) -> None:
        """A job sent to a queue no live worker consumes waits there; tell its watchers
        once (``waiting_for_queue``) rather than leave them guessing. Best effort: the job
        runs as soon as a worker of that queue appears either way."""
        try:
            served = presence.served_queues(self.redis)
            if queue_name in served:
                return
            with self.sessions.begin() as s:
                said = queue_waits.note_waiting(s, job_id, queue_name, served)
        except (redis.RedisError, sa.exc.SQLAlchemyError, ValueError) as exc:
            log.warning("could not check who serves queue %s for %s: %s", queue_name, job_id, exc)
            return
        if said:
            log.info("job %s waits: no live worker takes jobs from queue %s", job_id, queue_name)

    def _reject(self, job_id: str, message: str) -> None:
        log.warning("job %s not dispatched: %s", job_id, message)
        with self.sessions.begin() as s:
            jobs.reject_queued(s, job_id, "invalid_spec", message)

    def sweep_once(self) -> int:
        """Re-send queued jobs that no broker has; returns how many were sent."""
        with self.sessions() as s:
            rows = outbox.undispatched(s, utcnow() - self.sweep_min_age, SWEEP_BATCH)
        sent = 0
        for job_id, queue_name, attempt in rows:
            if not self.send(job_id, queue_name, attempt):
                break  # broker down: try again next sweep rather than time out per job
            sent += 1
        if sent:
            log.info("dispatcher sweep re-sent %d job(s)", sent)
        return sent

    def lead(self) -> bool:
        """Take or renew the leader lock; only the leader sweeps."""
        try:
            if self._leader:
                self._lock.reacquire()
            else:
                self._leader = bool(self._lock.acquire(blocking=False))
        except (LockError, redis.RedisError):
            self._leader = False
        return self._leader

    def close(self) -> None:
        """Release broker connections."""
        try:
            self.celery.close()
        except Exception:
            log.debug("closing the celery app failed", exc_info=True)

    def _leader_pass(self) -> None:
        steps: tuple[Callable[[], int], ...] = (
            partial(reconciler.reap_expired_leases, self.sessions),
            partial(
                reconciler.forget_lost_dispatches,
                self.sessions,
                self.redis,
                self.settings.routable_queues,
            ),
            self.sweep_once,
        )
        for step in steps:
            try:
                step()
            except (sa.exc.SQLAlchemyError, redis.RedisError) as exc:
                name = getattr(step, "func", step).__name__
                log.warning("dispatcher %s failed (will retry): %s", name, exc)

    def _resign(self) -> None:
        if self._leader:
            with contextlib.suppress(LockError, redis.RedisError):
                self._lock.release()
            self._leader = False

    def _mark_dispatched(self, job_id: str) -> None:
        with self.sessions.begin() as s:
            outbox.mark_dispatched(s, job_id)
