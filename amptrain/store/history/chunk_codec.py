"""How one chunk of a series is packed into its ``metric_chunks.data`` BLOB / ``bytea``.

A chunk holds the values of one series of one attempt at the steps of one aligned block of
:data:`CHUNK_STEPS` steps (``chunk = step // CHUNK_STEPS``). The bytes are, little-endian:

- a header ``<BBH``: format version (:data:`VERSION`), flags, the number of values ``n``;
- when the steps are not ``first_step .. first_step + n - 1`` (flag :data:`GAPS`): ``n``
  uint8 offsets of each step from the chunk's first aligned step (a chunk spans 256 steps);
- when some values were null (flag :data:`NULLS`): ``ceil(n / 8)`` bytes of
  ``numpy.packbits`` of the null mask (a null value is stored as NaN beside it);
- the values as float64, byte-shuffled (every value's byte 0, then every byte 1, ...) and
  compressed with zlib level 1: the filter Blosc and HDF5 use for slowly varying floats.

Why float64 and not float32: the store must give back exactly what was recorded (``lr``,
``time``, memory byte counts and ``samples_per_second`` are not float32 numbers, and every
read must return what it returned before). A value that came from a float32 tensor (loss,
grad norms, layer norms) has four zero mantissa bytes, which the shuffle turns into runs
zlib removes; a constant or slowly moving series (lr, memory, the wall clock) compresses
to a byte or two a value. NaN and the infinities keep their bit patterns.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

VERSION = 1
"""Bumped when the layout changes; a reader refuses a version it does not know."""
CHUNK_STEPS = 256
"""Steps per aligned chunk: offsets fit a byte, and an open chunk rewritten per recorder
batch stays a few KiB."""
GAPS = 1
NULLS = 2
_HEADER = struct.Struct("<BBH")


@dataclass(frozen=True, slots=True)
class Decoded:
    """A chunk's steps (int64, ascending), values (float64; NaN where null) and null mask
    (None when no value is null)."""

    steps: np.ndarray
    values: np.ndarray
    nulls: np.ndarray | None


def encode(first_aligned: int, steps: np.ndarray, values: np.ndarray, nulls: np.ndarray) -> bytes:
    """Pack ascending ``steps`` (all in ``first_aligned .. first_aligned + 255``), their
    float64 ``values`` and boolean ``nulls``."""
    n = len(steps)
    flags = 0
    parts: list[bytes] = []
    offsets = steps - first_aligned
    if n and not (offsets[-1] - offsets[0] + 1 == n):
        flags |= GAPS
        parts.append(offsets.astype(np.uint8).tobytes())
    elif n:
        parts.append(bytes((int(offsets[0]),)))  # contiguous: the first offset is enough
    if nulls.any():
        flags |= NULLS
        parts.append(np.packbits(nulls).tobytes())
    raw = np.ascontiguousarray(values, dtype="<f8").view(np.uint8).reshape(n, 8)
    parts.append(zlib.compress(raw.T.tobytes(), 1))
    return _HEADER.pack(VERSION, flags, n) + b"".join(parts)


def decode(first_aligned: int, data: bytes) -> Decoded:
    """The inverse of :func:`encode`."""
    version, flags, n = _HEADER.unpack_from(data)
    if version != VERSION:
        raise ValueError(f"metric chunk format {version} is not known to this version")
    pos = _HEADER.size
    if flags & GAPS:
        offsets = np.frombuffer(data, np.uint8, n, pos).astype(np.int64)
        pos += n
    else:
        start = data[pos] if n else 0
        offsets = np.arange(start, start + n, dtype=np.int64)
        pos += 1 if n else 0
    nulls = None
    if flags & NULLS:
        size = (n + 7) // 8
        nulls = np.unpackbits(np.frombuffer(data, np.uint8, size, pos), count=n).astype(bool)
        pos += size
    shuffled = np.frombuffer(zlib.decompress(data[pos:]), np.uint8).reshape(8, n)
    values = np.ascontiguousarray(shuffled.T).view("<f8").reshape(n)
    return Decoded(offsets + first_aligned, values.astype(np.float64), nulls)
