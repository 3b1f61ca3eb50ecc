"""The schema comes only from migrations: empty -> head -> base -> head on each database."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from amptrain.contract.spec import JobSpec
from amptrain.store import migrate
from amptrain.store.chunk_models import MetricChunk  # noqa: F401  (its tables join Base.metadata)
from amptrain.store.comparisons import Comparison  # noqa: F401  (its table joins Base.metadata)
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.models import Base, JobEvent
from tests.support.old_schema import create_old_job
from tests.support.specs import mlp_job

TABLES = {
    "jobs",
    "job_events",
    "metric_points",
    "api_tokens",
    "comparisons",
    "metric_summaries",
    "metric_summary_state",
    "metric_values",
    "metric_chunks",
    "metric_rollups",
    "alert_rules",
    "alert_firings",
    "alert_deliveries",
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
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            return list(compare_metadata(ctx, Base.metadata))
    finally:
        engine.dispose()


def test_upgrade_downgrade_roundtrip(database_url: str) -> None:
    assert migrate.current_revision(database_url) is None
    assert _tables(database_url) == set()

    migrate.upgrade(database_url)
    assert migrate.current_revision(database_url) == migrate.head_revision()
    assert _tables(database_url) == TABLES
    # The models describe exactly what the migrations built.
    assert _drift(database_url) == []

    migrate.downgrade(database_url, "base")
    assert migrate.current_revision(database_url) is None
    assert _tables(database_url) == set()

    migrate.upgrade(database_url)
    assert _tables(database_url) == TABLES
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
