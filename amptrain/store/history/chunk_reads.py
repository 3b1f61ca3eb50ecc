"""Records of one kind rebuilt from the chunks (numpy): by cursor range (the cursor pages) or by
steps (the windows' chosen points), ``effective`` (per step, and per name for the named
kinds, the newest attempt's value) or ``all`` attempts.

A record is a step point (kind ``step``) or one evaluation / one step's layer norms: its
step, attempt, cursor, time and values; the chunks hold them as the series of
:mod:`~amptrain.store.history.chunk_parts`. Only the chunks that can hold the range are
read (:mod:`~amptrain.store.history.chunk_load`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy
from sqlalchemy.orm import Session

from amptrain.contract.cursor import Cursor
from amptrain.store.history import chunk_index, chunk_load
from amptrain.store.history.chunk_load import Loaded
from amptrain.store.history.chunk_parts import MS, SEQ, SHIFT, STEP_KIND, TIME

_I64 = numpy.int64


@dataclass(frozen=True, slots=True)
class Records:
    """Records as columns, one row a record (of one attempt at one step)."""

    steps: numpy.ndarray
    attempts: numpy.ndarray
    ms: numpy.ndarray
    seq: numpy.ndarray
    time: numpy.ndarray
    """float64: the point's ``time`` field, a named record's time."""
    values: dict[str, numpy.ndarray]
    """float64 per name, NaN where null or absent."""
    nulls: dict[str, numpy.ndarray]
    """True where the value is null (a stored None, not a NaN)."""
    present: dict[str, numpy.ndarray]
    """True where the record holds the name (named kinds: not every record holds every
    name, and ``effective`` drops the names a newer attempt re-recorded)."""
    positions: dict[str, int]
    """A named series' place in its records (the order a page lists a record's values)."""

    def __len__(self) -> int:
        return len(self.steps)

    @classmethod
    def of(
        cls,
        cols: Sequence[numpy.ndarray],
        maps: Sequence[dict[str, numpy.ndarray]],
        positions: dict[str, int],
    ) -> Records:
        """From the columns (steps, attempts, ms, seq, time) and the maps (values, nulls,
        present)."""
        steps, attempts, ms, seq, time = cols
        values, nulls, present = maps
        return cls(steps, attempts, ms, seq, time, values, nulls, present, positions)

    def columns(self) -> tuple[numpy.ndarray, ...]:
        return (self.steps, self.attempts, self.ms, self.seq, self.time)

    def maps(self) -> tuple[dict[str, numpy.ndarray], ...]:
        return (self.values, self.nulls, self.present)

    def take(self, index: numpy.ndarray | slice) -> Records:
        """The records at ``index``."""
        maps = [{n: a[index] for n, a in m.items()} for m in self.maps()]
        return Records.of([c[index] for c in self.columns()], maps, self.positions)


def assemble(loaded: Loaded, kind: str, names: Sequence[str], effective: bool) -> Records:
    """Every record in ``loaded`` (all attempts' chunks of the same chunk numbers), in
    (chunk, attempt, step) order; ``effective``: only what no newer attempt re-recorded."""
    time_name = "time" if kind == STEP_KIND else TIME
    wanted = [n for n in names if n not in (MS, SEQ, TIME)]
    cols: list[list[numpy.ndarray]] = [[], [], [], [], []]
    vals: dict[str, list[numpy.ndarray]] = {n: [] for n in wanted}
    nulls: dict[str, list[numpy.ndarray]] = {n: [] for n in wanted}
    present: dict[str, list[numpy.ndarray]] = {n: [] for n in wanted}
    positions: dict[str, int] = {}
    newer = _newer_steps(loaded, effective)
    for (name, chunk, attempt), ms in sorted(loaded.items(), key=_record_order):
        if name != MS:
            continue
        steps = ms.steps
        keep = numpy.ones(len(steps), bool)
        if effective and kind == STEP_KIND:
            keep &= ~numpy.isin(steps, newer.get((MS, chunk, attempt), _EMPTY))
        holds: dict[str, tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]] = {}
        for n in wanted:
            c = loaded.get((n, chunk, attempt))
            v, null, there = _aligned(steps, c)
            if c is not None and c.position is not None:
                positions.setdefault(n, c.position)
            if effective and kind != STEP_KIND:
                there &= ~numpy.isin(steps, newer.get((n, chunk, attempt), _EMPTY))
            holds[n] = (v, null, there)
        if effective and kind != STEP_KIND and wanted:
            keep &= numpy.logical_or.reduce([h[2] for h in holds.values()])
        seq = loaded[(SEQ, chunk, attempt)]
        times = _aligned(steps, loaded.get((time_name, chunk, attempt)))[0]
        attempts = numpy.full(len(steps), attempt, _I64)
        row = (steps, attempts, ms.values.astype(_I64), seq.values.astype(_I64), times)
        for col, arr in zip(cols, row, strict=True):
            col.append(arr[keep])
        for n, (v, null, there) in holds.items():
            vals[n].append(v[keep])
            nulls[n].append(null[keep])
            present[n].append(there[keep])
    return Records.of(
        [_cat(c, numpy.float64 if i == 4 else _I64) for i, c in enumerate(cols)],
        [
            {n: _cat(a, numpy.float64) for n, a in vals.items()},
            {n: _cat(a, bool) for n, a in nulls.items()},
            {n: _cat(a, bool) for n, a in present.items()},
        ],
        positions,
    )


_EMPTY = numpy.empty(0, _I64)


def _record_order(item: tuple[tuple[str, int, int], chunk_load.Chunk]) -> tuple[int, int]:
    return item[0][1], item[0][2]


def _newer_steps(loaded: Loaded, effective: bool) -> dict[tuple[str, int, int], numpy.ndarray]:
    """Per (name, chunk, attempt): the steps some newer attempt recorded in that series."""
    if not effective:
        return {}
    by_series: dict[tuple[str, int], list[tuple[int, numpy.ndarray]]] = {}
    for (name, chunk, attempt), c in loaded.items():
        by_series.setdefault((name, chunk), []).append((attempt, c.steps))
    out = {}
    for (name, chunk), found in by_series.items():
        found.sort(key=lambda f: f[0])
        for i, (attempt, _) in enumerate(found):
            later = [f[1] for f in found[i + 1 :]]
            out[(name, chunk, attempt)] = numpy.concatenate(later) if later else _EMPTY
    return out


def _aligned(
    steps: numpy.ndarray, c: chunk_load.Chunk | None
) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    """A series chunk's values at ``steps`` (NaN where absent), its null flags there, and
    where it holds the step."""
    n = len(steps)
    if c is None:
        return numpy.full(n, numpy.nan), numpy.zeros(n, bool), numpy.zeros(n, bool)
    if len(c.steps) == n and numpy.array_equal(c.steps, steps):
        null = c.nulls if c.nulls is not None else numpy.zeros(n, bool)
        return c.values, null, numpy.ones(n, bool)
    at = numpy.searchsorted(c.steps, steps).clip(0, max(len(c.steps) - 1, 0))
    there = c.steps[at] == steps if len(c.steps) else numpy.zeros(n, bool)
    values = numpy.where(there, c.values[at], numpy.nan)
    null = there & (c.nulls[at] if c.nulls is not None else False)
    return values, null, there


def _cat(parts: list[numpy.ndarray], dtype: type) -> numpy.ndarray:
    return numpy.concatenate(parts) if parts else numpy.empty(0, dtype)


def by_cursor(
    s: Session,
    job_id: str,
    kind: str,
    after: Cursor | None,
    upto: Cursor | None,
    limit: int,
    effective: bool,
    names: Sequence[str] | None = None,
) -> Records:
    """The first ``limit`` records of ``kind`` after ``after`` and up to ``upto`` (cursors,
    inclusive), in cursor order (recording order across attempts). ``names``: the series to
    read (every one of the kind by default)."""
    names = list(chunk_index.names(s, job_id, kind) if names is None else names)
    series = sorted({*names, MS, SEQ, "time" if kind == STEP_KIND else TIME})
    found: list[Records] = []
    start = (after.ms if after else 0, -1)
    for attempt in chunk_index.attempts(s, job_id, kind):
        got, past, batch = 0, -1, limit // 256 + 2
        while got < limit:
            chunks = chunk_index.chunks_after(
                s, job_id, kind, attempt, (start[0], past), upto.ms if upto else None, batch
            )
            if not chunks:
                break
            rec = assemble(chunk_load.load(s, job_id, kind, series, chunks), kind, names, effective)
            rec = rec.take((rec.attempts == attempt) & _within(rec, after, upto))
            found.append(rec)
            got += len(rec)
            if len(chunks) < batch:
                break  # the attempt's last chunks
            past, batch = chunks[-1], batch * 2
    if not found:
        return assemble({}, kind, names, effective)
    return _first_by_cursor(found, limit)


def _within(rec: Records, after: Cursor | None, upto: Cursor | None) -> numpy.ndarray:
    keep = numpy.ones(len(rec), bool)
    if after is not None:
        keep &= (rec.ms > after.ms) | ((rec.ms == after.ms) & (rec.seq > after.seq))
    if upto is not None:
        keep &= (rec.ms < upto.ms) | ((rec.ms == upto.ms) & (rec.seq <= upto.seq))
    return keep


def _first_by_cursor(found: list[Records], limit: int) -> Records:
    names = list(found[0].values)
    cols = [numpy.concatenate([r.columns()[i] for r in found]) for i in range(5)]
    maps = [
        {n: numpy.concatenate([r.maps()[i][n] for r in found]) for n in names} for i in range(3)
    ]
    positions = {k: v for r in found[::-1] for k, v in r.positions.items()}
    joined = Records.of(cols, maps, positions)
    order = numpy.lexsort((joined.seq, joined.ms))[:limit]
    return joined.take(order)


def by_steps(
    s: Session, job_id: str, kind: str, steps: Sequence[int], names: Sequence[str], effective: bool
) -> Records:
    """The records of ``kind`` at ``steps`` (every attempt's, or the effective ones), in
    (step, attempt) order: one statement for the chunks holding them."""
    wanted = numpy.unique(numpy.asarray(steps, _I64))
    series = sorted({*names, MS, SEQ, "time" if kind == STEP_KIND else TIME})
    chunks = numpy.unique(wanted >> SHIFT).tolist()
    rec = assemble(chunk_load.load(s, job_id, kind, series, chunks), kind, names, effective)
    rec = rec.take(numpy.isin(rec.steps, wanted))
    return rec.take(numpy.lexsort((rec.attempts, rec.steps)))
