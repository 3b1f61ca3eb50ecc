"""The recorder against a real Redis and real SQLite / PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.cursor import ORIGIN, Cursor
from amptrain.contract.metrics import STORED_METRIC_FIELDS
from amptrain.contract.records import event, metric
from amptrain.contract.spec import JobSpec
from amptrain.contract.stream import decode, encode
from amptrain.core.redis import Keys
from amptrain.server.recorder.service import GROUP, Recorder
from amptrain.store import events, jobs
from amptrain.store.history import chunk_table
from amptrain.store.history import points as metrics
from amptrain.store.models import Job, JobEvent

Sessions = sessionmaker[Session]


def start_job(sf: Sessions, lease_s: float = 30) -> tuple[str, int]:
    spec = JobSpec.model_validate(
        {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "max_steps": 100}
    )
    with sf.begin() as s:
        job_id = jobs.create_job(s, spec, "alice", "cpu").id
    with sf.begin() as s:
        attempt = jobs.claim(s, job_id, "w1", lease_s)
    assert attempt is not None
    return job_id, attempt


def point(step: int, **kw: Any) -> dict[str, Any]:
    values = {
        "time": 1000.0 + step,
        "loss": 1.0 / step,
        "loss_scale": 65536.0,
        "skipped": False,
        "grad_norm": 0.5,
        "lr": 1e-3,
        "memory_allocated": 10 * step,
        "memory_reserved": 20 * step,
        "memory_peak": 30 * step,
        "samples_per_second": 100.0 + step,
        "step_time_ms": 5.0,
        "skipped_steps": 0,
    }
    values.update(kw)
    return metric(step=step, **values)


def publish(
    r: redis.Redis, job_id: str, attempt: int, items: list[dict[str, Any]], **kw: Any
) -> list[str]:
    ids = []
    for item in items:
        fields = encode(item, job_id=job_id, attempt=attempt, **kw)
        ids.append(r.xadd(Keys.telemetry(job_id), fields).decode())  # type: ignore[arg-type,union-attr]
    return ids


def open_chunks(sf: Sessions, job_id: str) -> dict[Any, int]:
    with sf() as s:
        return chunk_table.open_chunks(s, job_id)


def end_entry(status: str) -> dict[str, Any]:
    return {"kind": "end", "status": status}


def rows(sf: Sessions, job_id: str) -> list[SimpleNamespace]:
    """Every attempt's recorded points in stream order, as the chunks hold them (a point's
    fields as attributes, ``stream_ms``/``stream_seq`` its cursor)."""
    with sf() as s:
        got, _ = metrics.metric_page(s, job_id, metrics.Page(limit=10**6, attempts="all"))
    out = []
    for p in got:
        ms, seq = p["cursor"].split("-")
        out.append(SimpleNamespace(**p, stream_ms=int(ms), stream_seq=int(seq)))
    return out


def job(sf: Sessions, job_id: str) -> Job:
    with sf() as s:
        found = s.get(Job, job_id)
        assert found is not None
        return found


def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def crash_before_ack(rec: Recorder) -> Recorder:
    """The process dies after its transaction committed, before Redis heard of it."""

    def crash(*args: Any) -> None:
        raise RuntimeError("simulated crash between commit and XACK")

    rec.group.ack = crash  # type: ignore[method-assign,assignment]
    return rec


def test_drain_records_points_events_and_summary(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    ids = publish(r, job_id, attempt, [point(i) for i in range(1, 21)])
    publish(r, job_id, attempt, [event("checkpoint", 20, 1020.0, path="x")])
    started = publish(r, job_id, attempt, [event("started", 0, 1000.0)])
    rec = Recorder(None, sf, r)
    assert rec.drain_once() == 22

    got = rows(sf, job_id)
    assert [p.step for p in got] == list(range(1, 21))
    assert [f"{p.stream_ms}-{p.stream_seq}" for p in got] == ids
    assert (
        got[4].memory_peak == 150 and got[4].skipped is False and got[4].loss == pytest.approx(0.2)
    )
    j = job(sf, job_id)
    assert j.step == 20
    assert j.summary == {
        "loss": pytest.approx(0.05),
        "loss_scale": 65536.0,
        "skipped_steps": 0,
        "memory_peak": 600,
        # Steady: steps 3-20 (never the first 10%) at 103-120 samples/s, 5 ms each.
        "samples_per_second": 111.5,
    }
    with sf() as s:
        evs = s.execute(
            sa.select(JobEvent.type, JobEvent.source_id).where(JobEvent.job_id == job_id)
        )
        types = sorted((t, src is not None) for t, src in evs)
        source = s.scalar(sa.select(JobEvent.source_id).where(JobEvent.type == "started"))
    # queued (create_job, before any stream) + the engine's checkpoint + the supervisor's
    # started: every stream event is recorded once, with its entry id as its cursor.
    assert types == [("checkpoint", True), ("queued", False), ("started", True)]
    assert source == started[0]
    assert r.xpending(Keys.telemetry(job_id), GROUP)["pending"] == 0


def test_metric_page_cursor_returns_each_point_once(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    publish(r, job_id, attempt, [point(i) for i in range(1, 24)])
    Recorder(None, sf, r).drain_once()
    seen: list[int] = []
    cursor = None
    with sf() as s:
        for _ in range(10):
            items, cursor = metrics.metric_page(s, job_id, metrics.Page(cursor, limit=7))
            seen += [i["step"] for i in items]
            if not items:
                break
        first, _ = metrics.metric_page(s, job_id, metrics.Page(limit=1))
        assert set(first[0]) == {*STORED_METRIC_FIELDS, "attempt", "cursor"}
        assert first[0]["attempt"] == attempt
        with pytest.raises(ValueError):
            metrics.metric_page(s, job_id, metrics.Page("garbage", limit=5))
    assert seen == list(range(1, 24))
    assert cursor is not None  # an empty page hands back the cursor it was given


def test_replay_and_redelivery_insert_nothing(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    items = [point(i) for i in range(1, 11)]
    publish(r, job_id, attempt, items)

    crashed = crash_before_ack(Recorder(None, sf, r, lock_ttl_ms=200))
    with pytest.raises(RuntimeError):
        crashed.drain_once()
    assert len(rows(sf, job_id)) == 10  # committed, never acknowledged
    assert r.xpending(Keys.telemetry(job_id), GROUP)["pending"] == 10

    # A restarted process (new consumer) waits out the dead one's lock, then takes its
    # pending entries over: they are re-delivered and insert nothing.
    survivor = Recorder(None, sf, r)
    wait_for(lambda: survivor.drain_once() > 0 or job_id in survivor.owned)
    survivor.drain_once()
    assert r.xpending(Keys.telemetry(job_id), GROUP)["pending"] == 0
    assert len(rows(sf, job_id)) == 10

    # The same records published again (a worker re-sending after a Redis blip):
    # nothing new, and step/summary do not move back.
    publish(r, job_id, attempt, items[:5])
    assert survivor.drain_once() == 5
    assert [p.step for p in rows(sf, job_id)] == list(range(1, 11))
    assert job(sf, job_id).step == 10


def test_two_recorders_never_both_own_a_job(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    publish(r, job_id, attempt, [point(i) for i in range(1, 6)])
    a, b = Recorder(None, sf, r), Recorder(None, sf, r)
    assert a.drain_once() == 5
    assert b.drain_once() == 0 and job_id not in b.owned
    publish(r, job_id, attempt, [point(i) for i in range(6, 9)])
    assert b.drain_once() == 0
    assert a.drain_once() == 3
    a.close()  # e.g. an API process shutting down hands over at once
    publish(r, job_id, attempt, [point(9)])
    assert b.drain_once() == 1 and job_id in b.owned
    assert [p.step for p in rows(sf, job_id)] == list(range(1, 10))


def test_concurrent_recorders_commit_each_stream_in_order(sf: Sessions, r: redis.Redis) -> None:
    started = [start_job(sf) for _ in range(3)]
    stop = threading.Event()
    recorders = [Recorder(None, sf, r, block_ms=50, lock_ttl_ms=2000) for _ in range(2)]
    threads = [threading.Thread(target=rec.run, args=(stop,)) for rec in recorders]
    for t in threads:
        t.start()
    try:
        for batch in range(5):
            for job_id, attempt in started:
                publish(r, job_id, attempt, [point(batch * 20 + i) for i in range(1, 21)])
        wait_for(lambda: all(len(rows(sf, j)) == 100 for j, _ in started))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    for job_id, _ in started:
        got = rows(sf, job_id)
        # Insertion order (id) == stream order == step order: the cursor never skips.
        assert [p.step for p in got] == list(range(1, 101))
        assert [(p.stream_ms, p.stream_seq) for p in got] == sorted(
            (p.stream_ms, p.stream_seq) for p in got
        )
        assert r.get(Keys.recorder_owner(job_id)) is None  # released on stop


def test_consumer_group_recreated_after_redis_lost_its_data(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    publish(r, job_id, attempt, [point(i) for i in range(1, 6)])
    rec = Recorder(None, sf, r)
    assert rec.drain_once() == 5
    r.flushall()
    # The worker re-sends what it still retains (here more than SQL lacks).
    assert [p.step for p in rows(sf, job_id)] == [1, 2, 3, 4, 5]
    publish(r, job_id, attempt, [point(i) for i in range(4, 11)])
    assert rec.drain_once() == 7
    assert [p.step for p in rows(sf, job_id)] == list(range(1, 11))
    assert r.xinfo_groups(Keys.telemetry(job_id))[0]["name"] == GROUP.encode()


def test_end_entry_closes_the_stream(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    publish(r, job_id, attempt, [point(1), point(2)])
    rec = Recorder(None, sf, r)
    # An end entry while the job is still active (a re-queue) does not close anything.
    publish(r, job_id, attempt, [end_entry("queued")])
    rec.drain_once()
    assert job(sf, job_id).telemetry_done is False
    assert open_chunks(sf, job_id)  # each series' newest chunk, while the job may record
    recorded = rows(sf, job_id)
    with sf.begin() as s:
        assert jobs.finish(s, job_id, attempt, "succeeded")
    publish(r, job_id, attempt, [end_entry("succeeded")])
    rec.drain_once()
    assert job(sf, job_id).telemetry_done is True
    assert 0 < r.ttl(Keys.telemetry(job_id)) <= 3600
    assert r.get(Keys.recorder_owner(job_id)) is None and job_id not in rec.owned
    # The ended telemetry's chunks are closed (packed), and read the same.
    assert rows(sf, job_id) == recorded and [p.step for p in recorded] == [1, 2]
    assert not open_chunks(sf, job_id)


def test_finished_job_without_end_entry_is_swept(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    publish(r, job_id, attempt, [point(1)])
    with sf.begin() as s:
        assert jobs.finish(s, job_id, attempt, "failed", {"code": "worker_lost", "message": "m"})
    patient = Recorder(None, sf, r, finished_grace_s=3600)
    patient.drain_once()
    assert job(sf, job_id).telemetry_done is False  # still within the grace period
    patient.close()
    assert open_chunks(sf, job_id)
    Recorder(None, sf, r, finished_grace_s=0).drain_once()
    assert job(sf, job_id).telemetry_done is True
    assert len(rows(sf, job_id)) == 1 and not open_chunks(sf, job_id)


def test_effective_series_after_a_resume(sf: Sessions, r: redis.Redis) -> None:
    job_id, _ = start_job(sf, lease_s=-1)  # lease already expired: the next claim takes over
    publish(r, job_id, 1, [point(i) for i in range(1, 11)])
    rec = Recorder(None, sf, r)
    rec.drain_once()
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w2", 30) == 2
    publish(r, job_id, 2, [point(i, loss=9.0) for i in range(6, 13)])
    publish(r, job_id, 1, [point(11, loss=7.0)])  # a straggler from the fenced attempt
    rec.drain_once()
    with sf() as s:
        eff, _ = metrics.metric_page(s, job_id, metrics.Page(limit=100))
        every, _ = metrics.metric_page(s, job_id, metrics.Page(limit=100, attempts="all"))
    assert [(i["step"], i["attempt"]) for i in eff] == [(i, 1) for i in range(1, 6)] + [
        (i, 2) for i in range(6, 13)
    ]
    assert len(every) == 18
    j = job(sf, job_id)
    assert j.step == 12 and j.summary["loss"] == 9.0  # the straggler did not move them


def test_non_finite_values_are_stored(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    publish(r, job_id, attempt, [point(1, loss=float("nan"), skipped=True, grad_norm=None)])
    Recorder(None, sf, r).drain_once()
    (p,) = rows(sf, job_id)
    assert p.skipped is True and p.grad_norm is None
    assert job(sf, job_id).summary["loss"] is None


def test_run_loop_records_until_stopped(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    stop = threading.Event()
    rec = Recorder(None, sf, r, block_ms=100)
    thread = threading.Thread(target=rec.run, args=(stop,))
    thread.start()
    try:
        for i in range(1, 31):
            publish(r, job_id, attempt, [point(i)])
        wait_for(lambda: len(rows(sf, job_id)) == 30)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert job(sf, job_id).step == 30


def test_an_event_the_api_wrote_gets_one_stream_cursor(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf, lease_s=-1)  # the worker is gone: its lease expired
    publish(r, job_id, attempt, [point(1), point(2)])
    with sf.begin() as s:  # the reconciler: status and the event explaining it, in SQL
        assert jobs.reap_expired(s, job_id, attempt) == "queued"
    rec = Recorder(None, sf, r)
    rec.drain_once()
    entries = [(eid.decode(), decode(f)) for eid, f in r.xrange(Keys.telemetry(job_id))]
    relayed = [(eid, item) for eid, item in entries if item["kind"] == "event"]
    assert [item["type"] for _, item in relayed] == ["warning"]
    assert entries[-1][0] == relayed[0][0]  # after the attempt's points, like live watchers
    with sf() as s:
        warning = s.scalars(sa.select(JobEvent).where(JobEvent.type == "warning")).one()
        assert relayed[0][1]["id"] == warning.id
        assert warning.source_id == relayed[0][0]  # history shows it at its stream cursor
    assert rec.drain_once() == 0  # appended once: nothing more to read or relay
    assert r.xlen(Keys.telemetry(job_id)) == 3


def test_a_job_never_claimed_has_no_stream(sf: Sessions, r: redis.Redis) -> None:
    spec = JobSpec.model_validate(
        {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "max_steps": 10}
    )
    with sf.begin() as s:
        job_id = jobs.create_job(s, spec, "alice", "cpu").id
    with sf.begin() as s:
        assert jobs.request_cancel(s, job_id) == "cancelled"
    Recorder(None, sf, r).drain_once()
    assert not r.exists(Keys.telemetry(job_id))
    with sf() as s:
        found = events.events_after(s, job_id, ORIGIN)
    # queued, then cancelled: cursors "0-{id}", before any stream entry could be.
    assert [e["type"] for _, e in found] == ["queued", "cancelled"]
    assert [c for c, _ in found] == [Cursor(0, e["id"]) for _, e in found]


def test_an_event_re_sent_after_redis_lost_data_is_recorded_once(
    sf: Sessions, r: redis.Redis
) -> None:
    job_id, attempt = start_job(sf)
    started = event("started", 0, 1000.0, worker="w")
    publish(r, job_id, attempt, [started, point(1)])
    rec = Recorder(None, sf, r)
    rec.drain_once()
    publish(r, job_id, attempt, [started, point(1)])  # the writer re-sends what it retained
    assert rec.drain_once() == 2
    with sf() as s:
        types = s.scalars(sa.select(JobEvent.type).where(JobEvent.job_id == job_id)).all()
    assert sorted(types) == ["queued", "started"]
