"""The chunked metric store: what the recorder's batches put in ``metric_chunks`` is, per
series, the effective history (per step the newest attempt's value) that scan_run
streams; replays write nothing; migration 0014 moves a run recorded by the previous
version into the same chunks (0014) and their roll-ups (0016), resumably, and every read
returns what it returned before.
Real SQLite and PostgreSQL."""

from __future__ import annotations

import importlib
import json
import math
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import EVAL_KIND, LAYER_NORM_KIND
from amptrain.store import migrate
from amptrain.store.chunk_models import MetricChunk
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history import chunk_writes, rollups, series_scan
from amptrain.store.history.downsample import series_window
from amptrain.store.history.eval_window import eval_window
from amptrain.store.history.points import Page, metric_page
from amptrain.store.history.values import eval_page
from tests.support import row_reads, row_tables, row_window, row_writes
from tests.support.history_data import new_job, series
from tests.support.row_eval_window import row_eval_window

Sessions = sessionmaker[Session]
LAYERS = ("enc.0.weight", "enc.0.bias", "head.weight")

_M = MetricChunk
_COLUMNS = sa.select(_M.kind, _M.name, _M.chunk, _M.attempt, _M.data)
"""What the chunk comparisons take, at any revision (0021 added the ``open`` column)."""


def named(job_id: str, steps: list[int], attempt: int, ms: int) -> list[dict[str, Any]]:
    """Layer norms at every step and an evaluation every 50, with null and non-finite ones."""
    rows = []
    for i, step in enumerate(steps):
        common = {"job_id": job_id, "attempt": attempt, "step": step, "time": 2000.0 + step}
        cursor = {"stream_ms": ms + i, "stream_seq": 1}
        for k, layer in enumerate(LAYERS):
            value = None if (step + k) % 97 == 0 else (step * 0.25 + k) * attempt
            rows.append(common | cursor | {"kind": LAYER_NORM_KIND, "name": layer, "value": value})
        if step % 50 == 0:
            for name, value in (("accuracy", step / 1000 + attempt), ("eval_loss", math.inf)):
                rows.append(common | cursor | {"kind": EVAL_KIND, "name": name, "value": value})
    return rows


def record(
    sessions: Sessions,
    points: list[dict[str, Any]],
    values: list[dict[str, Any]],
    size: int,
    *,
    chunks: bool = True,
    roll_ups: bool = True,
) -> None:
    """The recorder's writes, ``size`` points (and their steps' values) a transaction;
    ``chunks``/``roll_ups``: as the versions before 0014 / before 0016 did not."""
    for i in range(0, len(points), size):
        batch = points[i : i + size]
        steps = {(p["attempt"], p["step"]) for p in batch}
        vals = [v for v in values if (v["attempt"], v["step"]) in steps]
        with sessions.begin() as s:
            # The rows the previous versions' recorder wrote (the oracles read them).
            row_tables.ensure(s.connection())
            row_writes.insert_points(s, batch)
            row_writes.insert_values(s, vals)
            if chunks and roll_ups:
                rollups.record(s, batch, vals)
            elif chunks:
                chunk_writes.append(s, batch, vals)


def a_run(job_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Attempt 1 records steps 1..300; attempt 2 resumes from a checkpoint at 199 and
    records 200..560 (chunks 0 and 1 hold both attempts' steps)."""
    p1 = series(job_id, list(range(1, 301)), attempt=1, seed=1, ms=10_000)
    p2 = series(job_id, list(range(200, 561)), attempt=2, seed=2, ms=20_000)
    v1 = named(job_id, list(range(1, 301)), 1, 10_000)
    v2 = named(job_id, list(range(200, 561)), 2, 20_000)
    return p1 + p2, v1 + v2


def expected(
    points: list[dict[str, Any]], values: list[dict[str, Any]]
) -> dict[tuple[str, str], dict[int, float]]:
    """Per series, per step the newest attempt's value (None and NaN alike read as NaN)."""
    newest: dict[tuple[str, str], dict[int, tuple[int, float]]] = {}

    def put(kind: str, name: str, attempt: int, step: int, value: Any) -> None:
        series = newest.setdefault((kind, name), {})
        if step not in series or attempt > series[step][0]:
            series[step] = (attempt, math.nan if value is None else float(value))

    for p in points:
        for f in chunk_writes.STEP_SERIES:
            put("step", f, p["attempt"], p["step"], p.get(f))
    for v in values:
        kind = "eval" if v["kind"] == EVAL_KIND else "layer"
        put(kind, v["name"], v["attempt"], v["step"], v["value"])
    # A series with no finite number (fp32's loss scale) is no series of the scan.
    return {
        key: {step: v for step, (_, v) in sorted(s.items())}
        for key, s in newest.items()
        if any(math.isfinite(v) for _, v in s.values())
    }


def scanned(sessions: Sessions, job_id: str) -> dict[tuple[str, str], dict[int, float]]:
    out: dict[tuple[str, str], dict[int, float]] = {}
    seen: list[tuple[str, str]] = []
    with sessions() as s:
        for block in series_scan.scan_run(s, job_id):
            assert block.steps.dtype == np.int64 and block.values.dtype == np.float64
            assert (np.diff(block.steps) > 0).all()
            key = (block.kind, block.name)
            if not seen or seen[-1] != key:
                assert key not in seen  # series after series
                seen.append(key)
            series = out.setdefault(key, {})
            assert not series or block.steps[0] > max(series)
            series.update(zip(block.steps.tolist(), block.values.tolist(), strict=True))
    return out


def same(
    a: dict[tuple[str, str], dict[int, float]], b: dict[tuple[str, str], dict[int, float]]
) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert list(a[key]) == list(b[key]), key
        x, y = np.array(list(a[key].values())), np.array(list(b[key].values()))
        assert np.array_equal(x, y, equal_nan=True), key


def test_scan_streams_the_effective_series_and_replays_write_nothing(
    db: tuple[sa.Engine, Sessions], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, sessions = db
    job_id = new_job(sessions)
    points, values = a_run(job_id)
    record(sessions, points, values, 37)
    # Re-sent ranges (at-least-once delivery): nothing changes, nothing is written.
    with sessions.begin() as s:
        before = {(c.kind, c.name, c.chunk, c.attempt): c.data for c in s.execute(_COLUMNS)}
        assert chunk_writes.append(s, points[100:400], values[300:1200]) == 0
    monkeypatch.setattr(series_scan, "BLOCK_VALUES", 300)  # several blocks per series
    want = expected(points, values)
    same(scanned(sessions, job_id), want)
    with sessions() as s:
        after = {(c.kind, c.name, c.chunk, c.attempt): c.data for c in s.execute(_COLUMNS)}
        # The chunks' summaries: attempt 2's chunk 0 holds steps 200..255.
        c = s.get(MetricChunk, (job_id, "step", "loss", 0, 2, False))  # closed
        assert c is not None and (c.first_step, c.last_step, c.count) == (200, 255, 56)
        flags = [p for p in points if p["attempt"] == 2 and 200 <= p["step"] <= 255]
        assert c.skipped == sum(bool(p["skipped"]) for p in flags)
    assert after == before
    assert want[("step", "loss")].keys() == set(range(1, 561))


def test_a_value_that_is_not_a_number_is_stored_as_null(db: tuple[sa.Engine, Sessions]) -> None:
    """A malformed entry's field (the stream decoder's generic route keeps any JSON) does
    not fail the batch at every retry: it reads as null, its neighbours as recorded."""
    _, sessions = db
    job_id = new_job(sessions)
    points = series(job_id, [1, 2, 3])
    points[1] = points[1] | {"loss": "1.5", "lr": [1], "memory_peak": 10**400}
    with sessions.begin() as s:
        chunk_writes.append(s, points, [])
    got = scanned(sessions, job_id)
    assert [math.isnan(v) for v in got[("step", "loss")].values()] == [
        points[0]["loss"] is None or math.isnan(points[0]["loss"]),
        True,
        points[2]["loss"] is None or math.isnan(points[2]["loss"]),
    ]
    assert math.isnan(got[("step", "lr")][2]) and got[("step", "lr")][3] == points[2]["lr"]
    peak = got.get(("step", "memory_peak"))  # no series when no step holds a number
    assert peak is None or math.isnan(peak[2])


def reads(sessions: Sessions, job_id: str, *, old: bool = False) -> str:
    """What the history endpoints return for the job, as JSON text; ``old``: the previous
    version's reads from the rows (tests/support/row_reads.py, row_window.py), before the
    chunks hold the run."""
    metric, evals = (
        (row_reads.metric_page, row_reads.eval_page) if old else (metric_page, eval_page)
    )
    window = row_window.raw_window if old else series_window
    evals_window = row_eval_window if old else eval_window
    with sessions() as s, pytest.MonkeyPatch.context() as patch:
        if old:  # the windows' newest cursor from the rows too
            patch.setattr(row_window, "newest_cursor", row_reads.newest_cursor)
        out = {
            "metrics": metric(s, job_id, Page(limit=10_000)),
            "all": metric(s, job_id, Page(limit=10_000, attempts="all")),
            "window": window(s, job_id, 100).__dict__,
            "zoom": window(s, job_id, 50, ["loss", "lr"], 100, 400).__dict__,
            "evals": evals(s, job_id, Page(limit=10_000)),
            "layers": evals(s, job_id, Page(limit=10_000), LAYER_NORM_KIND),
            "eval_window": evals_window(s, job_id, 10).__dict__,
            "layer_window": evals_window(s, job_id, 40, 100, 500, LAYER_NORM_KIND).__dict__,
        }
    return json.dumps(out, sort_keys=True, default=str)


def test_migration_moves_a_run_of_the_previous_version_resumably(database_url: str) -> None:
    migrate.upgrade(database_url, "0013")
    engine = make_engine(database_url)
    try:
        sessions = make_session_factory(engine)
        job_id = new_job(sessions)
        points, values = a_run(job_id)
        record(sessions, points, values, 97, chunks=False)  # the previous recorder's rows
        before = reads(sessions, job_id, old=True)
        migrate.upgrade(database_url, "0016")  # the last revision with the rows (0017 drops them)
        assert reads(sessions, job_id) == before == reads(sessions, job_id, old=True)
        want = expected(points, values)
        same(scanned(sessions, job_id), want)
        # Run again (as after an interruption): the same chunks, byte for byte.
        with sessions.begin() as s:
            stored = {(c.kind, c.name, c.chunk, c.attempt): c.data for c in s.execute(_COLUMNS)}
            s.execute(sa.delete(MetricChunk).where(MetricChunk.kind == "step"))  # half done
        with sessions.begin() as s:
            mover = importlib.import_module("amptrain.migrations.versions.0014_metric_chunks")
            mover.move_rows(s)
            importlib.import_module("amptrain.migrations.versions.0015_record_series").backfill(s)
        with sessions() as s:
            again = {(c.kind, c.name, c.chunk, c.attempt): c.data for c in s.execute(_COLUMNS)}
        assert again == stored
        migrate.downgrade(database_url, "0013")
        assert reads(sessions, job_id, old=True) == before
    finally:
        engine.dispose()
