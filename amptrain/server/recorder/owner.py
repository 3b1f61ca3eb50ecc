"""Which jobs this API process records: SQL says which need recording, a redis-py
``Lock`` per job (:meth:`amptrain.core.redis.Keys.recorder_owner`) says who records each.

One owner per job at a time keeps a job's entries committed in stream order, so
the cursor never skips a point. A lock is renewed with every batch and every
refresh; an owner that stops renewing loses the job after ``ttl_s``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import redis
from redis.exceptions import LockError, LockNotOwnedError
from redis.lock import Lock
from sqlalchemy.orm import Session, sessionmaker

from amptrain.core.enums import JobStatus
from amptrain.core.redis import Keys
from amptrain.store import recording

log = logging.getLogger(__name__)


@dataclass
class Owned:
    """A job this process records, as SQL last described it."""

    job: recording.Recordable
    caught_up: bool = False  # previous owner's and our own pending entries handled

    @property
    def finished(self) -> bool:
        return JobStatus(self.job.status).finished


class Ownership:
    """``jobs``: the jobs held now. :meth:`refresh` follows SQL; :meth:`hold` renews one."""

    def __init__(self, sessions: sessionmaker[Session], client: redis.Redis, ttl_s: float) -> None:
        self.sessions = sessions
        self.redis = client
        self.ttl_s = ttl_s
        self.jobs: dict[str, Owned] = {}
        self._locks: dict[str, Lock] = {}
        self._renewed: dict[str, float] = {}
        """When each lock was last renewed (taken before asking, so never late)."""

    def refresh(self) -> None:
        """Take (or keep) every job SQL says needs recording and no other process holds;
        give up the ones that no longer need it."""
        with self.sessions() as s:
            wanted = {r.id: r for r in recording.jobs_to_record(s)}
        for job_id in list(self.jobs):
            if job_id not in wanted:
                self.release(job_id)
        for job_id, row in wanted.items():
            if self.hold(job_id):
                own = self.jobs.get(job_id)
                if own is None:
                    self.jobs[job_id] = Owned(row)
                else:
                    own.job = row
            elif job_id in self.jobs:
                log.warning("recorder lost job %s to another process", job_id)
                del self.jobs[job_id]

    def hold(self, job_id: str) -> bool:
        """Renew this process's lock on the job, or take it if nobody holds it. A lock
        renewed less than a third of its TTL ago is still ours for two thirds more, so it
        is not asked again: with 200 jobs a batch, one Redis round trip each was the
        recorder's largest cost after SQL."""
        asked = time.monotonic()
        if job_id in self._locks and asked - self._renewed.get(job_id, -1e9) < self.ttl_s / 3:
            return True
        lock = self._locks.pop(job_id, None)
        if lock is not None:
            with contextlib.suppress(LockNotOwnedError):  # expired: maybe someone else's now
                lock.reacquire()
                self._locks[job_id] = lock
                self._renewed[job_id] = asked
                return True
        lock = self.redis.lock(Keys.recorder_owner(job_id), timeout=self.ttl_s, thread_local=False)
        if lock.acquire(blocking=False):
            self._locks[job_id] = lock
            self._renewed[job_id] = asked
            return True
        return False

    def release(self, job_id: str) -> None:
        """Stop recording the job and let another process take it at once."""
        self.jobs.pop(job_id, None)
        self._renewed.pop(job_id, None)
        lock = self._locks.pop(job_id, None)
        if lock is not None:
            with contextlib.suppress(LockError, redis.RedisError):  # else it expires
                lock.release()

    def release_all(self) -> None:
        for job_id in list(self.jobs):
            self.release(job_id)

    def forget_progress(self) -> None:
        """After a Redis error or data loss: catch up on every job again before reading on."""
        self._renewed.clear()  # Redis may have lost the locks too: ask again
        for own in self.jobs.values():
            own.caught_up = False
