"""Recording named series' values (``metric_values``: evaluations and per-layer gradient
norms) and the job's newest evaluation, inside the recorder's transaction (it commits;
these do not).

Evaluations are rare next to steps (one per ``eval.every`` steps, a handful of names), and
layer norms come every ``telemetry.layer_grad_norms_every`` steps with at most
:data:`~amptrain.contract.layers.LAYER_NORMS_MAX` names, so a plain multi-row ``INSERT ...
ON CONFLICT DO NOTHING RETURNING`` is enough: no COPY path.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.metrics import EVAL_KIND
from amptrain.store.db import dialect_insert
from amptrain.store.models import Job, MetricValue

PAGE = 500
"""Rows per statement (9 parameters each: far below SQLite's limit of 32766)."""


def insert(s: Session, rows: list[dict[str, Any]]) -> set[str]:
    """Insert the value rows (keys: the columns of ``metric_values`` but ``id``) that are
    not there yet; the ids of the jobs that got any evaluation value (whose summary
    :func:`refresh_summary` recomputes). A replay, or an entry the worker
    re-sent after Redis lost data (same attempt, step and names, a new entry id), inserts
    nothing, so the first cursor stays."""
    jobs: set[str] = set()
    for i in range(0, len(rows), PAGE):
        stmt = dialect_insert(s, MetricValue).values(rows[i : i + PAGE])
        key = ["job_id", "attempt", "step", "kind", "name"]
        stmt = stmt.on_conflict_do_nothing(index_elements=key)
        returned = s.execute(stmt.returning(MetricValue.job_id, MetricValue.kind))
        jobs.update(job for job, kind in returned if kind == EVAL_KIND)
    return jobs


def refresh_summary(s: Session, job_ids: set[str]) -> None:
    """Set each job's ``eval_summary`` to its newest evaluation: the newest attempt that has
    evaluated, at its highest step (the model the job holds now; when the job has finished,
    its final evaluation). Recomputed from SQL, so entries arriving out of order or replayed
    cannot move it back."""
    v = MetricValue
    for job_id in sorted(job_ids):
        newest = s.execute(
            sa.select(v.attempt, v.step)
            .where(v.job_id == job_id, v.kind == EVAL_KIND)
            .order_by(v.attempt.desc(), v.step.desc())
            .limit(1)
        ).first()
        if newest is None:
            continue
        attempt, step = newest
        values = s.execute(
            sa.select(v.name, v.value)
            .where(v.job_id == job_id, v.kind == EVAL_KIND, v.attempt == attempt, v.step == step)
            .order_by(v.name)
        ).all()
        summary = {"step": step, "attempt": attempt, "values": dict(values)}
        s.execute(
            sa.update(Job)
            .where(Job.id == job_id)
            .values(eval_summary=summary)
            .execution_options(synchronize_session=False)
        )
