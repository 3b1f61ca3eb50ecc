"""What the metric tables hold on disk while a run records (issue 41: at most 8 bytes a
value, what a running service holds): recorded batch by batch, SQLite's pages stay as dense
as a ``VACUUM`` rewrites them (a rewritten chunk is appended, not grown in place); on
PostgreSQL migration 0019 gives the tables the storage parameters with which autovacuum and
HOT updates reuse the space of rewritten rows, and its downgrade takes them back.
Real SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import LAYER_NORM_KIND
from amptrain.store import migrate
from amptrain.store.db import make_engine
from amptrain.store.history import rollups
from tests.support.history_data import new_job

TABLES = ("metric_chunks", "metric_rollups", "metric_exemplars")


def layer_norms(job_id: str, first: int, n: int, layers: int) -> list[dict[str, Any]]:
    """Float32-like norms of ``layers`` layers at steps ``first .. first + n - 1``."""
    return [
        {
            "job_id": job_id,
            "attempt": 1,
            "step": step,
            "kind": LAYER_NORM_KIND,
            "name": f"blocks.{k}.weight",
            "value": float(((step * 7919 + k * 104729) % 10007) / 8192.0 + 0.25),
            "time": 1.7e9 + step * 0.025,
            "stream_ms": 1_700_000_000_000 + step * 25,
            "stream_seq": 0,
        }
        for step in range(first, first + n)
        for k in range(layers)
    ]


def sqlite_bytes(s: Session) -> int:
    """The pages of the metric tables and their indexes (``dbstat``)."""
    return int(
        s.execute(
            sa.text(
                "SELECT sum(pgsize) FROM dbstat WHERE name IN "
                "(SELECT name FROM sqlite_master WHERE tbl_name IN :t)"
            ).bindparams(sa.bindparam("t", expanding=True)),
            {"t": list(TABLES)},
        ).scalar_one()
    )


def test_chunks_rewritten_batch_by_batch_leave_sqlite_pages_dense(
    database_url: str, sf: sessionmaker[Session]
) -> None:
    if not database_url.startswith("sqlite"):
        pytest.skip("PostgreSQL's reuse needs autovacuum: its parameters are tested below")
    job_id = new_job(sf)
    # 64 layers over 4 chunks in batches of 16 steps: each open chunk rewritten 16 times,
    # growing, then compressed when it closes (a live recorder's batches are this small).
    for first in range(0, 1024, 16):
        with sf.begin() as s:
            rollups.record(s, [], layer_norms(job_id, first, 16, 64))
    with sf() as s:
        held = sqlite_bytes(s)
    engine = make_engine(database_url)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM"))
    engine.dispose()
    with sf() as s:
        compacted = sqlite_bytes(s)
    # Grown in place, the chunks split their pages and left them mostly empty: 3.8x here
    # (1,155,072 bytes against 307,200); appended, 1.07x.
    assert held <= 1.15 * compacted, (held, compacted)


def reloptions(url: str) -> dict[str, set[str]]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT relname, reloptions FROM pg_class WHERE relname IN :t").bindparams(
                    sa.bindparam("t", expanding=True)
                ),
                {"t": list(TABLES)},
            )
            return {name: set(options or ()) for name, options in rows}
    finally:
        engine.dispose()


def test_0019_sets_the_postgresql_storage_parameters_and_downgrade_resets_them(
    database_url: str,
) -> None:
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite has no storage parameters: 0019 changes nothing there")
    migrate.upgrade(database_url, "0019")
    vacuum = {"autovacuum_vacuum_scale_factor=0.01", "autovacuum_vacuum_threshold=1000"}
    assert reloptions(database_url) == {
        "metric_chunks": vacuum,
        "metric_rollups": vacuum | {"fillfactor=90"},
        "metric_exemplars": vacuum,
    }
    migrate.downgrade(database_url, "-1")  # to 0019's down revision, whichever it is
    assert reloptions(database_url) == {t: set() for t in TABLES}
