"""A batch of stream entries as the rows the recorder writes (see :mod:`api.store.recording`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from api.contracts.cursor import Cursor
from api.contracts.jsonsafe import finite
from api.contracts.stream import decode
from api.core.redis import text
from api.store.recording import FLOAT_FIELDS
from trainer_core.contract.records import (
    METRIC_FIELDS,
    PARALLEL_METRIC_FIELDS,
    STORED_METRIC_FIELDS,
)

log = logging.getLogger(__name__)

Entry = tuple[Any, list[Any] | None]
"""``(entry_id, [field, value, field, value, ...])`` as hiredis gives it (see
:mod:`api.services.recorder_group`); None: trimmed from the stream while pending."""


@dataclass
class Batch:
    """Points and events to insert, and the attempts whose ``end`` entry came."""

    points: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)


def parse(job_id: str, entries: Iterable[Entry]) -> Batch:
    batch = Batch()
    for eid, flat in entries:
        if not flat:
            continue  # trimmed from the stream while pending
        entry_id = text(eid)
        try:
            if _kind(flat) in _METRIC:
                row = _point_row(job_id, entry_id, flat)
                if type(row["step"]) is int:
                    batch.points.append(row)
                continue
            item = decode(_pairs(flat))
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
_ATTEMPT = (b"attempt", "attempt")
_PARALLEL = frozenset(k for f in PARALLEL_METRIC_FIELDS for k in (f, f.encode()))
_BLANK = dict.fromkeys(STORED_METRIC_FIELDS)
_TYPES: dict[str, tuple[type, ...]] = {
    f: (float, int) if f in FLOAT_FIELDS else (bool,) if f == "skipped" else (int,)
    for f in METRIC_FIELDS
}
"""What a metric column takes (None aside); anything else takes the ``decode`` route."""


class _Layout(NamedTuple):
    """Where a metric entry's values are, for one order of field names (the sink always
    writes the same): the metric values' positions, their columns and types, and where
    ``attempt`` and the data-parallel fields are."""

    values: list[int]
    columns: tuple[str, ...]
    types: tuple[tuple[type, ...], ...]
    floats: tuple[int, ...]
    """Indexes (into ``columns``) of float columns: an integer there is read as a float,
    as SQL stores it."""
    attempt: int
    parallel: tuple[tuple[str, int], ...]


_LAYOUTS: dict[tuple[Any, ...], _Layout | None] = {}
_MAX_LAYOUTS = 64  # the field names come from the stream: the cache stays small whatever comes


def _layout(names: tuple[Any, ...]) -> _Layout | None:
    """The layout of entries with these field names; None when they lack ``attempt``."""
    if names in _LAYOUTS:
        return _LAYOUTS[names]
    columns = {text(n): i for i, n in enumerate(names) if text(n) in METRIC_FIELDS}
    attempt = next((i for i, n in enumerate(names) if n in _ATTEMPT), None)
    layout = None
    if attempt is not None and columns:
        layout = _Layout(
            values=list(columns.values()),
            columns=tuple(columns),
            types=tuple(_TYPES[c] for c in columns),
            floats=tuple(i for i, c in enumerate(columns) if c in FLOAT_FIELDS),
            attempt=attempt,
            parallel=tuple((text(n), i) for i, n in enumerate(names) if n in _PARALLEL),
        )
    if len(_LAYOUTS) < _MAX_LAYOUTS:
        _LAYOUTS[names] = layout
    return layout


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    it = iter(flat)
    return dict(zip(it, it, strict=True))


def _kind(flat: list[Any]) -> Any:
    if flat[0] in _KIND:  # the worker's sink writes it first
        return flat[1]
    pairs = _pairs(flat)
    return pairs.get(b"kind", pairs.get("kind"))


def _point_row(job_id: str, entry_id: str, flat: list[Any]) -> dict[str, Any]:
    """The row of a metric entry. The values are JSON scalars (:mod:`api.contracts.stream`):
    all of an entry's are read by ONE ``json.loads`` of them joined as an array, not one
    call each (that was half the recorder's CPU), and checked against their columns'
    types; anything unusual takes the :func:`api.contracts.stream.decode` route."""
    ms, seq = Cursor.of_entry(entry_id)
    values = flat[1::2]
    layout = _layout(tuple(flat[0::2]))
    if layout is None:
        raise KeyError("attempt")  # undecodable
    row = _fast_row(layout, values)
    if row is None:
        item = decode(_pairs(flat))
        row = {f: item.get(f) for f in METRIC_FIELDS}
        row.update(_parallel(f, json.dumps(item.get(f))) for f in PARALLEL_METRIC_FIELDS)
    attempt = int(values[layout.attempt])
    row.update(job_id=job_id, attempt=attempt, stream_ms=ms, stream_seq=seq)
    return row


def _fast_row(layout: _Layout, values: list[Any]) -> dict[str, Any] | None:
    """The metric columns of an entry laid out as ``layout``; None when a value is not
    the JSON scalar its column takes."""
    parsed = _scalars([values[i] for i in layout.values])
    if parsed is None or len(parsed) != len(layout.columns):
        return None  # not JSON, or a value that was more than one
    if not all(v is None or type(v) in t for v, t in zip(parsed, layout.types, strict=True)):
        return None
    for i in layout.floats:
        if type(parsed[i]) is int:
            parsed[i] = float(parsed[i])
    row = _BLANK.copy()
    row.update(zip(layout.columns, parsed, strict=True))
    row.update(_parallel(name, text(values[i])) for name, i in layout.parallel)
    return row


def _scalars(raw: list[Any]) -> list[Any] | None:
    """JSON texts (bytes or str) as values, by one parse; None if they are not JSON."""
    try:
        if raw and isinstance(raw[0], bytes):
            return json.loads(b"[" + b",".join(raw) + b"]")
        return json.loads("[" + ",".join(raw) + "]")
    except (ValueError, TypeError):
        return None


def _parallel(name: str, value: str) -> tuple[str, Any]:
    """A data-parallel run's field as its column holds it: ``world_size`` an int,
    ``memory_peak_per_rank`` JSON text of a list of ints (checked: a malformed value would
    fail the whole batch's insert on PostgreSQL); null when absent or malformed."""
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if name == "world_size":
        return name, parsed if type(parsed) is int else None
    ok = isinstance(parsed, list) and all(type(v) is int for v in parsed)
    return name, json.dumps(parsed) if ok else None


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
