"""A watcher's SQL history read while the recorder commits: everything up to the end the
read fixed, points, evaluations and events, and nothing of it twice."""

from __future__ import annotations

import asyncio
from itertools import chain
from typing import Any

import pytest

from amptrain.contract.cursor import ORIGIN
from amptrain.contract.records import evaluation, event, metric
from amptrain.contract.stream import encode
from amptrain.server.live.history import History
from amptrain.server.recorder.entries import parse
from amptrain.store import events, jobs, migrate, recording
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history import rollups
from tests.support.history_data import new_job


def record(sessions: Any, job_id: str, items: list[tuple[str, dict[str, Any]]]) -> None:
    """One recorder batch: ``(entry id, record)`` pairs in stream order, one commit."""
    flat = [(eid, list(chain(*encode(i, job_id=job_id, attempt=1).items()))) for eid, i in items]
    batch = parse(job_id, flat)
    with sessions.begin() as s:
        rollups.record(s, batch.points, batch.values)
        recording.insert_events(s, batch.events)


def test_a_batch_committed_during_the_read_is_seen_whole(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    sessions = make_session_factory(engine)
    job_id = new_job(sessions)
    with sessions.begin() as s:
        assert jobs.claim(s, job_id, "w", 600) == 1
    record(sessions, job_id, [("1000-0", metric(step=1, time=1.0, loss=1.0))])

    # The recorder commits its next batch (an evaluation, then an event) after the read
    # has looked for the newest point and evaluation, before it reads the events.
    events_after = events.events_after

    def after_a_commit(s: Any, job: str, cursor: Any) -> Any:
        if not committed:
            committed.append(True)
            record(
                sessions,
                job_id,
                [
                    ("2000-0", evaluation(1, 2.0, {"eval_loss": 0.5})),
                    ("2000-1", event("checkpoint", 1, 2.0)),
                ],
            )
        return events_after(s, job, cursor)

    committed: list[bool] = []
    monkeypatch.setattr(events, "events_after", after_a_commit)

    async def read() -> list[tuple[str, str]]:
        return [
            (str(c), kind) async for c, kind, _ in History(sessions, job_id, 1000).after(ORIGIN)
        ]

    got = asyncio.run(read())
    engine.dispose()
    assert committed
    assert [g for g in got if not g[0].startswith("0-")] == [
        ("1000-0", "metric"),
        ("2000-0", "eval"),
        ("2000-1", "event"),
    ]
