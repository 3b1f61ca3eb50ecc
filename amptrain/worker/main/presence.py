"""The worker's presence in Redis: who it is, its devices, and the job each slot runs.

:class:`Presence` is a daemon thread in the worker's main process: it gathers
the capability report once (in a subprocess, see :mod:`amptrain.worker.main.devices`), logs
it, then re-publishes the worker's info with a TTL every heartbeat. It never
touches CUDA, so the pool processes forked later stay CUDA-free.

Each pool process keeps its own slot (:class:`amptrain.worker.pool.slot.JobSlot`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import redis

from amptrain.contract import host_memory
from amptrain.core import presence
from amptrain.worker.main import devices

log = logging.getLogger(__name__)


class Presence(threading.Thread):
    """Publishes ``info`` (+ the capability report) under the worker's name until stopped."""

    def __init__(
        self,
        client: redis.Redis,
        worker: str,
        info: dict[str, Any],
        *,
        interval_s: float,
        report: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name="amptrain-presence", daemon=True)
        self.client = client
        self.worker = worker
        self.info = dict(info)
        self.interval_s = interval_s
        self.ttl_s = presence.presence_ttl(interval_s)
        self.report = report
        self.stopped = threading.Event()

    def run(self) -> None:
        if self.report is None:
            self.report = devices.gather()
            log.info("capability report: %s", devices.summary(self.report))
        self.info.update(
            devices=self.report.get("devices", []),
            versions=self.report.get("versions", {}),
            report_error=self.report.get("error"),
        )
        failing = False
        while not self.stopped.is_set():
            try:
                self._measure_memory()
                presence.publish_worker(self.client, self.worker, self.info, self.ttl_s)
                if failing:
                    log.info("presence heartbeat to Redis restored")
                failing = False
            except redis.RedisError as exc:
                if not failing:
                    log.warning("presence heartbeat failed (%s); retrying", exc)
                failing = True
            self.stopped.wait(self.interval_s)

    def _measure_memory(self) -> None:
        """What a training process could get here, for the API's check at submit: measured
        while no slot runs a job (what the next job starts with: the API, Redis or a
        database on this machine already hold theirs), else kept from the last idle beat."""
        if "memory_available_bytes" in self.info:
            concurrency = int(self.info.get("concurrency") or 0)
            if presence.read_slots(self.client, self.worker, concurrency):
                return
        self.info["memory_available_bytes"] = host_memory.available()
        self.info["memory_total_bytes"] = host_memory.total()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop heartbeating and leave the list at once."""
        self.stopped.set()
        self.join(timeout)
        with contextlib.suppress(redis.RedisError):  # else the TTL removes it
            presence.remove_worker(self.client, self.worker)
