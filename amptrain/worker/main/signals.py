"""The Celery main process's life: logging, presence and metrics once ready, and a
graceful drain on shutdown.

``amptrain worker`` decides the :class:`WorkerOptions` and connects a
:class:`WorkerLifecycle` bound to them before Celery starts; the handlers read
nothing else. (Each pool process takes its own GPU slot: see
:mod:`amptrain.worker.pool.tasks`.)
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from celery.signals import setup_logging, worker_ready, worker_shutdown, worker_shutting_down

from amptrain.core import redis as amptrain_redis
from amptrain.core.logs import configure_logging, quiet_libraries
from amptrain.core.settings import Settings, get_settings
from amptrain.worker.main import devices, drain, metrics
from amptrain.worker.main.presence import Presence

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerOptions:
    """What ``amptrain worker`` decided: shown in ``GET /workers``, used by the metrics endpoint."""

    queues: list[str]
    concurrency: int
    metrics_host: str
    metrics_port: int
    devices_per_job: int = 1
    quiet: bool = False
    """Celery's own log lines only at WARNING and above (``amptrain worker --quiet``)."""
    slot_gpus: list[list[str]] = field(default_factory=list)
    """Per pool process (by index), the GPUs it owns (see :func:`amptrain.worker.main.devices.slot_gpus`)."""


@setup_logging.connect
def _setup_logging(loglevel: Any = None, **_: Any) -> None:
    # Connecting here stops Celery from installing its own handlers: one format everywhere.
    configure_logging(get_settings().log_format, component="worker", level=loglevel or "INFO")


class WorkerLifecycle:
    """The main process's signal handlers, bound to one worker's options and settings."""

    def __init__(self, options: WorkerOptions, settings: Settings) -> None:
        self.options = options
        self.settings = settings
        self.presence: Presence | None = None

    def connect(self) -> None:
        """Receive Celery's signals (strong references: this object lives as long as the worker)."""
        setup_logging.connect(self.on_setup_logging, weak=False)
        worker_ready.connect(self.on_ready, weak=False)
        worker_shutting_down.connect(self.on_shutting_down, weak=False)
        worker_shutdown.connect(self.on_shutdown, weak=False)

    def on_setup_logging(self, **_: Any) -> None:
        """After :func:`_setup_logging` (connected first): quiet Celery if asked."""
        if self.options.quiet:
            quiet_libraries()

    def _redis(self) -> redis.Redis:
        return amptrain_redis.client(self.settings.redis_url, amptrain_redis.WORKER_TIMEOUT_S)

    def on_ready(self, sender: Any = None, **_: Any) -> None:
        """Announce this worker and serve its metrics."""
        hostname = getattr(sender, "hostname", None)
        if not hostname:
            return
        if os.geteuid() == 0:
            log.info("worker %s runs as root (usual in a container)", hostname)
        client = self._redis()
        info = {
            "queues": self.options.queues,
            "concurrency": self.options.concurrency,
            "devices_per_job": self.options.devices_per_job,
            "slots": [{"slot": i, "gpus": g} for i, g in enumerate(self.options.slot_gpus)],
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": time.time(),
        }
        self.presence = Presence(
            client,
            hostname,
            info,
            interval_s=self.settings.heartbeat_seconds,
            report=devices.known_report(),  # taken before the fork, when `amptrain worker` ran
        )
        self.presence.start()
        metrics.serve(
            client,
            hostname,
            self.options.concurrency,
            self.options.metrics_host,
            self.options.metrics_port,
        )

    def on_shutting_down(self, sender: str | None = None, **_: Any) -> None:
        """SIGTERM: running jobs checkpoint and go back to the queue instead of failing.

        Celery's warm shutdown then waits for the supervisors, which return as soon
        as their child has checkpointed.
        """
        if self.presence is not None:
            self.presence.info["draining"] = True  # the dispatcher sends it nothing new
        told = drain.tell_pool_processes()
        log.info(
            "worker %s draining: %d pool processes checkpoint their jobs and re-queue them",
            sender,
            told,
        )

    def on_shutdown(self, **_: Any) -> None:
        if self.presence is not None:
            self.presence.stop()
