"""Migration 0020: the roll-ups no read takes (the reserved series', but a named kind's
cursor) are deleted; every other roll-up and every read stay as they were."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from amptrain.contract.metrics import EVAL_KIND
from amptrain.store import migrate
from amptrain.store.db import make_engine, make_session_factory
from amptrain.store.history.chunk_parts import MS, SEQ, STEP_KIND, TIME, rank
from amptrain.store.history.downsample import series_window
from amptrain.store.history.rollups import COLUMNS
from tests.store.history.test_chunk_window import as_json, retried_run

# What revision 0016's recorder kept beside the read series (faked as copies of the
# loss's roll-ups), and whether 0020 keeps it: only a named kind's cursor is read.
OLD = [(STEP_KIND, MS, False), (STEP_KIND, SEQ, False), (STEP_KIND, rank(0), False)]
OLD += [(EVAL_KIND, SEQ, False), (EVAL_KIND, TIME, False), (EVAL_KIND, MS, True)]


def rollups(engine: sa.Engine) -> set[tuple[Any, ...]]:
    with engine.connect() as conn:
        return set(
            map(tuple, conn.execute(sa.text(f"SELECT {', '.join(COLUMNS)} FROM metric_rollups")))
        )


def test_the_unread_rollups_go_and_every_read_stays(database_url: str) -> None:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    try:
        sessions = make_session_factory(engine)
        job_id = retried_run(sessions, 5)
        asked = [(7, {}), (300, {"from_step": 1700, "to_step": 2700})]
        with sessions() as s:
            before = [as_json(series_window(s, job_id, n, **kw)) for n, kw in asked]
        read = rollups(engine)
        assert read and not any(r[2].startswith("@") for r in read)

        migrate.downgrade(database_url, "0019")
        copies = ", ".join(c if c not in ("kind", "name") else f":{c}" for c in COLUMNS)
        copy = sa.text(
            f"INSERT INTO metric_rollups ({', '.join(COLUMNS)}) SELECT {copies} "
            "FROM metric_rollups WHERE kind = 'step' AND name = 'loss'"
        )
        with engine.begin() as conn:
            for kind, name, _ in OLD:
                conn.execute(copy, {"kind": kind, "name": name})
        old = rollups(engine)
        losses = sum(r[1:3] == (STEP_KIND, "loss") for r in read)
        assert len(old) == len(read) + losses * len(OLD)

        migrate.upgrade(database_url)
        kept = {(kind, name) for kind, name, stays in OLD if stays}
        after = rollups(engine)
        assert after == read | {r for r in old if r[1:3] in kept}
        assert len(after) == len(read) + losses  # the copies as the eval cursor's stay
        with sessions() as s:
            assert [as_json(series_window(s, job_id, n, **kw)) for n, kw in asked] == before
        migrate.upgrade(database_url)  # nothing left to do
        assert rollups(engine) == after
    finally:
        engine.dispose()
