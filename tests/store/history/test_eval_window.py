"""The eval series in at most max_points evaluations (``eval_window``), on real SQLite and
PostgreSQL: every bucket keeps its first and last evaluation and each name's min and max
(a spike in accuracy survives), the budget is never exceeded, and a window that fits
comes back whole: the effective series ``eval_page`` pages through."""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import EVAL_KIND
from amptrain.store.history import rollups
from amptrain.store.history.eval_window import eval_window
from amptrain.store.history.points import Page
from amptrain.store.history.values import eval_page
from amptrain.store.history.window import width_for
from tests.store.history.test_downsample import new_job

T0 = 1_700_000_000_000
SPIKE, DIP = 1_230, 2_010


def accuracy(step: int) -> float:
    return 0.999 if step == SPIKE else 0.0 if step == DIP else 0.2 + step / 10_000


def seed(sessions: sessionmaker[Session]) -> str:
    """A job evaluated every 10 steps up to 3000 (300 evaluations); attempt 2 resumed from
    step 2500 and evaluated from there again, lower eval loss."""
    job_id = new_job(sessions)
    rows: list[dict[str, Any]] = []
    for attempt, steps in ((1, range(10, 2_801, 10)), (2, range(2_510, 3_001, 10))):
        for step in steps:
            values = {"accuracy": accuracy(step), "eval_loss": attempt / step}
            for name, value in values.items():
                ms = T0 + step + 10_000 * attempt
                rows.append(
                    {
                        "job_id": job_id,
                        "attempt": attempt,
                        "step": step,
                        "name": name,
                        "value": value,
                        "time": ms / 1000,
                        "stream_ms": ms,
                        "stream_seq": 0,
                    }
                )
    with sessions.begin() as s:
        rollups.record(s, [], [{"kind": EVAL_KIND} | r for r in rows])  # as the recorder
    return job_id


def test_downsampled_evals_keep_each_buckets_extremes(
    db: tuple[sa.Engine, sessionmaker[Session]],
) -> None:
    _, sessions = db
    job_id = seed(sessions)
    with sessions() as s:
        series, _ = eval_page(s, job_id, Page(limit=10_000))  # the effective series
        assert len(series) == 300 and [e["step"] for e in series] == list(range(10, 3_001, 10))
        for max_points in (1, 7, 40, 299):
            window = eval_window(s, job_id, max_points)
            got = window.items
            assert 1 <= len(got) <= max_points and all(e["downsampled"] for e in got)
            assert [e["step"] for e in got] == sorted({e["step"] for e in got})
            assert window.next_cursor == series[-1]["cursor"]
            assert all(e == {**series_at(series, e["step"]), "downsampled": True} for e in got)
            if max_points == 1:  # below one bucket's share: the highest accuracy first
                assert [e["step"] for e in got] == [SPIKE]
                continue
            # Every bucket (by the width series_window's arithmetic gives) keeps its first,
            # last and each name's min and max.
            width = width_for(10, 3_000, max_points, 2 + 2 * 2)
            kept = {e["step"] for e in got}
            for b in {e["step"] // width for e in series}:
                bucket = [e for e in series if e["step"] // width == b]
                want = {bucket[0]["step"], bucket[-1]["step"]}
                for name in ("accuracy", "eval_loss"):
                    ranked = [(e["values"][name], e["step"]) for e in bucket]
                    want |= {min(ranked)[1], max(ranked, key=itemgetter(0))[1]}
                assert want <= kept, (max_points, b, sorted(want - kept))
            assert {SPIKE, DIP} <= kept
        # Whole when it fits: the effective series itself, the run's or a window's.
        whole = eval_window(s, job_id, 300).items
        assert whole == [{**e, "downsampled": False} for e in series]
        zoom = eval_window(s, job_id, 50, from_step=1_000, to_step=1_400).items
        assert zoom == [{**e, "downsampled": False} for e in series if 1_000 <= e["step"] <= 1_400]
        assert eval_window(s, job_id, 5, from_step=3_001).items == []


def series_at(series: list[dict[str, Any]], step: int) -> dict[str, Any]:
    (found,) = [e for e in series if e["step"] == step]
    return found
