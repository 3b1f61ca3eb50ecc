"""Where the recorder runs: a thread of each API process (:mod:`amptrain.server.runtime`, the
default) or a process of its own (``amptrain recorder``, :func:`run_recorder`).

Either way it is the same :class:`~amptrain.server.recorder.service.Recorder` with its own Redis
client and database pool; job ownership (:mod:`amptrain.server.recorder.owner`) lets any
mix of them run at once, each job recorded by one of them at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import sqlalchemy as sa

from amptrain.core import redis as core_redis
from amptrain.core.settings import Settings
from amptrain.server.recorder.service import Recorder
from amptrain.store import recording
from amptrain.store.db import make_engine, make_session_factory, needs_migrated

log = logging.getLogger(__name__)

RECORDER_POOL = {"pool_size": 2, "max_overflow": 2}
"""The recorder's connections: one at a time, a spare for its ownership refresh."""


def make_recorder(settings: Settings) -> tuple[Recorder, list[Callable[[], None]]]:
    """A recorder and what closes its connections (call them after it stopped)."""
    # The recorder blocks on XREADGROUP: its socket timeout must exceed that block.
    client = core_redis.client(settings.redis_url, core_redis.BLOCKING_READ_TIMEOUT_S)
    # Its own small pool: in an API process, requests in flight may hold every connection
    # of the shared one, and the recorder waiting for one stalls every job's history.
    url = sa.make_url(settings.database_url)
    in_memory = url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")
    engine = make_engine(settings.database_url, **({} if in_memory else RECORDER_POOL))
    recorder = Recorder(settings, make_session_factory(engine), client)
    return recorder, [client.close, engine.dispose]


def run_recorder(settings: Settings, stop_event: threading.Event) -> None:
    """Record until ``stop_event`` is set, then give every job lock up (another recorder
    takes those jobs over at once) and close. Raises ``RuntimeError`` when the database
    is not migrated: a recorder that only logs failed passes would look alive."""
    recorder, closers = make_recorder(settings)
    try:
        with needs_migrated(settings.database_url), recorder.sessions() as s:
            recording.jobs_to_record(s)
        log.info("recorder: started as consumer %s", recorder.group.consumer)
        recorder.run(stop_event)
    finally:
        for close in reversed(closers):
            close()
