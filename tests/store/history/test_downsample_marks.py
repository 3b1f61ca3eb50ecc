"""Downsampling that serves charts honestly: extremes of every requested field that can
spike (grad_norm too), NaN/Inf and skipped steps always kept or counted, a step window at
full resolution, and buckets that stay put while a run grows. Real SQLite/PostgreSQL."""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.spec import JobSpec
from amptrain.store import jobs
from amptrain.store.history import rollups
from amptrain.store.history.downsample import series_window

Sessions = sessionmaker[Session]


def run(db: tuple[sa.Engine, Sessions], steps: int, **special: dict[int, dict[str, Any]]) -> str:
    """A job with ``steps`` recorded points: a smooth loss, grad norm 1, no skips, except
    the values ``special[field][step]`` overrides."""
    _, sessions = db
    spec = JobSpec.model_validate(
        {
            "model": {"name": "mlp"},
            "dataset": {"name": "synthetic-classification"},
            "max_steps": steps,
        }
    )
    with sessions.begin() as s:
        job_id = jobs.create_job(s, spec, "tester", "cpu").id
    rows = []
    for step in range(1, steps + 1):
        row = {
            "job_id": job_id,
            "attempt": 1,
            "stream_ms": 1_000_000 + step,
            "stream_seq": 0,
            "step": step,
            "time": 1000.0 + step,
            "loss": 1 / math.sqrt(step),
            "grad_norm": 1.0,
            "skipped": False,
            "loss_scale": 65536.0,
            "lr": 1e-3,
        }
        for name, values in special.items():
            if step in values:
                row[name] = values[step]
        rows.append(row)
    with sessions.begin() as s:
        rollups.record(s, rows, [])  # as the recorder writes them
    return job_id


def window(db: tuple[sa.Engine, Sessions], job_id: str, n: int, **kw: Any) -> Any:
    with db[1]() as s:
        return series_window(s, job_id, n, **kw)


def steps_of(w: Any) -> list[int]:
    return [p["step"] for p in w.items]


def test_extremes_of_each_requested_field_survive(db: tuple[sa.Engine, Sessions]) -> None:
    job_id = run(db, 20_000, grad_norm={12_345: 80.0, 4_321: 0.001}, loss={15_000: 9.0})
    by_default = window(db, job_id, 300)
    assert len(by_default.items) <= 300 and all(p["downsampled"] for p in by_default.items)
    assert {12_345, 4_321, 15_000} <= set(steps_of(by_default))  # loss and grad_norm by default
    only_norm = window(db, job_id, 300, fields=["grad_norm"])
    assert {12_345, 4_321} <= set(steps_of(only_norm))
    assert set(only_norm.items[0]) == {
        *("step", "attempt", "cursor", "downsampled", "bucket_last", "grad_norm")
    }
    assert max(p["grad_norm"] for p in only_norm.items) == 80.0


def test_non_finite_and_skipped_steps_are_kept_and_counted(
    db: tuple[sa.Engine, Sessions],
) -> None:
    # An fp16 overflow at 777 (NaN loss, skipped), an inf grad norm at 9_000, and three
    # skipped steps in a row at 3_000 (a loss-scale backoff).
    job_id = run(
        db,
        10_000,
        loss={777: math.nan},
        skipped={777: True, 3_000: True, 3_001: True, 3_002: True},
        grad_norm={777: None, 3_000: None, 3_001: None, 3_002: None, 9_000: math.inf},
    )
    w = window(db, job_id, 200, fields=["loss", "skipped", "grad_norm"])
    assert len(w.items) <= 200
    kept = {p["step"]: p for p in w.items}
    assert {777, 3_000, 3_001, 3_002, 9_000} <= set(kept)
    # JSON has no NaN or Infinity: both come back null, on SQLite and on PostgreSQL.
    assert kept[777]["loss"] is None and kept[9_000]["grad_norm"] is None
    assert sum(m["skipped"] for m in w.marks) == 4
    assert sum(m["non_finite"] for m in w.marks) == 1
    assert sum(m["flagged"] for m in w.marks) == 5
    for step in (777, 3_000, 9_000):
        assert any(m["from_step"] <= step <= m["to_step"] for m in w.marks), step


def test_too_many_flagged_steps_keep_each_buckets_first_and_count_the_rest(
    db: tuple[sa.Engine, Sessions],
) -> None:
    # A collapsed loss scale: every step from 5_001 on skipped.
    job_id = run(db, 10_000, skipped=dict.fromkeys(range(5_001, 10_001), True))
    w = window(db, job_id, 150, fields=["loss", "skipped"])
    assert len(w.items) <= 150
    assert sum(m["skipped"] for m in w.marks) == 5_000
    assert min(m["from_step"] for m in w.marks) <= 5_001
    kept = set(steps_of(w))
    for m in w.marks:  # each marked bucket shows its first skipped step
        assert max(m["from_step"], 5_001) in kept, m
    assert len(w.items) < 5_000 / 10  # and not every one of them


def test_a_step_window_comes_at_full_resolution(db: tuple[sa.Engine, Sessions]) -> None:
    job_id = run(db, 20_000, loss={5_200: 7.0})
    zoomed = window(db, job_id, 1000, from_step=5_000, to_step=5_400)
    assert steps_of(zoomed) == list(range(5_000, 5_401))
    assert not any(p["downsampled"] for p in zoomed.items)
    wider = window(db, job_id, 100, from_step=5_000, to_step=9_000)
    assert len(wider.items) <= 100 and 5_200 in steps_of(wider)
    assert min(steps_of(wider)) == 5_000 and max(steps_of(wider)) == 9_000
    assert zoomed.next_cursor == wider.next_cursor == f"{1_000_000 + 20_000}-0"
    assert window(db, job_id, 10, from_step=30_000).items == []


def test_a_growing_run_keeps_its_buckets(db: tuple[sa.Engine, Sessions]) -> None:
    """Refreshing a live chart must not make the curve jump: the points chosen in the
    buckets that were already complete stay the same."""
    noisy = {s: 1 / math.sqrt(s) + 0.1 * math.sin(s * 1.7) for s in range(1, 10_301)}
    job_id = run(db, 10_300, loss=noisy)
    before = window(db, job_id, 400, to_step=10_000)
    after = window(db, job_id, 400)
    cut = 9_000  # well inside the buckets both answers share
    assert [s for s in steps_of(before) if s < cut] == [s for s in steps_of(after) if s < cut]
