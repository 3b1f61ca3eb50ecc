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
from amptrain.store.history import chunk_index, chunk_load, chunk_pick
from amptrain.store.history.chunk_load import Loaded
from amptrain.store.history.chunk_parts import MS, SEQ, SHIFT, STEP_KIND, TIME

_I64 = numpy.int64
_EMPTY = numpy.empty(0, _I64)


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


def assemble(
    loaded: Loaded,
    kind: str,
    names: Sequence[str],
    effective: bool,
    within: tuple[int, int] | None = None,
) -> Records:
    """Every record in ``loaded`` (all attempts' chunks of the same chunk numbers), in
    (attempt, step) order; ``effective``: only what no newer attempt re-recorded;
    ``within``: only the steps ``first..last``. Each series is joined to the records at
    once (numpy over all its chunks), not chunk by chunk: a window's points touch a chunk
    each."""
    time_name = "time" if kind == STEP_KIND else TIME
    wanted = [n for n in names if n not in (MS, SEQ, TIME)]
    series = _by_name(loaded)
    ms = series.get(MS)
    if ms is None:
        ms = _Series(_EMPTY, numpy.empty(0), numpy.empty(0, bool), {})
    keys, steps, attempts = ms.keys, ms.keys & _STEP_MASK, ms.keys >> 32
    keep = numpy.ones(len(keys), bool)
    if within is not None:
        keep &= (steps >= within[0]) & (steps <= within[1])
    # one attempt loaded: no record of it is superseded (nearly every read)
    effective = effective and len(keys) > 0 and attempts[0] != attempts[-1]
    if effective and kind == STEP_KIND:
        keep &= attempts == _newest(ms.keys, steps)
    maps: list[dict[str, numpy.ndarray]] = [{}, {}, {}]
    positions: dict[str, int] = {}
    for n in wanted:
        found = series.get(n)
        values, nulls, there = _joined(keys, found)
        if found is not None:
            if found.positions:  # the first chunk's (the order a page lists the names in)
                positions[n] = found.positions[min(found.positions)]
            if effective and kind != STEP_KIND:
                there &= attempts == _newest(found.keys, steps)
        for m, a in zip(maps, (values, nulls, there), strict=True):
            m[n] = a
    if effective and kind != STEP_KIND and wanted:
        keep &= numpy.logical_or.reduce([maps[2][n] for n in wanted])
    cols = [
        steps,
        attempts,
        ms.values.astype(_I64),
        _joined(keys, series.get(SEQ))[0].astype(_I64),
        _joined(keys, series.get(time_name))[0],
    ]
    if keep.all():
        return Records.of(cols, maps, positions)
    return Records.of(cols, maps, positions).take(_as_slice(keep))


def _as_slice(keep: numpy.ndarray) -> numpy.ndarray | slice:
    """``keep`` (a mask) as a slice where it is one run: a window's steps of one attempt,
    the cut edges of its first and last chunk left out. A slice takes views of the ~70
    columns; the mask copied each (2 ms of a 10,000-point window's read)."""
    at = numpy.flatnonzero(keep)
    if len(at) and at[-1] - at[0] + 1 == len(at):
        return slice(int(at[0]), int(at[-1]) + 1)
    return keep


_STEP_MASK = (1 << 32) - 1


@dataclass(frozen=True, slots=True)
class _Series:
    """One series over every loaded chunk, sorted by key ``attempt << 32 | step``."""

    keys: numpy.ndarray
    values: numpy.ndarray
    nulls: numpy.ndarray
    positions: dict[tuple[int, int], int]
    """(chunk, attempt) -> the name's place, where the chunk keeps one."""


def _by_name(loaded: Loaded) -> dict[str, _Series]:
    """Each name's chunks joined: a slice of the loaded columns when they lie end to end in
    (attempt, chunk) order (as :mod:`~amptrain.store.history.chunk_load` loads them)."""
    members: dict[str, list[int]] = {}
    for i, (name, _, _) in enumerate(loaded.chunk_keys):
        members.setdefault(name, []).append(i)
    counts = numpy.diff(loaded.bounds)
    attempts = numpy.repeat(numpy.asarray([k[2] for k in loaded.chunk_keys], _I64), counts)
    every = (attempts << 32) | loaded.steps
    out = {}
    for name, held in members.items():
        at: slice | numpy.ndarray = slice(loaded.bounds[held[0]], loaded.bounds[held[-1] + 1])
        if held[-1] - held[0] + 1 != len(held):
            at = numpy.concatenate(
                [numpy.arange(loaded.bounds[i], loaded.bounds[i + 1]) for i in held]
            )
        keys, values, nulls = every[at], loaded.floats[at], loaded.nulls[at]
        if len(keys) > 1 and not (keys[1:] > keys[:-1]).all():
            order = numpy.argsort(keys, kind="stable")
            keys, values, nulls = keys[order], values[order], nulls[order]
        positions = {
            loaded.chunk_keys[i][1:]: p for i in held if (p := loaded.positions[i]) is not None
        }
        out[name] = _Series(keys, values, nulls, positions)
    return out


def _joined(
    keys: numpy.ndarray, found: _Series | None
) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray]:
    """A series' values at the records ``keys`` (NaN where absent), its null flags there,
    and where it holds the record."""
    n = len(keys)
    if found is None or not len(found.keys):
        return numpy.full(n, numpy.nan), numpy.zeros(n, bool), numpy.zeros(n, bool)
    if len(found.keys) == n and numpy.array_equal(found.keys, keys):
        # the series holds every record (every step field of an ordinary run): no search
        return found.values, found.nulls, numpy.ones(n, bool)
    at = numpy.searchsorted(found.keys, keys).clip(0, len(found.keys) - 1)
    there = found.keys[at] == keys
    return numpy.where(there, found.values[at], numpy.nan), there & found.nulls[at], there


def _newest(keys: numpy.ndarray, steps: numpy.ndarray) -> numpy.ndarray:
    """Per step of ``steps``: the newest attempt among ``keys`` (a series' entries) that
    holds it (-1 where none does)."""
    held, inverse = numpy.unique(keys & _STEP_MASK, return_inverse=True)
    newest = numpy.full(len(held), -1, _I64)
    numpy.maximum.at(newest, inverse, keys >> 32)
    if not len(held):
        return numpy.full(len(steps), -1, _I64)
    at = numpy.searchsorted(held, steps).clip(0, len(held) - 1)
    return numpy.where(held[at] == steps, newest[at], -1)


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
    if names is not None:
        return _by_cursor(s, job_id, kind, (after, upto), limit, effective, list(names))
    # Every name of the kind, as the database holds them once the page is read. Each
    # statement of a read sees its own snapshot (PostgreSQL's READ COMMITTED; SQLite, whose
    # driver opens no transaction for a SELECT): a record committed between reading the
    # names and reading the chunks, under a name new to the job, came without that value,
    # and the page's cursor then passed it for good. The names are read again after the
    # chunks: when none is new, every record read holds only names read with it (a job's
    # names only grow, and are bounded, so this ends).
    wanted = chunk_index.names(s, job_id, kind)
    while True:
        rec = _by_cursor(s, job_id, kind, (after, upto), limit, effective, wanted)
        again = chunk_index.names(s, job_id, kind)
        if set(again) <= set(wanted):
            return rec
        wanted = again


def _by_cursor(
    s: Session,
    job_id: str,
    kind: str,
    bounds: tuple[Cursor | None, Cursor | None],
    limit: int,
    effective: bool,
    names: list[str],
) -> Records:
    after, upto = bounds
    series = _with_record_series(kind, names)
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
        return assemble(chunk_load.decode_many([]), kind, names, effective)
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
    series = _with_record_series(kind, names)
    rec = assemble(chunk_pick.load_at(s, job_id, kind, series, wanted), kind, names, effective)
    return rec.take(numpy.lexsort((rec.attempts, rec.steps)))


def by_range(
    s: Session, job_id: str, kind: str, first: int, last: int, names: Sequence[str]
) -> Records:
    """The effective records of ``kind`` at steps ``first..last``, in step order: every
    chunk of the range decoded whole (a full-resolution window keeps all its values)."""
    series = _with_record_series(kind, names)
    loaded = chunk_load.load_range(s, job_id, kind, series, first >> SHIFT, last >> SHIFT)
    rec = assemble(loaded, kind, names, True, (first, last))
    if len(rec) < 2 or (numpy.diff(rec.steps) > 0).all():
        return rec  # one attempt: already in step order
    return rec.take(numpy.lexsort((rec.attempts, rec.steps)))


def in_chunks(
    s: Session, job_id: str, kind: str, chunks: Sequence[int], names: Sequence[str], effective: bool
) -> Records:
    """Every record of ``kind`` in the chunk numbers ``chunks`` (of every attempt), as
    :func:`assemble` gives them: one statement."""
    series = _with_record_series(kind, names)
    return assemble(chunk_load.load(s, job_id, kind, series, chunks), kind, names, effective)


def _with_record_series(kind: str, names: Sequence[str]) -> list[str]:
    """``names`` and the series every record is rebuilt from (its cursor and time)."""
    return sorted({*names, MS, SEQ, "time" if kind == STEP_KIND else TIME})
