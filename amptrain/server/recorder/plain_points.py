"""The recorder's common case decoded a batch at a time: metric entries exactly as the
worker's sink writes them (:func:`amptrain.contract.stream.encode` of a one-device step),
packed (:mod:`amptrain.server.recorder.packed_points`) or, from an older worker, flat
(this module). A batch holding both takes the per-entry route (only while workers are
being upgraded).

A field-by-field loop in Python cost about 6 us a point (a fifth of the recorder's CPU).
Here a job's batch is two JSON documents, its float columns and its integer columns, each
parsed by ``json.loads`` in C, and kept as columns
(:class:`~amptrain.store.history.point_columns.PointColumns`): the chunks take them by
slicing, with no dict per point. Every value either parses as the JSON
scalar its column takes or the whole batch goes back to the per-entry route
(:func:`amptrain.server.recorder.entries.parse`), which keeps its rules for odd values:

* the bytes are checked to hold one scalar per value (no quote, bracket or brace, one
  comma fewer than values), so an odd value can never shift another column;
* a float column's integer reads as a float (``parse_int=float``), as SQL stores it, and
  ``NaN``/``Infinity`` as the floats they name, as ``float()`` reads them;
* an integer column (the attempt among them) holding a float or a non-finite constant
  rejects the batch (``parse_float``, ``parse_constant``): the per-entry route keeps such
  a value as sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

from amptrain.contract.metrics import FLOAT_FIELDS, METRIC_FIELDS
from amptrain.server.recorder import packed_points
from amptrain.store.history.point_columns import PointColumns

KEYS = [b"kind", b"job_id", b"attempt", *(f.encode() for f in METRIC_FIELDS)]
"""The field names of a plain flat metric entry, in the sink's order (compared as one list)."""
PACKED_KEYS = packed_points.KEYS
_FLOAT_COLUMNS = [f for f in METRIC_FIELDS if f in FLOAT_FIELDS]
_INT_COLUMNS = [f for f in METRIC_FIELDS if f not in FLOAT_FIELDS]
_VALUE_AT = {f: 2 * i + 1 for i, f in enumerate(k.decode() for k in KEYS)}
_FLOATS_OF = itemgetter(*(_VALUE_AT[f] for f in _FLOAT_COLUMNS))
# The attempt last: each row takes its integer columns, then its attempt.
_INTS_OF = itemgetter(*(_VALUE_AT[f] for f in [*_INT_COLUMNS, "attempt"]))
_F, _I = len(_FLOAT_COLUMNS), len(_INT_COLUMNS)
_NOT_SCALARS = (b'"', b"[", b"]", b"{", b"}")
ONLY_INTS = frozenset((int,))
"""``ONLY_INTS.issuperset(map(type, column))``: every value an int (not a bool), in C."""


class _NotPlain(ValueError):
    """A value that is not the JSON scalar its column takes."""


def _reject(_text: str) -> Any:
    raise _NotPlain


Entry = tuple[Any, list[Any] | None]
"""An entry as :mod:`amptrain.server.recorder.entries` takes it (id, flat fields)."""


def is_plain(flat: list[Any] | None) -> bool:
    """Whether an entry's fields are a one-device metric's, flat or packed, in the sink's
    order and bytes."""
    return flat is not None and flat[::2] in (PACKED_KEYS, KEYS) and flat[1] == b"metric"


def split(entries: list[Entry]) -> tuple[list[Entry], list[Entry]]:
    """The plain entries (:func:`is_plain`) and the rest, each in stream order. Nearly every
    batch is all plain: that is decided by two list comparisons in C (a call per entry
    was ~0.6 us a point)."""
    flats: list[Any] = [flat for _, flat in entries]
    n = len(flats)
    # the kinds are taken only once every entry holds one layout's fields (so a kind)
    layouts = list(map(_KEYS_OF, flats))
    if (layouts.count(PACKED_KEYS) == n or layouts.count(KEYS) == n) and list(
        map(_KIND_OF, flats)
    ).count(b"metric") == n:
        return entries, []
    plain: list[Entry] = []
    rest: list[Entry] = []
    for e in entries:
        (plain if is_plain(e[1]) else rest).append(e)
    return plain, rest


_KEYS_OF = itemgetter(slice(None, None, 2))
_KIND_OF = itemgetter(1)
_ID_OF = itemgetter(0)


def _scalars(values: list[bytes], **hooks: Any) -> list[Any]:
    doc = b",".join(values)
    # a byte search each (memchr), not a regular expression's scan: ~0.4 us a point
    if doc.count(b",") != len(values) - 1 or any(map(doc.__contains__, _NOT_SCALARS)):
        raise _NotPlain
    parsed: list[Any] = json.loads(b"[" + doc + b"]", **hooks)
    return parsed


def columns(job_id: str, entries: Sequence[tuple[Any, Any]]) -> PointColumns | None:
    """The points of plain metric entries (:func:`is_plain`, all of one layout) as columns,
    in stream order, holding what the per-entry route's rows hold; None when a value is not
    plain or the layouts are mixed (then that route decides)."""
    flats = [flat for _, flat in entries]
    n = len(flats)
    layouts = list(map(_KEYS_OF, flats))
    if layouts.count(PACKED_KEYS) == n:
        got = packed_points.columns(flats)
    else:
        got = _flat_columns(flats) if layouts.count(KEYS) == n else None
    try:
        # Entry ids come from Redis ("ms-seq", both integers): one document of their parts.
        ids = json.loads(b"[" + b",".join(map(_ID_OF, entries)).replace(b"-", b",") + b"]")
    except (ValueError, TypeError):  # str ids (tests)
        return None
    if got is None or len(ids) != 2 * n:
        return None
    return PointColumns(job_id, got[0], ids[::2], ids[1::2], got[1])


def _flat_columns(flats: list[Any]) -> tuple[list[int], dict[str, list[Any]]] | None:
    try:
        floats = _scalars(_flattened(map(_FLOATS_OF, flats)), parse_int=float)
        ints = _scalars(
            _flattened(map(_INTS_OF, flats)), parse_float=_reject, parse_constant=_reject
        )
    except (ValueError, TypeError):  # _NotPlain, not JSON at all, or str values (tests)
        return None
    attempts = ints[_I :: _I + 1]
    if not ONLY_INTS.issuperset(map(type, attempts)):
        return None  # true, false or null: the per-entry route drops the entry
    fields = {f: floats[i::_F] for i, f in enumerate(_FLOAT_COLUMNS)}
    fields.update((f, ints[i :: _I + 1]) for i, f in enumerate(_INT_COLUMNS))
    return attempts, fields


def _flattened(groups: Iterable[tuple[bytes, ...]]) -> list[bytes]:
    return list(chain.from_iterable(groups))
