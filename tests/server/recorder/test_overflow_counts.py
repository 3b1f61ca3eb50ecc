"""A job's per-parameter overflow counts: the engine's ``gradient_overflow`` warnings of
an fp16 run, through the stream and the recorder, into ``jobs.overflow_counts`` and
``GET /jobs/{id}``'s ``summary.overflow_counts``."""

from __future__ import annotations

import math

import redis

from amptrain.contract.records import OVERFLOW_WARNING, event
from amptrain.engine import RunContext, Trainer
from amptrain.server.recorder.service import Recorder
from amptrain.server.web.schemas import JobOut
from tests.engine.test_amp import components, spec
from tests.engine.test_attribution import Blocks
from tests.server.recorder.test_recorder import Sessions, job, point, publish, start_job
from tests.support.sinks import ListSink


def test_an_injected_overflow_is_counted_for_its_parameter_in_the_job_summary(
    sf: Sessions, r: redis.Redis
) -> None:
    sink = ListSink()
    trainer = Trainer(
        spec(precision="fp16", max_steps=6, loss_scale={"init_scale": 256}),
        RunContext(None, sink=sink),
        components(Blocks),
    )
    weight = trainer.model.blocks[2].weight  # type: ignore[index,union-attr]
    weight.register_hook(lambda g: g * math.inf if trainer.step + 1 in (2, 4, 5) else g)
    trainer.train()
    job_id, attempt = start_job(sf)
    publish(r, job_id, attempt, sink.items)
    assert Recorder(None, sf, r).drain_once() == len(sink.items)
    recorded = job(sf, job_id)
    assert recorded.overflow_counts == {"blocks.2.weight": 3}
    assert JobOut.from_job(recorded, admin=True).summary.overflow_counts == {"blocks.2.weight": 3}  # type: ignore[attr-defined]


def test_a_step_re_run_by_a_later_attempt_counts_once(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)

    def overflow(step: int, param: str) -> dict[str, object]:
        return event("warning", step, 1000.0 + step, code=OVERFLOW_WARNING, param=param)

    publish(r, job_id, attempt, [point(1), overflow(3, "a.weight"), overflow(5, "b.weight")])
    # A later attempt resumed from step 4 re-ran step 5, where "a.weight" overflowed first.
    publish(r, job_id, attempt + 1, [overflow(5, "a.weight"), overflow(7, "a.weight")])
    Recorder(None, sf, r).drain_once()
    assert job(sf, job_id).overflow_counts == {"a.weight": 3}
    assert JobOut.from_job(job(sf, job_id), admin=True).summary.overflow_counts == {"a.weight": 3}  # type: ignore[attr-defined]


def test_a_job_without_overflows_shows_empty_counts(sf: Sessions, r: redis.Redis) -> None:
    job_id, attempt = start_job(sf)
    publish(r, job_id, attempt, [point(1)])
    Recorder(None, sf, r).drain_once()
    assert job(sf, job_id).overflow_counts is None
    assert JobOut.from_job(job(sf, job_id), admin=True).summary.overflow_counts == {}  # type: ignore[attr-defined]
