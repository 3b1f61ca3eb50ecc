"""Prometheus metrics of an API process, served by ``GET /metrics``.

Two kinds of series:

- **Process instruments** in the default registry, updated as things happen:
  request latency by route template (:class:`RequestMetrics`, a pure ASGI
  middleware that leaves WebSockets and streams alone), and the recorder's
  throughput and lag (:func:`points_recorded`, called by the recorder after
  each commit).
- **Service state read at scrape time** (:class:`ServiceCollector`, one per
  app): jobs by status from SQL, queue depth of every configured queue
  (``AMPTRAIN_QUEUES``) from Redis,
  live watchers from the hub, and the dispatch latency (submit -> first
  claim), observed once per job from ``created_at``/``started_at`` with a
  SQL watermark, so nothing is missed between scrapes and nothing is counted
  twice by one process.

Every API replica reports the same SQL-derived values (jobs, queue depth,
dispatch latency): aggregate them with ``max``, not ``sum``. Request latency,
recorder and watcher series are per replica and do sum.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import redis
import sqlalchemy as sa
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker

from amptrain.core.enums import JobStatus
from amptrain.server import broker
from amptrain.store import job_reads

log = logging.getLogger(__name__)

REQUEST_LATENCY = Histogram(
    "amptrain_http_request_duration_seconds",
    "Time from request to response start, by route template.",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECORDED_POINTS = Counter(
    "amptrain_recorder_points", "Metric points this process's recorder committed to SQL."
)
RECORDED_BATCHES = Counter("amptrain_recorder_batches", "Recorder transactions committed.")
RECORDER_LAG = Histogram(
    "amptrain_recorder_lag_seconds",
    "Per committed batch: commit time minus the newest point's step time.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
RECORDER_LAST_POINT = Gauge(
    "amptrain_recorder_last_point_timestamp_seconds",
    "Step time of the newest point committed (lag now = time() - this).",
)

WEBHOOK_ATTEMPTS = Counter(
    "amptrain_webhook_attempts",
    "Alert webhook requests this process made, by outcome: delivered, retry (will be "
    "tried again), failed (the receiver's final answer or retries spent), refused (the "
    "destination is not allowed).",
    ["outcome"],
)


def webhook_attempt(outcome: str) -> None:
    WEBHOOK_ATTEMPTS.labels(outcome).inc()


def points_recorded(inserted: int, times: Iterable[Any]) -> None:
    """The recorder committed a batch: ``inserted`` new points out of those whose ``time``
    fields are ``times`` (replays add none)."""
    RECORDED_BATCHES.inc()
    if inserted:
        RECORDED_POINTS.inc(inserted)
    times = list(times)
    try:  # nearly every batch: numbers only, one max in C instead of a check per point
        newest = max(times) if times else None
    except TypeError:  # a null time (or an odd one) among them
        newest = None
    if not isinstance(newest, int | float):
        held = [t for t in times if isinstance(t, int | float)]
        newest = max(held) if held else None
    if newest is not None:
        RECORDER_LAG.observe(max(0.0, time.time() - newest))
        RECORDER_LAST_POINT.set(newest)


class RequestMetrics:
    """ASGI middleware: latency per (method, route template, status) up to the response start.

    Measuring to the first byte keeps streaming responses (SSE) meaningful;
    WebSocket scopes pass through untouched. Unmatched paths share one label so
    scanners cannot blow up the series count.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        observed = False

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal observed
            if message["type"] == "http.response.start" and not observed:
                observed = True
                _observe(scope, message["status"], time.perf_counter() - start)
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException:
            if not observed:
                _observe(scope, 500, time.perf_counter() - start)
            raise


def _observe(scope: dict[str, Any], status: int, seconds: float) -> None:
    route = scope.get("route")
    template = getattr(route, "path", None) or "unmatched"
    REQUEST_LATENCY.labels(scope.get("method", "?"), template, str(status)).observe(seconds)


class ServiceCollector(Collector):
    """Series read from SQL, Redis and the live hub when Prometheus scrapes."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        client: redis.Redis,
        queues: Sequence[str],
        watchers: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.sessions = session_factory
        self.redis = client
        self.queues = tuple(queues)
        self.watchers = watchers
        self.dispatch = Histogram(
            "amptrain_dispatch_latency_seconds",
            "Submit to first claim by a worker (created_at -> started_at), once per job.",
            buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600),
            registry=None,
        )
        # Jobs first claimed after this process started; older history is not re-counted.
        self._watermark = (datetime.now(UTC), "")
        self._lock = threading.Lock()

    def collect(self) -> Iterable[Any]:
        try:
            yield from self._from_sql()
        except sa.exc.SQLAlchemyError as exc:
            log.warning("metrics scrape: database unreachable (%s)", type(exc).__name__)
        try:
            yield self._queue_depth()
        except redis.RedisError as exc:
            log.warning("metrics scrape: Redis unreachable (%s)", type(exc).__name__)
        if self.watchers is not None:
            watchers, overflows = self.watchers()
            yield GaugeMetricFamily(
                "amptrain_live_watchers",
                "WebSocket and SSE clients watching a job in this process.",
                value=watchers,
            )
            yield GaugeMetricFamily(
                "amptrain_live_overflows",
                "Watchers cut off for falling behind, since this process started.",
                value=overflows,
            )

    def _from_sql(self) -> Iterable[Any]:
        with self.sessions() as s:
            counts = job_reads.count_by_status(s)
            with self._lock:
                self._observe_dispatches(s)
        family = GaugeMetricFamily("amptrain_jobs", "Jobs by status.", labels=["status"])
        for status in sorted({s.value for s in JobStatus} | set(counts)):
            family.add_metric([status], counts.get(status, 0))
        yield family
        yield from self.dispatch.collect()

    def _observe_dispatches(self, s: Session) -> None:
        """Observe every job first claimed since the last scrape (keyed by started_at, id)."""
        for row in job_reads.first_claims_after(s, self._watermark):
            started = _aware(row.started_at)
            self.dispatch.observe(max(0.0, (started - _aware(row.created_at)).total_seconds()))
            self._watermark = (started, row.id)

    def _queue_depth(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "amptrain_queue_depth",
            "Tasks waiting in the broker, per queue (jobs sent, not yet taken by a worker).",
            labels=["queue"],
        )
        for queue, depth in broker.queue_depths(self.redis, self.queues).items():
            family.add_metric([queue], depth)
        return family


def _aware(value: datetime) -> datetime:
    # SQLite returns naive datetimes even for timezone=True columns; they are UTC.
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def make_registry(collector: ServiceCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def exposition(app_registry: CollectorRegistry | None) -> bytes:
    """The text format of the process instruments plus the app's scrape-time series."""
    out = generate_latest(REGISTRY)
    if app_registry is not None:
        out += generate_latest(app_registry)
    return out
