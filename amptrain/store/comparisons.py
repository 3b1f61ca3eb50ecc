"""Precision A/B comparisons: one spec trained once per precision, and the report on them.

A comparison row only remembers which job ran which precision; everything in the
report is computed from the jobs' recorded metric points when it is asked for, so
it is as fresh as the recorder and never disagrees with ``GET /jobs/{id}/metrics``.

The report's numbers, per job:

- ``throughput``: the steady-state samples/s of the job's current attempt, the one
  definition (:func:`amptrain.store.history.throughput.steady_rate`) that is also its
  ``summary.samples_per_second`` in the job list;
- ``peak_memory``: the highest ``memory_peak`` recorded;
- ``final_loss``: mean of the finite losses of the last :data:`FINAL_FRACTION` of the
  recorded steps (at least 1, at most :data:`FINAL_MAX_STEPS`), so one noisy batch does
  not decide the accuracy verdict;
- ratios of those against the baseline run (requested ``fp32``; else the first run that
  actually trained in fp32), and the loss curves aligned by step;
- the final evaluation, its difference from the baseline's and the accuracy verdict
  (:mod:`amptrain.store.accuracy`).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from itertools import islice
from math import fsum, isfinite
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, Session, mapped_column

from amptrain.core.enums import JobStatus
from amptrain.store import accuracy, job_reads
from amptrain.store.history import chunk_tail
from amptrain.store.history.chunk_parts import STEP_KIND
from amptrain.store.history.downsample import downsample
from amptrain.store.history.throughput import steady_rate
from amptrain.store.models import Base, Job, UTCDateTime, utcnow

FINAL_FRACTION = 0.1
FINAL_MAX_STEPS = 100
CURVE_POINTS = 1000
"""Per run, at most this many loss points in the report (downsampled, spikes kept)."""


def new_comparison_id() -> str:
    return "c_" + uuid.uuid4().hex


class Comparison(Base):
    """One spec submitted once per precision; ``runs`` is ``[{"precision", "job_id"}]``."""

    __tablename__ = "comparisons"
    __table_args__ = (sa.Index(None, "owner", "created_at"),)

    id: Mapped[str] = mapped_column(sa.String(40), primary_key=True, default=new_comparison_id)
    name: Mapped[str] = mapped_column(sa.String(200))
    owner: Mapped[str] = mapped_column(sa.String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    spec: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    runs: Mapped[list[dict[str, str]]] = mapped_column(sa.JSON)


def create(
    s: Session, name: str, owner: str, spec: dict[str, Any], runs: list[dict[str, str]]
) -> Comparison:
    """Add the comparison row for jobs the caller already created in this transaction."""
    row = Comparison(name=name, owner=owner, spec=spec, runs=runs)
    s.add(row)
    s.flush()
    return row


def get(s: Session, comparison_id: str) -> Comparison | None:
    return s.get(Comparison, comparison_id)


def newest(s: Session, owner: str | None, limit: int) -> list[Comparison]:
    """The newest comparisons of ``owner`` (None: everyone's)."""
    query = sa.select(Comparison)
    if owner is not None:
        query = query.where(Comparison.owner == owner)
    return list(
        s.scalars(query.order_by(Comparison.created_at.desc(), Comparison.id.desc()).limit(limit))
    )


def report(
    s: Session, comparison: Comparison, tolerance: dict[str, float] | None = None
) -> dict[str, Any]:
    """Each run's status and numbers, the ratios against the baseline, the final
    evaluations with the accuracy verdict (:mod:`amptrain.store.accuracy`; ``tolerance``
    defaults to :data:`~amptrain.store.accuracy.DEFAULT_TOLERANCE`) and the loss curves."""
    tolerance = {**accuracy.DEFAULT_TOLERANCE, **(tolerance or {})}
    job_ids = [r["job_id"] for r in comparison.runs]
    jobs = {j.id: j for j in s.scalars(sa.select(Job).where(Job.id.in_(job_ids)))}
    runs = [
        _run_numbers(s, run["precision"], jobs[run["job_id"]])
        for run in comparison.runs
        if run["job_id"] in jobs
    ]
    base = _baseline(runs)
    for run in runs:
        run["ratios"] = {
            key: _ratio(run[key], base[key]) if base is not None else None
            for key in ("throughput", "peak_memory", "final_loss")
        }
        run["eval_diff"] = accuracy.differences(run, base)
    for run in runs:
        run["verdict"] = accuracy.verdict(run, base, tolerance)
    return {
        "id": comparison.id,
        "name": comparison.name,
        "created_at": comparison.created_at,
        "spec": comparison.spec,
        "baseline": base["precision"] if base is not None else None,
        "tolerance": tolerance,
        "runs": runs,
        "loss_curves": _aligned_curves(s, runs),
    }


def _run_numbers(s: Session, precision: str, job: Job) -> dict[str, Any]:
    numbers: dict[str, Any] = {"throughput": None, "peak_memory": None, "final_loss": None}
    # The effective series (per step the newest attempt's point), from its chunks.
    count, peak = chunk_tail.effective_extent(s, job.id, STEP_KIND, "memory_peak")
    if count:
        final_n = max(1, min(FINAL_MAX_STEPS, int(count * FINAL_FRACTION)))
        numbers["throughput"] = steady_rate(s, job.id, job.attempt)
        numbers["peak_memory"] = int(peak) if peak is not None else None
        losses = chunk_tail.newest_first(s, job.id, STEP_KIND, ("loss",))
        last = list(islice((v for _, (v,) in losses if v is not None and isfinite(v)), final_n))
        # The mean the SQL avg() gave, summed exactly (SQL sums in no stated order).
        numbers["final_loss"] = fsum(last) / len(last) if last else None
    return {
        "precision": precision,
        "job_id": job.id,
        "name": job.name,
        "status": job.status,
        "step": job.step or 0,
        "max_steps": job.max_steps,
        "effective_precision": job.precision_effective,
        "precision_history": job_reads.precision_history(s, job.id),
        "error": {"code": job.error_code, "message": job.error_message or ""}
        if job.error_code
        else None,
        **{k: float(v) if k != "peak_memory" and v is not None else v for k, v in numbers.items()},
        **accuracy.final_eval(job.eval_summary, _final_eval_step(job)),
    }


def _final_eval_step(job: Job) -> int | None:
    """The step a succeeded job's last evaluation is due at: its last step when the spec
    evaluates at the end (``eval.at_end``, ``eval.enabled`` not false); None otherwise."""
    spec_eval = (job.spec or {}).get("eval") or {}
    if job.status != JobStatus.SUCCEEDED or spec_eval.get("enabled") is False:
        return None
    return (job.step or 0) if spec_eval.get("at_end", True) else None


def _baseline(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    for run in runs:
        if run["precision"] == "fp32":
            return run
    for run in runs:
        if run["effective_precision"] == "fp32":
            return run
    return None


def _ratio(value: float | int | None, base: float | int | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return float(value) / float(base)


def _aligned_curves(s: Session, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"step": [...], "loss": {precision: [...]}}``: one shared step axis, null where a
    run has no point at that step (still running, or dropped by downsampling)."""
    series: dict[str, dict[int, float | None]] = {}
    for run in runs:
        items, _ = downsample(s, run["job_id"], CURVE_POINTS, ["loss"])
        series[run["precision"]] = {int(i["step"]): i["loss"] for i in items}
    steps = sorted({step for points in series.values() for step in points})
    return {
        "step": steps,
        "loss": {name: [points.get(step) for step in steps] for name, points in series.items()},
    }
