"""The worker's Prometheus endpoint: throughput, loss scale and memory of each busy slot.

Served by the worker's main process (``prometheus_client.start_http_server``
on ``--metrics-host``/``--metrics-port``, default 127.0.0.1:9808). The values
come from the job slots the supervisors keep in Redis
(:class:`amptrain.worker.pool.slot.JobSlot`), read at scrape time, so the forked pool
processes need no shared-memory metrics directory.

The endpoint has no authentication, so it listens on loopback unless told
otherwise, and its series are per slot (``slot``, ``gpu``), never per job: job
ids would tell anyone who can scrape it whose jobs run here and how their loss
goes (``GET /workers`` shows a job only to its owner). An operator finds the job
in a slot through ``GET /workers`` as an admin.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer

import redis
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from amptrain.contract.metrics import STEP_METRICS, Metric
from amptrain.core import presence

log = logging.getLogger(__name__)


def _gauge_name(m: Metric) -> str:
    return f"amptrain_worker_job_{m.name}" + ("_bytes" if m.unit == "bytes" else "")


_JOB_GAUGES = tuple(
    (_gauge_name(m), m.name, f"{m.doc} (the job's newest recorded step)")
    for m in STEP_METRICS
    if m.type in ("int", "float", "bytes") and not m.parallel and m.name != "time"
)
"""(metric name, slot field, help): a gauge per numeric field of the metric table."""


class SlotCollector(Collector):
    """Reads this worker's job slots from Redis at each scrape."""

    def __init__(self, client: redis.Redis, worker: str, concurrency: int) -> None:
        self.client = client
        self.worker = worker
        self.concurrency = concurrency

    def collect(self) -> Iterable[Any]:
        try:
            slots = presence.read_slots(self.client, self.worker, self.concurrency)
            up = 1.0
        except redis.RedisError as exc:
            log.warning("metrics scrape: Redis unreachable (%s)", exc)
            slots, up = [], 0.0
        yield _gauge("amptrain_worker_slots", "Jobs this worker runs at once.", self.concurrency)
        yield _gauge("amptrain_worker_busy_slots", "Slots running a job now.", len(slots))
        yield _gauge("amptrain_worker_redis_up", "1 when the last scrape reached Redis.", up)
        for name, field, help_text in _JOB_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=["slot", "gpu"])
            for s in slots:
                value = s.get(field)
                if isinstance(value, int | float) and not isinstance(value, bool):
                    family.add_metric([str(s["slot"]), str(s.get("gpu"))], float(value))
            yield family


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def serve(
    client: redis.Redis, worker: str, concurrency: int, host: str, port: int
) -> WSGIServer | None:
    """Serve the endpoint on ``host:port`` from a daemon thread (port 0: disabled). None, with a
    log line, if it cannot bind."""
    if port <= 0:
        return None
    registry = CollectorRegistry()
    registry.register(SlotCollector(client, worker, concurrency))
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        log.error("worker metrics endpoint not started on %s:%d: %s", host, port, exc)
        return None
    log.info("worker metrics on http://%s:%d/metrics", host, port)
    return server
