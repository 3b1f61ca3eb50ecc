"""The schema comes only from migrations: empty -> head -> base -> head on each database."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from api.store import migrate
from api.store.comparisons import Comparison  # noqa: F401  (its table joins Base.metadata)
from api.store.db import make_engine
from api.store.models import Base

TABLES = {"jobs", "job_events", "metric_points", "api_tokens", "comparisons"}


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
