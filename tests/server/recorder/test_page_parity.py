"""The cursor pages from the chunks equal, as JSON bytes, what the per-value rows gave (the
oracle: tests/support/row_reads.py), for a realistic run recorded through the real recorder:
a retried job whose attempt 2 resumes from an earlier checkpoint and re-records steps, NaN,
inf and null losses, skipped steps, evaluations, layer norms (some re-recorded only in
part), two-rank memory lists; every limit, after/upto cursors, both attempt modes. Real
Redis, real SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import redis

from amptrain.contract.metrics import EVAL_KIND, LAYER_NORM_KIND
from amptrain.contract.records import evaluation, layer_norms
from amptrain.server.recorder.service import Recorder
from amptrain.store.history import points, values
from amptrain.store.history.points import Page
from tests.server.recorder.test_recorder import Sessions, point, publish, start_job
from tests.support import row_reads, row_writes

LAYERS = ("enc.0", "enc.1", "(root)")


def _point(step: int, attempt: int) -> dict[str, Any]:
    loss: float | None = 1.0 / step + attempt
    if step % 41 == 0:
        loss = math.nan
    elif step % 43 == 0:
        loss = math.inf
    elif step % 47 == 0:
        loss = None
    extra: dict[str, Any] = {"skipped": step % 29 == 0, "loss": loss}
    if step % 3 == 0:  # a two-process step's per-rank memory
        extra |= {"world_size": 2, "memory_peak_per_rank": [7 * step, 7 * step + 2**40]}
    return point(step, **extra)


def _records(steps: range, attempt: int, layers: tuple[str, ...]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for step in steps:
        out.append(_point(step, attempt))
        if step % 10 == 0:
            norms = {
                n: (None if (step + i) % 7 == 0 else step * 0.5 + i) for i, n in enumerate(layers)
            }
            if step % 30 == 0:
                norms[layers[0]] = math.inf
            out.append(layer_norms(step, 1000.0 + step, norms))
        if step % 50 == 0:
            ev = {
                "eval_loss": 2.0 / step,
                "accuracy": None if step % 100 == 0 else 0.5 + attempt / 10,
            }
            out.append(evaluation(step, 1000.5 + step, ev))
    return out


def record_run(sf: Sessions, r: redis.Redis) -> str:
    """Attempt 1 records steps 1..530; attempt 2 resumes from a checkpoint at 300 and
    records 301..820, its layer norms without ``enc.1`` (attempt 1's stay effective there)."""
    job_id, _ = start_job(sf)
    rec = Recorder(None, sf, r)
    items = _records(range(1, 531), 1, LAYERS)
    for i in range(0, len(items), 97):  # many transactions: open chunks rewritten
        publish(r, job_id, 1, items[i : i + 97])
        rec.drain_once()
    publish(r, job_id, 1, items[100:140])  # re-sent after a Redis loss: nothing new
    items = _records(range(301, 821), 2, (LAYERS[0], LAYERS[2]))
    for i in range(0, len(items), 301):
        publish(r, job_id, 2, items[i : i + 301])
        rec.drain_once()
    row_writes.record_stream(sf, r, job_id)  # the oracle's rows, as the old recorder wrote
    return job_id


def _json(x: Any) -> str:
    return json.dumps(x)


def _same_pages(
    sf: Sessions, job_id: str, kind: str | None, page: Page, pages: int = 10_000
) -> list[str]:
    """Walks the series from ``page`` (at most ``pages`` pages) with both reads; the
    cursors seen."""
    seen: list[str] = []
    with sf() as s:
        for _ in range(pages):
            if kind is None:
                want, got = (
                    row_reads.metric_page(s, job_id, page),
                    points.metric_page(s, job_id, page),
                )
            else:
                want = row_reads.eval_page(s, job_id, page, kind)
                got = values.eval_page(s, job_id, page, kind)
            assert _json(got) == _json(want), (kind, page)
            if not want[0]:
                return seen
            seen += [i["cursor"] for i in want[0]]
            page = Page(want[1], page.limit, page.attempts, page.upto)
    return seen


@pytest.mark.parametrize("kind", [None, EVAL_KIND, LAYER_NORM_KIND])
def test_every_page_from_the_chunks_equals_the_rows(
    sf: Sessions, r: redis.Redis, kind: str | None
) -> None:
    job_id = record_run(sf, r)
    everything = _same_pages(sf, job_id, kind, Page(limit=100_000, attempts="all"))
    effective = _same_pages(sf, job_id, kind, Page(limit=100_000))
    assert len(everything) >= len(effective) > 0  # layer records stay, in part
    for attempts in ("all", "effective"):
        for limit in (*range(1, 41), 97, 255, 256, 257, 1000):  # its first pages
            _same_pages(sf, job_id, kind, Page(limit=limit, attempts=attempts), 3)  # type: ignore[arg-type]
        for limit in (7, 97, 256, 257, 1000):  # whole walks
            _same_pages(sf, job_id, kind, Page(limit=limit, attempts=attempts))  # type: ignore[arg-type]
        # After and up to cursors inside the run, between entries, and past its end: the
        # pages on from there (the walks above went on to the end from the start).
        marks = [*everything[:: max(1, len(everything) // 9)], everything[-1]]
        for after in [*marks, f"{marks[3].split('-')[0]}-0", "99999999999999-0"]:
            for upto in (None, *marks[5::2]):
                p = Page(after, 13, attempts, None if upto is None else Page(upto).start)  # type: ignore[arg-type]
                _same_pages(sf, job_id, kind, p, 12)


def test_newest_cursor_record_size_and_recorded_through(sf: Sessions, r: redis.Redis) -> None:
    job_id = record_run(sf, r)
    with sf() as s:
        assert points.recorded_through(s, job_id) == row_reads.recorded_through(s, job_id)
        assert points.recorded_through(s, job_id) == {1: 530, 2: 820}
        assert points.newest_cursor(s, job_id) == row_reads.newest_cursor(s, job_id)
        for kind in (EVAL_KIND, LAYER_NORM_KIND):
            assert values.newest_cursor(s, job_id, kind) == row_reads.newest_value_cursor(
                s, job_id, kind
            )
            assert values.newest_record_size(s, job_id, kind) == row_reads.newest_record_size(
                s, job_id, kind
            )
        assert values.newest_record_size(s, job_id, LAYER_NORM_KIND) == 2


def test_points_at_gives_the_effective_points_as_point_dict(sf: Sessions, r: redis.Redis) -> None:
    """What the downsampled windows fetch their chosen points with: the effective point at
    each step asked for (re-recorded steps from attempt 2), as the rows' point_dict."""
    from amptrain.store.history.chunk_pages import points_at

    job_id = record_run(sf, r)
    steps = [1, 2, 41, 43, 47, 255, 256, 299, 300, 301, 302, 530, 531, 777, 820, 821, 5000]
    with sf() as s:
        rows, _ = row_reads.metric_page(s, job_id, Page(limit=100_000))
        by_step = {p["step"]: p for p in rows}
        assert _json(points_at(s, job_id, steps)) == _json(
            [by_step[step] for step in steps if step in by_step]
        )
        fields = ["loss", "memory_peak_per_rank"]
        assert _json(points_at(s, job_id, steps[::-1], fields)) == _json(
            [
                {
                    k: v
                    for k, v in by_step[step].items()
                    if k in {"step", *fields, "attempt", "cursor"}
                }
                for step in steps
                if step in by_step
            ]
        )
