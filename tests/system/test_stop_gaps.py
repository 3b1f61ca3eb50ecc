"""A worker stopped mid-job after its Redis died first, as Kubernetes stops a pod (SIGTERM,
then SIGKILL after the grace period) or at once (kill -9): the job resumes from no
checkpoint beyond its recorded history, so its series ends complete. (The two variants
alternate between SQLite and PostgreSQL where both are configured.)"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.support.specs import service_job
from tests.support.stack import Stack, wait_until
from tests.system.test_faults import assert_complete_series, checkpoints

pytestmark = pytest.mark.slow

STEPS = 400
GRACE_S = 3  # the pod's termination grace period; the drain cannot finish without Redis


@pytest.fixture
def one_worker(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.start_api()
    s.start_worker("w1")
    yield s
    s.close()


@pytest.mark.parametrize("grace_s", [GRACE_S, 0], ids=["pod-stop", "kill-9"])
def test_a_worker_stopped_after_redis_died_first_resumes_within_the_recorded_history(
    one_worker: Stack, grace_s: float
) -> None:
    stack = one_worker
    job = stack.submit(
        service_job(
            max_steps=STEPS,
            checkpoint={"every_steps": 20, "keep_last": 10},
            telemetry={"flush_every_steps": 10, "flush_every_ms": 100},
        )
    )
    wait_until(lambda: stack.job(job["id"])["step"] >= 30, 60, "some recorded steps")
    stack.redis_server.kill()
    before = set(checkpoints(stack, job["id"]))
    # Training goes on without Redis: its checkpoints get ahead of the recorded history.
    ahead = wait_until(
        lambda: set(checkpoints(stack, job["id"])) - before, 60, "a checkpoint meanwhile"
    )
    worker = stack.processes["w1"]
    if grace_s:
        worker.send_signal(signal.SIGTERM)  # the pod's main process
    try:
        worker.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)  # the grace period is over
        worker.wait(10)
    stack.redis_server.start()
    stack.start_worker("w1")

    done = stack.wait_for_status(job["id"], "succeeded", "failed", timeout=180)
    assert done["status"] == "succeeded", done["error"]
    (resumed,) = [e for e in stack.events(job["id"]) if e["type"] == "resumed"] or [None]
    # Not from a checkpoint taken while Redis was down: steps before it were never recorded.
    assert resumed is None or resumed["data"]["from_step"] < min(ahead)
    assert_complete_series(stack, job["id"], STEPS)
