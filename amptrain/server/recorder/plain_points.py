"""The recorder's common case decoded a batch at a time: metric entries exactly as the
worker's sink writes them (:func:`amptrain.contract.stream.encode` of a one-device step).

A field-by-field loop in Python cost about 6 us a point (a fifth of the recorder's CPU).
Here a job's batch is two JSON documents, its float columns and its integer columns, each
parsed by ``json.loads`` in C, and the rows built from the parsed columns in C too (a
Python loop turn per row was half of what was left). Every value either parses as the JSON
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
import re
from collections.abc import Iterable, Sequence
from itertools import chain, repeat
from operator import itemgetter
from typing import Any

from amptrain.contract.metrics import FLOAT_FIELDS, METRIC_FIELDS, STORED_METRIC_FIELDS

KEYS = [b"kind", b"job_id", b"attempt", *(f.encode() for f in METRIC_FIELDS)]
"""The field names of a plain metric entry, in the sink's order (compared as one list)."""
_FLOAT_COLUMNS = [f for f in METRIC_FIELDS if f in FLOAT_FIELDS]
_INT_COLUMNS = [f for f in METRIC_FIELDS if f not in FLOAT_FIELDS]
_VALUE_AT = {f: 2 * i + 1 for i, f in enumerate(k.decode() for k in KEYS)}
_FLOATS_OF = itemgetter(*(_VALUE_AT[f] for f in _FLOAT_COLUMNS))
# The attempt last: each row takes its integer columns, then its attempt.
_INTS_OF = itemgetter(*(_VALUE_AT[f] for f in [*_INT_COLUMNS, "attempt"]))
_F, _I = len(_FLOAT_COLUMNS), len(_INT_COLUMNS)
_ROW_KEYS = (*STORED_METRIC_FIELDS, "job_id", "attempt", "stream_ms", "stream_seq")
_NOT_SCALARS = re.compile(rb'["\[\]{}]')


class _NotPlain(ValueError):
    """A value that is not the JSON scalar its column takes."""


def _reject(_text: str) -> Any:
    raise _NotPlain


def is_plain(flat: list[Any] | None) -> bool:
    """Whether an entry's fields are a one-device metric's, in the sink's order and bytes."""
    return flat is not None and flat[::2] == KEYS and flat[1] == b"metric"


def _scalars(values: list[bytes], **hooks: Any) -> list[Any]:
    doc = b",".join(values)
    if doc.count(b",") != len(values) - 1 or _NOT_SCALARS.search(doc):
        raise _NotPlain
    parsed: list[Any] = json.loads(b"[" + doc + b"]", **hooks)
    return parsed


def rows(job_id: str, entries: Sequence[tuple[Any, Any]]) -> list[dict[str, Any]] | None:
    """The rows of plain metric entries (:func:`is_plain`), in stream order, as the
    per-entry route makes them; None when a value is not plain (then that route decides)."""
    flats = [flat for _, flat in entries]
    n = len(flats)
    try:
        floats = _scalars(_flattened(map(_FLOATS_OF, flats)), parse_int=float)
        ints = _scalars(
            _flattened(map(_INTS_OF, flats)), parse_float=_reject, parse_constant=_reject
        )
        # Entry ids come from Redis ("ms-seq", both integers): one document of their parts.
        ids = json.loads(b"[" + b",".join(eid for eid, _ in entries).replace(b"-", b",") + b"]")
    except (ValueError, TypeError):  # _NotPlain, not JSON at all, or str ids (tests)
        return None
    attempts = ints[_I :: _I + 1]
    if len(ids) != 2 * n or not all(type(a) is int for a in attempts):
        return None  # true, false or null: the per-entry route drops the entry
    # One column per key of a row (the per-entry route's order: every stored field, then
    # job, attempt and cursor), and the rows built from them in C: a Python loop turn
    # per row was most of this function's time.
    # (The fields a plain entry lacks share one endless repeat of None.)
    columns: dict[str, Iterable[Any]] = dict.fromkeys(_ROW_KEYS, repeat(None))
    columns.update((f, floats[i::_F]) for i, f in enumerate(_FLOAT_COLUMNS))
    columns.update((f, ints[i :: _I + 1]) for i, f in enumerate(_INT_COLUMNS))
    columns.update(
        job_id=repeat(job_id), attempt=attempts, stream_ms=ids[::2], stream_seq=ids[1::2]
    )
    # Every column holds n values or repeats one (not strict: the repeats never end).
    return list(map(dict, map(zip, repeat(_ROW_KEYS), zip(*columns.values(), strict=False))))


def _flattened(groups: Iterable[tuple[bytes, ...]]) -> list[bytes]:
    return list(chain.from_iterable(groups))
