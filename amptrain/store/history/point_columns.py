"""A job's step points as columns: the recorder's common batch (plain metric entries,
:mod:`amptrain.server.recorder.plain_points`) as one list per field, in stream order,
instead of a dict per point.

A dict of ~15 keys per point, then one pass over the points per series to gather each
chunk's values, was most of the recorder's CPU per point; the columns go to the chunks
(:func:`amptrain.store.history.chunk_parts.collect`) by slicing. :meth:`PointColumns.rows`
gives the points as the per-entry route's rows (the key order of :data:`ROW_KEYS`), for
the rare reader that wants them (an alert rule's window, tests).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from amptrain.contract.metrics import STORED_METRIC_FIELDS

ROW_KEYS = (*STORED_METRIC_FIELDS, "job_id", "attempt", "stream_ms", "stream_seq")
"""The keys of a point's row, in the per-entry route's order (every stored field, then job,
attempt and cursor)."""


@dataclass(slots=True)
class PointColumns:
    """One job's points, each list in stream order and of one length."""

    job_id: str
    attempts: list[int]
    stream_ms: list[int]
    stream_seq: list[int]
    fields: dict[str, list[Any]]
    """The stored fields the entries carry (``step`` among them; a field absent here is
    null at every point), each a column of values as decoded."""

    @property
    def steps(self) -> list[int]:
        return self.fields["step"]

    def __len__(self) -> int:
        return len(self.attempts)

    def column(self, name: str) -> Sequence[Any]:
        """A field's values (None at every point where the entries lack the field)."""
        got = self.fields.get(name)
        return [None] * len(self) if got is None else got

    def take(self, at: Iterable[int]) -> PointColumns:
        """The points at the indices ``at``, in that order."""
        at = list(at)
        return PointColumns(
            self.job_id,
            [self.attempts[i] for i in at],
            [self.stream_ms[i] for i in at],
            [self.stream_seq[i] for i in at],
            {name: [col[i] for i in at] for name, col in self.fields.items()},
        )

    def row(self, i: int) -> dict[str, Any]:
        """The row of point ``i``."""
        return self.take([i]).rows()[0]

    def rows(self) -> list[dict[str, Any]]:
        """Every point's row, in stream order (built in C: a Python loop turn per row was
        half of building them)."""
        columns: dict[str, Iterable[Any]] = dict.fromkeys(ROW_KEYS, repeat(None))
        columns.update(self.fields)
        columns.update(
            job_id=repeat(self.job_id),
            attempt=self.attempts,
            stream_ms=self.stream_ms,
            stream_seq=self.stream_seq,
        )
        # Every column holds n values or repeats one (not strict: the repeats never end).
        return list(map(dict, map(zip, repeat(ROW_KEYS), zip(*columns.values(), strict=False))))
