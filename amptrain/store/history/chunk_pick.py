"""The values at a few chosen steps (a downsampled window's points), read from the chunks
without decoding them whole.

A window of a long run chooses about one step per chunk: every chosen step costs one chunk
of each series, so decoding whole chunks (un-shuffling 256 values to keep one) and joining
256 records per chunk to keep one dominated the read (0.5 s for 1,000 points of 15
series). Here only each chunk's header is parsed, in Python, and the wanted values'
bytes are gathered from all chunks' shuffled values by one numpy indexing, per series and
attempt (:func:`load_at`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy
from sqlalchemy.orm import Session

from amptrain.store.history import chunk_codec, chunk_load
from amptrain.store.history.chunk_codec import CHUNK_STEPS
from amptrain.store.history.chunk_load import Chunk, Decoded, Loaded
from amptrain.store.history.chunk_parts import SHIFT


class _Picked:
    """What one (series, attempt) holds at the wanted steps, gathered chunk by chunk."""

    __slots__ = ("chunk", "nulls", "position", "steps", "values")

    def __init__(self, chunk: int, position: int | None) -> None:
        self.chunk = chunk
        """The first chunk read (the one whose place in the records counts)."""
        self.position = position
        self.steps: list[int] = []
        self.values: list[bytes] = []
        """Each value's 8 bytes (little-endian float64)."""
        self.nulls: list[int] = []


def load_at(
    s: Session, job_id: str, kind: str, names: Sequence[str], steps: numpy.ndarray
) -> Loaded:
    """Every attempt's values of the ``names`` series of ``kind`` at ``steps`` (sorted,
    unique, int64), one :class:`~amptrain.store.history.chunk_load.Chunk` per series and
    attempt (keyed by its first chunk read): only the values at ``steps``."""
    offsets: dict[int, list[int]] = {}
    for step in steps.tolist():
        offsets.setdefault(step >> SHIFT, []).append(step & (CHUNK_STEPS - 1))
    picked: dict[tuple[str, int], _Picked] = {}
    where: dict[tuple[int, bytes | int, int], tuple[list[int], list[int]]] = {}
    for (name, chunk, attempt), data in chunk_load.fetch(s, job_id, kind, names, list(offsets)):
        flags, n, position, pos = chunk_codec.header(data)
        # the steps a chunk holds: its offsets (GAPS) or its first offset; the same for
        # every series of a record, so found once per chunk, not per series
        spec: bytes | int
        if flags & chunk_codec.GAPS:
            spec, pos = data[pos : pos + n], pos + n
        else:
            spec, pos = (data[pos], pos + 1) if n else (0, pos)
        found = where.get((chunk, spec, n))
        if found is None:
            found = where[(chunk, spec, n)] = _where(chunk, spec, n, offsets[chunk])
        at, held = found
        if not at:
            continue
        nulls = data[pos : pos + n] if flags & chunk_codec.NULLS else None
        pos += n if nulls is not None else 0
        raw = zlib.decompress(data[pos:]) if flags & chunk_codec.PACKED else data[pos:]
        p = picked.get((name, attempt))
        if p is None:
            p = picked[(name, attempt)] = _Picked(chunk, position)
        elif chunk < p.chunk:
            p.chunk, p.position = chunk, position
        p.steps.extend(held)
        # value i's byte b lies at b * n + i (the codec's byte shuffle): a strided slice
        p.values.extend([raw[i::n] for i in at])
        p.nulls.extend([nulls[i] for i in at] if nulls is not None else [0] * len(at))
    out: dict[tuple[str, int, int], Chunk] = {}
    for (name, attempt), p in sorted(picked.items()):
        values = numpy.frombuffer(b"".join(p.values), "<f8").astype(numpy.float64)
        at_steps = numpy.asarray(p.steps, numpy.int64)
        order = numpy.argsort(at_steps, kind="stable")
        nulls_of = numpy.asarray(p.nulls, bool)[order]
        out[(name, p.chunk, attempt)] = Chunk(
            at_steps[order], values[order], nulls_of if nulls_of.any() else None, p.position
        )
    return Decoded.of(out)


def _where(chunk: int, spec: bytes | int, n: int, want: list[int]) -> tuple[list[int], list[int]]:
    """Where in a chunk of ``n`` values the wanted offsets lie, and their steps; ``spec``:
    the chunk's step offsets, or its first offset when its steps are consecutive."""
    if isinstance(spec, bytes):
        at = [i for o in want if (i := spec.find(o)) >= 0]
        offsets = [spec[i] for i in at]
    else:
        at = [o - spec for o in want if 0 <= o - spec < n]
        offsets = [spec + i for i in at]
    base = chunk * CHUNK_STEPS
    return at, [base + o for o in offsets]
