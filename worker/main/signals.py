"""Worker process signals: logging, GPU assignment per pool process, presence and
metrics in the main process, graceful drain on shutdown."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from typing import Any

import redis
from celery.signals import (
    setup_logging,
    worker_process_init,
    worker_ready,
    worker_shutdown,
    worker_shutting_down,
)

from api.core.logs import configure_logging
from api.core.settings import get_settings

log = logging.getLogger(__name__)

DRAIN_TTL_S = 3600

# Set by `amptrain worker` before Celery starts (see configure()).
_options: dict[str, Any] = {"queues": [], "concurrency": 1, "metrics_port": 0}
_presence: Any = None


def configure(*, queues: list[str], concurrency: int, metrics_port: int) -> None:
    """What `amptrain worker` decided, for the presence report and the metrics endpoint."""
    _options.update(queues=queues, concurrency=concurrency, metrics_port=metrics_port)


def draining_key(worker: str) -> str:
    """Set while a worker shuts down gracefully: its jobs checkpoint and go back to the queue."""
    return f"amptrain:worker:{worker}:draining"


@setup_logging.connect
def _setup_logging(loglevel: Any = None, **_: Any) -> None:
    # Connecting here stops Celery from installing its own handlers: one format everywhere.
    configure_logging(get_settings().log_format, component="worker", level=loglevel or "INFO")


def visible_gpus() -> list[str]:
    """GPU ids this worker may use, without importing torch in the (forking) main process.

    Asked once of ``python -m worker.child.probe --gpus`` (a process of its own,
    so CUDA never initialises here) and kept in the environment that the pool
    processes inherit.
    """
    for var in ("CUDA_VISIBLE_DEVICES", "AMPTRAIN_VISIBLE_GPUS"):
        env = os.environ.get(var)
        if env is not None:
            return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    try:
        out = subprocess.run(
            [sys.executable, "-m", "worker.child.probe", "--gpus"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    os.environ["AMPTRAIN_VISIBLE_GPUS"] = out
    return [d for d in out.split(",") if d]


@worker_process_init.connect
def _assign_gpu(**_: Any) -> None:
    # Each prefork pool process trains on its own GPU: pool index i -> i-th visible GPU.
    from billiard.process import current_process

    gpus = visible_gpus()
    index = getattr(current_process(), "index", 0) or 0
    os.environ["AMPTRAIN_POOL_INDEX"] = str(index)  # the job slot it reports (worker.main.presence)
    if gpus:
        os.environ["AMPTRAIN_ASSIGNED_GPU"] = gpus[index % len(gpus)]


def _redis() -> redis.Redis:
    return redis.Redis.from_url(
        get_settings().redis_url, socket_connect_timeout=2, socket_timeout=5
    )


@worker_ready.connect
def _clear_drain_flag(sender: Any = None, **_: Any) -> None:
    hostname = getattr(sender, "hostname", None)
    if hostname:
        try:
            _redis().delete(draining_key(hostname))
        except redis.RedisError:
            log.warning("could not clear the drain flag of %s", hostname)


@worker_ready.connect
def _announce(sender: Any = None, **_: Any) -> None:
    """Start the presence heartbeat (capability report included) and the metrics endpoint."""
    global _presence
    from worker.main import metrics
    from worker.main.presence import Presence

    hostname = getattr(sender, "hostname", None)
    if not hostname:
        return
    settings = get_settings()
    client = _redis()
    info = {
        **_options,
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "started_at": time.time(),
    }
    _presence = Presence(client, hostname, info, interval_s=settings.heartbeat_seconds)
    _presence.start()
    metrics.serve(client, hostname, int(_options["concurrency"]), int(_options["metrics_port"]))


@worker_shutdown.connect
def _leave(**_: Any) -> None:
    if _presence is not None:
        _presence.stop()


@worker_shutting_down.connect
def _drain(sender: str | None = None, **_: Any) -> None:
    """SIGTERM: running jobs checkpoint and go back to the queue instead of failing.

    Celery's warm shutdown then waits for the supervisors, which return as soon
    as their child has checkpointed.
    """
    if not sender:
        return
    try:
        _redis().set(draining_key(sender), "1", ex=DRAIN_TTL_S)
        if _presence is not None:
            _presence.info["draining"] = True
        log.info("worker %s draining: running jobs will checkpoint and be re-queued", sender)
    except redis.RedisError:
        log.error("could not flag %s as draining; running jobs finish as usual", sender)
