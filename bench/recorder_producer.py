"""The producer of ``bench/recorder_throughput.py``: a process that publishes every job's step
points in the worker sink's entry format, as fast as it can (:class:`Producer`)."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any


def step_record(step: int, now: float) -> dict[str, Any]:
    """The step point every job publishes: a training step's fields as the engine fills
    them on a CPU (no allocator figures)."""
    from amptrain.contract.records import metric

    return metric(
        step=step,
        time=now,
        loss=1.0 / step,
        loss_scale=65536.0,
        skipped=False,
        grad_norm=0.5,
        lr=0.1,
        memory_peak=1000 + step,
        samples_per_second=512.0,
        step_time_ms=3.0,
        skipped_steps=0,
    )


def values_per_point() -> int:
    """The values a step point records: its fields that hold one (step and time count,
    as the issue counts "an 11-value step point")."""
    from amptrain.contract.metrics import METRIC_FIELDS

    record = step_record(1, time.time())
    return sum(record.get(f) is not None for f in METRIC_FIELDS)


def produce(
    redis_url: str, started: list[tuple[str, int]], per_job: int, batch: int, q: Any, go: Any
) -> None:
    """Publish ``per_job`` points to every job, round-robin, ``batch`` at a time: the sink's
    own entry format (:func:`amptrain.contract.stream.encode`, which the sink's
    :class:`~amptrain.core.stream_writer.StreamWriter` calls: packed entries from the tree
    that packs them; the ``--before`` leg imports its own tree's, so an older recorder is
    fed the flat entries it reads) and XADD (``MAXLEN ~``), encoded before the clock starts
    so that the producer outruns the recorder on two cores."""
    import redis

    from amptrain.contract.stream import STREAM_MAXLEN, encode
    from amptrain.core.redis import Keys

    client = redis.Redis.from_url(redis_url, socket_timeout=30)
    now = time.time()
    encoded = {
        job_id: [
            encode(step_record(i, now), job_id=job_id, attempt=attempt)
            for i in range(1, per_job + 1)
        ]
        for job_id, attempt in started
    }
    q.put("ready")
    go.get()
    first_at = time.time()
    for first in range(0, per_job, batch):
        for job_id, fields in encoded.items():
            pipe = client.pipeline(transaction=False)
            for f in fields[first : first + batch]:
                pipe.xadd(Keys.telemetry(job_id), f, maxlen=STREAM_MAXLEN, approximate=True)  # type: ignore[arg-type]
            pipe.execute()
    q.put((first_at, time.time()))


class Producer:
    """The producer process, started and holding its points ready; :meth:`go` publishes."""

    def __init__(self, redis_url: str, started: list[tuple[str, int]], cfg: dict[str, Any]) -> None:
        ctx = mp.get_context("spawn")
        self.q, self.go_q = ctx.Queue(), ctx.Queue()
        self.per_job = cfg["points"] // cfg["jobs"]
        args = (redis_url, started, self.per_job, cfg["batch"], self.q, self.go_q)
        self.proc = ctx.Process(target=produce, args=args, daemon=True)
        self.proc.start()
        assert self.q.get(timeout=300) == "ready"

    def go(self) -> None:
        """Start publishing."""
        self.go_q.put("go")

    def done(self) -> tuple[float, float]:
        """Wait for the last publish: the times of the first and the last."""
        first_at, last_at = self.q.get(timeout=1800)
        self.proc.join(30)
        return first_at, last_at
