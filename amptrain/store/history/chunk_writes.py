"""Appending a batch's values to the series' chunks (``metric_chunks``), inside the caller's
transaction: the recorder's batch, or migrations 0014/0015 moving old rows.

Which series exist is the metric table's decision: every per-step field of
:data:`~amptrain.contract.metrics.STEP_METRICS` that is a number (:data:`STEP_SERIES`: all
but ``step`` itself, the key) is a ``step`` series; each evaluation metric and each layer's
gradient norm is a series of its kind (:data:`~amptrain.contract.metrics.VALUE_KINDS`); the
reserved series of :mod:`~amptrain.store.history.chunk_parts` keep what else a page shows
(cursors, record times, the per-rank memory list).

A value lands in the chunk ``(job, kind, name, step // 256, attempt)``: the key alone says
where it goes, so at-least-once delivery is harmless. The touched chunks are read by
primary key, decoded, given the steps they lack (:mod:`~amptrain.store.history.chunk_merge`:
a step already there keeps its first value, as ``ON CONFLICT DO NOTHING`` did for rows),
re-encoded and upserted in one statement (the table's statements:
:mod:`~amptrain.store.history.chunk_table`); a replayed or re-sent range adds no step and
writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from amptrain.store.history import chunk_codec, chunk_merge
from amptrain.store.history.block_stats import Row
from amptrain.store.history.chunk_codec import Decoded
from amptrain.store.history.chunk_merge import Gained, Span
from amptrain.store.history.chunk_merge import Stored as Stored
from amptrain.store.history.chunk_parts import SHIFT as _SHIFT
from amptrain.store.history.chunk_parts import STEP_KIND as STEP_KIND
from amptrain.store.history.chunk_parts import STEP_SERIES as STEP_SERIES
from amptrain.store.history.chunk_parts import Key, Part, collect
from amptrain.store.history.chunk_table import COLUMNS, open_chunks, passed, read, store, upsert
from amptrain.store.history.point_columns import PointColumns
from amptrain.store.history.rollup_stats import STATS


def append(
    s: Session,
    points: Sequence[Mapping[str, Any]],
    values: Sequence[Mapping[str, Any]],
    pack: bool = False,
    step_fields: Sequence[str] = STEP_SERIES,
    keyed_open: bool = True,
) -> int:
    """Add the points and the named values to their chunks (what each holds:
    :func:`~amptrain.store.history.chunk_parts.collect`); the number of chunks written.
    ``pack``: as for :func:`merge`; ``step_fields``: the metric table's series to write
    (migration 0015 writes only the reserved ones); ``keyed_open``: false for the table
    before revision 0021, which has no ``open`` column (migrations 0014-0017 write it). The
    recorder writes through :func:`amptrain.store.history.rollups.record`, which also keeps
    the roll-ups."""
    return len(write(s, collect(points, values, step_fields), pack, keyed_open=keyed_open))


Gains = dict[Key, Gained]
"""Per chunk the steps a write added to it (:data:`~amptrain.store.history.chunk_merge.Gained`)."""


def gather(
    points: Sequence[Mapping[str, Any]],
    values: Sequence[Mapping[str, Any]],
    columns: Sequence[PointColumns] = (),
) -> dict[Key, Part]:
    """The new values of each chunk, from the recorder's points (rows and columns) and
    named values."""
    return collect(points, values, columns=columns)


def write(
    s: Session,
    parts: Mapping[Key, Part],
    pack: bool = False,
    last: dict[Key, int] | None = None,
    keyed_open: bool = True,
    blocks: Mapping[Key, Row] | None = None,
) -> Gains:
    """Merge ``parts`` (:func:`gather`) into their stored chunks and upsert the chunks that
    changed (a chunk that closes moves to the closed rows: :func:`close`); what each gained
    (the roll-ups' upkeep reads it). ``last``, when given, gets the last step each chunk
    held before (a chunk not stored before is absent). ``keyed_open``: as for :func:`append`;
    ``blocks``: the parts' aggregates where taken
    (:func:`~amptrain.store.history.block_stats.part_blocks`), whose lowest and highest value
    and non-finite count a chunk that gains its whole part takes instead of a pass over its
    new values."""
    if not parts:
        return {}
    spans: dict[Key, Span] = {}
    opened: set[Key] | None = set() if keyed_open else None
    stored = read(s, list(parts), spans, opened)
    if last is not None:
        last.update((key, d.steps[-1]) for key, (d, _, _) in stored.items() if d.steps)
    merged, gains = _merge(parts, stored)
    new = _gained_spans(parts, gains, blocks) if blocks else {}
    if opened is None:
        rows = _rows(merged, stored, pack, spans, new)
        upsert(s, [r[:-1] for r in rows], COLUMNS[:-1])
        return gains
    sealed = _sealed(s, parts, stored, opened, spans)
    merged.update((k, stored[k]) for k in sealed if k not in parts)  # the passed ones
    rows = _rows(merged, stored, pack, spans, new, sealed)
    store(s, list(merged), rows, opened)
    return gains


def _sealed(
    s: Session,
    parts: Mapping[Key, Part],
    stored: dict[Key, Stored],
    opened: set[Key],
    spans: dict[Key, Span],
) -> set[Key]:
    """The chunks that are closed after this write: those stored closed (a late step keeps
    a chunk closed), those below a newer chunk of their series and attempt in ``parts``,
    and the stored open chunk that the lowest new chunk of each series passes (read into
    ``stored``). The newest chunk of a series and attempt stays open, full or not: a
    series recorded at intervals (an evaluation every 100 steps, layer norms every 10) never
    fills one, and on PostgreSQL the next chunk takes over the open row of the one it
    closes (:func:`~amptrain.store.history.chunk_table.store`), which it can only when both
    are in one write."""
    sealed = {k for k in stored if k not in opened}
    lowest: dict[tuple[str, str, str, int], Key] = {}
    newest: dict[tuple[str, str, str, int], int] = {}
    for key in parts:
        series = (key[0], key[1], key[2], key[4])
        if series not in lowest or key[3] < lowest[series][3]:
            lowest[series] = key
        newest[series] = max(newest.get(series, key[3]), key[3])
    sealed.update(k for k in parts if k[3] < newest[(k[0], k[1], k[2], k[4])])
    below = passed(s, [k for k in lowest.values() if k not in stored])
    reopen = [k for k, is_open_ in below.items() if is_open_]
    if reopen:
        stored.update(read(s, reopen, spans, opened))
        sealed.update(reopen)
    return sealed


def seal(s: Session, skipped: Mapping[Key, int]) -> None:
    """Close the stored open chunks that are keys of ``skipped`` (each one's ``skipped``
    column as stored): each rewritten packed into the closed rows, its open row deleted
    (migration 0022, for chunks a newer chunk of their series passed before the writer
    closed such chunks itself)."""
    if not skipped:
        return
    spans: dict[Key, Span] = {}
    opened: set[Key] = set()
    stored = read(s, list(skipped), spans, opened)
    rows = [_row(k, *m, skipped[k], True, spans[k], True) for k, m in stored.items()]
    store(s, list(stored), rows, opened)


def seal_job(s: Session, job_id: str) -> None:
    """Close every open chunk of the job, whose telemetry ended: packed and in the closed
    rows, as they would be once a newer chunk passed them (a finished job's newest chunks
    would otherwise keep their open rows, a page each on PostgreSQL). A late step still
    finds its chunk, and keeps it closed."""
    seal(s, open_chunks(s, job_id))


def _gained_spans(
    parts: Mapping[Key, Part], gains: Gains, blocks: Mapping[Key, Row]
) -> dict[Key, Span]:
    """The :data:`Span` of what each chunk gained, for those that gained their whole part
    (rising steps: what they gained is the part, in order) from its block's aggregates."""
    out: dict[Key, Span] = {}
    for key, row in blocks.items():
        new = gains.get(key)
        if new is not None and len(new) == len(parts[key].steps):
            out[key] = (row[_LOW], row[_HIGH], row[_NON_FINITE])
    return out


_LOW, _HIGH, _NON_FINITE = (STATS.index(c) for c in ("low", "high", "non_finite"))


def merge(
    parts: Mapping[Key, Part], stored: Mapping[Key, Stored], pack: bool = False
) -> list[tuple[Any, ...]]:
    """The rows (:data:`COLUMNS`) of every chunk that gains a step; a step already stored
    (or repeated in ``parts``) keeps its first value. ``pack``: compress every chunk, open
    or not (the migration's, whose chunks will not grow)."""
    return _rows(_merge(parts, stored)[0], stored, pack)


def _merge(
    parts: Mapping[Key, Part], stored: Mapping[Key, Stored]
) -> tuple[dict[Key, Stored], Gains]:
    """Every chunk that changes (:func:`chunk_merge.merged`) and the steps each gains."""
    merged: dict[Key, Stored] = {}
    gains: Gains = {}
    rising: dict[int, bool] = {}
    for key, part in parts.items():
        m = chunk_merge.merged(part, stored.get(key), rising)
        if m is not None:
            merged[key], new = m
            if new:
                gains[key] = new
    return merged, gains


def _rows(
    merged: Mapping[Key, Stored],
    stored: Mapping[Key, Stored],
    pack: bool,
    spans: Mapping[Key, Span] | None = None,
    new: Mapping[Key, Span] | None = None,
    sealed: set[Key] | frozenset[Key] = frozenset(),
) -> list[tuple[Any, ...]]:
    seen: dict[Key, int] = {}
    spans = spans or {}
    new = new or {}
    return [
        _row(
            key,
            *m,
            _skipped(key, merged, stored, seen),
            pack,
            chunk_merge.merged_span(m[0], stored.get(key), spans.get(key), new.get(key)),
            key in sealed,
        )
        for key, m in merged.items()
    ]


def _skipped(
    key: Key, merged: Mapping[Key, Stored], stored: Mapping[Key, Stored], seen: dict[Key, int]
) -> int:
    """How many of the chunk's steps were skipped: from the same attempt's ``skipped``
    series (written with every step series of a point, so over the same steps); counted
    once per chunk in ``seen``, not once per series."""
    if key[1] != STEP_KIND:
        return 0
    flag_key = (key[0], STEP_KIND, "skipped", key[3], key[4])
    count = seen.get(flag_key)
    if count is None:
        flags = merged.get(flag_key) or stored.get(flag_key)
        count = seen[flag_key] = 0 if flags is None else flags[0].values.count(1.0)
    return count


def _row(
    key: Key,
    d: Decoded,
    t_first: float | None,
    t_last: float | None,
    skipped: int,
    pack: bool,
    span: Span | None = None,
    sealed: bool = False,
) -> tuple[Any, ...]:
    nulls = d.nulls
    low, high, non_finite = chunk_merge.value_range(d.values) if span is None else span
    return (
        *key,
        d.steps[0],
        d.steps[-1],
        len(d.steps),
        non_finite,
        skipped,
        low,
        high,
        None if nulls and nulls[0] else d.values[0],
        None if nulls and nulls[-1] else d.values[-1],
        t_first,
        t_last,
        chunk_codec.encode(key[3] << _SHIFT, d.steps, d.values, nulls, pack or sealed, d.position),
        not sealed,
    )
