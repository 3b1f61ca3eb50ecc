"""The warm spare of one pool slot: a training process started before its job.

:class:`SpareKeeper` keeps one :meth:`~amptrain.worker.pool.child_handle.ChildProcess.spare`
ready per pool process (``AMPTRAIN_WARM_SPARE``, on by default). The supervisor
:meth:`~SpareKeeper.take`\\ s it for the next attempt and asks for the next one
once that attempt has started (:meth:`~SpareKeeper.refill`), so the next
spare's imports do not compete with this job's start for the CPU.

One thread per pool process starts every spare and replaces one that died while
idle, with a growing pause when spares keep dying (a broken install must not
become a fork loop). That thread lives as long as the pool process: the spare's
parent-death signal follows the thread that started it, and a spare must die
with its pool process (worker shutdown, ``kill -9``) and with nothing else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from amptrain.worker.pool.child_handle import ChildProcess

log = logging.getLogger(__name__)

CHECK_S = 1.0
"""How often the keeper looks at an idle spare (to replace one that died)."""
BACKOFF_S = (1.0, 60.0)
"""First and longest pause before starting another spare after one died while idle."""
SHORT_LIVED_S = 60.0
"""A spare that died sooner than this after its start doubles the pause."""


class SpareKeeper:
    """One warm spare training process for this pool process's slot."""

    def __init__(self, gpu: str | None, passthrough: Sequence[str] = ()) -> None:
        self.gpu = gpu
        self.passthrough = tuple(passthrough)
        self._spare: ChildProcess | None = None
        self._started_at = 0.0
        self._wanted = True
        self._not_before = 0.0
        self._pause = BACKOFF_S[0]
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="amptrain-spare", daemon=True)

    def start(self) -> SpareKeeper:
        self._thread.start()
        return self

    @property
    def pid(self) -> int | None:
        """The idle spare's process id, if there is one."""
        with self._lock:
            return self._spare.pid if self._spare is not None else None

    def take(self) -> ChildProcess | None:
        """The idle spare, if one lives (it is the caller's from now on); None otherwise.

        No new spare starts until :meth:`refill`."""
        with self._lock:
            spare, self._spare = self._spare, None
            self._wanted = False
        if spare is not None and not spare.alive():
            self._discard(spare, "before its launch")
            return None
        if spare is not None:
            self._pause = BACKOFF_S[0]
        return spare

    def refill(self) -> None:
        """Start the next spare now (in the keeper's thread)."""
        with self._lock:
            self._wanted = True
        self._wake.set()

    def close(self) -> None:
        """Stop keeping spares and kill the idle one (worker shutdown)."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            spare.proc.kill()
            spare.proc.wait()
            spare.close()

    # -- the keeper's thread ---------------------------------------------------------

    def _keep(self) -> None:
        while not self._stop.is_set():
            try:
                self._check()
            except Exception:  # the keeper must outlive any one failed start
                log.exception("warm spare: could not start a training process")
                self._not_before = time.monotonic() + self._backoff()
            self._wake.wait(CHECK_S)
            self._wake.clear()

    def _check(self) -> None:
        with self._lock:
            if self._stop.is_set() or not self._wanted:
                return
            spare = self._spare
            if spare is not None and spare.alive():
                return
            self._spare = None
        if spare is not None:
            lived = time.monotonic() - self._started_at
            self._discard(spare, "while idle")
            self._not_before = time.monotonic() + (
                self._backoff() if lived < SHORT_LIVED_S else BACKOFF_S[0]
            )
        if time.monotonic() < self._not_before:
            return
        new = ChildProcess.spare(self.gpu, self.passthrough)
        with self._lock:
            if self._stop.is_set() or not self._wanted or self._spare is not None:
                keep = False
            else:
                self._spare, self._started_at, keep = new, time.monotonic(), True
        if not keep:  # closed or taken meanwhile
            new.close()
            new.proc.kill()
            new.proc.wait()
        else:
            log.info("warm spare training process %d started", new.pid)

    def _backoff(self) -> float:
        pause = self._pause
        self._pause = min(self._pause * 2, BACKOFF_S[1])
        return pause

    @staticmethod
    def _discard(spare: ChildProcess, when: str) -> None:
        code = spare.proc.wait()
        spare.close()
        log.warning("warm spare training process %d exited %s (code %s)", spare.pid, when, code)
