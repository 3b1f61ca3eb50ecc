"""Which series keep roll-ups (``chunk_parts.rolled_up``): every series of the metric table
and a named kind's ``@ms`` (the evaluation window counts records by it); no other reserved
series (``@seq``, ``@time``, ``@ranks``, ``@rankN``, a step point's ``@ms``), which no read
takes. The recorder keeps exactly what the rebuild builds, and the exemplars still gain a
re-sent point's per-rank memory although the rank series keep no roll-ups. Real SQLite and
PostgreSQL."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import EVAL_KIND, LAYER_NORM_KIND
from amptrain.store.chunk_models import MetricRollup
from amptrain.store.history import rollup_rebuild, rollups
from amptrain.store.history.chunk_parts import STEP_KIND
from tests.store.history.test_exemplars import rebuilt, stored
from tests.support.history_data import T0, new_job, series

Sessions = sessionmaker[Session]


def _rollups(sessions: Sessions, job_id: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    r = MetricRollup.__table__.c
    with sessions() as s:
        rows = s.execute(sa.select(r).where(r.job_id == job_id)).all()
    return {tuple(row[:6]): tuple(row[6:]) for row in rows}


def _named(job_id: str, steps: range) -> list[dict[str, Any]]:
    out = []
    for step in steps:
        ms = T0 + step
        for kind, name, v in ((EVAL_KIND, "eval_loss", step / 7), (LAYER_NORM_KIND, "l.0", 1.5)):
            out.append(
                {"job_id": job_id, "attempt": 1, "step": step, "kind": kind, "name": name}
                | {"value": v, "time": ms / 1000, "stream_ms": ms, "stream_seq": 0}
            )
    return out


def test_only_the_read_series_keep_roll_ups_and_kept_is_rebuilt(
    db: tuple[sa.Engine, Sessions],
) -> None:
    _, sessions = db
    job_id = new_job(sessions)
    rows = series(job_id, list(range(0, 900)), seed=4)
    rows = [r | {"memory_peak_per_rank": json.dumps([5, 7])} for r in rows]
    named = _named(job_id, range(0, 900, 10))
    for lo in range(0, 900, 300):
        with sessions.begin() as s:
            rollups.record(s, rows[lo : lo + 300], named[lo // 5 : lo // 5 + 60])
    kept = _rollups(sessions, job_id)
    names = {(kind, name) for _, kind, name, *_ in kept}
    assert (STEP_KIND, "loss") in names and (EVAL_KIND, "eval_loss") in names
    assert {n for n in names if n[1].startswith("@")} == {
        (EVAL_KIND, "@ms"),
        (LAYER_NORM_KIND, "@ms"),
    }
    with sessions.begin() as s:
        s.execute(sa.delete(MetricRollup).where(MetricRollup.job_id == job_id))
        rollup_rebuild.rebuild(s, job_id, exemplars=False)
    assert _rollups(sessions, job_id) == kept


def test_a_resent_points_rank_memory_reaches_the_exemplars(
    db: tuple[sa.Engine, Sessions],
) -> None:
    """The re-sent points gain only rank series (no roll-ups): the blocks' records gain them."""
    _, sessions = db
    job_id = new_job(sessions)
    rows = series(job_id, list(range(300)), seed=5)
    with sessions.begin() as s:
        rollups.record(s, rows, [])
    before = stored(sessions, job_id)
    with sessions.begin() as s:
        rollups.record(s, [r | {"memory_peak_per_rank": json.dumps([3])} for r in rows], [])
    kept = stored(sessions, job_id)
    assert kept != before and all(b"@rank0" in data for data in kept.values())
    assert rebuilt(sessions, job_id) == kept


def test_the_upsert_stores_every_value_as_given(db: tuple[sa.Engine, Sessions]) -> None:
    """:func:`rollups.upsert` (on PostgreSQL one statement of array literals) keeps odd
    names and the exact floats: -0.0 (SQLite's REAL itself stores 0.0), the smallest
    subnormal, the largest float, nulls."""
    engine, sessions = db
    job_id = new_job(sessions)
    names = ['a "quoted", {braced}\\ name', "NULL", "(root)", "é.l_0", ""]
    floats = [-0.0, 5e-324, 1.7976931348623157e308, 0.1, None]
    rows = [
        (job_id, EVAL_KIND, name, 0, i, 1, i, i + 1, 2, 0, 0, 0, None, low, i, 2.5, i + 1)
        for i, (name, low) in enumerate(zip(names, floats, strict=True))
    ]
    for _ in range(2):  # an insert, then an update of every row
        with sessions.begin() as s:
            rollups.upsert(s, rows)
    got = _rollups(sessions, job_id)
    assert got == {row[:6]: row[6:] for row in rows}
    low = {key[2]: stats[7] for key, stats in got.items()}
    assert low[names[1]] == 5e-324
    assert str(low[names[0]]) == ("-0.0" if engine.dialect.name == "postgresql" else "0.0")
