"""The fenced job repository on real SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from amptrain.contract.spec import JobSpec
from amptrain.store import jobs
from amptrain.store.db import database_now
from amptrain.store.models import Job, JobEvent

EXPIRED = -1.0  # a lease that ended a second ago: claimable at once, no sleeping


def spec(**kw: object) -> JobSpec:
    return JobSpec.model_validate(
        {"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "max_steps": 10, **kw}
    )


def new_job(sf: sessionmaker[Session], **kw: object) -> str:
    with sf.begin() as s:
        return jobs.create_job(s, spec(**kw), owner="alice", queue="cpu").id


def events(sf: sessionmaker[Session], job_id: str) -> list[tuple[int, str]]:
    with sf() as s:
        rows = s.execute(
            sa.select(JobEvent.attempt, JobEvent.type)
            .where(JobEvent.job_id == job_id)
            .order_by(JobEvent.id)
        )
        return [(r.attempt, r.type) for r in rows]


def test_create_job_records_queued_event_and_idempotency(sf: sessionmaker[Session]) -> None:
    with sf.begin() as s:
        job = jobs.create_job(s, spec(name="a"), "alice", "cpu", "key-1", "h1")
    assert job.id.startswith("j_") and job.status == "queued" and job.attempt == 0
    assert job.created_at.tzinfo is not None and job.max_steps == 10 and job.max_attempts == 3
    assert events(sf, job.id) == [(0, "queued")]
    with sf() as s:
        found = jobs.find_by_idempotency_key(s, "alice", "key-1")
        assert found is not None and found.id == job.id and found.request_hash == "h1"
        assert jobs.find_by_idempotency_key(s, "bob", "key-1") is None
        assert found.spec["model"]["name"] == "mlp"
    with pytest.raises(sa.exc.IntegrityError), sf.begin() as s:
        jobs.create_job(s, spec(), "alice", "cpu", "key-1", "h2")
    with sf.begin() as s:  # same key, another owner: a different job
        jobs.create_job(s, spec(), "bob", "cpu", "key-1", "h2")


def race_claims(sf: sessionmaker[Session], job_id: str, n: int) -> list[int | None]:
    """``n`` threads, each with its own session, claim the same job at the same moment."""
    barrier = threading.Barrier(n)
    results: list[int | None] = []
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            with sf() as s:
                barrier.wait()
                got = jobs.claim(s, job_id, name, 30)
                s.commit()
            results.append(got)
        except BaseException as exc:  # surfaced by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    return results


def test_concurrent_claims_give_exactly_one_attempt(sf: sessionmaker[Session]) -> None:
    for _ in range(5):
        job_id = new_job(sf)
        assert sorted(race_claims(sf, job_id, 4), key=str) == [1, None, None, None]
        with sf() as s:
            job = jobs.get_job(s, job_id)
            assert job is not None and job.status == "running" and job.attempt == 1


def test_lease_uses_database_clock(sf: sessionmaker[Session]) -> None:
    job_id = new_job(sf)
    with sf.begin() as s:
        before = database_now(s)
        assert jobs.claim(s, job_id, "w1", 30) == 1
        after = database_now(s)
        job = jobs.get_job(s, job_id)
        assert job is not None and job.lease_expires_at is not None
        assert before + 30 - 0.01 <= job.lease_expires_at <= after + 30 + 0.01
        assert job.worker == "w1" and job.started_at is not None


def test_live_lease_and_finished_jobs_are_not_claimable(sf: sessionmaker[Session]) -> None:
    job_id = new_job(sf)
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w1", 30) == 1
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w2", 30) is None  # duplicate delivery
        assert jobs.finish(s, job_id, 1, "succeeded")
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w2", 30) is None
        job = jobs.get_job(s, job_id)
        assert job is not None and job.status == "succeeded" and job.lease_expires_at is None
        assert job.finished_at is not None


def test_expired_lease_is_reclaimed_and_old_attempt_fenced(sf: sessionmaker[Session]) -> None:
    job_id = new_job(sf)
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w1", EXPIRED) == 1
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w2", 30) == 2
    with sf.begin() as s:
        # Every write of attempt 1 is now refused and changes nothing.
        assert jobs.heartbeat(s, job_id, 1, 30) is None
        assert not jobs.set_precision(s, job_id, 1, "fp16", "fp16", None)
        assert not jobs.finish(s, job_id, 1, "failed", {"code": "internal", "message": "x"})
        assert not jobs.release(s, job_id, 1)
        assert jobs.heartbeat(s, job_id, 2, 30) == "running"
        assert jobs.set_precision(s, job_id, 2, "auto", "fp32", "cpu")
    with sf() as s:
        job = jobs.get_job(s, job_id)
        assert job is not None and job.status == "running" and job.worker == "w2"
        assert job.precision_effective == "fp32" and job.error_code is None
    # Lifecycle events travel through the job's stream (the recorder fences them).
    assert events(sf, job_id) == [(0, "queued")]


def test_claim_respects_max_attempts_on_expired_lease(sf: sessionmaker[Session]) -> None:
    job_id = new_job(sf, max_attempts=1)
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w1", EXPIRED) == 1
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w2", 30) is None
        assert jobs.expired_jobs(s) == [(job_id, 1)]
        assert jobs.reap_expired(s, job_id, 1) == "failed"
        job = jobs.get_job(s, job_id)
        assert job is not None and job.error_code == "worker_lost" and job.finished_at


def test_reap_expired_requeues_when_attempts_remain(sf: sessionmaker[Session]) -> None:
    job_id = new_job(sf)
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w1", 30) == 1
        assert jobs.reap_expired(s, job_id, 1) is None  # lease still live
        assert jobs.expired_jobs(s) == []
        assert jobs.heartbeat(s, job_id, 1, EXPIRED) == "running"
        assert jobs.reap_expired(s, job_id, 1) == "queued"
        job = jobs.get_job(s, job_id)
        assert job is not None and job.status == "queued" and job.dispatched_at is None
        assert jobs.heartbeat(s, job_id, 1, 30) is None  # the lost worker is fenced
        assert jobs.claim(s, job_id, "w2", 30) == 2


def test_release_requeues_and_cancelling_release_cancels(sf: sessionmaker[Session]) -> None:
    job_id = new_job(sf)
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w1", 30) == 1
        assert jobs.release(s, job_id, 1)
        job = jobs.get_job(s, job_id)
        assert job is not None and job.status == "queued" and job.worker is None
        assert jobs.claim(s, job_id, "w2", 30) == 2
        assert jobs.request_cancel(s, job_id) == "cancelling"
        assert jobs.release(s, job_id, 2)
        job = jobs.get_job(s, job_id)
        assert job is not None and job.status == "cancelled" and job.finished_at is not None


def test_request_cancel(sf: sessionmaker[Session]) -> None:
    queued = new_job(sf)
    with sf.begin() as s:
        assert jobs.request_cancel(s, queued) == "cancelled"
    with sf.begin() as s:
        assert jobs.claim(s, queued, "w1", 30) is None  # never runs
        with pytest.raises(jobs.JobFinished):
            jobs.request_cancel(s, queued)
        with pytest.raises(jobs.JobNotFound):
            jobs.request_cancel(s, "j_missing")
    assert events(sf, queued) == [(0, "queued"), (0, "cancelled")]

    running = new_job(sf)
    with sf.begin() as s:
        assert jobs.claim(s, running, "w1", EXPIRED) == 1
        assert jobs.request_cancel(s, running) == "cancelling"
        assert jobs.request_cancel(s, running) == "cancelling"  # repeat is harmless
    with sf.begin() as s:
        # A cancel survives the worker's death: the next attempt starts cancelling.
        assert jobs.claim(s, running, "w2", 30) == 2
        assert jobs.heartbeat(s, running, 2, 30) == "cancelling"
        assert jobs.finish(s, running, 2, "cancelled", {"code": "cancelled", "message": "m"})
    with sf() as s:
        job = s.get(Job, running)
        assert job is not None and job.status == "cancelled" and job.cancel_requested_at
        with pytest.raises(jobs.JobFinished):
            jobs.request_cancel(s, running)


def test_finish_rejects_non_final_status(sf: sessionmaker[Session]) -> None:
    job_id = new_job(sf)
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w1", 30) == 1
        with pytest.raises(ValueError):
            jobs.finish(s, job_id, 1, "running")
        assert jobs.finish(s, job_id, 1, "failed", {"code": "oom", "message": "m", "step": 4})
        job = jobs.get_job(s, job_id)
        assert job is not None and (job.error_code, job.error_step) == ("oom", 4)


def test_reap_expired_explains_its_decision_with_one_event(sf: sessionmaker[Session]) -> None:
    cancelling, exhausted = new_job(sf), new_job(sf, max_attempts=1)
    with sf.begin() as s:
        for job_id in (cancelling, exhausted):
            assert jobs.claim(s, job_id, "w1", EXPIRED) == 1
        assert jobs.request_cancel(s, cancelling) == "cancelling"
    with sf.begin() as s:
        assert jobs.reap_expired(s, cancelling, 1) == "cancelled"
        assert jobs.reap_expired(s, exhausted, 1) == "failed"
        assert jobs.reap_expired(s, exhausted, 1) is None  # already reaped: nothing written
    assert events(sf, cancelling) == [(0, "queued"), (1, "cancelled")]
    assert events(sf, exhausted) == [(0, "queued"), (1, "failed")]
    with sf() as s:
        job = jobs.get_job(s, cancelling)
        assert job is not None and (job.error_code, job.worker) == ("cancelled", None)
        failed = s.scalars(
            sa.select(JobEvent.data).where(JobEvent.job_id == exhausted, JobEvent.type == "failed")
        ).one()
        assert failed == jobs.WORKER_LOST


def test_queued_queues_names_each_waiting_queue_once(sf: sessionmaker[Session]) -> None:
    with sf.begin() as s:
        a, _, c = (jobs.create_job(s, spec(), "alice", q).id for q in ("cpu-x2", "cpu-x2", "gpu"))
        assert jobs.claim(s, c, "w", 60) == 1  # running: no longer waits
        assert sorted(jobs.queued_queues(s)) == ["cpu-x2"]
        assert jobs.claim(s, a, "w", 60) == 1
        assert jobs.queued_queues(s) == ["cpu-x2"]  # the other one still waits


def test_an_unplaced_multi_node_attempt_is_not_charged_and_waits_before_dispatch(
    sf: sessionmaker[Session],
) -> None:
    from datetime import timedelta

    from amptrain.store import outbox
    from amptrain.store.models import utcnow

    job_id = new_job(sf, max_attempts=2, nodes=2)
    for attempt in (1, 2, 3):  # three waits for nodes: each an attempt, none charged
        with sf.begin() as s:
            assert jobs.claim(s, job_id, "w", EXPIRED) == attempt  # expired lease at once
            assert jobs.release(s, job_id, attempt, unplaced_wait_s=60)
    with sf() as s:
        job = s.get(Job, job_id)
        assert job is not None and (job.status, job.attempt, job.unplaced) == ("queued", 3, 3)
        # The sweep leaves it alone until dispatch_after, then sends it again.
        assert outbox.undispatched(s, utcnow(), 10) == []
        later = s.execute(
            sa.update(Job).where(Job.id == job_id).values(dispatch_after=utcnow() - timedelta(1))
        )
        assert later.rowcount == 1
        assert outbox.undispatched(s, utcnow(), 10) == [(job_id, "cpu", 3)]
        assert outbox.returned(s, job_id) == ("cpu", 3)
    # The budget is max_attempts + unplaced: the two real attempts (4 and 5) are both had.
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w", EXPIRED) == 4
    with sf.begin() as s:
        assert jobs.reap_expired(s, job_id, 4) == "queued"
    with sf.begin() as s:
        assert jobs.claim(s, job_id, "w", EXPIRED) == 5
    with sf.begin() as s:
        assert jobs.reap_expired(s, job_id, 5) == "failed"
