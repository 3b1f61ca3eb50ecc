"""A cursor page of a named kind read while the recorder commits: a record under a name new
to the job, committed between the page's statements (each sees its own snapshot, on both databases),
comes whole, now or on the next page, never without that value and never passed over."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.metrics import EVAL_KIND
from amptrain.store.history import rollups
from amptrain.store.history.points import Page
from amptrain.store.history.values import eval_page
from tests.store.history.test_downsample import new_job

T0 = 1_700_000_000_000


def record(sessions: sessionmaker[Session], job_id: str, steps: range, names: list[str]) -> None:
    rows: list[dict[str, Any]] = [
        {
            "kind": EVAL_KIND,
            "job_id": job_id,
            "attempt": 1,
            "step": step,
            "name": name,
            "value": step / (i + 1),
            "time": (T0 + step) / 1000,
            "stream_ms": T0 + step,
            "stream_seq": 0,
        }
        for step in steps
        for i, name in enumerate(names)
    ]
    with sessions.begin() as s:
        rollups.record(s, [], rows)  # as the recorder: one transaction


def test_a_page_read_across_a_commit_of_a_new_name_loses_no_value(
    db: tuple[sa.Engine, sessionmaker[Session]],
) -> None:
    engine, sessions = db
    job_id = new_job(sessions)
    record(sessions, job_id, range(10, 51, 10), ["eval_loss"])
    state = {"names_read": False, "committed": False}

    def commit_after_the_names(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        # the statement after the page's first read of the names: the recorder commits
        # evaluations carrying a name the job never had, before that statement runs
        if state["committed"]:
            return
        if "WITH RECURSIVE n(name)" in statement:
            state["names_read"] = True
        elif state["names_read"]:
            state["committed"] = True
            record(sessions, job_id, range(60, 101, 10), ["eval_loss", "accuracy"])

    sa.event.listen(engine, "before_cursor_execute", commit_after_the_names)
    try:
        with sessions() as s:
            first, cursor = eval_page(s, job_id, Page(limit=10_000))
    finally:
        sa.event.remove(engine, "before_cursor_execute", commit_after_the_names)
    assert state["committed"]
    with sessions() as s:
        rest, _ = eval_page(s, job_id, Page(after=cursor, limit=10_000))
        whole, _ = eval_page(s, job_id, Page(limit=10_000))
    assert len(whole) == 10 and all(len(e["values"]) == 2 for e in whole if e["step"] >= 60)
    assert first + rest == whole  # every record once, each with every value it was given
