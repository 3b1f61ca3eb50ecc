"""A job's steady-state samples/s from its recorded points: the one definition
(:func:`amptrain.contract.progress.steady_rate`) read from SQL, for the recorder's
``summary.samples_per_second`` (the job list, ``GET /jobs/{id}``) and the comparison
report alike, so no two pages show two figures under one name.

The recorder's batch usually decides it alone (:func:`steady_rates`): a batch of a backlog
brings an attempt's newest few hundred steps, and reading them back (a walk of the chunks
per job and batch) was a tenth of the recorder's CPU a point."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import islice
from math import isfinite
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.contract.progress import STEADY_LOOKBACK
from amptrain.contract.progress import steady_rate as rate_of
from amptrain.store.history.chunk_merge import Gained, number
from amptrain.store.history.chunk_parts import STEP_KIND, Key
from amptrain.store.history.chunk_tail import newest_first

TIME, RATE = "step_time_ms", "samples_per_second"
"""The walk follows the step times' series; the rate is read at its steps."""


def steady_rate(s: Session, job_id: str, attempt: int) -> float | None:
    """The attempt's steady-state samples/s (:data:`~amptrain.contract.progress.STEADY_RATE_DOC`);
    None before a step with a finite rate and a positive step time. One bounded read: the
    newest STEADY_LOOKBACK such steps, from the attempt's newest chunks."""
    steps = newest_first(s, job_id, STEP_KIND, (TIME, RATE), attempt)
    newest = list(islice(_usable((rate, ms) for _, (ms, rate) in steps), STEADY_LOOKBACK))[::-1]
    return rate_of(newest, len(newest))


def _usable(pairs: Iterable[tuple[Any, Any]]) -> Iterable[tuple[float, float]]:
    """The ``(rate, step time)`` pairs that count: both finite, the time positive."""
    return (
        (rate, ms)
        for rate, ms in pairs
        if ms is not None and rate is not None and isfinite(rate) and isfinite(ms) and ms > 0
    )


def steady_rates(
    s: Session, wants: Mapping[str, int], gains: Mapping[Key, Gained], last: Mapping[Key, int]
) -> dict[str, float | None]:
    """Per job of ``wants`` (``job_id -> attempt``) its :func:`steady_rate` just after a
    batch's chunk write: ``gains`` what the write added
    (:data:`~amptrain.store.history.chunk_writes.Gains`), ``last`` the last step each
    chunk it read held before (:func:`~amptrain.store.history.chunk_writes.write`). From
    the batch alone when its new steps are the attempt's newest STEADY_LOOKBACK usable
    ones (no other step of the attempt at or above the lowest of them, no chunk above its
    highest: one statement for all jobs asks), else read."""
    tops = _top_chunks(s, wants)
    out: dict[str, float | None] = {}
    for job_id, attempt in wants.items():
        newest = _from_batch(job_id, attempt, gains, last, tops.get(job_id))
        out[job_id] = rate_of(newest, len(newest)) if newest else steady_rate(s, job_id, attempt)
    return out


def _from_batch(
    job_id: str,
    attempt: int,
    gains: Mapping[Key, Gained],
    last: Mapping[Key, int],
    top: int | None,
) -> list[tuple[float, float]] | None:
    """The attempt's newest STEADY_LOOKBACK usable pairs, oldest first, when the batch
    alone holds them (else None): newest_first's walk over what the batch gained."""
    if top is None or (job_id, STEP_KIND, TIME, top, attempt) not in gains:
        return None  # the batch did not write the attempt's newest chunk
    found: list[tuple[float, float]] = []
    chunk = top
    while True:
        key = (job_id, STEP_KIND, TIME, chunk, attempt)
        got = gains.get(key)
        if got is None:
            return None  # a chunk the batch did not write: its steps are not known here
        # as dicts (one pass each in C): the walk looks up to STEADY_LOOKBACK steps up in
        # each, which an appended part (gained.Appended) answers in Python
        times = dict(got.items())
        rates = dict(gains.get((job_id, STEP_KIND, RATE, chunk, attempt), {}).items())
        for step in sorted(times, reverse=True):
            if step not in rates:
                return None  # a rate stored apart from its step time (never written so)
            found += _usable([(number(rates[step]), number(times[step]))])
            if len(found) == STEADY_LOOKBACK:
                # Every step the chunk held before must lie below this one.
                held = last.get(key)
                return found[::-1] if held is None or held < step else None
        if key in last or chunk == 0:
            return None  # steps the chunk held before may be among the newest
        chunk -= 1


def _top_chunks(s: Session, wants: Mapping[str, int]) -> dict[str, int]:
    """Per job the highest chunk of its attempt's step times (one statement)."""
    if not wants:
        return {}
    parts: list[str] = []
    params: dict[str, Any] = {}
    for i, (job_id, attempt) in enumerate(wants.items()):
        params |= {f"j{i}": job_id, f"a{i}": attempt}
        parts.append(
            f"SELECT * FROM (SELECT {i} AS part, chunk FROM metric_chunks WHERE job_id = :j{i}"
            f" AND kind = '{STEP_KIND}' AND name = '{TIME}' AND attempt = :a{i}"
            f" ORDER BY chunk DESC LIMIT 1) AS p{i}"
        )
    jobs = list(wants)
    rows = s.execute(sa.text(" UNION ALL ".join(parts)), params)
    return {jobs[part]: int(chunk) for part, chunk in rows}
