"""A job's steady-state samples/s from its recorded points: the one definition
(:func:`amptrain.contract.progress.steady_rate`) read from SQL, for the recorder's
``summary.samples_per_second`` (the job list, ``GET /jobs/{id}``) and the comparison
report alike, so no two pages show two figures under one name."""

from __future__ import annotations

from itertools import islice
from math import isfinite

from sqlalchemy.orm import Session

from amptrain.contract.progress import STEADY_LOOKBACK
from amptrain.contract.progress import steady_rate as rate_of
from amptrain.store.history.chunk_parts import STEP_KIND
from amptrain.store.history.chunk_tail import newest_first


def steady_rate(s: Session, job_id: str, attempt: int) -> float | None:
    """The attempt's steady-state samples/s (:data:`~amptrain.contract.progress.STEADY_RATE_DOC`);
    None before a step with a finite rate and a positive step time. One bounded read: the
    newest STEADY_LOOKBACK such steps, from the attempt's newest chunks."""
    steps = newest_first(s, job_id, STEP_KIND, ("step_time_ms", "samples_per_second"), attempt)
    usable = (
        (rate, ms)
        for _, (ms, rate) in steps
        if ms is not None and rate is not None and isfinite(rate) and isfinite(ms) and ms > 0
    )
    newest = list(islice(usable, STEADY_LOOKBACK))[::-1]
    return rate_of(newest, len(newest))
