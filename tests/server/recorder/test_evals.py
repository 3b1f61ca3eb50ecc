"""Eval records through the recorder: named values in their chunks, exactly once, in
the same transaction as the points, and the job's newest evaluation (``eval_summary``)."""

from __future__ import annotations

import pytest
import redis

from amptrain.contract.records import evaluation
from amptrain.core.redis import Keys
from amptrain.server.recorder.service import GROUP, Recorder
from amptrain.store import jobs
from amptrain.store.history.points import Page
from amptrain.store.history.values import eval_page
from tests.server.recorder.test_recorder import (
    Sessions,
    crash_before_ack,
    job,
    point,
    publish,
    rows,
    start_job,
    wait_for,
)


def values(sf: Sessions, job_id: str) -> list[tuple[int, int, str, float | None, str]]:
    """Every attempt's recorded eval values in stream order, as the chunks hold them."""
    with sf() as s:
        got, _ = eval_page(s, job_id, Page(limit=10**6, attempts="all"))
    return [
        (i["attempt"], i["step"], name, value, i["cursor"])
        for i in got
        for name, value in i["values"].items()
    ]


def test_eval_values_recorded_once_across_a_crash_and_a_re_send(
    sf: Sessions, r: redis.Redis
) -> None:
    job_id, attempt = start_job(sf)
    ev = evaluation(10, 1010.0, {"eval_loss": 0.5, "accuracy": 0.8})
    publish(r, job_id, attempt, [point(i) for i in range(1, 11)])
    (eid,) = publish(r, job_id, attempt, [ev])
    publish(r, job_id, attempt, [point(11)])

    # Committed, never acknowledged: the restarted recorder replays all of it.
    crashed = crash_before_ack(Recorder(None, sf, r, lock_ttl_ms=200))
    with pytest.raises(RuntimeError):
        crashed.drain_once()
    assert len(values(sf, job_id)) == 2 and len(rows(sf, job_id)) == 11
    survivor = Recorder(None, sf, r)
    wait_for(lambda: survivor.drain_once() > 0 or job_id in survivor.owned)
    survivor.drain_once()
    assert r.xpending(Keys.telemetry(job_id), GROUP)["pending"] == 0

    # The worker re-sends it after Redis lost data: a new entry id, nothing new in SQL.
    publish(r, job_id, attempt, [ev])
    assert survivor.drain_once() == 1
    assert values(sf, job_id) == [
        (attempt, 10, "eval_loss", 0.5, eid),
        (attempt, 10, "accuracy", 0.8, eid),
    ]
    j = job(sf, job_id)
    assert j.eval_summary == {
        "step": 10,
        "attempt": attempt,
        "values": {"accuracy": 0.8, "eval_loss": 0.5},
    }
    assert j.step == 11  # the metric summary kept its own column


def test_eval_series_effective_after_a_resume_and_odd_values(sf: Sessions, r: redis.Redis) -> None:
    job_id, _ = start_job(sf, lease_s=-1)  # lease already expired: the next claim takes over
    publish(r, job_id, 1, [evaluation(s, 1000.0 + s, {"eval_loss": 1.0 / s}) for s in (5, 10)])
    publish(r, job_id, 1, [evaluation(15, 1015.0, {"eval_loss": 0.01, "accuracy": 0.5})])
    rec = Recorder(None, sf, r)
    rec.drain_once()
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w2", 30) == 2
    # Attempt 2 resumed from step 5: it re-evaluates step 10 (a plugin's name among them).
    odd = {"eval_loss": float("nan"), "my_plugin_score": 3, "accuracy": True}
    publish(r, job_id, 2, [evaluation(10, 2010.0, odd)])
    # Undecodable: dropped alone, the rest of the batch is recorded.
    bad = {"kind": "eval", "job_id": job_id, "attempt": "2", "step": "x", "values": "{}"}
    r.xadd(Keys.telemetry(job_id), bad)  # type: ignore[arg-type]
    bad_name = {**bad, "step": "11", "values": '{"Bad Name": 1}'}
    r.xadd(Keys.telemetry(job_id), bad_name)  # type: ignore[arg-type]
    publish(r, job_id, 2, [evaluation(12, 2012.0, {"eval_loss": 0.2})])
    rec.drain_once()

    with sf() as s:
        eff, cursor = eval_page(s, job_id, Page(limit=100))
        every, _ = eval_page(s, job_id, Page(limit=100, attempts="all"))
        pages, after = [], None
        for _ in range(10):
            page, after = eval_page(s, job_id, Page(after, limit=1))
            if not page:
                break
            pages += page
    assert [(i["step"], i["attempt"], i["values"]) for i in eff] == [
        (5, 1, {"eval_loss": 0.2}),
        (15, 1, {"eval_loss": 0.01, "accuracy": 0.5}),
        (10, 2, {"eval_loss": None, "my_plugin_score": 3.0, "accuracy": None}),
        (12, 2, {"eval_loss": 0.2}),
    ]
    assert len(every) == 5 and pages == eff and cursor == eff[-1]["cursor"]
    # The newest attempt's newest evaluation, though attempt 1 evaluated a later step.
    assert job(sf, job_id).eval_summary == {
        "step": 12,
        "attempt": 2,
        "values": {"eval_loss": 0.2},
    }
