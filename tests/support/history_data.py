"""Metric histories for the store's tests: a job, points with every odd value (ties, NaN,
inf and null losses, non-finite grad norms, skipped steps), random batch sizes; written
through the recorder's own path (:func:`amptrain.store.history.rollups.record`: chunks and
roll-ups) and, for the oracles, as the rows the old writers wrote
(:mod:`tests.support.row_writes`)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import STORED_METRIC_FIELDS
from amptrain.contract.spec import JobSpec
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history import rollups
from tests.support import row_tables, row_writes
from tests.support.old_schema import create_old_job

Sessions = sessionmaker[Session]
T0 = 1_700_000_000_000


def new_job(sessions: Sessions) -> str:
    """A job in the columns of revision 0004 (the oldest these tests start from)."""
    spec = JobSpec.model_validate(
        {
            "model": {"name": "mlp"},
            "dataset": {"name": "synthetic-classification"},
            "max_steps": 100_000,
        }
    )
    with sessions.begin() as s:
        return create_old_job(s, spec, "tester", "cpu")


def series(
    job_id: str, steps: list[int], attempt: int = 1, seed: int = 0, ms: int = T0
) -> list[dict[str, Any]]:
    """Points with ties (values on a coarse grid), NaN/inf/null losses, non-finite grad
    norms and skipped steps."""
    rng = random.Random(seed)
    rows = []
    for i, step in enumerate(steps):
        loss: float | None = round(rng.uniform(0, 3), 1)
        roll = rng.random()
        if roll < 0.01:
            loss = None
        elif roll < 0.02:
            loss = math.nan
        elif roll < 0.03:
            loss = math.inf
        grad = rng.choice([1.0, 2.0, 0.5, 1.0, 1.0, 9.0]) if rng.random() > 0.01 else math.inf
        rows.append(
            dict.fromkeys(STORED_METRIC_FIELDS)
            | {
                "job_id": job_id,
                "attempt": attempt,
                "stream_ms": ms + i,
                "stream_seq": 0,
                "step": step,
                "time": 1000.0 + step,
                "loss": loss,
                "grad_norm": grad,
                "skipped": rng.random() < 0.02,
                "loss_scale": rng.choice([32768.0, 65536.0]),
                "lr": 1e-3,
                "samples_per_second": rng.choice([100.0, 120.0, 80.0]),
                "step_time_ms": None if rng.random() < 0.1 else rng.uniform(5, 6),
                "memory_allocated": rng.choice([10**8, 2 * 10**8, 10**8 + 7]),
            }
        )
    return rows


def record(
    sessions: Sessions,
    rows: Sequence[dict[str, Any]],
    sizes: Sequence[int] | None = None,
    values: Sequence[dict[str, Any]] = (),
    oracle: bool = True,
) -> None:
    """The recorder's transactions, ``sizes`` points each (default: one): the chunks and
    roll-ups of the points (and with the first, the named ``values``), and with ``oracle``
    the rows the old writers wrote beside them."""
    sizes = list(sizes or [len(rows)])
    i = 0
    for n, size in enumerate(sizes):
        batch = list(rows[i : i + size])
        i += size
        named = list(values) if n == 0 else []
        with sessions.begin() as s:
            rollups.record(s, batch, named)
            if oracle:
                row_tables.ensure(s.connection())
                row_writes.insert_points(s, batch)
                row_writes.insert_values(s, named)
    if oracle:
        with sessions.begin() as s:
            row_writes.analyse(s)
    assert i >= len(rows)


def seed(sessions: Sessions, rows: Sequence[dict[str, Any]], oracle: bool = True) -> None:
    """Points written in one transaction, with their rows for the oracles."""
    record(sessions, rows, None, (), oracle)


def random_sizes(n: int, rng: random.Random) -> list[int]:
    sizes = []
    while sum(sizes) < n:
        sizes.append(rng.choice([1, 3, 17, 100, 333, 1000]))
    return sizes


SEED_COLUMNS = (
    "job_id",
    "attempt",
    "stream_ms",
    "stream_seq",
    "step",
    "time",
    "loss",
    "loss_scale",
    "skipped",
    "grad_norm",
    "lr",
    "memory_allocated",
    "memory_reserved",
    "memory_peak",
    "samples_per_second",
)
"""The fields of :func:`seed_url`'s tuples, in order (the rest are null)."""


def seed_url(database_url: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """Points (tuples of :data:`SEED_COLUMNS`) into a service's database as the recorder
    writes them (chunks and roll-ups, one transaction): a test's data, not the code under
    test."""
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine).begin() as s:
            rollups.record(s, [dict(zip(SEED_COLUMNS, r, strict=True)) for r in rows], [])
    finally:
        engine.dispose()
