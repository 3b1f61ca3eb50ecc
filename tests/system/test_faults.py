"""Nothing lost: worker death, Redis and API restarts, duplicate deliveries, shutdown, failures.

Every test runs the real processes (uvicorn, Celery workers, training children,
a private redis-server) and injects the fault the way it happens in production. The tests
share one stack per database and leave it as they found it (a stopped worker is started
again); those that take Redis down keep a stack of their own.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from amptrain.core.settings import Settings
from amptrain.server.dispatcher import make_celery
from tests.support.probe import ROOT, probe_paths
from tests.support.shared_stack import log_since, log_size, restarted, running_stack
from tests.support.specs import service_job
from tests.support.stack import Stack, wait_until
from tests.system.test_e2e_service import wait_for_points

pytestmark = pytest.mark.slow

STEPS = 240
DRAINED_STEPS = 1200


EVAL_EVERY = 40


def long_job(steps: int = STEPS, **extra: Any) -> dict[str, Any]:
    # Evaluated on the held-out split as it trains: the eval series must survive too.
    return service_job(
        max_steps=steps,
        checkpoint={"every_steps": 40, "keep_last": 10},
        telemetry={"flush_every_steps": 10, "flush_every_ms": 100},
        eval={"every_steps": EVAL_EVERY, "batches": 2},
        **extra,
    )


HELD_AT = 90  # the held job's first attempt stops in this step, after the checkpoint at 80


def probe_job(**hold: Any) -> dict[str, Any]:
    """``long_job`` on the probe model (an MLP whose seams change no numerics)."""
    return long_job(model={"name": "ddp-probe", "args": {"width": 32, **hold}})


@contextmanager
def faults_stack(
    root: Path, database_url: str, workers: tuple[str, ...] = ("w1", "w2"), **env: str
) -> Iterator[Stack]:
    """The API and ``workers`` with the probe model installed (it holds a job at a known
    step: see test_kill_9_worker_...); ``env`` adds to the stack's settings."""
    env["PYTHONPATH"] = os.pathsep.join(map(str, [*probe_paths(root), ROOT]))
    with running_stack(root, database_url, workers=workers, env=env) as s:
        yield s


@pytest.fixture(scope="module")
def two_workers(
    module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """One stack for the tests that leave it as they found it: each submits its own jobs, and
    one that stops a worker starts it again (tests/support/shared_stack.py)."""
    with faults_stack(tmp_path_factory.mktemp("faults"), module_database_url) as s:
        yield s


@pytest.fixture
def own_two_workers(database_url: str, tmp_path: Path) -> Iterator[Stack]:
    """A stack of the test's own, for a test that takes the stack's Redis down."""
    with faults_stack(tmp_path, database_url) as s:
        yield s


def owner(stack: Stack, job_id: str) -> str:
    """Which of the stack's workers runs the job ("w1@test" -> "w1")."""
    job = wait_until(
        lambda: (j := stack.job(job_id))["worker"] and j, 60, f"{job_id} to be claimed"
    )
    return str(job["worker"]).split("@")[0]


def checkpoints(stack: Stack, job_id: str) -> list[int]:
    return [c["step"] for c in stack.client.get(f"/jobs/{job_id}/checkpoints").json()["items"]]


def final_weights(stack: Stack, job_id: str) -> dict[str, torch.Tensor]:
    r = stack.client.get(f"/jobs/{job_id}/checkpoints/{STEPS}")
    assert r.status_code == 200, r.text
    path = stack.root / f"{job_id}.pt"
    path.write_bytes(r.content)
    return dict(torch.load(path, weights_only=True)["model"])


def assert_complete_series(stack: Stack, job_id: str, steps: int = STEPS) -> list[dict[str, Any]]:
    """Every step's point and every evaluation, once each (the newest attempt's)."""
    points = wait_for_points(stack, job_id, steps)
    assert [p["step"] for p in points] == list(range(1, steps + 1))
    evals = stack.client.get(f"/jobs/{job_id}/evals").json()["items"]
    every = stack.job(job_id)["spec"]["eval"]["every_steps"]
    due = [step for step in range(1, steps + 1) if (every and step % every == 0) or step == steps]
    assert [e["step"] for e in evals] == due  # every every_steps, and at the end
    assert all(set(e["values"]) >= {"eval_loss", "accuracy"} for e in evals), evals
    return points


def test_kill_9_worker_resumes_on_the_other_and_matches_an_uninterrupted_run(
    two_workers: Stack,
) -> None:
    stack = two_workers
    # Held in step HELD_AT until the gate exists: the kill comes after the checkpoint at
    # step 80 is recorded and before the run ends, however slowly the recorder or the
    # machine goes (racing it, a lagging recorder once showed step 80 only after step 240).
    gate = stack.root / "go-on"
    job = stack.submit(probe_job(hang_rank=0, hang_at=HELD_AT, hang_until=str(gate)))
    victim = owner(stack, job["id"])
    # The checkpoint's file, and the points through its step in SQL: a retry resumes only
    # from a checkpoint whose steps are recorded (the file alone once gave a resume from 40,
    # the kill coming before step 80's points had left the sink).
    wait_until(
        lambda: 80 in checkpoints(stack, job["id"]) and stack.job(job["id"])["step"] >= 80,
        120,
        "a checkpoint at step 80 and the points through it recorded",
    )
    with restarted(stack, victim):
        stack.kill(victim, signal.SIGKILL)  # the worker, its pool process and training child
        gate.touch()  # the resumed attempt counts its forward passes anew: never held again
        done = stack.wait_for_status(job["id"], "succeeded", "failed", timeout=180)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempt"] == 2
    resumed = [e for e in stack.events(job["id"]) if e["type"] == "resumed"]
    assert (
        len(resumed) == 1 and resumed[0]["attempt"] == 2 and resumed[0]["data"]["from_step"] >= 80
    )
    points = assert_complete_series(stack, job["id"])
    assert {p["attempt"] for p in points if p["step"] > resumed[0]["data"]["from_step"]} == {2}

    # The same model, data and seed, never interrupted, ends with bitwise the same weights.
    straight = stack.submit(probe_job())
    assert (
        stack.wait_for_status(straight["id"], "succeeded", "failed", timeout=180)["status"]
        == "succeeded"
    )
    a, b = final_weights(stack, job["id"]), final_weights(stack, straight["id"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_same_task_delivered_twice_trains_once(two_workers: Stack) -> None:
    stack = two_workers
    logged = {name: log_size(stack, name) for name in ("w1", "w2")}  # this test's lines after
    job = stack.submit(long_job())  # the API sends it once ...
    celery = make_celery(Settings(redis_url=stack.redis_server.url))
    celery.send_task("amptrain.run_job", args=[job["id"]], queue="cpu")  # ... and once more
    done = stack.wait_for_status(job["id"], "succeeded", "failed", timeout=180)
    assert done["status"] == "succeeded" and done["attempt"] == 1
    assert [e["type"] for e in stack.events(job["id"])].count("started") == 1
    assert {p["attempt"] for p in assert_complete_series(stack, job["id"])} == {1}
    logs = log_since(stack, "w1", logged["w1"]) + log_since(stack, "w2", logged["w2"])
    assert "not claimable" in logs  # the second delivery arrived and did nothing


@pytest.mark.parametrize("lose_data", [False, True], ids=["restart", "restart-without-data"])
def test_redis_restart_mid_job_loses_no_point(own_two_workers: Stack, lose_data: bool) -> None:
    stack = own_two_workers
    job = stack.submit(long_job())
    # Mid-job by its checkpoint files, not by its recorded steps: under load the recorder
    # once trailed training by the whole run, and then no checkpoint was left to come.
    before = wait_until(lambda: checkpoints(stack, job["id"]), 60, "the first checkpoint")
    stack.redis_server.kill()
    if lose_data:
        for f in Path(stack.redis_server.directory).glob("appendonly*"):
            f.unlink()
    # Training goes on without Redis: new checkpoints appear while it is down.
    wait_until(
        lambda: set(checkpoints(stack, job["id"])) - set(before),
        60,
        "a checkpoint during the outage",
    )
    stack.redis_server.start()

    done = stack.wait_for_status(job["id"], "succeeded", "failed", timeout=180)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done["error"]
    assert_complete_series(stack, job["id"])


def test_job_submitted_while_the_broker_is_down_runs_once_it_is_back(
    own_two_workers: Stack,
) -> None:
    stack = own_two_workers
    stack.redis_server.kill()
    r = stack.client.post("/jobs", json=service_job(max_steps=10))
    assert r.status_code == 201 and r.json()["status"] == "queued"
    stack.redis_server.start()
    done = stack.wait_for_status(r.json()["id"], "succeeded", "failed", timeout=120)
    assert done["status"] == "succeeded", done["error"]


def test_sigterm_worker_requeues_its_job_which_resumes_and_succeeds(two_workers: Stack) -> None:
    stack = two_workers
    # Long enough that the drain lands before the end on a fast machine: step 50 is seen in
    # SQL a recorder pass late, and the supervisor notices the drain at its next heartbeat.
    # With 240 steps a fast run once finished first (attempt 1 succeeded in a CI run).
    job = stack.submit(long_job(DRAINED_STEPS))
    victim = owner(stack, job["id"])
    wait_until(lambda: stack.job(job["id"])["step"] >= 50, 60, "some recorded steps")
    with restarted(stack, victim):
        stack.processes[victim].send_signal(signal.SIGTERM)  # `docker stop`: the main process
        assert stack.processes[victim].wait(60) == 0  # the drain ends the worker cleanly
        done = stack.wait_for_status(job["id"], "succeeded", "failed", timeout=180)
    assert done["status"] == "succeeded" and done["attempt"] == 2, done["error"]
    types = [e["type"] for e in stack.events(job["id"])]
    assert "requeued" in types and "resumed" in types and "failed" not in types
    assert_complete_series(stack, job["id"], DRAINED_STEPS)


def test_out_of_memory_fails_once_without_pointless_retries(two_workers: Stack) -> None:
    # A batch whose activations cannot fit is refused before training by the worker's
    # estimate (too_large); like an out-of-memory error it is never retried.
    stack = two_workers
    huge = service_job(max_steps=3, batch_size=65_536)
    huge.update(
        model={"name": "cnn", "args": {}},
        dataset={
            "name": "synthetic-images",
            "args": {"channels": 1, "height": 2000, "width": 2000, "classes": 2},
        },
    )
    job = stack.submit(huge)
    done = stack.wait_for_status(job["id"], "failed", "succeeded", timeout=120)
    assert done["status"] == "failed" and done["attempt"] == 1
    assert done["error"]["code"] == "too_large"
    assert "micro-batch of 65536" in done["error"]["message"]


def test_diverging_job_fails_naming_the_step(two_workers: Stack) -> None:
    stack = two_workers
    spec = service_job(
        max_steps=50, precision="fp32", grad_clip_norm=None, telemetry={"flush_every_steps": 4}
    )
    spec["optimizer"] = {"name": "sgd", "lr": 1e12}
    job = stack.submit(spec)
    done = stack.wait_for_status(job["id"], "failed", "succeeded", timeout=120)
    assert done["status"] == "failed" and done["attempt"] == 1
    assert done["error"]["code"] == "diverged"
    # One step everywhere, although detection lags by up to a flush (4 steps here): the
    # error, the job's progress, the failed event and the history's last point.
    step = done["error"]["step"]
    assert f"diverged at step {step}" in done["error"]["message"]
    (failed,) = wait_until(
        lambda: [e for e in stack.events(job["id"]) if e["type"] == "failed"], 30, "the event"
    )
    assert failed["step"] == step and stack.job(job["id"])["step"] == step


def test_cancel_of_a_child_stuck_in_a_long_step_is_bounded(
    database_url: str, tmp_path: Path
) -> None:
    # A stack of its own: a cancel grace of 1 s. The probe model hangs in step 2 (sleeping,
    # ignoring stop signals) for good: the child is stuck there however fast the machine
    # (a CNN step on 512 px images used to stand in for it, 45 s of CPU a run).
    with faults_stack(tmp_path, database_url, ("w1",), AMPTRAIN_CANCEL_GRACE_SECONDS="1") as stack:
        stuck = service_job(
            max_steps=100,
            telemetry={"flush_every_steps": 1},
            model={"name": "ddp-probe", "args": {"width": 32, "hang_rank": 0, "hang_at": 2}},
        )
        job = stack.submit(stuck)
        # Step 1 is recorded, so the child is now inside step 2, never to leave it.
        wait_until(lambda: stack.job(job["id"])["step"] >= 1, 120, "the first step")
        assert stack.client.post(f"/jobs/{job['id']}/cancel").status_code == 202
        done = stack.wait_for_status(job["id"], "cancelled", "failed", "succeeded", timeout=60)
        assert done["status"] == "cancelled"
        assert "ignored the stop request; terminating" in stack.log_tail("w1", 400)


def test_a_crashed_training_child_is_retried_and_resumes(two_workers: Stack) -> None:
    stack = two_workers
    job = stack.submit(long_job())
    victim = owner(stack, job["id"])
    wait_until(lambda: 40 in checkpoints(stack, job["id"]), 120, "a checkpoint at step 40")
    worker = psutil.Process(stack.processes[victim].pid)
    children = [
        p
        for p in worker.children(recursive=True)
        if "amptrain.worker.child.main" in " ".join(p.cmdline())
    ]
    assert len(children) == 1
    children[0].kill()  # what the kernel's OOM killer does: the supervisor survives

    done = stack.wait_for_status(job["id"], "succeeded", "failed", timeout=180)
    assert done["status"] == "succeeded" and done["attempt"] == 2, done["error"]
    requeued = [e for e in stack.events(job["id"]) if e["type"] == "requeued"]
    assert len(requeued) == 1 and requeued[0]["data"]["error"]["code"] == "internal"
    assert "exited with code -9" in requeued[0]["data"]["error"]["message"]
    assert_complete_series(stack, job["id"])
