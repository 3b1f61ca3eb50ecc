"""The packed form of a one-device ``metric`` entry: the step's values in one binary field.

The flat form (one text field per metric value, :func:`amptrain.contract.stream.encode`)
cost the recorder about 1.2 us a point in hiredis (~32 fields) and 2.5 us turning the
texts into numbers. Packed, an entry has four fields -- ``kind``, ``job_id``, ``attempt``
and :data:`FIELD` -- and a batch of them is read with one ``numpy.frombuffer``
(:mod:`amptrain.server.recorder.packed_points`). Measured on 500 entries of a step point:
hiredis 0.37 us a point (1.17 flat), the batch's columns 0.47 us in a first cut (2.46
flat), and the worker's encoding 2.2 us (4.5 flat). One JSON array field was the other
candidate: as small (252 bytes an entry with its id, 265 packed, 497 flat) and as cheap
for hiredis, but its ``json.loads`` and the float columns' checks cost as much as the flat
texts' (2.65 us).

Layout, version 1 (:data:`VERSION`), little-endian, :data:`SIZE` bytes:

* byte 0: the version. A reader that does not know it drops the entry as undecodable
  (so a later version can reorder or add fields: it bumps this byte, and the readers
  that know it are deployed before the workers that write it);
* one type code per field of :data:`~amptrain.contract.metrics.METRIC_FIELDS`, in that
  table's order: :data:`NULL`, :data:`FALSE`, :data:`TRUE`, :data:`FLOAT`, :data:`INT`;
* an 8-byte slot per field, in the same order: a float64 (``FLOAT``), an int64 (``INT``)
  or zero.

The codes keep what the flat form's JSON scalars keep: an int stays an int in a float
field (``loss_scale=65536``), ``true``/``false``/``null`` stay themselves, NaN and
+-Infinity are the floats (every NaN as ``math.nan``, as ``json.loads("NaN")`` gives it).
What the layout cannot carry exactly -- an int beyond 64 bits, any other type, the
data-parallel fields (:data:`~amptrain.contract.metrics.PARALLEL_METRIC_FIELDS`) -- makes
:func:`pack` return None, and the entry is written flat.

Standard library only (the worker imports it): :mod:`struct`.
"""

from __future__ import annotations

import math
import struct
from typing import Any

from amptrain.contract.metrics import FLOAT_FIELDS, METRIC_FIELDS

FIELD = "packed"
"""The name of the entry's packed field."""
VERSION = 1
NULL, FALSE, TRUE, FLOAT, INT = range(5)
CONSTANTS: tuple[Any, ...] = (None, False, True)
"""The value of each code below :data:`FLOAT`."""
COUNT = len(METRIC_FIELDS)
HEADER = 1 + COUNT
"""The version byte and the type codes; the slots follow."""
SIZE = HEADER + 8 * COUNT
INT_AT: tuple[int, ...] = tuple(i for i, f in enumerate(METRIC_FIELDS) if f not in FLOAT_FIELDS)
"""The slots of the integer (and boolean) fields."""

_INT64 = range(-(2**63), 2**63)
_FLOATS = struct.Struct(f"<{COUNT}d")
_INTS = struct.Struct(f"<{COUNT}q")
_LAYOUTS: dict[str, struct.Struct] = {}
"""One :class:`struct.Struct` per sequence of slot kinds (a run has a handful)."""


def pack(item: dict[str, Any]) -> bytes | None:
    """A one-device metric record's values as :data:`FIELD`'s bytes; None when one of them
    is not a None, bool, int64 or float (the entry is then written flat)."""
    codes: list[int] = []
    slots: list[Any] = []
    kinds: list[str] = []
    for name in METRIC_FIELDS:
        v = item.get(name)
        t = type(v)
        if t is float:
            codes.append(FLOAT)
            slots.append(v if v == v else math.nan)  # one NaN, as the flat form's "NaN"
            kinds.append("d")
        elif t is int and v in _INT64:
            codes.append(INT)
            slots.append(v)
            kinds.append("q")
        elif v is None or t is bool:
            codes.append(NULL if v is None else TRUE if v else FALSE)
            slots.append(0)
            kinds.append("q")
        else:
            return None
    layout = "".join(kinds)
    packer = _LAYOUTS.get(layout)
    if packer is None:
        if len(_LAYOUTS) > 256:  # bounded whatever a run sends
            _LAYOUTS.clear()
        packer = _LAYOUTS[layout] = struct.Struct(f"<B{COUNT}B{layout}")
    return packer.pack(VERSION, *codes, *slots)


def refusal(head: bytes) -> str | None:
    """Why a packed field that starts with ``head`` (its :data:`HEADER` bytes: the version
    and the type codes) cannot be read here, or None when it can: the one statement of
    these rules. :func:`check` raises it; the recorder's batch route asks it once per
    distinct header of a batch (:mod:`amptrain.server.recorder.packed_points`)."""
    if head[0] != VERSION:
        return f"packed metric field of unknown version {head[0]}"
    code = max(head[1:HEADER])
    if code > INT:
        return f"packed metric field with type code {code}"
    return None


def check(blob: Any) -> bytes:
    """``blob`` if it is a packed field this reader knows (bytes of :data:`SIZE`, and
    :func:`refusal` finds nothing), else ValueError (the entry is undecodable: logged and
    dropped, like a flat entry whose text is not JSON)."""
    if not isinstance(blob, bytes):
        raise ValueError(f"packed metric field of type {type(blob).__name__}, not bytes")
    if len(blob) != SIZE:
        raise ValueError(f"packed metric field of {len(blob)} bytes, not {SIZE}")
    why = refusal(blob[:HEADER])
    if why is not None:
        raise ValueError(why)
    return blob


def unpack(blob: Any) -> list[Any]:
    """The values of a packed field, in :data:`~amptrain.contract.metrics.METRIC_FIELDS`'
    order, as the flat form's ``json.loads`` gives them; ValueError when it is not one
    (:func:`check`)."""
    check(blob)
    floats = _FLOATS.unpack_from(blob, HEADER)
    ints = _INTS.unpack_from(blob, HEADER)
    return [
        f if code == FLOAT else i if code == INT else CONSTANTS[code]
        for code, f, i in zip(blob[1:HEADER], floats, ints, strict=True)
    ]
