"""The layer-norm window's kept steps folded over every name at once
(``layer_buckets.kept_steps``) against the rule they replace, on real SQLite and
PostgreSQL: each name's aggregates merged per bucket (``chunk_stats.series_stats``), then the
bucket's first and last step and the first step of its highest norm of any layer. Buckets
of many widths (cutting chunks, or unions of roll-ups), ties between layers, non-finite and
null norms, a retry that re-records some layers only and resumes inside a chunk, a growing
run and a replayed batch."""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import LAYER_NORM_KIND
from amptrain.store.history import chunk_index, layer_buckets, rollups
from amptrain.store.history.chunk_cover import attempt_runs_of
from amptrain.store.history.chunk_parts import RESERVED
from amptrain.store.history.chunk_stats import series_stats
from amptrain.store.history.rollups import Stats
from tests.store.history.test_downsample import new_job

T0 = 1_700_000_000_000
LAYERS = [f"l.{i}" for i in range(9)]


def norm(layer: int, step: int, attempt: int) -> float | None:
    """Many ties across layers and steps; a spike, an overflow, NaN and nulls."""
    if (layer, step) == (3, 41_230):
        return 1e4
    if (layer, step) == (5, 20_480):
        return math.inf
    if step % 770 == 0:
        return math.nan if layer % 2 else None
    return float((step // 10 + layer * 3 + attempt) % 17)


def rows(job_id: str, attempt: int, steps: range, layers: list[str]) -> list[dict[str, Any]]:
    out = []
    for step in steps:
        ms = T0 + step + 10_000_000 * attempt
        for name in layers:
            out.append(
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "step": step,
                    "kind": LAYER_NORM_KIND,
                    "name": name,
                    "value": norm(LAYERS.index(name), step, attempt),
                    "time": ms / 1000,
                    "stream_ms": ms,
                    "stream_seq": 1,
                }
            )
    return out


def old_rule(buckets: list[dict[str, Stats]]) -> set[int]:
    """What eval_window kept per bucket before: each name merged apart, then folded."""
    chosen: set[int] = set()
    for totals in buckets:
        held = [t for t in totals.values() if t.count]
        if not held:
            continue
        chosen.add(min(t.first_step for t in held))
        chosen.add(max(t.last_step for t in held))
        highs = [t for t in held if t.high is not None]
        if highs:
            top = max(t.high for t in highs if t.high is not None)
            chosen.add(min(t.high_step for t in highs if t.high == top and t.high_step is not None))
    return chosen


def check(s: Session, job_id: str) -> int:
    """Both rules over many windows and widths; how many buckets were compared."""
    names = [n for n in chunk_index.names(s, job_id, LAYER_NORM_KIND) if not n.startswith(RESERVED)]
    runs = attempt_runs_of(s, job_id, LAYER_NORM_KIND, names)
    compared = 0
    for lo, hi in ((10, 70_000), (0, 1 << 40), (300, 41_300), (40_950, 41_500), (60_000, 66_000)):
        for width in (7, 100, 256, 448, 1_000, 4_096, 5_120, 16_384, 65_536):
            if (hi - lo) // width > 2_000:
                continue
            ranges = [
                (max(lo, b * width), min(hi, (b + 1) * width - 1))
                for b in range(lo // width, hi // width + 1)
            ]
            want = old_rule(series_stats(s, job_id, LAYER_NORM_KIND, runs, ranges))
            got = layer_buckets.kept_steps(s, job_id, LAYER_NORM_KIND, runs, ranges)
            assert got == want, (lo, hi, width)
            compared += len(ranges)
    return compared


def test_kept_steps_are_the_merged_rules(db: tuple[sa.Engine, sessionmaker[Session]]) -> None:
    _, sessions = db
    job_id = new_job(sessions)
    with sessions.begin() as s:
        # attempt 1 to step 66,000; attempt 2 resumed at 41,005 (inside a chunk) and
        # re-recorded three layers only, to 52,000; attempt 3 every layer from 60,010 on
        rollups.record(s, [], rows(job_id, 1, range(10, 66_001, 10), LAYERS))
        rollups.record(s, [], rows(job_id, 2, range(41_005, 52_001, 10), LAYERS[2:5]))
        rollups.record(s, [], rows(job_id, 3, range(60_010, 64_001, 10), LAYERS))
    with sessions() as s:
        assert check(s, job_id) > 1_000
    with sessions.begin() as s:  # the run grows; a replayed batch changes nothing
        rollups.record(s, [], rows(job_id, 3, range(64_010, 70_001, 10), LAYERS))
        rollups.record(s, [], rows(job_id, 3, range(64_010, 66_001, 10), LAYERS))
    with sessions() as s:
        assert check(s, job_id) > 1_000
