"""A job's steady-state samples/s from its recorded points: the one definition
(:func:`amptrain.contract.progress.steady_rate`) read from SQL, for the recorder's
``summary.samples_per_second`` (the job list, ``GET /jobs/{id}``) and the comparison
report alike, so no two pages show two figures under one name."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.progress import STEADY_LOOKBACK
from amptrain.contract.progress import steady_rate as rate_of
from amptrain.store.history.window import is_finite
from amptrain.store.models import MetricPoint


def steady_rate(s: Session, job_id: str, attempt: int) -> float | None:
    """The attempt's steady-state samples/s (:data:`~amptrain.contract.progress.STEADY_RATE_DOC`);
    None before a step with a finite rate and a positive step time. One bounded read: the
    newest STEADY_LOOKBACK such steps."""
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
