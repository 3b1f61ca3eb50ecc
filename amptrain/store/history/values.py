"""Reading the recorded named series (their chunks): cursor pages of one kind's
series (:data:`~amptrain.contract.metrics.VALUE_KINDS`: the evaluations by default, or the
per-layer gradient norms); every read names its kind.

An item is one record (an evaluation, or one step's layer norms) as it arrived: ``step``, ``attempt``, ``time``, ``cursor`` (its
stream entry id, the same :class:`~amptrain.contract.cursor.Cursor` as the metric points
and events) and ``values`` (name -> value, null when not finite). A page holds whole
records: it is cut by records, never between two names of one record.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from amptrain.contract.cursor import Cursor
from amptrain.contract.metrics import EVAL_KIND
from amptrain.store.history import points
from amptrain.store.history.points import FIRST, Page


def eval_page(
    s: Session, job_id: str, page: Page = FIRST, kind: str = EVAL_KIND
) -> tuple[list[dict[str, Any]], str | None]:
    """The ``kind`` records of ``page`` (whole records: up to ``limit`` of them) in recording
    order. ``effective`` keeps, per step and name, only the newest attempt's value (a record
    whose every value was re-evaluated by a newer attempt disappears); ``all`` keeps every
    attempt's. ``next_cursor`` as for the metric points (:meth:`Page.next_cursor`). Read
    from the chunks that can hold the page."""
    # numpy with the first read, not at the API's start (amptrain.store.history.points).
    from amptrain.store.history import chunk_pages, chunk_reads

    rec = chunk_reads.by_cursor(s, job_id, kind, page.start, page.upto, page.limit, page.effective)
    items = chunk_pages.named_items(rec, chunk_pages.nan_is_null(s))
    return items, page.next_cursor(items)


def newest_record_size(s: Session, job_id: str, kind: str = EVAL_KIND) -> int:
    """How many named values the job's newest ``kind`` record holds (its layers, for layer
    norms); 0 before the first. A few index reads, whatever the run's length."""
    from amptrain.store.history import chunk_pages

    return chunk_pages.record_size(s, job_id, kind)


def newest_cursor(s: Session, job_id: str, kind: str = EVAL_KIND) -> Cursor | None:
    """The cursor of the job's most recently recorded ``kind`` record (None before the first)."""
    return points.newest_cursor(s, job_id, kind)
