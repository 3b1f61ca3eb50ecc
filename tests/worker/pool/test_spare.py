"""Warm spares: real training processes (torch imported ahead of the job) and a real Redis."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.contract.stream import decode
from amptrain.core.redis import Keys
from amptrain.worker.child.protocol import ControlMessage, Finished, Launch
from amptrain.worker.pool.child_handle import ChildProcess
from amptrain.worker.pool.spare import SpareKeeper
from tests.support.specs import service_job
from tests.support.stack import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def keeper() -> Iterator[SpareKeeper]:
    k = SpareKeeper(None).start()
    yield k
    k.close()


def launch(job_id: str, redis_url: str, root: Path, max_steps: int = 6) -> Launch:
    return Launch(
        job_id=job_id,
        attempt=1,
        spec=service_job(max_steps=max_steps, seed=7),
        checkpoint_dir=str(root / job_id),
        redis_url=redis_url,
    )


def train(child: ChildProcess) -> list[ControlMessage]:
    """Every control message of ``child``'s attempt, to its end (which must be clean)."""
    got: list[ControlMessage] = []
    while not child.finished():
        got += child.messages(0.1)
    child.close()
    assert child.proc.returncode == 0, got
    return got


def losses(redis_url: str, job_id: str) -> list[tuple[int, float]]:
    client = redis.Redis.from_url(redis_url)
    entries: Any = client.xrange(Keys.telemetry(job_id))
    items = [decode(f) for _, f in entries]
    return [(i["step"], i["loss"]) for i in items if i["kind"] == "metric"]


def ended(messages: list[ControlMessage]) -> Any:
    return next(m for m in messages if isinstance(m, Finished))


def test_a_warm_spare_trains_exactly_like_a_fresh_process(
    keeper: SpareKeeper, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    spare_pid = wait_until(lambda: keeper.pid, 60, "a spare")
    spare = keeper.take()
    assert spare is not None and spare.pid == spare_pid
    assert keeper.pid is None  # taken: the next one waits for refill()

    warm_launch = launch("j_" + "a" * 32, redis_server.url, tmp_path)
    assert spare.hand(warm_launch) and spare.wait_accepted(120)
    warm = train(spare)
    cold_launch = launch("j_" + "b" * 32, redis_server.url, tmp_path)
    cold = ChildProcess.cold(cold_launch, None)
    cold_messages = train(cold)

    assert spare.accepted is not None and cold.accepted is not None
    assert spare.accepted.warm and spare.accepted.pid == spare_pid
    assert spare.accepted.cuda_initialized is False  # torch imported, CUDA never touched
    assert not cold.accepted.warm and cold.accepted.pid == cold.pid != spare_pid
    assert ended(warm).final_step == ended(cold_messages).final_step == 6
    # Same seed, same spec: the same run, step for step.
    assert losses(redis_server.url, warm_launch.job_id) == losses(
        redis_server.url, cold_launch.job_id
    )
    assert len(losses(redis_server.url, warm_launch.job_id)) == 6
    assert sorted(os.listdir(tmp_path / warm_launch.job_id)) == sorted(
        os.listdir(tmp_path / cold_launch.job_id)
    )


def test_a_spare_that_dies_while_idle_is_replaced_and_the_next_one_trains(
    keeper: SpareKeeper, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    first = wait_until(lambda: keeper.pid, 60, "a spare")
    assert first is not None
    os.kill(first, signal.SIGKILL)
    second = wait_until(lambda: keeper.pid not in (None, first) and keeper.pid, 60, "a new spare")

    spare = keeper.take()
    assert spare is not None and spare.pid == second
    job = launch("j_" + "c" * 32, redis_server.url, tmp_path, max_steps=3)
    assert spare.hand(job) and spare.wait_accepted(120)
    assert ended(train(spare)).final_step == 3


def test_a_dead_spare_takes_no_launch(tmp_path: Path) -> None:
    # The supervisor then starts a fresh process: a dead spare never fails a job.
    spare = ChildProcess.spare(None)
    spare.proc.kill()
    spare.proc.wait()
    job = launch("j_" + "d" * 32, "redis://127.0.0.1:1", tmp_path)
    assert not (spare.hand(job) and spare.wait_accepted(10))
    spare.close()
