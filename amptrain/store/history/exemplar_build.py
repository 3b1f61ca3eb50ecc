"""Building the exemplars (:mod:`amptrain.store.history.exemplars`) from what is stored:
migration 0018 for every job, :func:`amptrain.store.history.rollup_rebuild.rebuild`, and
data loaded straight into ``metric_chunks`` (benchmarks).

Level 0 from the chunks: per batch of :data:`BATCH` aligned chunk indexes, the step
kind's level-0 roll-ups name each block's notable steps and only the values at those steps
are read (:func:`~amptrain.store.history.chunk_pick.load_at`, every step series of the
job). A block above level 0 takes its records from the level below: its notable steps are
among its children's (its first step is its first child's, each extreme some child's), so
levels 4 and 8 read no chunk. Every write is an upsert of what the stored rows alone
decide: interrupted and run again, a build ends with the same rows (as the roll-ups').
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from typing import Any

import numpy
import sqlalchemy as sa
from sqlalchemy.orm import Session

from amptrain.store.chunk_models import MetricExemplar, MetricRollup
from amptrain.store.history import chunk_index, chunk_pick
from amptrain.store.history.chunk_parts import KEY_SERIES, STEP_KIND
from amptrain.store.history.exemplars import DECIDING, Block, decode, encode, notable, upsert
from amptrain.store.history.rollups import LEVELS, Stats

BATCH = 1024
"""Aligned chunk indexes per batch (262,144 steps)."""


def rebuild(s: Session, job_id: str | None = None, batch: int = BATCH) -> None:
    """Every exemplar of one job (or of every job with step roll-ups) from its chunks and
    roll-ups (the roll-ups first: :mod:`~amptrain.store.history.rollup_rebuild`), ``batch``
    chunk indexes at a time."""
    r = MetricRollup
    query = (
        sa.select(r.job_id, sa.func.min(r.idx), sa.func.max(r.idx))
        .where(r.kind == STEP_KIND, r.name == KEY_SERIES, r.level == 0)
        .group_by(r.job_id)
        .order_by(r.job_id)
    )
    if job_id is not None:
        query = query.where(r.job_id == job_id)
    for job, lo, hi in s.execute(query).all():
        names = chunk_index.names(s, job, STEP_KIND)
        for start in range(lo, hi + 1, batch):
            _level0(s, job, names, start, start + batch - 1)
        for below, level in pairwise(LEVELS):
            span = batch << level  # aligned: no block is split between two batches
            for start in range(lo - lo % span, hi + 1, span):
                _fold(s, job, below, level, start, start + span - 1)


def _blocks(s: Session, job: str, level: int, lo: int, hi: int) -> dict[tuple[int, int], set[int]]:
    """Per block (idx, attempt) of ``level`` over chunks ``lo..hi``: its notable steps."""
    r = MetricRollup
    rows = s.execute(
        sa.select(r.idx, r.attempt, r.name, *(getattr(r, c) for c in Stats.__slots__)).where(
            r.job_id == job,
            r.kind == STEP_KIND,
            r.name.in_(DECIDING),
            r.level == level,
            r.idx.between(lo >> level, hi >> level),
        )
    ).all()
    stats: dict[tuple[int, int], dict[str, Stats]] = defaultdict(dict)
    for idx, attempt, name, *row in rows:
        stats[(idx, attempt)][name] = Stats(row)
    out = {}
    for key, held in stats.items():
        steps = notable(held)
        if steps is not None:
            out[key] = steps
    return out


def _level0(s: Session, job: str, names: list[str], lo: int, hi: int) -> None:
    blocks = _blocks(s, job, 0, lo, hi)
    wanted = sorted({step for steps in blocks.values() for step in steps})
    if not wanted:
        return
    loaded = chunk_pick.load_at(s, job, STEP_KIND, names, numpy.asarray(wanted, numpy.int64))
    found: dict[tuple[int, int], dict[str, float | None]] = defaultdict(dict)
    for (name, _, attempt), got in loaded.items():
        nulls = got.nulls.tolist() if got.nulls is not None else [False] * len(got.steps)
        for step, value, null in zip(got.steps.tolist(), got.values.tolist(), nulls, strict=True):
            found[(attempt, step)][name] = None if null else value
    rows: list[tuple[Any, ...]] = []
    for (idx, attempt), steps in blocks.items():
        block = {step: found[(attempt, step)] for step in steps if (attempt, step) in found}
        rows.append((job, 0, idx, attempt, encode(block)))
    upsert(s, rows)


def _fold(s: Session, job: str, below: int, level: int, lo: int, hi: int) -> None:
    blocks = _blocks(s, job, level, lo, hi)
    if not blocks:
        return
    e = MetricExemplar
    children = s.execute(
        sa.select(e.idx, e.attempt, e.data).where(
            e.job_id == job, e.level == below, e.idx.between(lo >> below, hi >> below)
        )
    ).all()
    held: dict[int, Block] = defaultdict(dict)  # by attempt
    for _, attempt, data in children:
        held[attempt].update(decode(bytes(data)))
    rows: list[tuple[Any, ...]] = []
    for (idx, attempt), steps in blocks.items():
        records = held.get(attempt, {})
        block = {step: records[step] for step in steps if step in records}
        rows.append((job, level, idx, attempt, encode(block)))
    upsert(s, rows)
