"""The readers beside the pages, from the chunks, equal what the per-value rows gave (the
oracle: tests/support/row_consumers.py): the steady rate of each attempt, the comparison
report's numbers, the alert windows before any step and the effective evaluation series,
and the stall watch's newest step. A realistic run recorded through the real recorder: a
job retried twice (attempt 2 resumes inside a chunk attempt 1 filled, attempt 3 re-records
a few steps of attempt 2's), NaN, inf and null values, zero and missing step times, skipped
steps, evaluations some attempts re-record (one a chunk in a sparse series). Real Redis, real SQLite and PostgreSQL."""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis

from amptrain.contract.records import evaluation
from amptrain.server.recorder.service import Recorder
from amptrain.server.stall_watch import last_progress
from amptrain.store import alert_windows, comparisons
from amptrain.store.history import chunk_tail
from amptrain.store.history.throughput import steady_rate
from amptrain.store.models import Job
from tests.server.recorder.test_recorder import Sessions, point, publish, start_job
from tests.support import row_consumers, row_writes

ODD = (math.nan, math.inf, -math.inf, None)


def _odd(step: int, every: int, normal: Any) -> Any:
    return ODD[(step // every) % len(ODD)] if step % every == 0 else normal


def _records(steps: range, attempt: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in steps:
        fields = {
            "loss": _odd(step, 7, 1.0 / step + attempt),
            "skipped": step % 29 == 0,
            "step_time_ms": 0.0 if step % 13 == 0 else _odd(step, 11, 5.0 + step % 5),
            "samples_per_second": _odd(step, 17, 100.0 + step * attempt),
            # Attempt 1's peaks are the highest: re-recorded steps must not keep them.
            "memory_peak": 30 * step * (4 if attempt == 1 and step > 300 else 1),
        }
        out.append(point(step, time=1000.0 + step + attempt * 10_000, **fields))
        if step % 25 == 0:
            ev = {"eval_loss": _odd(step, 100, 2.0 / step + attempt)}
            if attempt != 2:  # accuracy: attempt 2 never evaluates it
                ev["accuracy"] = _odd(step, 75, 0.5 + attempt / 10)
            if step % 300 == 0:  # a sparse series: one value a chunk, some re-recorded
                ev["sparse"] = _odd(step, 600, 3.0 + attempt)
            out.append(evaluation(step, 1000.5 + step, ev))
    return out


def _record(sf: Sessions, r: redis.Redis, attempts: list[range]) -> str:
    job_id, _ = start_job(sf)
    rec = Recorder(None, sf, r)
    for attempt, steps in enumerate(attempts, start=1):
        items = _records(steps, attempt)
        for i in range(0, len(items), 211):  # many batches: open chunks rewritten
            publish(r, job_id, attempt, items[i : i + 211])
            rec.drain_once()
        publish(r, job_id, attempt, items[50:90])  # re-sent: nothing new
        rec.drain_once()
    row_writes.record_stream(sf, r, job_id)  # the oracle's rows, as the old recorder wrote
    return job_id


RETRIED = [range(1, 601), range(301, 901), range(850, 1001)]


def test_steady_rate_and_stall_watch_equal_the_rows(sf: Sessions, r: redis.Redis) -> None:
    job_id = _record(sf, r, RETRIED)
    with sf() as s:
        for attempt in (1, 2, 3, 4):
            want = row_consumers.steady_rate(s, job_id, attempt)
            assert steady_rate(s, job_id, attempt) == want
            assert (want is None) == (attempt == 4)
            want_ms = row_consumers.newest_ms(s, job_id, attempt)
            assert chunk_tail.newest_ms(s, job_id, attempt) == want_ms
        assert last_progress(s, job_id, 3) == row_consumers.newest_ms(s, job_id, 3) / 1000.0


@pytest.mark.parametrize("attempts", [RETRIED, [range(1, 41)], []])
def test_comparison_numbers_equal_the_rows(
    sf: Sessions, r: redis.Redis, attempts: list[range]
) -> None:
    job_id = _record(sf, r, attempts)
    with sf() as s:
        job = s.get(Job, job_id)
        assert job is not None
        attempt = max(len(attempts), 1)
        job.attempt = attempt
        got = comparisons._run_numbers(s, "fp16", job)
        want = row_consumers.run_numbers(s, job_id, attempt)
    assert got["throughput"] == want["throughput"]
    assert got["peak_memory"] == want["peak_memory"]
    assert type(got["peak_memory"]) is type(want["peak_memory"])
    # The mean of up to 100 losses: the SQL avg() sums in an order it does not state, so
    # the two agree to rounding, not to the last bit.
    if want["final_loss"] is None:
        assert got["final_loss"] is None and not attempts
    else:
        assert got["final_loss"] == pytest.approx(want["final_loss"], rel=1e-14)
    assert (want["throughput"] is None) == (not attempts)
    if attempts == RETRIED:
        assert want["peak_memory"] == 30 * 1000  # attempt 1's higher peaks were re-recorded


def test_alert_windows_equal_the_rows(sf: Sessions, r: redis.Redis) -> None:
    job_id = _record(sf, r, RETRIED)
    series = ("loss", "step_time_ms", "memory_peak", "eval_loss", "accuracy", "sparse", "nothing")
    with sf() as s:
        for name in series:
            for attempt in (1, 2, 3, 4):
                for step in (0, 1, 2, 255, 256, 257, 300, 301, 302, 512, 600, 850, 1001, 9999):
                    for count in (1, 3, 25, 111, 700):
                        needs = {(job_id, name): (attempt, step, count)}
                        want = row_consumers.before(s, needs)
                        assert alert_windows.before(s, needs) == want, (name, attempt, step)
            got = alert_windows.eval_series(s, job_id, name)
            assert _same(got, row_consumers.eval_series(s, job_id, name))
        many = {(job_id, n): (2, 700, 50) for n in series}
        assert alert_windows.before(s, many) == row_consumers.before(s, many)
        # accuracy: attempt 1's 24 evaluations (attempt 2 recorded none) and attempt 3's 7.
        assert len(alert_windows.eval_series(s, job_id, "accuracy")) == 600 // 25 + 7
        assert alert_windows.eval_series(s, job_id, "sparse") == [
            (300, 4.0),
            (600, None),
            (900, 6.0),
        ]


def _same(a: list[tuple[int, float | None]], b: list[tuple[int, float | None]]) -> bool:
    return a == b and all(type(x[1]) is type(y[1]) for x, y in zip(a, b, strict=True))
