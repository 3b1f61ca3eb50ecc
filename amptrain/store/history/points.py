"""Reading the recorded metric series: cursor pages, the newest cursor, the effective series.

The cursor (:class:`amptrain.contract.cursor.Cursor`) is the Redis stream entry id the
point arrived with. The pages and the newest cursor read the chunks
(:mod:`~amptrain.store.history.chunk_pages`).

The chunk readers use numpy, imported with the first read: the API starts without it, and
the recorder and the Celery processes (:func:`recorded_through`, numpy-free) never load it. One recorder owns a job's stream at a time and commits in stream
order, so paging by ``(stream_ms, stream_seq)`` never repeats or skips a point.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy.orm import Session

from amptrain.contract.cursor import Cursor
from amptrain.store.history.chunk_index import recorded_through as recorded_through
from amptrain.store.history.chunk_parts import STEP_KIND

Attempts = Literal["effective", "all"]


@dataclass(frozen=True)
class Page:
    """Which part of a job's series a cursor page reads (the points' and the evaluations'
    alike): after ``after`` (a Cursor or its text; :class:`~amptrain.contract.cursor.CursorError`,
    a ValueError, on a bad one), up to ``upto`` (inclusive), at most ``limit`` items, of the
    ``effective`` series (per step the newest attempt's) or of ``all`` attempts."""

    after: Cursor | str | None = None
    limit: int = 1000
    attempts: Attempts = "effective"
    upto: Cursor | None = None
    start: Cursor | None = field(init=False, repr=False, compare=False)
    """``after`` parsed."""

    def __post_init__(self) -> None:
        after = Cursor.parse(self.after) if isinstance(self.after, str) else self.after
        object.__setattr__(self, "start", after)
        if self.attempts not in ("effective", "all"):
            raise ValueError(f"attempts must be 'effective' or 'all', not {self.attempts!r}")

    @property
    def effective(self) -> bool:
        return self.attempts == "effective"

    def next_cursor(self, items: Sequence[dict[str, Any]]) -> str | None:
        """The last item's cursor, or ``after`` when the page is empty, so a client polling a
        running job keeps passing it back."""
        return items[-1]["cursor"] if items else None if self.start is None else str(self.start)


FIRST = Page()
"""The series from its start, 1000 items, effective."""


def metric_page(
    s: Session, job_id: str, page: Page = FIRST
) -> tuple[list[dict[str, Any]], str | None]:
    """The points of ``page`` in recording order, as dicts of STORED_METRIC_FIELDS +
    ``attempt`` + ``cursor``; ``effective`` keeps, for each step, only the newest attempt's
    point (the series after a resume), ``all`` every attempt's. And ``next_cursor``
    (:meth:`Page.next_cursor`). Read from the chunks that can hold the page."""
    from amptrain.store.history import chunk_pages, chunk_reads
    from amptrain.store.history.chunk_pages import POINT_SERIES

    rec = chunk_reads.by_cursor(
        s, job_id, STEP_KIND, page.start, page.upto, page.limit, page.effective, POINT_SERIES
    )
    items = chunk_pages.point_dicts(rec, chunk_pages.nan_is_null(s))
    return items, page.next_cursor(items)


def newest_cursor(s: Session, job_id: str, kind: str = STEP_KIND) -> Cursor | None:
    """The cursor of the job's most recently recorded ``kind`` record (a point by default,
    or a named kind's record); None before the first."""
    from amptrain.store.history import chunk_pages

    found = chunk_pages.newest(s, job_id, kind)
    return None if found is None else found[0]
