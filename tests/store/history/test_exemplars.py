"""The exemplars (``metric_exemplars``): the blobs the recorder keeps batch by batch are the
bytes a build from the stored chunks gives (retried runs, NaN/inf/null values, flagged
steps, replays, a run growing batch by batch), and a downsampled window takes its points
from them where its buckets are whole blocks (the chunks of a field no bucket decides can
be gone, and the window still reads as before). The windows' byte-for-byte parity with the
rows' read over these paths: tests/store/history/test_chunk_window.py. Real SQLite and
PostgreSQL."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.store import migrate
from amptrain.store.chunk_models import MetricChunk, MetricExemplar, MetricRollup
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history import exemplar_build, exemplars, rollup_rebuild, rollups
from amptrain.store.history.chunk_merge import number
from amptrain.store.history.downsample import series_window
from amptrain.store.history.window import parse_fields
from tests.store.history.test_chunk_window import as_json, retried_run
from tests.support.history_data import T0, new_job, series

Sessions = sessionmaker[Session]


def stored(sessions: Sessions, job_id: str) -> dict[tuple[int, int, int], bytes]:
    e = MetricExemplar
    with sessions() as s:
        rows = s.execute(sa.select(e.level, e.idx, e.attempt, e.data).where(e.job_id == job_id))
        return {(level, idx, a): bytes(d) for level, idx, a, d in rows}


def rebuilt(
    sessions: Sessions, job_id: str, batch: int = exemplar_build.BATCH
) -> dict[tuple[int, int, int], bytes]:
    with sessions.begin() as s:
        s.execute(sa.delete(MetricExemplar).where(MetricExemplar.job_id == job_id))
        exemplar_build.rebuild(s, job_id, batch)
    return stored(sessions, job_id)


def test_the_codec_keeps_nulls_nans_and_absent_names() -> None:
    block: exemplars.Block = {
        7: {"@ms": 5.0, "loss": None, "grad_norm": math.nan, "lr": 1e-3},
        3: {"@ms": 4.0, "loss": 2.5, "@rank0": 10.0**8},
        9: {"loss": 1.0},  # no cursor: no record to a read
    }
    data = exemplars.encode(block)
    back = exemplars.decode(data)
    assert set(back) == {3, 7}
    assert back[3] == block[3]
    assert back[7]["loss"] is None and math.isnan(back[7]["grad_norm"] or 0.0)
    one = exemplars.records_at(data, [7, 8])  # (NaN != NaN: compared as bytes)
    assert exemplars.encode(one) == exemplars.encode({7: back[7]}) != data
    assert exemplars.encode(back) == data


def test_kept_exemplars_are_rebuilt_ones_and_replays_change_nothing(
    db: tuple[sa.Engine, Sessions],
) -> None:
    _, sessions = db
    job_id = retried_run(sessions, 8)
    kept = stored(sessions, job_id)
    assert {key[0] for key in kept} == {0, 4, 8}
    assert {key[2] for key in kept} == {1, 2, 3}
    with sessions.begin() as s:
        again = series(job_id, list(range(1800, 2601)), 2, 9, T0 + 10_000)
        rollups.record(s, again[100:500], [])  # a re-sent range
    assert stored(sessions, job_id) == kept
    assert rebuilt(sessions, job_id) == kept
    assert rebuilt(sessions, job_id, batch=1) == kept  # a block (or 16) a batch
    with sessions.begin() as s:  # the roll-ups' rebuild builds them too
        s.execute(sa.delete(MetricRollup).where(MetricRollup.job_id == job_id))
        s.execute(sa.delete(MetricExemplar).where(MetricExemplar.job_id == job_id))
        rollup_rebuild.rebuild(s, job_id)
    assert stored(sessions, job_id) == kept


def test_a_growing_run_keeps_what_a_build_gives_after_every_batch(
    db: tuple[sa.Engine, Sessions],
) -> None:
    _, sessions = db
    job_id = new_job(sessions)
    rows = series(job_id, list(range(1, 6000)), seed=5)
    done = 0
    for size in (1, 255, 1, 700, 3000, 2042):
        with sessions.begin() as s:
            rollups.record(s, rows[done : done + size], [])
        done += size
        kept = stored(sessions, job_id)
        assert rebuilt(sessions, job_id) == kept, done


def test_a_window_of_whole_blocks_takes_its_points_from_the_exemplars(
    db: tuple[sa.Engine, Sessions],
) -> None:
    """Steps 0..16383 in 5 buckets of 3,584 steps (whole chunks): every chosen point is a
    block's notable step. With the ``lr`` chunks gone (no bucket decides by it), the
    window still reads ``lr`` as before; a window cut mid-chunk reads its edges' points
    from the chunks (``lr`` null there now)."""
    _, sessions = db
    rng = random.Random(3)
    job_id = new_job(sessions)
    rows = series(job_id, list(range(16384)), seed=3)
    for row in rows:
        row["lr"] = rng.choice([1e-3, 2e-3, 5e-4])
    with sessions.begin() as s:
        for i in range(0, len(rows), 4096):
            rollups.record(s, rows[i : i + 4096], [])
    asked: list[tuple[int, dict[str, Any]]] = [(40, {}), (25, {"fields": parse_fields("lr")})]
    with sessions() as s:
        before = [as_json(series_window(s, job_id, n, **kw)) for n, kw in asked]
        cut = series_window(s, job_id, 40, from_step=100, to_step=16000)
    assert all('"lr": null' not in b for b in before)
    with sessions.begin() as s:
        c = MetricChunk
        s.execute(sa.delete(c).where(c.job_id == job_id, c.name == "lr"))
    with sessions() as s:
        assert [as_json(series_window(s, job_id, n, **kw)) for n, kw in asked] == before
        edges = series_window(s, job_id, 40, from_step=100, to_step=16000)
    assert [p["step"] for p in edges.items] == [p["step"] for p in cut.items]
    gone = {p["step"] for p in edges.items if p["lr"] is None}
    assert 100 in gone and 16000 in gone  # the cut edges' first and last step
    assert len(gone) < len(edges.items) / 2


def test_migration_builds_the_exemplars_the_recorder_keeps(database_url: str) -> None:
    """A retried run recorded at head; downgraded to 0017 (the table goes) and upgraded
    again, 0018 builds the same blobs from the chunks; a build run again over a half-done
    one (as after an interruption) ends with them too; the windows read as before."""
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    try:
        sessions = make_session_factory(engine)
        job_id = retried_run(sessions, 12)
        kept = stored(sessions, job_id)
        asked = [(7, {}), (300, {"from_step": 1700, "to_step": 2700})]
        with sessions() as s:
            before = [as_json(series_window(s, job_id, n, **kw)) for n, kw in asked]
        migrate.downgrade(database_url, "0017")
        migrate.upgrade(database_url)
        assert stored(sessions, job_id) == kept
        with sessions.begin() as s:
            e = MetricExemplar
            s.execute(sa.delete(e).where(e.job_id == job_id, e.level > 0))  # half done
            exemplar_build.rebuild(s)
        assert stored(sessions, job_id) == kept
        with sessions() as s:
            assert [as_json(series_window(s, job_id, n, **kw)) for n, kw in asked] == before
    finally:
        engine.dispose()


def test_the_recorders_fold_of_a_batch_is_the_rebuilds() -> None:
    """:func:`rollups.gained_stats` (builtins over a chunk's new steps, in any order) gives
    the aggregates the rebuild's numpy pass gives (ties, -0.0, NaN, infinities, nulls,
    values that are no numbers, skipped and flagged steps)."""
    rng = random.Random(11)
    pool: list[Any] = [0.0, -0.0, 1.5, 1.5, -2.0, 7, True, None, math.nan, math.inf, -math.inf]
    pool += ["x", 10**400]
    finite = [0.0, -0.0, 1.5, 1.5, -2.0, 7, True, False, 1e308]
    for i in range(600):
        steps = rng.sample(range(256, 512), rng.randint(1, 40))
        if i % 2:  # the common batch (ascending steps, finite numbers) and its near misses
            steps.sort()
        values = finite if i % 4 == 1 else [None] if i % 8 == 2 else pool
        new = {st: rng.choice(values) for st in steps}
        skipped = {st for st in steps if rng.random() < 0.2}
        flagged = skipped | {st for st in steps if rng.random() < 0.2}
        marks = (skipped, flagged) if rng.random() < 0.7 else None
        at = numpy.asarray(sorted(steps), numpy.int64)
        values = numpy.array([_value(new[st]) for st in at.tolist()])
        masks = None, None
        if marks is not None:
            masks = numpy.isin(at, list(skipped)), numpy.isin(at, list(flagged))
        want = rollup_rebuild.array_stats(at, values, *masks).row()
        got = rollups.gained_stats(new, marks).row()
        assert got == want, (new, marks)
        assert [math.copysign(1, x) for x in got if isinstance(x, float)] == [
            math.copysign(1, x) for x in want if isinstance(x, float)
        ]


def _value(v: Any) -> float:
    x = number(v)
    return math.nan if x is None else x


def test_a_field_a_resent_point_brings_later_joins_the_kept_record(
    db: tuple[sa.Engine, Sessions],
) -> None:
    """A point first recorded without its per-rank memory, then re-sent with it: the chunks
    gain the rank series at an old step, and the block's record gains them too (kept ==
    rebuilt), so a window shows them as the chunks do."""
    _, sessions = db
    job_id = new_job(sessions)
    rows = series(job_id, list(range(512)), seed=6)
    with sessions.begin() as s:
        rollups.record(s, rows, [])
    with_ranks = [row | {"memory_peak_per_rank": json.dumps([5, 7])} for row in rows]
    with sessions.begin() as s:
        rollups.record(s, with_ranks, [])
    kept = stored(sessions, job_id)
    assert any(b"@rank1" in data for data in kept.values())
    assert rebuilt(sessions, job_id) == kept
    with sessions() as s:
        items = series_window(s, job_id, 14).items
    assert items and all(p["memory_peak_per_rank"] == [5, 7] for p in items)
