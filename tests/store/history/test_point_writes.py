"""The recorder's bulk point inserts stay inside the caller's transaction on every path:
a batch's points become visible with its events and progress, at its one commit, and a
rolled-back batch (the recorder lost the job's ownership) leaves no point behind."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.store import recording
from amptrain.store.history.point_writes import PG_METHODS
from amptrain.store.models import MetricPoint
from tests.store.history.test_summaries import new_job, series

Sessions = sessionmaker[Session]


def visible(sessions: Sessions, job_id: str) -> int:
    with sessions() as other:
        return int(
            other.scalar(
                sa.select(sa.func.count())
                .select_from(MetricPoint)
                .where(MetricPoint.job_id == job_id)
            )
            or 0
        )


@pytest.mark.parametrize("method", [None, *PG_METHODS])
@pytest.mark.parametrize("replay", [False, True], ids=["new", "replay"])
def test_points_wait_for_the_callers_commit_and_go_with_its_rollback(
    db: tuple[sa.Engine, Sessions], method: str | None, replay: bool
) -> None:
    engine, sessions = db
    if method is not None and engine.dialect.name != "postgresql":
        pytest.skip("a PostgreSQL insert path")
    job_id = new_job(sessions)
    rows = series(job_id, list(range(1, 51)))
    if replay:  # the first half already recorded: the conflict path (COPY's fallback)
        with sessions.begin() as s:
            recording.insert_points(s, rows[:25], method)
    before = visible(sessions, job_id)

    with sessions() as s:
        # As in the recorder: the points are the transaction's first statement.
        inserted = recording.insert_points(s, rows, method)
        assert len(inserted[job_id]) == 50 - before
        assert visible(sessions, job_id) == before  # nothing shows before the commit
        s.rollback()
    assert visible(sessions, job_id) == before  # and a rollback keeps nothing

    with sessions() as s:
        recording.insert_points(s, rows, method)
        s.commit()
    assert visible(sessions, job_id) == 50
