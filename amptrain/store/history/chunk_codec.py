"""How one chunk of a series is packed into its ``metric_chunks.data`` BLOB / ``bytea``.

A chunk holds the values of one series of one attempt at the steps of one aligned block of
:data:`CHUNK_STEPS` steps (``chunk = step // CHUNK_STEPS``). The bytes are, little-endian:

- a header ``<BBH``: format version (:data:`VERSION`), flags, the number of values ``n``;
- for a named series (flag :data:`ORDER`): a uint16, the name's place in the records
  that carry it (a page lists a record's values in the order they were recorded);
- when the steps are not ``first_step .. first_step + n - 1`` (flag :data:`GAPS`): ``n``
  uint8 offsets of each step from the chunk's first aligned step (a chunk spans 256 steps);
- when some values were null (flag :data:`NULLS`): ``n`` bytes, 1 for a null value (stored
  as NaN among the values);
- the values as float64, byte-shuffled (every value's byte 0, then every byte 1, ...) and,
  once the chunk is closed (flag :data:`PACKED`: its last aligned step recorded, or
  written by the migration), compressed with zlib level 1: the filter Blosc and HDF5 use
  for slowly varying floats. An open chunk is rewritten by every recorder batch that
  reaches it, so it is compressed once, when it closes, not at every rewrite.

Why float64 and not float32: the store must give back exactly what was recorded (``lr``,
``time``, memory byte counts and ``samples_per_second`` are not float32 numbers, and every
read must return what it returned before). A value that came from a float32 tensor (loss,
grad norms, layer norms) has four zero mantissa bytes, which the shuffle turns into runs
zlib removes; a constant or slowly moving series (lr, memory, the wall clock) compresses
to a byte or two a value. NaN and the infinities keep their bit patterns.
"""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from dataclasses import dataclass
from typing import TypeAlias

VERSION = 1
"""Bumped when the layout changes; a reader refuses a version it does not know."""
CHUNK_STEPS = 256
"""Steps per aligned chunk: offsets fit a byte, and an open chunk rewritten per recorder
batch stays a few KiB."""
GAPS = 1
NULLS = 2
PACKED = 4
ORDER = 8
HEADER = struct.Struct("<BBH")
POSITION = struct.Struct("<H")
_SWAP = sys.byteorder != "little"

Steps: TypeAlias = "array[int] | range"
"""A chunk's steps: a ``range`` when they are consecutive (nearly every chunk: the recorder
extends an open chunk's range without building an array of its steps), else an array."""


@dataclass(frozen=True, slots=True)
class Decoded:
    """A chunk's steps (ascending), values (NaN where null) and null flags (None when no
    value is null). Standard-library types: the recorder (an API process) does without
    numpy; a reader wraps the arrays with ``numpy.frombuffer`` at no cost."""

    steps: Steps
    values: array[float]
    nulls: bytes | None
    """One byte a value, 1 where null."""
    position: int | None = None
    """A named series: the name's place in its records (None: a step series, or a chunk
    written before the place was kept)."""


def encode(
    first_aligned: int,
    steps: Steps,
    values: array[float],
    nulls: bytes | None,
    pack: bool,
    position: int | None = None,
) -> bytes:
    """Pack ascending ``steps`` (all in ``first_aligned .. first_aligned + 255``), their
    ``values`` (typecode ``d``), null flags and a named series' ``position``; ``pack``:
    compress (a closed chunk)."""
    n = len(steps)
    flags = 0
    parts: list[bytes] = []
    if position is not None:
        flags |= ORDER
        parts.append(POSITION.pack(position))
    if n and steps[-1] - steps[0] + 1 != n:
        flags |= GAPS
        parts.append(bytes(s - first_aligned for s in steps))
    elif n:
        parts.append(bytes((steps[0] - first_aligned,)))  # contiguous: the first is enough
    if nulls is not None and any(nulls):
        flags |= NULLS
        parts.append(nulls)
    if _SWAP:
        values = array("d", values)
        values.byteswap()
    raw = values.tobytes()
    shuffled = b"".join(raw[i::8] for i in range(8))
    if pack:
        flags |= PACKED
        shuffled = zlib.compress(shuffled, 1)
    parts.append(shuffled)
    return HEADER.pack(VERSION, flags, n) + b"".join(parts)


def header(data: bytes) -> tuple[int, int, int | None, int]:
    """A chunk's flags, number of values, name place (None without :data:`ORDER`) and the
    offset of what follows the header; ValueError for a format version not known here.
    Every decoder (this module's, and the numpy readers') starts here."""
    version, flags, n = HEADER.unpack_from(data)
    if version != VERSION:
        raise ValueError(f"metric chunk format {version} is not known to this version")
    pos = HEADER.size
    position = None
    if flags & ORDER:
        (position,) = POSITION.unpack_from(data, pos)
        pos += POSITION.size
    return flags, n, position, pos


def decode(first_aligned: int, data: bytes) -> Decoded:
    """The inverse of :func:`encode`."""
    flags, n, position, pos = header(data)
    if flags & GAPS:
        steps: Steps = array("q", (first_aligned + o for o in data[pos : pos + n]))
        pos += n
    elif n:
        start = first_aligned + data[pos]
        steps = range(start, start + n)
        pos += 1
    else:
        steps = range(first_aligned, first_aligned)
    nulls = None
    if flags & NULLS:
        nulls = data[pos : pos + n]
        pos += n
    shuffled = zlib.decompress(data[pos:]) if flags & PACKED else data[pos:]
    raw = bytearray(8 * n)
    for i in range(8):
        raw[i::8] = shuffled[i * n : (i + 1) * n]
    values = array("d")
    values.frombytes(raw)
    if _SWAP:
        values.byteswap()
    return Decoded(steps, values, nulls, position)
