"""Migration 0017 (the row tables go): a run recorded at 0016 by the previous version's
recorder (the recorder's chunks and roll-ups, plus the rows the old writers wrote:
tests/support/row_writes.py), read through every endpoint's read as the rows served it,
then migrated; the chunk reads after it return the same bytes, on SQLite and PostgreSQL.
Rows the chunks lack (a job recorded before the chunks, chunks lost in part) are moved
first, resumably; the downgrade rebuilds the rows from the chunks."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.metrics import EVAL_KIND, LAYER_NORM_KIND
from amptrain.store import migrate
from amptrain.store.chunk_models import MetricExemplar
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history import points, values
from amptrain.store.history.downsample import series_window
from amptrain.store.history.eval_window import eval_window
from amptrain.store.history.points import Page
from tests.server.recorder.test_page_parity import _records, record_run
from tests.server.recorder.test_recorder import publish, start_job
from tests.support import row_reads, row_writes
from tests.support.old_schema import open_key
from tests.support.row_eval_window import row_eval_window
from tests.support.row_window import raw_window

Sessions = sessionmaker[Session]
DROPPED = {"metric_points", "metric_values", "metric_summaries", "metric_summary_state"}
KINDS = (None, EVAL_KIND, LAYER_NORM_KIND)


@pytest.fixture
def r(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, socket_timeout=10)
    yield client
    client.close()


def _walk(read: Callable[[Page], tuple[list[Any], str | None]], page: Page) -> list[Any]:
    out = []
    while True:
        items, after = read(page)
        out.append(items)
        if not items:
            return out
        page = Page(after, page.limit, page.attempts)


def reads(sf: Sessions, job_id: str, old: bool) -> str:
    """Every endpoint's answer for the job as JSON text: the cursor pages of each kind (all
    attempts and effective, small and whole pages), the newest cursors and record sizes,
    the downsampled windows; ``old``: as the rows served them (the oracle's reads)."""
    got: list[Any] = []
    with sf() as s:
        for kind in KINDS:
            for attempts in ("all", "effective"):
                for limit in (7, 100_000):
                    page = Page(limit=limit, attempts=attempts)  # type: ignore[arg-type]
                    if kind is None:
                        read = row_reads.metric_page if old else points.metric_page
                        got.append(_walk(lambda p, r=read: r(s, job_id, p), page))  # type: ignore[misc]
                    else:
                        read = row_reads.eval_page if old else values.eval_page
                        got.append(_walk(lambda p, r=read, k=kind: r(s, job_id, p, k), page))  # type: ignore[misc]
        got.append(
            str(row_reads.newest_cursor(s, job_id) if old else points.newest_cursor(s, job_id))
        )
        got.append(
            row_reads.recorded_through(s, job_id) if old else points.recorded_through(s, job_id)
        )
        for kind in (EVAL_KIND, LAYER_NORM_KIND):
            if old:
                got += [str(row_reads.newest_value_cursor(s, job_id, kind))]
                got += [row_reads.newest_record_size(s, job_id, kind)]
            else:
                got += [str(values.newest_cursor(s, job_id, kind))]
                got += [values.newest_record_size(s, job_id, kind)]
        for n, first, last in ((5, None, None), (300, None, None), (40, 200, 700)):
            window = raw_window if old else series_window
            got.append(window(s, job_id, n, None, first, last).__dict__)
            for kind in (EVAL_KIND, LAYER_NORM_KIND):
                ev = row_eval_window if old else eval_window
                got.append(ev(s, job_id, n, first, last, kind).__dict__)
    return json.dumps(got, sort_keys=True)


def _rows_only(sf: Sessions, r: redis.Redis) -> str:
    """A job recorded before the chunks existed: rows alone."""
    job_id, _ = start_job(sf)
    publish(r, job_id, 1, _records(range(1, 301), 1, ("enc.0", "(root)")))
    row_writes.record_stream(sf, r, job_id)
    return job_id


def _tables(engine: sa.Engine) -> set[str]:
    return set(sa.inspect(engine).get_table_names())


def _store(s: Session) -> tuple[list[Any], list[Any]]:
    """Every chunk and roll-up row, comparable (a NaN, PostgreSQL's ``last`` of a chunk
    ending in one, is equal to a NaN here)."""
    chunks = s.execute(sa.text("SELECT * FROM metric_chunks ORDER BY 1, 2, 3, 4, 5")).all()
    rollups = s.execute(sa.text("SELECT * FROM metric_rollups ORDER BY 1, 2, 3, 4, 5, 6")).all()
    return [[_same(v) for v in c] for c in chunks], [[_same(v) for v in r] for r in rollups]


def _same(v: Any) -> Any:
    return bytes(v) if isinstance(v, memoryview) else repr(v) if isinstance(v, float) else v


def test_0017_moves_what_the_chunks_lack_and_every_read_stays_byte_for_byte(
    database_url: str, r: redis.Redis
) -> None:
    mod = importlib.import_module("amptrain.migrations.versions.0017_drop_metric_rows")
    migrate.upgrade(database_url, "0016")
    engine = make_engine(database_url)
    try:
        sf = make_session_factory(engine)
        # Today's recorder keeps the exemplars too (0018), which 0016's did not: their
        # table exists only while it records here.
        MetricExemplar.__table__.create(engine)
        with open_key(engine):  # today's chunk writes, at 0016
            recorded = record_run(sf, r)  # chunks, roll-ups and rows, as 0016's recorder left them
        rows_only = _rows_only(sf, r)
        MetricExemplar.__table__.drop(engine)
        with sf.begin() as s:  # chunks lost in part, and roll-ups that no longer match
            s.execute(
                sa.text(
                    "DELETE FROM metric_chunks WHERE job_id = :j AND ((name = 'loss' AND "
                    "attempt = 2) OR (kind = :k AND name = 'enc.0') OR name = '@seq')"
                ),
                {"j": recorded, "k": LAYER_NORM_KIND},
            )
            s.execute(sa.text("DELETE FROM metric_rollups WHERE job_id = :j"), {"j": recorded})
        before = {j: reads(sf, j, old=True) for j in (recorded, rows_only)}
        # Interrupted after moving one job's points (SQLite keeps that): the upgrade finds
        # the rest still to do.
        with sf.begin() as s:
            mod._move(s, rows_only, mod._POINTS, whole_records=False)

        migrate.upgrade(database_url)
        assert not _tables(engine) & DROPPED
        for job_id, want in before.items():
            assert reads(sf, job_id, old=False) == want
        with sf() as s:
            stored = _store(s)

        # Downgrade: the rows come back from the chunks, as the rows' reads served them.
        migrate.downgrade(database_url, "0016")
        assert _tables(engine) >= DROPPED
        for job_id, want in before.items():
            assert reads(sf, job_id, old=True) == want
        with sf() as s:
            assert s.scalar(sa.text("SELECT count(*) FROM metric_summaries")) == 0
        migrate.upgrade(database_url)  # nothing left to move: the same chunks and roll-ups
        with sf() as s:
            assert _store(s) == stored
    finally:
        engine.dispose()
