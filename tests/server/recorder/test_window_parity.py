"""The evaluation and layer-norm windows from the chunks' roll-ups equal, as JSON bytes, what
the per-value rows gave (the oracle: tests/support/row_eval_window.py), for runs recorded
through the real recorder: three attempts, each resuming from an earlier checkpoint and
re-recording steps (the third re-evaluating one name only and dropping some layers), NaN,
inf and null values, a name that appears mid-run, spikes and ties, 12 layers; whole runs and
windows that cut chunks, attempts' overlaps and roll-up blocks, every kind of budget. Real
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
from amptrain.store.history.eval_window import eval_window
from tests.server.recorder.test_recorder import Sessions, point, publish, start_job
from tests.support import row_writes
from tests.support.row_eval_window import row_eval_window

LAYERS = tuple(f"blocks.{i}.mlp" for i in range(12))


def _norm(step: int, attempt: int, i: int) -> float | None:
    if (step + i) % 97 == 0:
        return None
    if (step, i) == (4_440, 5):
        return math.inf
    if step % 1_000 == 0 and i == 3:
        return 1e6  # a spike of one layer
    return round(((step * 7 + i * 13) % 101) / (i + 1), 3) + attempt  # ties across steps


def _eval(step: int, attempt: int) -> dict[str, float | None]:
    values: dict[str, float | None] = {
        "eval_loss": math.nan if step % 700 == 0 else 2.0 / step + attempt,
        "accuracy": None if step % 900 == 0 else round((step % 37) / 37, 2) + attempt / 100,
    }
    if step >= 3_000:  # a metric added mid-run
        values["top5"] = math.inf if step % 1_100 == 0 else (step % 13) / 13
    return values


def _records(steps: range, attempt: int, layers: tuple[str, ...], evals: bool | str) -> list[Any]:
    out: list[Any] = [point(steps.start, loss=1.0)]
    for step in steps:
        if step % 8 == 0:
            norms = {n: _norm(step, attempt, i) for i, n in enumerate(layers)}
            out.append(layer_norms(step, 1000.0 + step, norms))
        if step % 20 == 0 and evals:
            ev = _eval(step, attempt)
            if isinstance(evals, str):  # only this name re-evaluated
                ev = {evals: ev[evals]}
            out.append(evaluation(step, 1000.5 + step, ev))
    return out


def record_run(sf: Sessions, r: redis.Redis) -> str:
    """Attempt 1 records steps 1..5200; attempt 2 resumes at 4001 up to 7000; attempt 3 at
    6301 up to 9000, re-evaluating ``accuracy`` only and without the last 4 layers."""
    job_id, _ = start_job(sf)
    rec = Recorder(None, sf, r)
    runs = (
        (1, range(1, 5_201), LAYERS, True),
        (2, range(4_001, 7_001), LAYERS, True),
        (3, range(6_301, 9_001), LAYERS[:-4], "accuracy"),
    )
    for attempt, steps, layers, evals in runs:
        items = _records(steps, attempt, layers, evals)
        for i in range(0, len(items), 500):
            publish(r, job_id, attempt, items[i : i + 500])
            rec.drain_once()
    row_writes.record_stream(sf, r, job_id)  # the oracle's rows, as the old recorder wrote
    return job_id


WINDOWS = [
    (None, None),
    (0, 300),
    (255, 257),
    (100, 1_000),
    (1_000, 5_000),
    (3_990, 4_300),
    (4_000, 9_000),
    (6_250, 6_400),
    (7_000, None),
    (None, 100),
    (9_500, None),
]
BUDGETS = (1, 3, 7, 40, 299, 10_000)


@pytest.mark.parametrize("kind", [EVAL_KIND, LAYER_NORM_KIND])
def test_every_window_from_the_chunks_equals_the_rows(
    sf: Sessions, r: redis.Redis, kind: str
) -> None:
    job_id = record_run(sf, r)
    downsampled = whole = 0
    with sf() as s:
        for first, last in WINDOWS:
            for budget in BUDGETS:
                want = row_eval_window(s, job_id, budget, first, last, kind)
                got = eval_window(s, job_id, budget, first, last, kind)
                assert json.dumps(got.__dict__) == json.dumps(want.__dict__), (
                    first,
                    last,
                    budget,
                )
                marked = [i["downsampled"] for i in want.items]
                downsampled += any(marked)
                whole += bool(marked) and not any(marked)
    assert downsampled > 15 and whole > 5  # both paths are exercised
