"""The recorder's batches: many jobs and attempts in one transaction, against real Redis and
SQL (SQLite and PostgreSQL)."""

from __future__ import annotations

import math

import pytest
import redis
from prometheus_client import REGISTRY
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.progress import STEADY_WINDOW
from amptrain.core.redis import Keys
from amptrain.server.recorder.service import GROUP, Recorder
from amptrain.store import jobs
from tests.server.recorder.test_recorder import (
    crash_before_ack,
    job,
    point,
    publish,
    rows,
    start_job,
    wait_for,
)

Sessions = sessionmaker[Session]


def resumed_job(sf: Sessions) -> str:
    """A job on its second attempt (the first one's lease expired)."""
    job_id, _ = start_job(sf, lease_s=-1)
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w2", 30) == 2
    return job_id


def publish_all(r: redis.Redis, sf: Sessions, plan: dict[str, list[tuple[int, int]]]) -> None:
    """Interleave the jobs' entries: each job gets its (attempt, step)s in order."""
    longest = max(map(len, plan.values()))
    for i in range(longest):
        for job_id, keys in plan.items():
            if i < len(keys):
                attempt, step = keys[i]
                publish(r, job_id, attempt, [point(step, loss=float(attempt * 1000 + step))])


def batches_committed() -> float:
    return REGISTRY.get_sample_value("amptrain_recorder_batches_total") or 0.0


def stored(sf: Sessions, job_id: str) -> list[tuple[int, int, float | None]]:
    return [(p.attempt, p.step, p.loss) for p in rows(sf, job_id)]


def test_many_jobs_and_attempts_in_one_transaction_exactly_once(
    sf: Sessions, r: redis.Redis
) -> None:
    plain = [start_job(sf)[0] for _ in range(4)]
    resumed = resumed_job(sf)
    # The resumed job: attempt 1's points 1-8, attempt 2 from step 5, a straggler of attempt 1.
    plan = {j: [(1, s) for s in range(1, 31)] for j in plain}
    plan[resumed] = [(1, s) for s in range(1, 9)] + [(2, s) for s in range(5, 16)] + [(1, 9)]
    publish_all(r, sf, plan)
    rec = Recorder(None, sf, r)
    before = batches_committed()
    assert rec.drain_once() == sum(map(len, plan.values()))
    assert batches_committed() == before + 1  # every job's entries in one transaction

    for job_id, keys in plan.items():
        got = stored(sf, job_id)
        assert got == [(a, s, float(a * 1000 + s)) for a, s in keys]  # once each, stream order
        assert r.xpending(Keys.telemetry(job_id), GROUP)["pending"] == 0
        last = r.xrevrange(Keys.telemetry(job_id), count=1)[0][0]  # type: ignore[index]
        assert r.get(Keys.recorded(job_id)) == last  # publishers may forget what SQL holds
    for job_id in plain:
        assert job(sf, job_id).step == 30 and job(sf, job_id).summary["loss"] == 1030.0
    # The current attempt's newest point, not attempt 1's straggler.
    assert job(sf, resumed).step == 15 and job(sf, resumed).summary["loss"] == 2015.0

    # Everything re-sent (a worker after a Redis blip): delivered, inserts and moves nothing.
    ids = {j: [p.cursor for p in rows(sf, j)] for j in plan}
    publish_all(r, sf, plan)
    assert rec.drain_once() == sum(map(len, plan.values()))
    assert {j: [p.cursor for p in rows(sf, j)] for j in plan} == ids
    assert job(sf, resumed).step == 15 and job(sf, resumed).summary["loss"] == 2015.0
    assert job(sf, plain[0]).step == 30


def test_crash_between_commit_and_ack_loses_and_duplicates_nothing(
    sf: Sessions, r: redis.Redis
) -> None:
    job_ids = [start_job(sf)[0] for _ in range(3)] + [resumed_job(sf)]
    plan = {j: [(job(sf, j).attempt, s) for s in range(1, 41)] for j in job_ids}
    publish_all(r, sf, plan)
    crashed = crash_before_ack(Recorder(None, sf, r, lock_ttl_ms=200))
    with pytest.raises(RuntimeError):
        crashed.drain_once()
    for job_id in job_ids:
        assert len(rows(sf, job_id)) == 40  # committed, never acknowledged
        assert r.xpending(Keys.telemetry(job_id), GROUP)["pending"] == 40
    more = {j: [(a, s + 40) for a, s in keys[:10]] for j, keys in plan.items()}
    publish_all(r, sf, more)

    # A restarted process waits out the dead one's locks, takes the pending entries over
    # (re-delivered: they insert nothing), then reads on.
    survivor = Recorder(None, sf, r)
    wait_for(lambda: survivor.drain_once() >= 0 and len(survivor.owned) == len(job_ids))
    survivor.drain_once()
    for job_id in job_ids:
        assert [s for _, s, _ in stored(sf, job_id)] == list(range(1, 51))
        assert r.xpending(Keys.telemetry(job_id), GROUP)["pending"] == 0
        assert job(sf, job_id).step == 50


def test_non_finite_and_missing_values_survive(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    nan, inf = float("nan"), float("inf")
    publish(
        r,
        job_id,
        attempt,
        [
            point(1, loss=nan, grad_norm=inf, lr=-inf, skipped=True, loss_scale=None),
            point(2, loss=inf, memory_peak=None, time=None, skipped=None),
            point(3, loss=2.5e-300, memory_peak=2**62, samples_per_second=0),
        ],
    )
    Recorder(None, sf, r).drain_once()
    p1, p2, p3 = rows(sf, job_id)
    if sf.kw["bind"].dialect.name == "sqlite":
        assert p1.loss is None  # SQLite stores NaN as NULL
    else:
        assert p1.loss is not None and math.isnan(p1.loss)
    assert (p1.grad_norm, p1.lr, p1.skipped, p1.loss_scale) == (inf, -inf, True, None)
    assert (p2.loss, p2.memory_peak, p2.time, p2.skipped) == (inf, None, None, None)
    assert (p3.loss, p3.memory_peak, p3.samples_per_second) == (2.5e-300, 2**62, 0.0)
    assert p3.memory_allocated == 30 and p3.skipped is False
    summary = job(sf, job_id).summary
    assert summary["memory_peak"] == 2**62
    assert summary["samples_per_second"] == pytest.approx((101 + 102 + 0) / 3)  # steady
    # The cursor of every point is its stream entry id.
    assert [p.cursor for p in rows(sf, job_id)] == [
        eid.decode()  # type: ignore[union-attr]
        for eid, _ in r.xrange(Keys.telemetry(job_id))  # type: ignore[union-attr]
    ]


def test_the_summary_shows_the_steady_rate_of_the_last_steps_not_the_newest_step(
    sf: Sessions, r: redis.Redis
) -> None:
    job_id, attempt = start_job(sf)
    # A run whose every tenth step waited on something: 10 ms at 100 samples/s, 1 ms at
    # 1000 the rest. The newest step's 1000 samples/s is not what it sustains.
    steps = range(1, STEADY_WINDOW + 51)
    slow = {step: step % 10 == 0 for step in steps}
    publish(
        r,
        job_id,
        attempt,
        [
            point(
                step,
                samples_per_second=100.0 if slow[step] else 1000.0,
                step_time_ms=10.0 if slow[step] else 1.0,
            )
            for step in steps
        ],
    )
    Recorder(None, sf, r).drain_once()
    last = list(steps)[-STEADY_WINDOW:]
    samples = float(len(last))  # one sample a step: 100/s x 10 ms, or 1000/s x 1 ms
    seconds = sum(10.0 if slow[i] else 1.0 for i in last) / 1000
    summary = job(sf, job_id).summary
    assert summary["samples_per_second"] == pytest.approx(samples / seconds)  # 100/0.19 s
