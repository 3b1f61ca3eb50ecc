"""A worker shared by a team: hostile broker messages and user code in the training child.

Real processes throughout: uvicorn, a Celery worker, its training child and a
private redis-server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.enums import TaskName
from amptrain.core.settings import Settings
from amptrain.server.dispatcher import make_celery
from tests.support.specs import service_job
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.slow

SECRET = "s3cr3t-only-for-the-worker"


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    # Secrets the worker holds: the admin token (the stack sets one) and a variable of the
    # operator's own; user code in the training child must see neither.
    s.env["AMPTRAIN_WORKER_TEST_SECRET"] = SECRET
    s.env["OMP_NUM_THREADS"] = "1"
    s.env["AMPTRAIN_WARM_SPARE"] = "true"  # the default outside the test stacks
    s.start_api()
    s.start_worker("w1")
    yield s
    s.close()


UNKNOWN = "j_" + "0" * 32
BAD_MESSAGES: list[tuple[str, list[Any], dict[str, Any], str]] = [
    # (task id, args, kwargs, what the worker's log line names)
    ("unknown-job", [UNKNOWN], {}, UNKNOWN),
    ("not-a-job-id", ["unacked"], {}, "unacked"),
    ("number", [42], {}, "number"),
    ("object", [{"id": "j_" + "1" * 32}], {}, "object"),
    ("null", [None], {}, "null"),
    ("no-arguments", [], {}, "no-arguments"),
    ("extra-argument", ["j_" + "2" * 32, "extra"], {}, "extra-argument"),
    ("keyword-argument", ["j_" + "3" * 32], {"attempt": 9}, "keyword-argument"),
]


def test_a_worker_drops_bad_messages_then_trains_each_job_in_a_warm_process_of_its_own(
    stack: Stack,
) -> None:
    worker_pid = stack.processes["w1"].pid
    celery = make_celery(Settings(redis_url=stack.redis_server.url))
    for task_id, args, kwargs, _ in BAD_MESSAGES:
        celery.send_task(TaskName.RUN_JOB, args=args, kwargs=kwargs, queue="cpu", task_id=task_id)

    def dropped(marker: str) -> bool:
        return any(
            marker in line and ("dropped" in line or "not claimable" in line)
            for line in stack.log_tail("w1", 1000).splitlines()
        )

    for task_id, _, _, marker in BAD_MESSAGES:
        wait_until(lambda m=marker: dropped(m), 60, f"the worker to drop message {task_id}")
    log = stack.log_tail("w1", 1000)
    assert "Traceback" not in log and "raised unexpected" not in log, log

    processes = []
    for _ in range(2):  # one after the other: the second takes the spare the first left
        job = stack.submit(service_job(max_steps=20))
        done = stack.wait_for_status(job["id"], "succeeded", "failed", timeout=180)
        assert done["status"] == "succeeded", done["error"]
        (started,) = [e for e in stack.events(job["id"]) if e["type"] == "started"]
        processes.append(started["data"]["process"])
    assert done["worker"] == "w1@test" and stack.processes["w1"].pid == worker_pid
    assert stack.processes["w1"].poll() is None

    # Each attempt trained in a warm spare that had imported torch but never touched
    # CUDA, and one process trains one attempt only.
    assert [p["warm"] for p in processes] == [True, True]
    assert [p["cuda_initialized_before_launch"] for p in processes] == [False, False]
    assert processes[0]["pid"] != processes[1]["pid"]
    assert not psutil.pid_exists(processes[0]["pid"])
    log = stack.log_tail("w1", 1000)
    for p in processes:
        assert f"training in a warm process {p['pid']} (CUDA untouched" in log


def training_child(
    stack: Stack, worker: str, module: str = "amptrain.worker.child.main"
) -> psutil.Process | None:
    """A training process of ``worker``: one running a job, or (``amptrain.worker.child.spare``) an
    idle warm spare."""
    children = psutil.Process(stack.processes[worker].pid).children(recursive=True)
    return next((p for p in children if module in " ".join(p.cmdline())), None)


def test_the_training_child_gets_no_secret_of_the_worker(stack: Stack) -> None:
    job = stack.submit(service_job(max_steps=1_000_000))
    child = wait_until(lambda: training_child(stack, "w1"), 60, "the training child")
    # The next job's warm spare, started once this one trains, was started with it too.
    spare = wait_until(
        lambda: training_child(stack, "w1", "amptrain.worker.child.spare"),
        60,
        "the next warm spare",
    )
    environments = [child.environ(), spare.environ()]
    stack.client.post(f"/jobs/{job['id']}/cancel")

    for env in environments:
        assert not any(SECRET in v for v in env.values())
        assert not any(stack.token in v for v in env.values())
        assert not [k for k in env if k.startswith("AMPTRAIN_")]
        # What it needs does reach it: the GPU assignment (none here), paths and tuning.
        assert env["CUDA_VISIBLE_DEVICES"] == ""
        assert env["PATH"] and env["OMP_NUM_THREADS"] == "1"
    done = stack.wait_for_status(job["id"], "cancelled", "failed", "succeeded", timeout=60)
    assert done["status"] == "cancelled", done["error"]
