"""Migration 0021: ``metric_chunks`` keyed by ``open`` too (on PostgreSQL partitioned by
it). A run recorded at 0020 by the recorder's writes, read by every history endpoint,
migrated: the same chunks, each row's ``open`` 0021's rule, and the same reads; recorded
further at 0021 (chunks close and move), down to 0020 and up again: nothing lost or
doubled. Real SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from amptrain.store import migrate
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history import chunk_table
from tests.store.history.test_chunks import a_run, reads, record
from tests.support.history_data import new_job
from tests.support.old_schema import open_key

_CHUNKS = "SELECT job_id, kind, name, chunk, attempt, last_step, data FROM metric_chunks"


def chunks(engine: sa.Engine) -> dict[tuple[Any, ...], tuple[int, bytes]]:
    with engine.connect() as conn:
        return {tuple(r[:5]): (r[5], bytes(r[6])) for r in conn.execute(sa.text(_CHUNKS))}


def opens(engine: sa.Engine) -> dict[tuple[Any, ...], bool]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT job_id, kind, name, chunk, attempt, open FROM metric_chunks")
        )
        return {tuple(r[:5]): bool(r[5]) for r in rows}


def test_0021_keys_the_chunks_by_open_and_every_read_stays(database_url: str) -> None:
    migrate.upgrade(database_url, "0020")
    engine = make_engine(database_url)
    try:
        sessions = make_session_factory(engine)
        job_id = new_job(sessions)
        points, values = a_run(job_id)
        cut = [p for p in points if p["step"] < 420 or p["attempt"] == 1]
        with open_key(engine):  # today's writes, at 0020
            record(sessions, cut, values, 37)
        before, stored = reads(sessions, job_id), chunks(engine)
        migrate.upgrade(database_url, "0021")
        assert chunks(engine) == stored
        assert reads(sessions, job_id) == before
        want = {k: chunk_table.is_open(k[3], last) for k, (last, _) in stored.items()}
        assert opens(engine) == want and any(want.values()) and not all(want.values())
        # The rest of the run at 0021: open chunks close (their rows move) and grow.
        record(sessions, points, values, 37)
        after, grown = reads(sessions, job_id), chunks(engine)
        # What 0021's rule closes is closed (today's writer also closes the chunks a newer
        # one passes: tests/store/test_passed_chunks_migration.py).
        flags = opens(engine)
        assert not any(flags[k] for k, (n, _) in grown.items() if not chunk_table.is_open(k[3], n))
        migrate.downgrade(database_url, "0020")
        assert chunks(engine) == grown and reads(sessions, job_id) == after
        migrate.upgrade(database_url, "0021")
        assert chunks(engine) == grown and reads(sessions, job_id) == after
    finally:
        engine.dispose()
