"""The readers ported to the chunks (issue 41), as the per-value rows served them before: the
oracle the chunk reads must equal (tests/store/history/test_consumer_parity.py). Moved here
verbatim from amptrain/store/history/throughput.py, amptrain/store/comparisons.py,
amptrain/store/alert_windows.py and amptrain/server/stall_watch.py."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.alerts import finite_or_none, is_step_series
from amptrain.contract.metrics import BY_NAME, EVAL_KIND
from amptrain.contract.progress import STEADY_LOOKBACK
from amptrain.contract.progress import steady_rate as rate_of
from amptrain.store.comparisons import FINAL_FRACTION, FINAL_MAX_STEPS
from tests.support.row_sql import is_finite
from tests.support.row_tables import MetricPoint, MetricValue

Key = tuple[str, str]
Point = tuple[int, float | None]


def steady_rate(s: Session, job_id: str, attempt: int) -> float | None:
    p = MetricPoint
    c = MetricPoint.__table__.c  # the metric columns (named by the metric table)
    rate, ms = c.samples_per_second, c.step_time_ms
    rows = s.execute(
        sa.select(rate, ms)
        .where(p.job_id == job_id, p.attempt == attempt, is_finite(rate), is_finite(ms), ms > 0)
        .order_by(p.step.desc())
        .limit(STEADY_LOOKBACK)
    ).all()
    newest = [(float(r), float(m)) for r, m in reversed(rows)]
    return rate_of(newest, len(newest))


def run_numbers(s: Session, job_id: str, attempt: int) -> dict[str, Any]:
    """The comparison report's numbers of one job (``comparisons._run_numbers``)."""
    p = MetricPoint
    c = MetricPoint.__table__.c  # the metric columns (named by the metric table)
    effective = _effective(p)
    count = s.scalar(sa.select(sa.func.count()).where(p.job_id == job_id, effective))
    numbers: dict[str, Any] = {"throughput": None, "peak_memory": None, "final_loss": None}
    if count:
        final_n = max(1, min(FINAL_MAX_STEPS, int(count * FINAL_FRACTION)))
        mine = (p.job_id == job_id, effective)
        numbers["throughput"] = steady_rate(s, job_id, attempt)
        numbers["peak_memory"] = s.scalar(sa.select(sa.func.max(c.memory_peak)).where(*mine))
        last = (
            sa.select(c.loss)
            .where(*mine, is_finite(c.loss))
            .order_by(p.step.desc())
            .limit(final_n)
            .subquery()
        )
        numbers["final_loss"] = s.scalar(sa.select(sa.func.avg(last.c.loss)))
    return {k: float(v) if k != "peak_memory" and v is not None else v for k, v in numbers.items()}


def _effective(p: Any) -> sa.ColumnElement[bool]:
    newer = sa.orm.aliased(MetricPoint)
    return ~sa.exists().where(
        newer.job_id == p.job_id, newer.step == p.step, newer.attempt > p.attempt
    )


def before(s: Session, needs: Mapping[Key, tuple[int, int, int]]) -> dict[Key, list[float]]:
    if not needs:
        return {}
    keys = list(needs)
    parts, params = [], {}
    for i, (job_id, series) in enumerate(keys):
        attempt, step, count = needs[(job_id, series)]
        params.update({f"j{i}": job_id, f"a{i}": attempt, f"s{i}": step, f"c{i}": count})
        if is_step_series(series):
            column, table, only = BY_NAME[series].name, "metric_points", ""
        else:
            column, table = "value", "metric_values"
            only = f" AND kind = :k{i} AND name = :n{i}"
            params.update({f"k{i}": EVAL_KIND, f"n{i}": series})
        parts.append(
            f"SELECT * FROM (SELECT {i} AS part, step, CAST({column} AS DOUBLE PRECISION) AS v"
            f" FROM {table} WHERE job_id = :j{i} AND attempt = :a{i} AND step < :s{i}{only}"
            f" ORDER BY step DESC LIMIT :c{i}) AS p{i}"
        )
    found: dict[Key, list[tuple[int, float]]] = {}
    for part, step, value in s.execute(sa.text(" UNION ALL ".join(parts)), params):
        if (x := finite_or_none(value)) is not None:
            found.setdefault(keys[part], []).append((step, x))
    return {key: [x for _, x in sorted(rows)] for key, rows in found.items()}


def eval_series(s: Session, job_id: str, series: str) -> list[Point]:
    v = MetricValue
    rows = s.execute(
        sa.select(v.step, v.attempt, v.value)
        .where(v.job_id == job_id, v.kind == EVAL_KIND, v.name == series)
        .order_by(v.step, v.attempt)
    )
    newest: dict[int, float | None] = {}
    for step, _attempt, value in rows:
        newest[step] = finite_or_none(value)
    return sorted(newest.items())


def newest_ms(s: Session, job_id: str, attempt: int) -> int | None:
    """``stall_watch.last_progress``'s read of the points."""
    p = MetricPoint
    return s.scalar(
        sa.select(sa.func.max(p.stream_ms)).where(p.job_id == job_id, p.attempt == attempt)
    )
