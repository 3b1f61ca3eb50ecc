"""The schema comes only from migrations: empty -> head -> base -> head on each database."""

from __future__ import annotations

import importlib
from typing import Any

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.orm import Session

from amptrain.contract.spec import JobSpec
from amptrain.store import migrate
from amptrain.store.chunk_models import MetricChunk
from amptrain.store.comparisons import Comparison  # noqa: F401  (its table joins Base.metadata)
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history import chunk_codec
from amptrain.store.models import Base, JobEvent
from tests.support.old_schema import create_old_job, open_key
from tests.support.specs import mlp_job

TABLES = {
    "jobs",
    "job_events",
    "api_tokens",
    "comparisons",
    "metric_chunks",
    "metric_rollups",
    "metric_exemplars",
    "alert_rules",
    "alert_firings",
    "alert_deliveries",
}

_M = MetricChunk
_COLUMNS = sa.select(_M.kind, _M.name, _M.chunk, _M.attempt, _M.data)
"""What the chunk comparisons take, at any revision (0021 added the ``open`` column)."""


def _partitions(url: str) -> set[str]:
    """PostgreSQL's tables that hold ``metric_chunks``' rows (0021): the open and the closed
    chunks apart, the open cursor chunks apart again (0022). SQLite has one table."""
    if not url.startswith("postgresql"):
        return set()
    return {"metric_chunks_open", "metric_chunks_closed"} | {
        f"metric_chunks_open_{part}"
        for part in ("ms", "rest")  # 0022: the open by name
    }


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _drift(url: str) -> list[object]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            # The partitions are the migration's storage of a table the models describe
            # (``postgresql_partition_by``): not models of their own; nor is the open chunks'
            # ``slack``, zero bytes the server keeps beside ``data`` (0021), never read; the
            # record-order index is two partitions' own there (0022).
            partitions = _partitions(url)
            opts = {
                "compare_type": True,
                "include_name": lambda name, kind, _: (
                    not (
                        (kind == "table" and name in partitions)
                        or (kind == "column" and name == "slack")
                    )
                ),
                "include_object": lambda _, name, kind, *__: (
                    not (partitions and kind == "index" and name == "ix_metric_chunks_record_order")
                ),
            }
            ctx = MigrationContext.configure(conn, opts=opts)
            return list(compare_metadata(ctx, Base.metadata))
    finally:
        engine.dispose()


def test_upgrade_downgrade_roundtrip(database_url: str) -> None:
    assert migrate.current_revision(database_url) is None
    assert _tables(database_url) == set()

    migrate.upgrade(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision()
    assert _tables(database_url) == TABLES | _partitions(database_url)
    # The models describe exactly what the migrations built.
    assert _drift(database_url) == []

    migrate.downgrade(database_url, "base")
    assert migrate.current_revision(database_url) is None
    assert _tables(database_url) == set()

    migrate.upgrade(database_url)
    assert _tables(database_url) == TABLES | _partitions(database_url)
    migrate.upgrade(database_url)  # idempotent at head
    assert migrate.current_revision(database_url) == migrate.head_revision()


def test_events_written_before_0004_get_a_time_ordered_cursor(database_url: str) -> None:
    migrate.upgrade(database_url, "0003")
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine).begin() as s:
            job_id = create_old_job(s, JobSpec.model_validate(mlp_job(3)), "admin", "cpu")
            for attempt, kind in [(1, "started"), (1, "checkpoint")]:
                s.add(JobEvent(job_id=job_id, attempt=attempt, type=kind, time=100.5, data={}))
        migrate.upgrade(database_url)
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(JobEvent.id, JobEvent.type, JobEvent.source_id).order_by(JobEvent.id)
            ).all()
    finally:
        engine.dispose()
    # The unclaimed ``queued`` event keeps its 0-{id} placement; the others get ms-id.
    assert [(kind, source) for _, kind, source in rows] == [
        ("queued", None),
        ("started", f"100500-{rows[1][0]}"),
        ("checkpoint", f"100500-{rows[2][0]}"),
    ]


def test_0015_backfills_the_record_series_of_a_previous_version_run_resumably(
    database_url: str,
) -> None:
    """A run recorded at 0014 (rows, and chunks without the reserved series or the names'
    places): after 0015 every cursor page reads from the chunks what the rows gave; an
    interrupted backfill run again gives the same chunks; the downgrade takes 0015's
    additions away and upgrading again brings the same back."""
    from tests.store.history.test_chunks import a_run, reads, record
    from tests.support.history_data import new_job

    backfill = importlib.import_module("amptrain.migrations.versions.0015_record_series")
    migrate.upgrade(database_url, "0014")
    engine = make_engine(database_url)
    try:
        sessions = make_session_factory(engine)
        job_id = new_job(sessions)
        points, values = a_run(job_id)
        with open_key(engine):  # today's writes, at 0014
            record(sessions, points, values, 97, roll_ups=False)
        with sessions.begin() as s:  # what the previous version's recorder left
            s.execute(sa.delete(MetricChunk).where(MetricChunk.name.startswith("@")))
            backfill.strip_places(s)
            previous = _chunks(s)
        before = reads(sessions, job_id, old=True)
        migrate.upgrade(database_url, "0016")  # the last revision with the rows
        assert reads(sessions, job_id) == before
        with sessions.begin() as s:
            stored = _chunks(s)
            assert {k: v for k, v in stored.items() if not k[1].startswith("@")}.keys() == (
                previous.keys()
            )
            # Half done: some reserved series gone, some places still missing.
            s.execute(sa.delete(MetricChunk).where(MetricChunk.name.in_(["@ms", "@time"])))
            backfill.strip_places(s)
        with sessions.begin() as s:
            backfill.backfill(s)
        with sessions() as s:
            assert _chunks(s) == stored
        migrate.downgrade(database_url, "0014")
        with sessions() as s:  # the same contents (0015 packed the chunks it rewrote)
            assert _decoded(_chunks(s)) == _decoded(previous)
        assert reads(sessions, job_id, old=True) == before
        migrate.upgrade(database_url, "0016")
        with sessions() as s:
            assert _chunks(s) == stored
    finally:
        engine.dispose()


def _chunks(s: Session) -> dict[tuple[str, str, int, int], bytes]:
    return {(c.kind, c.name, c.chunk, c.attempt): bytes(c.data) for c in s.execute(_COLUMNS)}


def _decoded(chunks: dict[tuple[str, str, int, int], bytes]) -> dict[Any, Any]:
    out = {}
    for key, data in chunks.items():
        d = chunk_codec.decode(key[2] * chunk_codec.CHUNK_STEPS, data)
        out[key] = (list(d.steps), d.values.tobytes(), d.nulls, d.position)
    return out
