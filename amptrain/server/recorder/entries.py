"""A batch of stream entries as the rows the recorder writes (see :mod:`amptrain.store.recording`)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from amptrain.contract.cursor import Cursor
from amptrain.contract.jsonsafe import finite
from amptrain.contract.layers import LAYER_NORMS_MAX, check_layer_path
from amptrain.contract.metrics import (
    EVAL_KIND,
    FLOAT_FIELDS,
    LAYER_NORM_KIND,
    METRIC_FIELDS,
    PARALLEL_METRIC_FIELDS,
    STORED_METRIC_FIELDS,
    VALUE_KINDS,
    check_series_name,
)
from amptrain.contract.spec import MAX_DEVICES
from amptrain.contract.stream import decode, text
from amptrain.server.recorder import packed_points, plain_points
from amptrain.store.history.point_columns import PointColumns

log = logging.getLogger(__name__)

Entry = tuple[Any, list[Any] | None]
"""``(entry_id, [field, value, field, value, ...])`` as hiredis gives it (see
:mod:`amptrain.server.recorder.group`); None: trimmed from the stream while pending."""


@dataclass
class Batch:
    """Points, eval values and events to insert, and the attempts whose ``end`` entry came."""

    columns: PointColumns | None = None
    """The points, when every metric entry was plain (nearly every batch): as columns."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """The points otherwise, one row each."""
    values: list[dict[str, Any]] = field(default_factory=list)
    """One row per named value of each eval and layer_grad_norm entry (``metric_values``)."""
    events: list[dict[str, Any]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    @property
    def points(self) -> list[dict[str, Any]]:
        """The points as rows, in stream order (built from the columns on each call)."""
        return self.rows if self.columns is None else self.columns.rows()

    def point_count(self) -> int:
        return len(self.rows) if self.columns is None else len(self.columns)

    def column(self, name: str) -> Sequence[Any]:
        """A point field's values (``attempt`` too), in stream order (None where a point
        lacks it), without building rows."""
        c = self.columns
        if c is None:
            return [p.get(name) for p in self.rows]
        return c.attempts if name == "attempt" else c.column(name)


def parse(job_id: str, entries: Iterable[Entry]) -> Batch:
    """A job's entries as rows (each list in stream order). Plain metric entries, nearly
    every entry, are decoded together as columns
    (:mod:`amptrain.server.recorder.plain_points`); the rest one by one, and everything
    one by one when a plain entry's value is odd."""
    entries = [e for e in entries if e[1]]  # a None: trimmed from the stream while pending
    plain, rest = plain_points.split(entries)
    columns = plain_points.columns(job_id, plain) if plain else None
    if plain and columns is None:
        return _parse(job_id, entries)
    batch = _parse(job_id, rest)
    if batch.rows:
        return _parse(job_id, entries)  # other metric entries among them: keep stream order
    if columns is not None:
        steps = columns.steps
        if not plain_points.ONLY_INTS.issuperset(map(type, steps)):
            columns = columns.take(i for i, step in enumerate(steps) if type(step) is int)
        batch.columns = columns
    return batch


def _parse(job_id: str, entries: Iterable[Entry]) -> Batch:
    batch = Batch()
    for eid, flat in entries:
        if not flat:
            continue  # trimmed from the stream while pending
        entry_id = text(eid)
        try:
            if _kind(flat) in _METRIC:
                row = _point_row(job_id, entry_id, flat)
                if type(row["step"]) is int:
                    batch.rows.append(row)
                continue
            item = decode(_pairs(flat))
            if item["kind"] in VALUE_KINDS:
                batch.values.extend(_value_rows(job_id, entry_id, item))
                continue
        except (KeyError, ValueError, IndexError):
            log.error("job %s: undecodable stream entry %s dropped", job_id, entry_id)
            continue
        if item["kind"] == "event":
            batch.events.append(_event_row(job_id, entry_id, item))
        elif item["kind"] == "end":
            batch.ends.append(item["attempt"])
    return batch


_KIND = (b"kind", "kind")
_METRIC = (b"metric", "metric")
# field name (bytes and str) -> (column, read as float): the float columns' text goes
# straight to float(); every other value is an int, true/false/null, or rare.
_COLUMN = {k: (f, f in FLOAT_FIELDS) for f in METRIC_FIELDS for k in (f, f.encode())}
_CONSTANTS: dict[Any, Any] = {
    k: v for t, v in (("null", None), ("true", True), ("false", False)) for k in (t, t.encode())
}
_NOT_CONSTANT = object()
_BLANK = dict.fromkeys(STORED_METRIC_FIELDS)


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    it = iter(flat)
    return dict(zip(it, it, strict=True))


def _kind(flat: list[Any]) -> Any:
    if flat[0] in _KIND:  # the worker's sink writes it first
        return flat[1]
    pairs = _pairs(flat)
    return pairs.get(b"kind", pairs.get("kind"))


def _point_row(job_id: str, entry_id: str, flat: list[Any]) -> dict[str, Any]:
    """The row of a metric entry, flat or packed, without :func:`amptrain.contract.stream.decode`'s
    per-field ``json.loads`` (it was half the recorder's CPU). A float column's integer
    reads as a float, as SQL stores it; anything unusual takes the ``decode`` route."""
    ms, seq = Cursor.of_entry(entry_id)
    row: dict[str, Any] = _BLANK.copy()
    attempt = None
    it = iter(flat)
    try:
        for k, v in zip(it, it, strict=True):
            column = _COLUMN.get(k)
            if column is None:
                if k in _ATTEMPT:
                    attempt = v
                elif k in packed_points.NAMES:  # ValueError: not a packed field this recorder knows
                    row.update(packed_points.row_values(v))
                elif k in _PARALLEL:
                    name, value = _parallel(text(k), text(v))
                    row[name] = value
                continue
            constant = _CONSTANTS.get(v, _NOT_CONSTANT)
            if constant is not _NOT_CONSTANT:
                row[column[0]] = constant
            elif column[1]:
                row[column[0]] = float(v)  # also NaN, Infinity, -Infinity
            else:
                row[column[0]] = int(v)
    except ValueError:
        item = decode(_pairs(flat))
        attempt = item["attempt"]
        row = {f: item.get(f) for f in METRIC_FIELDS}
        row.update(_parallel(f, json.dumps(item.get(f))) for f in PARALLEL_METRIC_FIELDS)
    if attempt is None:
        raise KeyError("attempt")  # undecodable
    row.update(job_id=job_id, attempt=int(attempt), stream_ms=ms, stream_seq=seq)
    return row


_ATTEMPT = (b"attempt", "attempt")
_PARALLEL = frozenset(k for f in PARALLEL_METRIC_FIELDS for k in (f, f.encode()))


def _parallel(name: str, value: str) -> tuple[str, Any]:
    """A data-parallel run's field as its column holds it: ``world_size`` an int,
    ``memory_peak_per_rank`` JSON text of a list of ints (checked: a malformed value would
    fail the whole batch's insert on PostgreSQL), at most one per rank a job can have (the
    chunks keep a series per rank); null when absent or malformed."""
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if name == "world_size":
        return name, parsed if type(parsed) is int else None
    ok = (
        isinstance(parsed, list)
        and len(parsed) <= MAX_DEVICES
        and all(type(v) is int and abs(v) < 2**53 for v in parsed)
    )
    return name, json.dumps(parsed) if ok else None


_NAME_CHECKS = {EVAL_KIND: check_series_name, LAYER_NORM_KIND: check_layer_path}
_MOST_NAMES = {EVAL_KIND: None, LAYER_NORM_KIND: LAYER_NORMS_MAX}


def _value_rows(job_id: str, entry_id: str, item: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of an eval or layer_grad_norm entry: a value that is not a finite number is
    stored as null; an entry with no integer step, a name that cannot name a series of its
    kind, or more layers than a job may have, is dropped whole (the engine's records never
    have one: :func:`amptrain.contract.records.evaluation`, ``layer_norms``)."""
    kind, step, values = item["kind"], item["step"], item["values"]
    # Steps are 32-bit columns: a larger one would fail the whole batch's insert.
    if type(step) is not int or not 0 <= step < 2**31 or not isinstance(values, dict):
        raise ValueError(f"{kind} entry without a step in 0..2^31-1 and a values object")
    most = _MOST_NAMES[kind]
    if most is not None and len(values) > most:
        raise ValueError(f"{kind} entry with more than {most} names")
    for name in values:
        _NAME_CHECKS[kind](name)  # ValueError: the entry is logged and dropped
    ms, seq = Cursor.of_entry(entry_id)
    at = item["time"] if isinstance(item["time"], int | float) else time.time()
    return [
        {
            "job_id": job_id,
            "attempt": item["attempt"],
            "step": step,
            "kind": kind,
            "name": name,
            "value": _number(value),
            "time": float(at),
            "stream_ms": ms,
            "stream_seq": seq,
        }
        for name, value in values.items()
    ]


def _number(value: Any) -> float | None:
    if type(value) not in (int, float):  # bool is not a measurement
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond a double
        return None
    return number if math.isfinite(number) else None


def _event_row(job_id: str, entry_id: str, item: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": item["id"],  # set when the API wrote the event to SQL first
        "job_id": job_id,
        "attempt": item["attempt"],
        "type": item["type"],
        "step": item["step"],
        "time": item["time"] if item["time"] is not None else time.time(),
        "data": finite(item["data"]),
        "source_id": entry_id,
    }
