"""Packed metric entries (:mod:`amptrain.contract.stream_pack`) as the recorder's points.

A batch's packed fields are one ``numpy.frombuffer`` of their concatenation: the fields'
columns are slices, turned into Python numbers by ``tolist`` in C, so a point costs no
text parsing at all. :func:`amptrain.server.recorder.entries.parse` of a step point's
entries, measured: 0.90 us a point in batches of 100 (3.11 flat), 0.80 in batches of 500
(3.05), 2.1 in batches of 10 (4.5). Both routes give what the flat form's give
(:mod:`amptrain.server.recorder.plain_points`, :func:`amptrain.server.recorder.entries.parse`):

* a float column's integer reads as a float, as SQL stores it;
* ``true``, ``false`` and ``null`` stay themselves in any column;
* an integer column holding a float (the flat form's ``int()`` fails on it) keeps every
  value of the entry as sent, as the flat form's ``decode`` fallback does: the batch
  takes the per-entry route (:func:`row_values`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from amptrain.contract.metrics import FLOAT_FIELDS, METRIC_FIELDS
from amptrain.contract.stream_pack import (
    CONSTANTS,
    COUNT,
    FIELD,
    FLOAT,
    HEADER,
    INT,
    INT_AT,
    SIZE,
    refusal,
    unpack,
)

if TYPE_CHECKING:
    import numpy

KEYS = [b"kind", b"job_id", b"attempt", FIELD.encode()]
"""The field names of a packed metric entry, in the sink's order (compared as one list)."""
NAMES = (FIELD.encode(), FIELD)
"""The packed field's name as hiredis gives it, and as tests pass it."""
_IS_FLOAT = [name in FLOAT_FIELDS for name in METRIC_FIELDS]
_ATTEMPT_OF = itemgetter(5)
_PACKED_OF = itemgetter(7)
_HEAD_OF = itemgetter(slice(HEADER))


def row_values(blob: Any) -> dict[str, Any]:
    """One packed entry's fields as the per-entry route's row holds them; ValueError when
    the field is not a packed field this recorder knows (the entry is dropped)."""
    values = unpack(blob)
    if any(type(values[i]) is float for i in INT_AT):
        return dict(zip(METRIC_FIELDS, values, strict=True))
    return {
        name: float(v) if is_float and type(v) is int else v
        for name, is_float, v in zip(METRIC_FIELDS, _IS_FLOAT, values, strict=True)
    }


@functools.cache
def _layouts() -> tuple[numpy.dtype[Any], numpy.dtype[Any]]:
    """The layout as numpy records: its slots read as float64, and as int64."""
    import numpy  # with the first batch, not at the API's start (as the reads load it)

    head = [("version", "u1"), ("codes", "u1", (COUNT,))]
    as_floats = numpy.dtype([*head, ("slots", "<f8", (COUNT,))])
    return as_floats, numpy.dtype([*head, ("slots", "<i8", (COUNT,))])


def columns(flats: Sequence[list[Any]]) -> tuple[list[int], dict[str, list[Any]]] | None:
    """The attempts and the field columns of packed entries (fields in :data:`KEYS`'
    layout), in stream order; None when one is odd (the per-entry route decides)."""
    blobs = list(map(_PACKED_OF, flats))
    try:
        attempts = list(map(int, map(_ATTEMPT_OF, flats)))
        data = b"".join(blobs)
    except (ValueError, TypeError):  # an attempt that is no integer, str fields (tests)
        return None
    if set(map(len, blobs)) != {SIZE}:
        return None
    import numpy

    heads = set(map(_HEAD_OF, blobs))  # nearly always one: each point's codes alike
    if not all(map(_readable, heads)):
        return None
    as_floats_layout, as_ints_layout = _layouts()
    as_floats = numpy.frombuffer(data, as_floats_layout)
    codes = as_floats["codes"]
    if len(heads) == 1:
        plan = _plan(heads.pop()[1:], _ALL)
    else:
        uniform = (codes == codes[0]).all(axis=0)  # per field: one code at every point
        plan = _plan(codes[0].tobytes(), uniform.tobytes())
    floats = as_floats["slots"]
    ints = numpy.frombuffer(data, as_ints_layout)["slots"]
    # One slice and tolist per kind of column, and the checks above on the points' headers
    # as bytes: numpy calls per column cost ~27 us a batch (~0.3 us a point in batches of
    # 100, a worker's flush), now ~11.
    fields: dict[str, list[Any]] = {}
    for (at, names), slots, as_float in (
        (plan.floats, floats, False),
        (plan.ints, ints, False),
        (plan.ints_as_floats, ints, True),  # int64 -> float64 rounds as float() of the int
    ):
        if at:
            got = slots[:, at].T
            got = got.astype(numpy.float64) if as_float else got
            fields.update(zip(names, got.tolist(), strict=True))
    fields.update((name, [CONSTANTS[code]] * len(blobs)) for name, code in plan.constants)
    for j in plan.mixed:  # rare: e.g. a null grad_norm at a skipped step
        numbers = ints[:, j].astype(numpy.float64) if _IS_FLOAT[j] else ints[:, j]
        fields[METRIC_FIELDS[j]] = _mixed(
            codes[:, j].tolist(), floats[:, j].tolist(), numbers.tolist()
        )
    return attempts, fields


@dataclass(frozen=True)
class _Plan:
    """How a batch's slots are read (each a list of slots and their fields' names), from
    its first point's codes and which fields have one code at every point."""

    floats: tuple[list[int], list[str]]
    ints: tuple[list[int], list[str]]
    ints_as_floats: tuple[list[int], list[str]]
    constants: list[tuple[str, int]]
    mixed: list[int]


@functools.lru_cache(maxsize=256)
def _readable(head: bytes) -> bool:
    """Whether this route reads the points whose packed fields start with ``head``: the
    packed form's rules (:func:`~amptrain.contract.stream_pack.refusal`), and no integer
    column holding a float (see the module docstring)."""
    return refusal(head) is None and all(head[1 + j] != FLOAT for j in INT_AT)


_ALL = b"\x01" * COUNT
"""Every field one code at every point (a batch of one header)."""


@functools.lru_cache(maxsize=256)
def _plan(first: bytes, uniform: bytes) -> _Plan:
    one = [j for j in range(COUNT) if uniform[j]]

    def slots(code: int, is_float: bool | None = None) -> tuple[list[int], list[str]]:
        at = [j for j in one if first[j] == code and is_float in (None, _IS_FLOAT[j])]
        return at, [METRIC_FIELDS[j] for j in at]

    return _Plan(
        floats=slots(FLOAT),
        ints=slots(INT, False),
        ints_as_floats=slots(INT, True),
        constants=[(METRIC_FIELDS[j], first[j]) for j in one if first[j] < FLOAT],
        mixed=[j for j in range(COUNT) if not uniform[j]],
    )


def _mixed(codes: list[int], floats: list[float], numbers: list[Any]) -> list[Any]:
    return [
        f if code == FLOAT else n if code == INT else CONSTANTS[code]
        for code, f, n in zip(codes, floats, numbers, strict=True)
    ]
