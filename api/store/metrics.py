"""Reading the recorded metric series: cursor pages and the persisted watermark.

The cursor is the Redis stream entry id ``"ms-seq"`` the point arrived with. One
recorder owns a job's stream at a time and commits in stream order, so paging by
``(stream_ms, stream_seq)`` never repeats or skips a point.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.orm import Session, aliased

from api.store.models import MetricPoint
from trainer_core.contract.records import METRIC_FIELDS

Attempts = Literal["effective", "all"]
_CURSOR = re.compile(r"^(\d{1,19})-(\d{1,19})$")


def parse_cursor(cursor: str) -> tuple[int, int]:
    """``"ms-seq"`` -> ``(ms, seq)``; ValueError for anything else."""
    match = _CURSOR.match(cursor)
    if not match:
        raise ValueError(f"bad metrics cursor {cursor!r}: expected 'MS-SEQ'")
    return int(match.group(1)), int(match.group(2))


def format_cursor(ms: int, seq: int) -> str:
    return f"{ms}-{seq}"


def metric_page(
    s: Session,
    job_id: str,
    after: str | None = None,
    limit: int = 1000,
    attempts: Attempts = "effective",
) -> tuple[list[dict[str, Any]], str | None]:
    """Points after ``after`` in recording order, as dicts of METRIC_FIELDS + ``attempt`` +
    ``cursor``. ``effective`` keeps, for each step, only the newest attempt's point (the
    series after a resume); ``all`` returns every attempt's points.

    ``next_cursor`` is the last item's cursor, or ``after`` when the page is empty, so a
    client polling a running job keeps passing it back. Raises ValueError on a bad cursor.
    """
    p = MetricPoint
    query = sa.select(p).where(p.job_id == job_id)
    if after is not None:
        ms, seq = parse_cursor(after)
        query = query.where(sa.tuple_(p.stream_ms, p.stream_seq) > sa.tuple_(ms, seq))
    if attempts == "effective":
        newer = aliased(MetricPoint)
        query = query.where(
            ~sa.exists().where(
                newer.job_id == p.job_id, newer.step == p.step, newer.attempt > p.attempt
            )
        )
    elif attempts != "all":
        raise ValueError(f"attempts must be 'effective' or 'all', not {attempts!r}")
    rows = s.scalars(query.order_by(p.stream_ms, p.stream_seq).limit(limit)).all()
    items = [point_dict(r) for r in rows]
    return items, (items[-1]["cursor"] if items else after)


def point_dict(row: MetricPoint) -> dict[str, Any]:
    out: dict[str, Any] = {f: getattr(row, f) for f in METRIC_FIELDS}
    out["attempt"] = row.attempt
    out["cursor"] = format_cursor(row.stream_ms, row.stream_seq)
    return out


def recorded_watermark(s: Session, job_id: str, attempt: int, first_step: int = 1) -> int:
    """The highest step S such that every step ``first_step..S`` of this attempt is in SQL
    (``first_step - 1`` when ``first_step`` itself is missing). A publisher that lost its
    Redis re-sends whatever lies above it."""
    p = MetricPoint
    mine = (p.job_id == job_id, p.attempt == attempt)
    has_first = s.scalar(sa.select(p.id).where(*mine, p.step == first_step).limit(1))
    if has_first is None:
        return first_step - 1
    nxt = aliased(MetricPoint)
    gap_before = ~sa.exists().where(
        nxt.job_id == job_id, nxt.attempt == attempt, nxt.step == p.step + 1
    )
    end = s.scalar(sa.select(sa.func.min(p.step)).where(*mine, p.step >= first_step, gap_before))
    return int(end) if end is not None else first_step - 1
