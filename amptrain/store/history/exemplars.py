"""Exemplars (``metric_exemplars``): per step-kind roll-up block (job, level, idx, attempt)
the full records of the attempt at the block's *notable* steps, packed in one blob.

Notable (:func:`notable`): the block's first and last step and first flagged step (from
the :data:`KEY_SERIES` roll-up) and the lowest and highest step of every field whose
extremes a read can keep (:data:`~amptrain.contract.metrics.EXTREMA_FIELDS`): exactly the
steps a downsampled bucket chooses (``downsample._choose``). A bucket's aggregates made of
whole blocks of one attempt are merges of those blocks' roll-ups, so every step it
chooses is one of its blocks' notable steps, and its point comes from here instead of one
chunk lookup per series (:mod:`amptrain.store.history.exemplar_reads`).

A record is every step series the attempt holds at the step (the metric table's fields
and the reserved ``@ms``/``@seq``/``@ranks``/``@rankN``), each a float as the chunks hold
it (:func:`~amptrain.store.history.chunk_merge.number`) or null; a record without its
cursor (``@ms``) is left out, as the chunk reads leave it out. NaNs are stored as the one
canonical NaN (a window reads every non-finite value as null), so a kept blob and a
rebuilt one are the same bytes.

Kept by the recorder in the batch's transaction (:func:`keep`, from the roll-ups' new
totals and what the chunks gained): a block's notable steps are old notable steps or new
steps (a chunk only gains steps; ties keep the earlier step), so every record comes from
the stored blob or from the batch. A replay gains nothing and writes nothing. Built from
stored chunks by :mod:`amptrain.store.history.exemplar_build` (migration 0018).
Standard library only: the recorder does without numpy.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.orm import Session

from amptrain.contract.metrics import EXTREMA_FIELDS
from amptrain.store.db import unnested, upsert_many
from amptrain.store.history.chunk_merge import Gained, number
from amptrain.store.history.chunk_parts import KEY_SERIES, MS, SHIFT, STEP_KIND

EKey = tuple[str, int, int, int]
"""``(job_id, level, idx, attempt)``: an exemplar blob's primary key."""
Record = dict[str, float | None]
"""A step's values by series name (None: null); a name the step does not hold is absent."""
Block = dict[int, Record]
"""A blob's records by step."""
DECIDING = tuple(dict.fromkeys((KEY_SERIES, *EXTREMA_FIELDS)))
"""The step series whose roll-ups decide a block's notable steps."""

_HEAD = struct.Struct("<HHH")  # records, names, bytes of the newline-joined names
NULL = 1
"""A name's state in a record: 0 not held, 1 (NULL) null, 2 a value."""
_NULL, _VALUE = NULL, 2
_NAN = float("nan")
_ABSENT = object()
_SWAP = sys.byteorder != "little"


def notable(stats: Mapping[str, Any]) -> set[int] | None:
    """The notable steps of a block from its :data:`DECIDING` series' roll-ups (objects
    with :class:`~amptrain.store.history.rollups.Stats`' attributes); None when one of
    them is missing."""
    if any(name not in stats for name in DECIDING):
        return None
    key = stats[KEY_SERIES]
    if not key.count:
        return set()
    out = {key.first_step, key.last_step}
    if key.first_flag is not None:
        out.add(key.first_flag)
    for name in EXTREMA_FIELDS:
        out.update(x for x in (stats[name].low_step, stats[name].high_step) if x is not None)
    return out


def encode(block: Mapping[int, Record]) -> bytes:
    """A blob of the records (deterministic: steps ascending, names sorted): the names, the
    steps, then record by record one state byte per name and every name's value as a
    little-endian float64 (NaN where null or not held), so a read unpacks a record at once."""
    steps = sorted(step for step, rec in block.items() if MS in rec)
    names = sorted({name for step in steps for name in block[step]})
    text = "\n".join(names).encode()
    out = [_HEAD.pack(len(steps), len(names), len(text)), text, _bytes(array("i", steps))]
    for step in steps:
        rec = block[step]
        states = bytearray(len(names))
        values = array("d", [_NAN]) * len(names)
        for i, name in enumerate(names):
            if name not in rec:
                continue
            v = rec[name]
            if v is None:
                states[i] = _NULL
            else:
                states[i] = _VALUE
                values[i] = v if v == v else _NAN
        out += [bytes(states), _bytes(values)]
    return b"".join(out)


def decode(data: bytes) -> Block:
    """The records of a blob (:func:`encode`)."""
    return records_at(data, None)


def records_at(data: bytes, wanted: Iterable[int] | None) -> Block:
    """The records of a blob at the ``wanted`` steps it holds (None: all)."""
    names, found = raw_at(data, wanted)
    return {
        step: {
            name: None if state == _NULL else v
            for name, state, v in zip(names, states, values, strict=True)
            if state
        }
        for step, states, values in found
    }


Raw = tuple[tuple[str, ...], list[tuple[int, bytes, tuple[float, ...]]]]
"""A blob's names, and per record read its step, its state byte per name (0: not held, 1:
null, 2: a value) and its values (NaN where no value)."""


def raw_at(data: bytes, wanted: Iterable[int] | None) -> Raw:
    """The records of a blob at the ``wanted`` steps it holds (None: all) as they are
    packed, without unpacking the others (a window takes one or two records a blob)."""
    n, m, size = _HEAD.unpack_from(data)
    pos = _HEAD.size
    names = tuple(data[pos : pos + size].decode().split("\n")) if m else ()
    pos += size
    steps = _array("i", data[pos : pos + 4 * n])
    pos += 4 * n
    where = {step: i for i, step in enumerate(steps)}
    at = where.items() if wanted is None else [(x, where[x]) for x in wanted if x in where]
    values = struct.Struct(f"<{m}d")
    found = []
    for step, i in at:
        off = pos + i * (9 * m)
        found.append((step, data[off : off + m], values.unpack_from(data, off + m)))
    return names, found


def _bytes(a: array[Any]) -> bytes:
    if _SWAP:
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def _array(typecode: str, data: bytes) -> array[Any]:
    a = array(typecode)
    a.frombytes(data)
    if _SWAP:
        a.byteswap()
    return a


def keep(
    s: Session,
    totals: Mapping[tuple[Any, ...], Any],
    gains: Mapping[Any, Gained],
    levels: Iterable[int],
) -> None:
    """The recorder's upkeep, in the caller's transaction: ``totals``, the step kind's
    roll-ups a batch changed (by :data:`~amptrain.store.history.rollups.RKey`, as merged
    with the batch), ``gains``, what the chunks gained
    (:data:`~amptrain.store.history.chunk_writes.Gains`), and the roll-up ``levels``."""
    blocks: dict[EKey, dict[str, Any]] = defaultdict(dict)
    # Every block a step series gained in, a reserved one too (which keeps no roll-ups): a
    # re-sent point can bring only its per-rank memory, which the records then gain.
    for job_id, kind, _, chunk, attempt in gains:
        if kind == STEP_KIND:
            for level in levels:
                blocks.setdefault((job_id, level, chunk >> level, attempt), {})
    for (job_id, kind, name, level, idx, attempt), stats in totals.items():
        if kind == STEP_KIND and name in DECIDING:
            blocks[(job_id, level, idx, attempt)][name] = stats
    if not blocks:
        return
    fresh: dict[tuple[str, int, int], list[tuple[str, Gained]]] = defaultdict(list)
    for (job_id, kind, name, chunk, attempt), new in gains.items():
        if kind == STEP_KIND:
            fresh[(job_id, chunk, attempt)].append((name, new))
    stored = read(s, list(blocks))
    rows = []
    for key, stats in blocks.items():
        was = stored.get(key)
        old = decode(was) if was is not None else {}
        steps = notable(stats)
        block: Block = {}
        for step in set(old) if steps is None else steps:
            rec = dict(old.get(step, {}))
            # a step's series can arrive in later batches (a re-sent point bringing a
            # field the first one lacked): the record gains what the chunks gained
            for name, new in fresh.get((key[0], step >> SHIFT, key[3]), ()):
                if name not in rec:
                    v = new.get(step, _ABSENT)  # one lookup, not `in` then `[]`
                    if v is not _ABSENT:
                        rec[name] = number(v)
            block[step] = rec
        data = encode(block)
        if data != was:
            rows.append((*key, data))
    upsert(s, rows)


_KEY = ("job_id", "level", "idx", "attempt")
_ONE = "SELECT data FROM metric_exemplars WHERE " + " AND ".join(f"{c} = ?" for c in _KEY)
_MANY = (
    "SELECT k.job_id, k.level, k.idx, k.attempt, e.data FROM {unnest} AS k(job_id, level, idx, attempt) CROSS JOIN LATERAL "
    "(SELECT data FROM metric_exemplars e WHERE "
    + " AND ".join(f"e.{c} = k.{c}" for c in _KEY)
    + " OFFSET 0) e"
)
"""One primary-key lookup per key whatever the planner knows (OFFSET 0: see
:data:`amptrain.store.history.chunk_stats._CHUNKS_PG`)."""
_UPSERT = (
    f"INSERT INTO metric_exemplars ({', '.join(_KEY)}, data) VALUES ({{marks}}) "
    f"ON CONFLICT ({', '.join(_KEY)}) DO UPDATE SET data = excluded.data"
)


def read(s: Session, keys: Iterable[EKey]) -> dict[EKey, bytes]:
    """The stored blobs among ``keys``: one statement on PostgreSQL, one cached statement
    per key on SQLite (no round trips to save)."""
    keys = list(keys)
    out: dict[EKey, bytes] = {}
    if not keys:
        return out
    conn: Any = s.connection().connection.driver_connection
    if s.get_bind().dialect.name == "sqlite":
        for key in keys:
            for (data,) in conn.execute(_ONE, key):
                out[key] = bytes(data)
        return out
    unnest, columns = unnested(_TYPED[:-1], keys)
    with conn.cursor() as cur:
        for job_id, level, idx, attempt, data in cur.execute(_MANY.format(unnest=unnest), columns):
            out[(job_id, level, idx, attempt)] = bytes(data)
    return out


def upsert(s: Session, rows: list[tuple[Any, ...]]) -> None:
    """Write whole blobs (``(*key, data)`` rows): one statement
    (:func:`~amptrain.store.db.upsert_many`; an executemany cost ~11 us of client CPU a row)."""
    upsert_many(s, _UPSERT, "metric_exemplars", _TYPED, rows)


_TYPED = (
    ("job_id", "text"),
    ("level", "int"),
    ("idx", "int"),
    ("attempt", "int"),
    ("data", "bytea"),
)
