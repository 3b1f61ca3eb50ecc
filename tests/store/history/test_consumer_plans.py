"""The readers of :mod:`~amptrain.store.history.chunk_tail` (the steady rate, alert windows,
the comparison numbers, the stall watch) are primary-key searches on a database that was
never analysed: no statement scans ``metric_chunks`` or sorts it, and the tail reads run a
statement or two however long the run. Real SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import EVAL_KIND
from amptrain.contract.spec import JobSpec
from amptrain.server.stall_watch import last_progress
from amptrain.store import alert_windows, comparisons, jobs
from amptrain.store.history import chunk_writes
from amptrain.store.history.throughput import steady_rate
from amptrain.store.models import Job
from tests.support.plans import SORT_NODE

STEPS = 60_000


def _long_run(sf: sessionmaker[Session]) -> str:
    """Attempt 1 records steps 1..STEPS, attempt 2 re-records the last 1000; an evaluation
    every 100 steps. Written straight to the chunks (test data, not the code under test)."""
    spec = JobSpec.model_validate(
        {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "max_steps": STEPS}
    )
    with sf.begin() as s:
        job_id = jobs.create_job(s, spec, "alice", "cpu").id
    for attempt, steps in ((1, range(1, STEPS + 1)), (2, range(STEPS - 999, STEPS + 1))):
        for lo in range(steps.start, steps.stop, 25_600):
            part = range(lo, min(lo + 25_600, steps.stop))
            with sf.begin() as s:
                chunk_writes.append(
                    s, _points(job_id, attempt, part), _evals(job_id, attempt, part), pack=True
                )
    return job_id


def _points(job_id: str, attempt: int, steps: range) -> list[dict[str, Any]]:
    return [
        {
            "job_id": job_id,
            "attempt": attempt,
            "step": i,
            "time": 1e9 + i,
            "loss": 1.0 / i,
            "step_time_ms": 5.0,
            "samples_per_second": 100.0 + i % 7,
            "memory_peak": i,
            "stream_ms": 10**12 + attempt * 10**8 + i,
            "stream_seq": 0,
        }
        for i in steps
    ]


def _evals(job_id: str, attempt: int, steps: range) -> list[dict[str, Any]]:
    return [
        {
            "job_id": job_id,
            "attempt": attempt,
            "step": i,
            "kind": EVAL_KIND,
            "name": "eval_loss",
            "value": 2.0 / i,
            "time": 1e9 + i,
            "stream_ms": 10**12 + attempt * 10**8 + i,
            "stream_seq": 1,
        }
        for i in steps
        if i % 100 == 0
    ]


class _Statements:
    """The statements run on an engine while it is on."""

    def __init__(self, engine: sa.Engine) -> None:
        self.seen: list[tuple[str, Any]] = []
        self.engine = engine

    def __enter__(self) -> _Statements:
        sa.event.listen(self.engine, "before_cursor_execute", self._add)
        return self

    def __exit__(self, *_: object) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._add)

    def _add(self, conn: Any, cursor: Any, statement: str, params: Any, *_: Any) -> None:
        if "metric_chunks" in statement:
            self.seen.append((statement, params))


def _plan(engine: sa.Engine, statement: str, params: Any) -> str:
    explain = "EXPLAIN QUERY PLAN " if engine.dialect.name == "sqlite" else "EXPLAIN "
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(explain + statement, params).all()
    return "\n".join(str(r[-1]) for r in rows)


def test_the_readers_search_the_primary_key_without_statistics(
    sf: sessionmaker[Session],
) -> None:
    job_id = _long_run(sf)
    engine = sf.kw["bind"]
    with sf() as s, _Statements(engine) as tail:
        assert steady_rate(s, job_id, 1) == pytest.approx(103.0, abs=3)
        assert last_progress(s, job_id, 2) == (10**12 + 2 * 10**8 + STEPS) / 1000
        window = {(job_id, "loss"): (1, STEPS // 2, 50), (job_id, "eval_loss"): (2, STEPS + 1, 4)}
        got = alert_windows.before(s, window)
        assert got[(job_id, "loss")] == [1.0 / i for i in range(STEPS // 2 - 50, STEPS // 2)]
        assert len(got[(job_id, "eval_loss")]) == 4  # in the newest two chunks
    assert len(tail.seen) == 2 + 1 + 1  # steady rate, newest step, both windows: not per chunk
    with sf() as s, _Statements(engine) as whole:
        job = s.get(Job, job_id)
        assert job is not None
        job.attempt = 2
        numbers = comparisons._run_numbers(s, "fp32", job)
        assert numbers["peak_memory"] == STEPS
        assert len(alert_windows.eval_series(s, job_id, "eval_loss")) == STEPS // 100
    for statement, params in tail.seen + whole.seen:
        plan = _plan(engine, statement, params)
        if engine.dialect.name == "sqlite":
            assert "SCAN metric_chunks" not in plan and "TEMP B-TREE" not in plan, plan
        else:
            # A filter: rows of the index range read and dropped (a chunk IN list can be);
            # an aggregate: the range read whole (max() was).
            bad = ("Seq Scan", SORT_NODE, "Filter", "Aggregate")
            assert not any(w in plan for w in bad), plan
