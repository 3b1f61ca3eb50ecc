"""Per-layer gradient norms downsampled (``eval_window`` of kind ``layer_grad_norm``), on
real SQLite and PostgreSQL, in the same table as a job's evaluations: the budget holds,
every bucket keeps its first and last step and the step of its highest norm of any layer
(one layer's spike survives), each item carries every layer, the effective attempt wins,
and the evaluations' window, pages and cursor are exactly what they were without them."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import LAYER_NORM_KIND
from amptrain.store.history import rollups
from amptrain.store.history.eval_window import eval_window
from amptrain.store.history.points import Page
from amptrain.store.history.values import eval_page, newest_cursor
from tests.store.history.test_eval_window import T0
from tests.store.history.test_eval_window import seed as seed_evals

LAYERS = [f"blocks.{i}.attn" for i in range(40)]
SPIKE = 1_230


def norm(layer: int, step: int, attempt: int) -> float:
    return 1e4 if (layer, step) == (7, SPIKE) else (layer + 1) / step * attempt


def seed_layers(sessions: sessionmaker[Session], job_id: str) -> None:
    """Norms every 10 steps to 3000 (attempt 2 from 2510 on, after a resume), stream
    entries of their own beside the evaluations'."""
    rows: list[dict[str, Any]] = []
    for attempt, steps in ((1, range(10, 2_801, 10)), (2, range(2_510, 3_001, 10))):
        for step in steps:
            ms = T0 + step + 10_000 * attempt
            for i, layer in enumerate(LAYERS):
                rows.append(
                    {
                        "job_id": job_id,
                        "attempt": attempt,
                        "step": step,
                        "kind": LAYER_NORM_KIND,
                        "name": layer,
                        "value": norm(i, step, attempt),
                        "time": ms / 1000,
                        "stream_ms": ms,
                        "stream_seq": 1,
                    }
                )
    with sessions.begin() as s:
        rollups.record(s, [], rows)  # as the recorder does


def test_layer_norms_downsample_by_bucket_beside_unchanged_evals(
    db: tuple[sa.Engine, sessionmaker[Session]],
) -> None:
    _, sessions = db
    job_id = seed_evals(sessions)
    with sessions() as s:
        evals_before = eval_window(s, job_id, 40)
        whole_before = eval_window(s, job_id, 10_000)
        page_before = eval_page(s, job_id, Page(limit=1000))
        cursor_before = newest_cursor(s, job_id)
    seed_layers(sessions, job_id)

    with sessions() as s:
        window = eval_window(s, job_id, 60, kind=LAYER_NORM_KIND)
        whole = eval_window(s, job_id, 10_000, kind=LAYER_NORM_KIND)
        zoomed = eval_window(s, job_id, 1_000, 1_200, 1_300, kind=LAYER_NORM_KIND)
        assert eval_window(s, job_id, 40) == evals_before
        assert eval_window(s, job_id, 10_000) == whole_before
        assert eval_page(s, job_id, Page(limit=1000)) == page_before
        assert newest_cursor(s, job_id) == cursor_before
        layer_cursor = newest_cursor(s, job_id, LAYER_NORM_KIND)

    items = window.items
    assert 0 < len(items) <= 60 and all(i["downsampled"] for i in items)
    steps = [i["step"] for i in items]
    assert steps == sorted(steps) and steps[0] == 10 and steps[-1] == 3_000
    assert SPIKE in steps  # one layer's spike, at any zoom
    assert all(list(i["values"]) == LAYERS for i in items)
    assert all(i["attempt"] == (2 if i["step"] >= 2_510 else 1) for i in items)
    assert window.next_cursor == str(layer_cursor) != str(cursor_before)
    # A window that fits comes whole: the effective series, every due step once.
    assert [i["step"] for i in whole.items] == list(range(10, 3_001, 10))
    assert not any(i["downsampled"] for i in whole.items)
    assert [i["step"] for i in zoomed.items] == list(range(1_200, 1_301, 10))
    spike = next(i for i in whole.items if i["step"] == SPIKE)
    assert spike["values"]["blocks.7.attn"] == 1e4
