"""The bounded hand-off between the training thread and the sink.

The training thread only ever calls :meth:`Publisher.offer`, which never
blocks: a batch that does not fit is dropped and counted. A daemon thread
drains the queue and calls ``sink.write(batch)`` once per batch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from amptrain.contract.records import Sink

log = logging.getLogger(__name__)

Batch = list[dict[str, Any]]

PUBLISHER_NICE = 10
"""Niceness added to the publisher thread: telemetry may lag, training should not."""


class Publisher:
    """A queue bounded by the number of *records* it holds, drained by a background thread.

    A batch is accepted when the queue is empty or when it fits under
    ``max_records``; otherwise it is dropped whole. Batches a sink fails to
    write (it raised) also count as dropped. The caller owns the sink: the
    publisher never closes it.
    """

    def __init__(self, sink: Sink | None, max_records: int) -> None:
        self._sink = sink
        self._max = max_records
        self._batches: deque[Batch] = deque()
        self._queued = 0
        self._dropped = 0
        self._closing = False
        self._writing = False
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        if sink is not None:
            self._thread = threading.Thread(
                target=self._drain, name="amptrain-telemetry", daemon=True
            )
            self._thread.start()

    @property
    def dropped(self) -> int:
        """Records dropped so far (queue full, sink error, or left over at close)."""
        with self._cond:
            return self._dropped

    def offer(self, batch: Batch) -> bool:
        """Queue ``batch`` without blocking; False (and counted) when it was dropped."""
        if self._sink is None or not batch:
            return True
        with self._cond:
            if self._closing or (self._queued and self._queued + len(batch) > self._max):
                self._dropped += len(batch)
                return False
            self._batches.append(batch)
            self._queued += len(batch)
            self._cond.notify()
        return True

    def wait_delivered(self, timeout: float) -> bool:
        """Block until every batch offered so far went through ``sink.write`` (True) or
        ``timeout`` seconds passed (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._batches and not self._writing, timeout)

    def close(self, timeout: float, notice: Callable[[int], Batch] | None = None) -> None:
        """Stop accepting, let the thread deliver what is queued for up to ``timeout`` seconds.

        Whatever is still queued after that counts as dropped; a sink stuck in
        ``write`` is abandoned (the thread is a daemon). When the queue drained
        and records were dropped, ``notice(dropped)`` builds a last batch (a
        warning) that is written directly: the sink is idle by then, and the
        warnings sent while it was overloaded were likely dropped themselves.
        """
        with self._cond:
            self._closing = True
            self._cond.notify()
        drained = True
        if self._thread is not None:
            self._thread.join(timeout)
            drained = not self._thread.is_alive()
        with self._cond:
            self._dropped += self._queued
            self._queued = 0
            self._batches.clear()
            dropped = self._dropped
        if drained and dropped and notice is not None and self._sink is not None:
            try:
                self._sink.write(notice(dropped))
            except Exception:
                log.exception("telemetry sink failed on the final notice")

    def _drain(self) -> None:
        assert self._sink is not None
        _lower_thread_priority()
        while True:
            with self._cond:
                while not self._batches and not self._closing:
                    self._cond.wait()
                if not self._batches:
                    return
                batch = self._batches.popleft()
                self._queued -= len(batch)
                self._writing = True
            try:
                self._sink.write(batch)
            except Exception:
                log.exception("telemetry sink failed; dropping a batch of %d records", len(batch))
                with self._cond:
                    self._dropped += len(batch)
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()


def _lower_thread_priority() -> None:
    """Let the training thread win when CPU cores are contended (Linux nices threads one by one)."""
    # Not Linux, or not permitted: priority is an optimisation only.
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PUBLISHER_NICE)
