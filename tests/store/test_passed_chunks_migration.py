"""Migration 0022 and the writer's rule since: a series' chunk closes when a newer chunk of
the series passes it, so a series recorded at intervals (the evaluations here, every 50
steps) keeps only its newest chunk open. A run whose rows are as 0021's writer left them
(every chunk that misses its last aligned step open and unpacked) is migrated: the same
reads, and the same rows as today's writer writes for the run; a job whose telemetry
ended keeps no open chunk; down to 0021 (its rule's rows again) and up. Real SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from amptrain.store import migrate
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history import chunk_codec, chunk_table
from tests.store.history.test_chunks import a_run, reads, record
from tests.store.test_open_chunks_migration import opens
from tests.support.history_data import new_job

_ROWS = "SELECT job_id, kind, name, chunk, attempt, last_step, data FROM metric_chunks"


def rows(engine: sa.Engine, job_id: str) -> dict[tuple[Any, ...], tuple[int, bytes, bool]]:
    """A job's chunks by (kind, name, chunk, attempt): last step, bytes, open."""
    with engine.connect() as conn:
        found = conn.execute(sa.text(f"{_ROWS} WHERE job_id = :j"), {"j": job_id}).all()
    flags = opens(engine)
    return {tuple(r[1:5]): (r[5], bytes(r[6]), flags[tuple(r[:5])]) for r in found}


def newest_open(chunks: dict[tuple[Any, ...], tuple[int, bytes, bool]]) -> dict[Any, bool]:
    """Today's rule: open while the newest chunk of its series and attempt, full or not."""
    newest: dict[tuple[Any, ...], int] = {}
    for kind, name, chunk, attempt in chunks:
        newest[kind, name, attempt] = max(chunk, newest.get((kind, name, attempt), chunk))
    return {k: k[2] == newest[k[0], k[1], k[3]] for k in chunks}


def as_0021_left_them(engine: sa.Engine, job_id: str) -> int:
    """Every closed chunk whose last aligned step is not recorded, open and unpacked again,
    as 0021's writer kept it; how many."""
    moved = 0
    with engine.begin() as conn:
        for (kind, name, chunk, attempt), (last, data, is_open) in rows(engine, job_id).items():
            if is_open or not chunk_table.is_open(chunk, last):
                continue
            d = chunk_codec.decode(chunk * chunk_codec.CHUNK_STEPS, data)
            unpacked = chunk_codec.encode(
                chunk * chunk_codec.CHUNK_STEPS, d.steps, d.values, d.nulls, False, d.position
            )
            conn.execute(
                sa.text(
                    "UPDATE metric_chunks SET open = true, data = :data WHERE job_id = :j "
                    "AND kind = :k AND name = :n AND chunk = :c AND attempt = :a"
                ),
                {"data": unpacked, "j": job_id, "k": kind, "n": name, "c": chunk, "a": attempt},
            )
            moved += 1
    return moved


def fillfactors(engine: sa.Engine) -> dict[str, str]:
    """PostgreSQL: the fillfactor of each partition of the open chunks."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT relname, reloptions FROM pg_class WHERE relname LIKE 'metric_chunks_open%' "
                "AND relkind = 'r'"
            )
        ).all()
    return {name: next(o for o in opts if o.startswith("fillfactor")) for name, opts in rows}


def test_0022_closes_the_chunks_a_newer_one_passed_and_every_read_stays(
    database_url: str,
) -> None:
    migrate.upgrade(database_url, "0021")
    engine = make_engine(database_url)
    try:
        sessions = make_session_factory(engine)
        today, old, ended = new_job(sessions), new_job(sessions), new_job(sessions)
        for job_id in (today, old, ended):
            points, values = a_run(job_id)
            record(sessions, points, values, 37)
        with sessions.begin() as s:
            s.execute(sa.text("UPDATE jobs SET telemetry_done = true WHERE id = :j"), {"j": ended})
        want = rows(engine, today)
        # Today's writer: only each series' newest chunk can be open.
        assert {k: o for k, (_, _, o) in want.items()} == newest_open(want)
        assert as_0021_left_them(engine, old) > 0
        before = reads(sessions, old)
        assert reads(sessions, today) == before.replace(old, today)

        migrate.upgrade(database_url, "0022")
        assert rows(engine, old) == want
        assert reads(sessions, old) == before
        if engine.dialect.name == "postgresql":  # a page a row: room for two rewrites
            assert fillfactors(engine) == dict.fromkeys(
                ["metric_chunks_open_ms", "metric_chunks_open_rest"], "fillfactor=30"
            )
        # A job whose telemetry ended keeps no open chunk, and reads the same.
        assert {k: o for k, (_, _, o) in rows(engine, ended).items()} == dict.fromkeys(want, False)
        assert reads(sessions, ended) == before.replace(old, ended)

        migrate.downgrade(database_url, "0021")
        assert {k: o for k, (_, _, o) in rows(engine, old).items()} == {
            k: chunk_table.is_open(k[2], last) for k, (last, _, _) in want.items()
        }
        assert reads(sessions, old) == before
        if engine.dialect.name == "postgresql":
            assert fillfactors(engine) == {"metric_chunks_open": "fillfactor=70"}
        migrate.upgrade(database_url, "0022")
        assert rows(engine, old) == want and rows(engine, today) == want
        assert reads(sessions, old) == before
    finally:
        engine.dispose()
