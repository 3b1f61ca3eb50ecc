"""A worker's drain, from its main process to its pool processes, without Redis.

On warm shutdown (SIGTERM: ``docker stop``, Kubernetes, ``amptrain up`` stopping) the
main process sends :data:`DRAIN_SIGNAL` to each of its pool processes; a pool process
that :func:`listen` ed then asks its training child to checkpoint at the next step
boundary, and the job goes back to the queue. A signal, not a Redis key: a worker whose
Redis is down (killed first, unreachable) drains all the same instead of training on
until it is killed.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import psutil

log = logging.getLogger(__name__)

DRAIN_SIGNAL = signal.SIGUSR2
_draining = False


def listen() -> None:
    """In a pool process: note the drain when it comes (Celery resets this signal to
    its default, which would kill the pool process, before ``worker_process_init``)."""
    signal.signal(DRAIN_SIGNAL, _on_drain)


def _on_drain(signum: int, frame: Any) -> None:
    global _draining
    _draining = True


def draining() -> bool:
    """In a pool process: whether its worker is draining."""
    return _draining


def tell_pool_processes() -> int:
    """In the main process: signal every pool process (its children); how many."""
    told = 0
    for child in psutil.Process().children():
        try:
            child.send_signal(DRAIN_SIGNAL)
            told += 1
        except psutil.NoSuchProcess:
            pass
    return told
