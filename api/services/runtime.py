"""What one API process holds while it runs: database engine, Redis clients, background loops.

The app's lifespan calls :meth:`Services.start` and :meth:`Services.stop`;
request handlers reach the instance through :mod:`api.web.deps`. Later features
(live hub, Prometheus collectors) add their parts here, next to the recorder
and the dispatcher.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from api.core import redis as core_redis
from api.core.settings import Settings
from api.services.dispatcher import Dispatcher
from api.services.recorder import Recorder
from api.store import tokens
from api.store.db import make_engine, make_session_factory

log = logging.getLogger(__name__)


@dataclass
class Services:
    """The long-lived parts of one API process."""

    settings: Settings
    engine: sa.Engine
    session_factory: sessionmaker[Session]
    redis: redis.Redis
    dispatcher: Dispatcher
    stop_event: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)

    @classmethod
    def create(cls, settings: Settings) -> Services:
        """Connect to the database and Redis (lazily: nothing here needs them up yet)."""
        engine = make_engine(settings.database_url)
        session_factory = make_session_factory(engine)
        client = core_redis.client(settings.redis_url, core_redis.REQUEST_TIMEOUT_S)
        dispatcher = Dispatcher(settings, session_factory, client)
        return cls(settings, engine, session_factory, client, dispatcher)

    def start(self) -> None:
        """Ensure the admin token, then start the recorder and the dispatcher loops."""
        self._ensure_admin_token()
        self._spawn("amptrain-dispatcher", self.dispatcher.run)
        self._start_recorder()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loops, wait for them, and close connections."""
        self.stop_event.set()
        self.dispatcher.wake()
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

    def _ensure_admin_token(self) -> None:
        try:
            with self.session_factory() as s:
                token = tokens.ensure_admin_token(s, self.settings)
                s.commit()
        except (sa.exc.OperationalError, sa.exc.ProgrammingError) as exc:
            # The usual cause on a fresh database; say how to fix it instead of a bare traceback.
            raise RuntimeError(
                f"database {self.engine.url.render_as_string(hide_password=True)} is not ready "
                f"({type(exc.orig).__name__}: {exc.orig}); run `amptrain db upgrade` first"
            ) from exc
        if token:
            # Shown once; it is also saved (mode 0600) to the data directory.
            print(
                f"amptrain admin token (saved to {self.settings.admin_token_file}): {token}",
                flush=True,
            )

    def _start_recorder(self) -> None:
        # The recorder blocks on XREADGROUP: its socket timeout must exceed that block.
        client = core_redis.client(self.settings.redis_url, core_redis.BLOCKING_READ_TIMEOUT_S)
        self.closers.append(client.close)
        recorder = Recorder(self.settings, self.session_factory, client)
        self._spawn("amptrain-recorder", recorder.run)
