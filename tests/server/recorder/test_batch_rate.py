"""The summary's steady rate decided from a batch's own new steps equals the rate read back
from the chunks (:func:`amptrain.store.history.throughput.steady_rate`, the one reader),
and the batch decides only when nothing stored could be among the newest steps: gaps
filled later, a chunk that held steps above the batch's, an attempt that resumes below
its predecessor, too few new steps, step times that are zero, null or not finite. Real
SQLite and PostgreSQL."""

from __future__ import annotations

import math
from typing import Any

import pytest

from amptrain.contract.stream import encode
from amptrain.server.recorder.entries import parse
from amptrain.store.history import rollups, throughput
from amptrain.store.history.chunk_parts import Key
from tests.server.recorder.test_entries import entry
from tests.server.recorder.test_recorder import Sessions, point, start_job


def _point(step: int, attempt: int) -> dict[str, Any]:
    ms: float | None = 1.0 + step % 7
    if step % 13 == 0:
        ms = (0.0, None, math.nan, math.inf)[step % 4]
    rate = None if step % 17 == 0 else 100.0 + step * attempt
    return point(step, samples_per_second=rate, step_time_ms=ms)


# (attempt, steps) per batch, and whether the batch alone decides its attempt's rate
BATCHES: list[tuple[int, list[int], bool]] = [
    (1, list(range(1, 101)) + list(range(200, 251)), True),  # a gap: decided above it
    (1, list(range(101, 200)) + list(range(251, 301)), False),  # 200..250 are among the newest
    (1, list(range(301, 320)), False),  # too few new steps
    (1, list(range(320, 560)), True),
    (1, list(range(580, 600)) + list(range(700, 900)), True),
    (1, list(range(560, 580)), False),  # below the stored newest chunk
    (2, list(range(500, 540)), False),
    (2, list(range(540, 800)), True),  # attempt 2 resumes below attempt 1's newest steps
    (2, list(range(800, 813)), False),
    (3, list(range(1030, 1036)), False),
    (3, list(range(800, 1024)) + list(range(1036, 1041)), False),  # 1030..1035 are newer
]


@pytest.mark.parametrize("columns", [True, False], ids=["columns", "rows"])
def test_the_batch_decides_the_steady_rate_as_the_read_does(sf: Sessions, columns: bool) -> None:
    job_id, _ = start_job(sf)
    seq = 0
    for attempt, steps, decides in BATCHES:
        entries = []
        for step in steps:
            seq += 1
            fields = encode(_point(step, attempt), job_id=job_id, attempt=attempt)
            if not columns:  # another field order: the per-entry route
                fields = dict(reversed(fields.items()))
            entries.append(entry(seq, fields))
        batch = parse(job_id, entries)
        assert (batch.columns is not None) == columns
        with sf.begin() as s:
            last: dict[Key, int] = {}
            gains = rollups.record(s, batch.rows, [], [batch.columns] if columns else [], last)
            got = throughput.steady_rates(s, {job_id: attempt}, gains, last)
            assert got == {job_id: throughput.steady_rate(s, job_id, attempt)}
            tops = throughput._top_chunks(s, {job_id: attempt})
            alone = throughput._from_batch(job_id, attempt, gains, last, tops[job_id])
            assert (alone is not None) == decides, steps[0]
