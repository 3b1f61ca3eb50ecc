"""A stand-in for a worker that tests and benchmarks drive step by step: it claims a job
in SQL like the supervisor, publishes metric and eval records through the worker's own RedisSink
(the training child's publisher), and tells the job's lifecycle the way the supervisor
does (fenced SQL status, then the event and the ``end`` entry through
``amptrain.worker.pool.events``)."""

from __future__ import annotations

import time
from typing import Any

import redis

from amptrain.contract.records import evaluation, metric
from amptrain.store import jobs
from amptrain.store.db import make_engine, make_session_factory
from amptrain.worker.child.sink import RedisSink
from amptrain.worker.pool.events import LifecycleEvents


class Producer:
    """``Producer(redis_url, database_url, job_id).start()``, ``.steps(1, 50)``, ``.finish()``."""

    def __init__(self, redis_url: str, database_url: str, job_id: str) -> None:
        self.job_id = job_id
        self.engine = make_engine(database_url)
        self.sessions = make_session_factory(self.engine)
        self.redis = redis.Redis.from_url(redis_url, socket_timeout=10)
        self.attempt = 0
        self.sink: RedisSink | None = None
        self.events = LifecycleEvents(self.redis)

    def start(self, precision: str = "fp32") -> int:
        """Claim the next attempt and say it started, training in ``precision``."""
        with self.sessions.begin() as s:
            attempt = jobs.claim(s, self.job_id, "test-producer", 600)
        assert attempt is not None, f"job {self.job_id} not claimable"
        self.attempt = attempt
        self.sink = RedisSink(self.redis, self.job_id, attempt)
        self.events.publish(
            self.job_id, attempt, "started", 0, {"precision": {"effective": precision}}
        )
        return attempt

    def steps(self, first: int, last: int, **values: Any) -> None:
        """Publish records for steps ``first..last`` in one batch (like one engine flush)."""
        assert self.sink is not None
        now = time.time()
        records = [
            metric(step=i, time=now, loss=values.get("loss", 1.0 / i), skipped_steps=0, lr=0.1)
            for i in range(first, last + 1)
        ]
        self.sink.write(records)
        assert self.sink.flush(), "Redis refused the records"

    def evals(self, *steps: int, **values: float | None) -> None:
        """Publish one eval record per step (the engine evaluating after those steps), with
        ``values`` (default eval_loss 1/step and accuracy 1 - 1/step), like one flush."""
        assert self.sink is not None
        now = time.time()
        self.sink.write(
            [
                evaluation(s, now, values or {"eval_loss": 1.0 / s, "accuracy": 1.0 - 1.0 / s})
                for s in steps
            ]
        )
        assert self.sink.flush(), "Redis refused the records"

    def record(self, step: int, **values: Any) -> None:
        """Publish one record created now (``time`` is its creation time)."""
        assert self.sink is not None
        self.sink.write([metric(step=step, time=time.time(), **values)])

    def engine_event(self, type_: str, step: int, **data: Any) -> None:
        assert self.sink is not None
        self.sink.write(
            [{"kind": "event", "type": type_, "step": step, "time": time.time(), "data": data}]
        )

    def finish(self, status: str = "succeeded", step: int = 0) -> None:
        with self.sessions.begin() as s:
            assert jobs.finish(s, self.job_id, self.attempt, status)
        self.events.conclude(self.job_id, self.attempt, status, step, {}, end_status=status)

    def requeue(self, step: int = 0) -> None:
        """Give the job back to the queue, as a supervisor whose worker drains does."""
        with self.sessions.begin() as s:
            assert jobs.release(s, self.job_id, self.attempt)
        self.events.conclude(self.job_id, self.attempt, "requeued", step, {}, end_status=None)

    def close(self) -> None:
        self.redis.close()
        self.engine.dispose()
