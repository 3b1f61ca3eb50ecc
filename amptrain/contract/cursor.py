"""The resume cursor: the one position type every reader and writer of a job's series uses.

A cursor is the Redis stream entry id ``"MS-SEQ"`` that a record (metric point
or event) was appended with, or ``"0-{id}"`` for an event of a job before its
first claim (no stream exists yet; see :mod:`amptrain.contract.stream`). SQL keeps
it with each recorded row, the live hub reads it from the stream, clients pass
it back as ``after=`` / ``Last-Event-ID`` and the WebSocket's ``?after=``: one
parse, one format, one order.
"""

from __future__ import annotations

import re
from typing import NamedTuple

INT64_MAX = 2**63 - 1
_TEXT = re.compile(r"([0-9]{1,19})-([0-9]{1,19})")
"""ASCII digits and the whole text: ``\\d`` takes any Unicode digit, ``$`` a final newline."""


class CursorError(ValueError):
    """A cursor that is not ``MS-SEQ`` with both parts in 0..2^63-1."""


class Cursor(NamedTuple):
    """A stream position; tuples order like stream ids (by ms, then seq)."""

    ms: int
    seq: int

    @classmethod
    def parse(cls, text: str | bytes) -> Cursor:
        """Strict: exactly ``MS-SEQ``, each part a non-negative int64 (the SQL columns' range)."""
        raw = text.decode() if isinstance(text, bytes) else text
        match = _TEXT.fullmatch(raw)
        if not match:
            raise CursorError(f"bad cursor {raw[:40]!r}: expected 'MS-SEQ'")
        ms, seq = int(match.group(1)), int(match.group(2))
        if ms > INT64_MAX or seq > INT64_MAX:
            raise CursorError(f"bad cursor {raw[:40]!r}: each part must be at most 2^63-1")
        return cls(ms, seq)

    @classmethod
    def of_entry(cls, entry_id: str | bytes) -> Cursor:
        """A stream entry id as Redis returns it (trusted: no range check needed)."""
        raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        ms, _, seq = raw.partition("-")
        return cls(int(ms), int(seq or 0))

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


ORIGIN = Cursor(0, 0)
"""Before every entry: ``after=0-0`` means from the start."""
