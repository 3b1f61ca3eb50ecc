"""``amptrain up``'s workers for multi-device jobs, started when such a job waits.

A ``devices: N`` job (N > 1) goes to its shape queue (``cpu-xN``, ``gpu-xN``), which
only a worker started with ``--devices-per-job N`` takes (:mod:`amptrain.server.dispatcher`).
On a fleet an operator starts those; on one machine ``up`` does: the first time a queued
job waits on a shape queue of a queue ``up`` serves, and the machine can run it -- N CPU
ranks for ``cpu`` on a machine with at least N cores, N visible GPUs otherwise -- it
starts one such worker (one job at a time, no metrics endpoint) and keeps it until it
stops. A job the machine cannot run keeps waiting, and ``up`` says once why.

The shape worker shares the machine with the one-device worker: its job's ranks run
beside the one-device jobs (on a GPU machine, on the same GPUs), as two people sharing
one workstation would.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.cli.up_stop import WORKER_PART, say
from amptrain.contract.spec import MAX_DEVICES
from amptrain.core.settings import parse_shape_queue
from amptrain.store import jobs

log = logging.getLogger(__name__)

POLL_S = 2.0
"""How often ``up`` looks for jobs waiting on a shape queue."""


def shape_of(queue: str, served: tuple[str, ...]) -> tuple[str, int] | None:
    """``(base, N)`` for a shape queue of a queue ``up`` serves (``cpu-x2`` -> ``("cpu", 2)``)."""
    shape = parse_shape_queue(queue)
    return shape if shape is not None and shape[0] in served and shape[1] <= MAX_DEVICES else None


def why_not(base: str, n: int, cpus: int, gpus: Callable[[], int]) -> str | None:
    """Why this machine cannot run ``n``-device jobs of ``base`` (None: it can)."""
    if base == "cpu":
        return None if n <= cpus else f"{n} CPU ranks need {n} cores; this machine has {cpus}"
    visible = gpus()
    return None if n <= visible else f"{n} GPUs needed; this machine shows {visible}"


@dataclass
class ShapeWorkers:
    """Starts (through ``spawn``) the shape workers queued jobs wait for, into ``parts``."""

    sessions: sessionmaker[Session]
    served: tuple[str, ...]
    spawn: Callable[[list[str]], subprocess.Popen[bytes]]
    parts: dict[str, subprocess.Popen[bytes]]
    gpus: Callable[[], int]
    cpus: int = field(default_factory=lambda: os.cpu_count() or 1)
    _told: set[str] = field(default_factory=set)
    _next: float = 0.0

    def poll(self) -> None:
        """At most every :data:`POLL_S`: start what the waiting jobs need. A database that
        does not answer now is asked again next time (``up`` keeps running)."""
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + POLL_S
        try:
            with self.sessions() as s:
                waiting = jobs.queued_queues(s)
        except sa.exc.SQLAlchemyError as exc:
            log.warning("cannot see the queued jobs now: %s", exc)
            return
        for queue in waiting:
            shape = shape_of(queue, self.served)
            if shape is not None and f"{WORKER_PART} {queue}" not in self.parts:
                self._start(queue, *shape)

    def _start(self, queue: str, base: str, n: int) -> None:
        reason = why_not(base, n, self.cpus, self.gpus)
        if reason is not None:
            if queue not in self._told:
                self._told.add(queue)
                say(f"a job waits on queue {queue}, which this machine cannot run: {reason}")
            return
        say(f"starting a worker for {n}-device jobs (queue {queue})")
        args = ["worker", "--queues", base, "--devices-per-job", str(n), "--concurrency", "1"]
        args += ["--metrics-port", "0", "--name", f"up-{queue}@{os.uname().nodename}"]
        self.parts[f"{WORKER_PART} {queue}"] = self.spawn(args)
