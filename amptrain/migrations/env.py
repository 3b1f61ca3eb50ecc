"""Alembic environment: the schema comes only from these migrations.

Run programmatically by ``amptrain.store.migrate`` (which passes an open connection
in ``config.attributes["connection"]``) or by the alembic CLI with
``alembic -c amptrain/migrations/alembic.ini`` and ``sqlalchemy.url`` / AMPTRAIN_DATABASE_URL.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy.engine import Connection

from amptrain.store.chunk_models import MetricChunk  # noqa: F401  (its tables join Base.metadata)
from amptrain.store.comparisons import Comparison  # noqa: F401  (its table joins Base.metadata)
from amptrain.store.db import make_engine
from amptrain.store.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things: batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    url = os.environ.get("AMPTRAIN_DATABASE_URL") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set AMPTRAIN_DATABASE_URL or sqlalchemy.url")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _configure(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported; run them online")
run_online()
