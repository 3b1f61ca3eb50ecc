"""What one API process holds while it runs, and the one place that starts and stops it.

:class:`Services` owns the database engine, the Redis client, the dispatcher
(with the reconciler), the recorder thread, the live hub and the Prometheus
collector. The app's lifespan calls :meth:`Services.create`,
:meth:`Services.start` and :meth:`Services.aclose`; request handlers reach the
instance through :mod:`amptrain.server.web.deps` (``app.state.services`` holds nothing else).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session, sessionmaker

from amptrain.core import redis as core_redis
from amptrain.core.settings import Settings
from amptrain.server import observability
from amptrain.server.delivery import DeliverySender
from amptrain.server.dispatcher import Dispatcher
from amptrain.server.limits import AuthFailures, LiveSlots, RateLimiter
from amptrain.server.live.hub import LiveHub
from amptrain.server.recorder.process import make_recorder
from amptrain.server.stall_watch import StallWatch
from amptrain.server.token_checks import TokenChecks
from amptrain.store import tokens
from amptrain.store.db import make_engine, make_session_factory, needs_migrated

log = logging.getLogger(__name__)


@dataclass
class Services:
    """The long-lived parts of one API process."""

    settings: Settings
    engine: sa.Engine
    session_factory: sessionmaker[Session]
    redis: redis.Redis
    dispatcher: Dispatcher
    hub: LiveHub
    metrics_registry: CollectorRegistry
    write_limiter: RateLimiter
    auth_failures: AuthFailures
    live_slots: LiveSlots
    token_checks: TokenChecks
    sender: DeliverySender
    stop_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)

    @classmethod
    def create(cls, settings: Settings) -> Services:
        """Build every part (lazily: nothing here needs the database or Redis up yet)."""
        engine = make_engine(settings.database_url)
        session_factory = make_session_factory(engine)
        client = core_redis.client(settings.redis_url, core_redis.REQUEST_TIMEOUT_S)
        hub = LiveHub(settings.redis_url, queue_size=settings.live_queue_size)
        collector = observability.ServiceCollector(
            session_factory, client, settings.routable_queues, lambda: live_watchers(hub)
        )
        return cls(
            settings,
            engine,
            session_factory,
            client,
            Dispatcher(settings, session_factory, client),
            hub,
            observability.make_registry(collector),
            RateLimiter(settings.write_rate_limit, client),
            AuthFailures(settings.auth_failure_rate_limit, client),
            LiveSlots(client, settings.max_live_connections_per_user),
            TokenChecks(session_factory, settings.token_recheck_seconds),
            DeliverySender(settings, session_factory),
        )

    def start(self) -> None:
        """Ensure the admin token, then start the recorder, the dispatcher and the webhook
        sender loops."""
        ensure_admin_token(self.settings, self.session_factory)
        self._spawn("amptrain-dispatcher", self.dispatcher.run)
        self._spawn("amptrain-webhooks", self.sender.run)
        stalls = StallWatch(
            self.session_factory, self.redis, self.settings.alert_stall_poll_seconds
        )
        self._spawn("amptrain-stall-watch", stalls.run)
        self._start_recorder()

    async def aclose(self) -> None:
        """Close the live hub (on the event loop), then :meth:`stop` the threads."""
        try:
            await self.hub.close()
        finally:
            await asyncio.to_thread(self.stop)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loops, wait for them, and close connections."""
        self.stop_event.set()
        self.dispatcher.wake()
        self.sender.wake()
        for thread in self.threads:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("background thread %s did not stop within %.0fs", thread.name, timeout)
        for close in reversed(self.closers):
            try:
                close()
            except Exception:
                log.exception("error while closing")
        self.dispatcher.close()
        self.redis.close()
        self.engine.dispose()

    def _spawn(self, name: str, target: Callable[[threading.Event], None]) -> None:
        def run() -> None:
            try:
                target(self.stop_event)
            except Exception:
                log.exception("background loop %s crashed", name)

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _start_recorder(self) -> None:
        if not self.settings.recorder_in_api:
            log.info("recorder: not in this process (AMPTRAIN_RECORDER_IN_API=false)")
            return
        recorder, closers = make_recorder(self.settings)
        self.closers += closers
        self._spawn("amptrain-recorder", recorder.run)


def ensure_admin_token(
    settings: Settings, session_factory: sessionmaker[Session], *, reveal: bool = False
) -> bool:
    """Make sure an admin token exists (``amptrain up`` and every API process call this).

    A newly generated token is saved (mode 0600) to ``settings.admin_token_file`` and
    that path is printed; the token itself only with ``reveal`` (``amptrain up``, run by
    a person at a terminal), never by the API process, whose output ends up in logs.
    Returns whether a token was generated.
    """
    with needs_migrated(settings.database_url), session_factory.begin() as s:
        token = tokens.ensure_admin_token(s, settings)
    if token and reveal:
        print(
            f"amptrain admin token (shown once; also saved to {settings.admin_token_file}): "
            f"{token}",
            flush=True,
        )
    elif token:
        print(
            f"amptrain admin token generated and saved to {settings.admin_token_file} "
            "(mode 0600; read it from there)",
            flush=True,
        )
    return token is not None


def live_watchers(hub: LiveHub) -> tuple[int, int]:
    """Live watchers now and overflows so far, for ``GET /metrics``."""
    for _ in range(3):
        try:  # read from a scrape thread while the event loop may add or drop readers
            return sum(len(r.subs) for r in list(hub.readers.values())), hub.overflows
        except RuntimeError:
            continue
    return 0, hub.overflows
