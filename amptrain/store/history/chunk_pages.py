"""What the cursor pages and the newest-record reads return, rebuilt from the chunks
(:mod:`~amptrain.store.history.chunk_reads`) exactly as the per-value rows gave it: the same
dicts, key order, floats and nulls.

A value recorded as NaN reads as null on SQLite (which stores a NaN as NULL) and as NaN on
PostgreSQL, as the rows did; a null stays null, an infinity stays infinite on both. The
integer and boolean fields of the metric table come back as ``int`` and ``bool``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import numpy
from sqlalchemy.orm import Session

from amptrain.contract.cursor import Cursor
from amptrain.contract.metrics import STEP_METRICS, STORED_METRIC_FIELDS
from amptrain.store.history import chunk_index, chunk_load, chunk_reads
from amptrain.store.history.chunk_parts import (
    MS,
    RANK_SERIES,
    RANKS,
    SEQ,
    STEP_KIND,
    STEP_SERIES,
)
from amptrain.store.history.chunk_reads import Records

POINT_SERIES = (*STEP_SERIES, RANKS, *RANK_SERIES)
"""Every series a point is rebuilt from (its cursor's aside)."""
_TYPES = {m.name: m.type for m in STEP_METRICS}


def nan_is_null(s: Session) -> bool:
    """SQLite stores a NaN as NULL: a read from rows gave None for it there."""
    return s.get_bind().dialect.name == "sqlite"


def point_dicts(
    rec: Records, nan_null: bool, fields: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The records of the step kind as :func:`amptrain.store.history.points.point_dict`
    gave them (only ``step`` and ``fields`` when given)."""

    def nan(f: str, v: numpy.ndarray) -> numpy.ndarray:
        # a NaN stays a float NaN on PostgreSQL (the rows kept it); elsewhere it was null
        return numpy.isnan(v) if nan_null or _TYPES[f] != "float" else numpy.zeros(len(v), bool)

    return _dicts(rec, fields, nan, ())


def window_items(
    rec: Records, fields: Sequence[str] | None, downsampled: bool
) -> list[dict[str, Any]]:
    """The records of the step kind as a window's items: what :func:`point_dicts` gives,
    every non-finite number null (JSON, and browsers, cannot carry NaN or infinities; the
    rows' read cleaned them one by one), and ``downsampled``."""

    def non_finite(f: str, v: numpy.ndarray) -> numpy.ndarray:
        return ~numpy.isfinite(v)

    return _dicts(rec, fields, non_finite, (("downsampled", downsampled),))


def _dicts(
    rec: Records,
    fields: Sequence[str] | None,
    null_where: Callable[[str, numpy.ndarray], numpy.ndarray],
    constants: Sequence[tuple[str, Any]],
) -> list[dict[str, Any]]:
    """The records as dicts, column by column: ``null_where(field, values)`` says which
    values (besides the null and absent ones) read as None; ``constants`` end each dict."""
    names = [f for f in STORED_METRIC_FIELDS if fields is None or f == "step" or f in fields]
    columns: list[Any] = []
    for f in names:
        if f == "step":
            columns.append(rec.steps.tolist())
        elif f == "memory_peak_per_rank":
            columns.append(_ranks(rec))
        else:
            values = rec.values[f]
            null = rec.nulls[f] | ~rec.present[f] | null_where(f, values)
            kind = _TYPES[f]
            if null.all():  # a field the run never records (world size, skipped_steps)
                columns.append([None] * len(rec))
                continue
            if kind in ("int", "bytes"):
                column = numpy.where(null, 0, values).astype(numpy.int64).tolist()
            elif kind == "bool":
                column = numpy.where(null, 0, values).astype(bool).tolist()
            else:
                column = values.tolist()
            for i in numpy.flatnonzero(null).tolist():
                column[i] = None
            columns.append(column)
    columns.append(rec.attempts.tolist())
    columns.append([f"{m}-{q}" for m, q in zip(rec.ms.tolist(), rec.seq.tolist(), strict=True)])
    keys = [*names, "attempt", "cursor"]
    for key, value in constants:
        keys.append(key)
        columns.append([value] * len(rec))
    return _row_maker(tuple(keys))(columns)


@lru_cache(maxsize=64)  # bounded: a request's ``fields`` choose among 2^18 key tuples
def _row_maker(keys: tuple[str, ...]) -> Callable[[list[Any]], list[dict[str, Any]]]:
    """A function of the columns (one list per key of ``keys``) that returns their rows as
    dicts: a comprehension over a dict display of ``keys`` as constants, compiled once per
    key tuple (the metric table's field names a request names, written as ``repr``
    literals: no request string reaches the source). Building 10,000 items of 18 keys was
    most of a full-resolution window's CPU; the display builds each dict in one step,
    ~25% faster than ``dict(zip(keys, row))`` (this machine: 9.1 vs 11.8 ms)."""
    args = ", ".join(f"v{i}" for i in range(len(keys)))
    pairs = ", ".join(f"{key!r}: v{i}" for i, key in enumerate(keys))
    source = f"lambda columns: [{{{pairs}}} for {args}, in zip(*columns, strict=True)]"
    made: Callable[[list[Any]], list[dict[str, Any]]] = eval(source, {})
    return made


def _clean(v: float, null: bool, nan_null: bool, convert: Any) -> Any:
    if null or (v != v and (nan_null or convert is not float)):
        return None
    return convert(v)


def _ranks(rec: Records) -> list[list[int] | None]:
    if RANKS not in rec.present or not rec.present[RANKS].any():  # a single-device run
        return [None] * len(rec)
    held = rec.present[RANKS].tolist()
    sizes = rec.values[RANKS].tolist()
    ranks = [rec.values[r].tolist() for r in RANK_SERIES if r in rec.values]
    return [
        [int(ranks[k][i]) for k in range(int(sizes[i]))] if held[i] else None
        for i in range(len(rec))
    ]


def named_items(rec: Records, nan_null: bool) -> list[dict[str, Any]]:
    """The records of a named kind as eval pages gave them: ``step``, ``attempt``, ``time``,
    ``cursor`` and ``values`` (the names the record holds, in its order)."""
    order = sorted(rec.values, key=lambda n: (rec.positions.get(n, math.inf), n))
    present = {n: rec.present[n].tolist() for n in order}
    values = {n: rec.values[n].tolist() for n in order}
    nulls = {n: rec.nulls[n].tolist() for n in order}
    out = []
    for i, (step, attempt, t, ms, seq) in enumerate(
        zip(
            *(c.tolist() for c in (rec.steps, rec.attempts, rec.time, rec.ms, rec.seq)), strict=True
        )
    ):
        held = {
            n: _clean(values[n][i], nulls[n][i], nan_null, float) for n in order if present[n][i]
        }
        out.append(
            {"step": step, "attempt": attempt, "time": t, "cursor": f"{ms}-{seq}", "values": held}
        )
    return out


def newest(s: Session, job_id: str, kind: str) -> tuple[Cursor, int, int] | None:
    """The cursor, attempt and step of the job's most recently recorded ``kind`` record;
    None before the first. A few index reads, whatever the run's length."""
    best: tuple[Cursor, int, int] | None = None
    for attempt in chunk_index.attempts(s, job_id, kind):
        chunks = chunk_index.newest_chunks(s, job_id, kind, attempt)
        loaded = chunk_load.load(s, job_id, kind, (MS, SEQ), chunks)
        for chunk in chunks:
            ms, seq = loaded[(MS, chunk, attempt)], loaded[(SEQ, chunk, attempt)]
            i = int(numpy.lexsort((seq.values, ms.values))[-1])
            found = (Cursor(int(ms.values[i]), int(seq.values[i])), attempt, int(ms.steps[i]))
            best = found if best is None or found[0] > best[0] else best
    return best


def record_size(s: Session, job_id: str, kind: str) -> int:
    """How many named values the job's newest ``kind`` record holds; 0 before the first."""
    found = newest(s, job_id, kind)
    if found is None:
        return 0
    _, attempt, step = found
    names = [n for n in chunk_index.names(s, job_id, kind) if not n.startswith("@")]
    rec = chunk_reads.by_steps(s, job_id, kind, [step], names, effective=False)
    rec = rec.take(rec.attempts == attempt)
    return sum(bool(held.any()) for held in rec.present.values())


def points_at(
    s: Session, job_id: str, steps: Sequence[int], fields: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The effective points at ``steps`` (those recorded), in step order, as
    :func:`amptrain.store.history.points.point_dict` gives them, only ``step`` and
    ``fields`` when given: one statement for the chunks holding them."""
    rec = chunk_reads.by_steps(s, job_id, STEP_KIND, steps, point_series(fields), effective=True)
    return point_dicts(rec, nan_is_null(s), fields)


def point_series(fields: Sequence[str] | None) -> list[str]:
    """The series a point's ``fields`` (None: all) are rebuilt from."""
    wanted = [f for f in POINT_SERIES if fields is None or f in fields or f.startswith("@")]
    if fields is not None and "memory_peak_per_rank" not in fields:
        wanted = [f for f in wanted if not f.startswith("@")]
    return wanted


def window_at(
    s: Session, job_id: str, steps: Sequence[int], fields: Sequence[str] | None
) -> list[dict[str, Any]]:
    """The effective points at ``steps`` as a downsampled window's items
    (:func:`window_items`), in step order: only the wanted values of each chunk read
    (:mod:`~amptrain.store.history.chunk_pick`)."""
    rec = chunk_reads.by_steps(s, job_id, STEP_KIND, steps, point_series(fields), effective=True)
    return window_items(rec, fields, True)


def window_between(
    s: Session, job_id: str, first: int, last: int, fields: Sequence[str] | None
) -> list[dict[str, Any]]:
    """Every effective point of steps ``first..last`` as a full-resolution window's items."""
    rec = chunk_reads.by_range(s, job_id, STEP_KIND, first, last, point_series(fields))
    return window_items(rec, fields, False)
