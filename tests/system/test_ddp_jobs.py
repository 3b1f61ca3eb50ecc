"""Data-parallel jobs (``devices: 2``, gloo on CPU) through the real service.

One API, one Celery worker taking 2-device jobs (queue cpu-x2) in two pool slots, and
the probe plugin, whose rank 1 can be held at a known step: a rank killed mid-job, the
launcher killed, two jobs at once, a cancel, and a hung rank. Each launch costs two ``import torch`` (plus the launcher's), so the
scenarios share one stack and run side by side.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.support.probe import ROOT, probe_paths
from tests.support.processes import running
from tests.support.stack import Stack, wait_until
from tests.system.test_e2e_service import wait_for_points

pytestmark = pytest.mark.slow

STEPS = 40
HELD_AT = 25  # rank 1 stops here (after the checkpoint at step 20) until the test lets it go


def ddp_job(name: str, **probe: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"name": "ddp-probe", "args": {"width": 8, **probe}},
        "dataset": {"name": "synthetic-classification", "args": {"features": 8}},
        "device": "cpu",
        "precision": "fp32",
        "devices": 2,
        "batch_size": 8,
        "max_steps": STEPS,
        "telemetry": {"flush_every_steps": 5},
        "checkpoint": {"every_steps": 10, "keep_last": 10},
    }


@pytest.fixture
def ddp_stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.env["PYTHONPATH"] = os.pathsep.join(map(str, [*probe_paths(tmp_path), ROOT]))
    s.env["AMPTRAIN_WARM_SPARE"] = "false"  # multi-device jobs never use one; spare the CPU
    s.env["AMPTRAIN_WORKER_METRICS_PORT"] = "0"
    s.start_api()
    # Two jobs of two devices at once: the cpu-x2 queue, two pool slots.
    s.start_worker("worker", "gpu,cpu", "--devices-per-job", "2", "--concurrency", "2")
    yield s
    s.close()


def started(stack: Stack, job_id: str, attempt: int) -> dict[str, Any]:
    """The ``started`` event's process part for ``attempt`` (waits for it)."""

    def find() -> dict[str, Any]:
        for e in stack.events(job_id):
            if e["type"] == "started" and e["attempt"] == attempt:
                return dict(e["data"])
        return {}

    return wait_until(find, 180, f"{job_id} attempt {attempt} to start")


def pids(process: dict[str, Any]) -> list[int]:
    return [process["launcher_pid"], *(r["pid"] for r in process["ranks"])]


def none_alive(processes: list[int]) -> bool:
    return not any(map(running, processes))


def checkpointed(stack: Stack, job_id: str, step: int) -> bool:
    items = stack.client.get(f"/jobs/{job_id}/checkpoints").json()["items"]
    return any(c["step"] == step for c in items)


# Process handling, not SQL: one database keeps the suite short (each launch costs seconds).
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_lost_rank_lost_launcher_hung_rank_and_cancel_leave_no_process(
    ddp_stack: Stack, tmp_path: Path
) -> None:
    stack = ddp_stack
    gates = {k: tmp_path / f"{k}-go" for k in ("rank", "launcher")}
    # "rank": its rank 1 waits at step 25 (checkpoint 20 is written) until it is killed.
    # "launcher": its rank 1 waits at step 5 in every attempt: the first loses its launcher,
    # the second is cancelled while held (the cancel must wait for the flush at step 5).
    jobs = {
        "rank": stack.submit(
            ddp_job("kill-rank", hang_rank=1, hang_at=HELD_AT, hang_until=str(gates["rank"]))
        ),
        "launcher": stack.submit(
            ddp_job("kill-launcher", hang_rank=1, hang_at=5, hang_until=str(gates["launcher"]))
        ),
    }
    # A third job queues behind them: its rank 1 hangs for good, and the 5 s collective
    # timeout of its rank 0 must end the attempt (no retry: max_attempts 1).
    hung = stack.submit(
        {**ddp_job("hung", hang_rank=1, hang_at=HELD_AT), "collective_timeout_s": 5}
        | {"max_attempts": 1}
    )

    first = {k: started(stack, j["id"], 1) for k, j in jobs.items()}
    for data in first.values():
        assert data["precision"]["device"] == "cpu x 2 (DDP, gloo)"
        assert data["process"]["devices"] == 2 and len(data["process"]["ranks"]) == 2
    # Two jobs at once: each its own launcher, ranks and rendezvous port.
    ports = {k: d["process"]["rendezvous_port"] for k, d in first.items()}
    assert None not in ports.values() and ports["rank"] != ports["launcher"]
    procs = {k: d["process"] for k, d in first.items()}

    wait_until(lambda: checkpointed(stack, jobs["rank"]["id"], 20), 120, "checkpoint 20")
    os.kill(next(r["pid"] for r in procs["rank"]["ranks"] if r["rank"] == 1), signal.SIGKILL)
    os.kill(procs["launcher"]["launcher_pid"], signal.SIGKILL)
    for k in jobs:
        # Nothing of the first attempt survives: not the peer, not the orphaned ranks.
        wait_until(partial(none_alive, pids(procs[k])), 30, f"{k}: no process")
    gates["rank"].touch()  # its retry must not stop at the same step

    done = stack.wait_for_status(jobs["rank"]["id"], "succeeded", "failed", timeout=240)
    assert done["status"] == "succeeded" and done["attempt"] == 2, done["error"]
    resumed = [e for e in stack.events(jobs["rank"]["id"]) if e["type"] == "resumed"]
    assert [(e["attempt"], e["data"]["from_step"]) for e in resumed] == [(2, 20)]
    points = wait_for_points(stack, jobs["rank"]["id"], STEPS)
    assert [p["step"] for p in points] == list(range(1, STEPS + 1))
    requeued = [e for e in stack.events(jobs["rank"]["id"]) if e["type"] == "requeued"]
    assert "process(es) 1 of 2 ended without a result" in requeued[0]["data"]["error"]["message"]

    # Cancel: rank 0 is asked, rank 1 is held; both stop together at the flush of step 5.
    retry = started(stack, jobs["launcher"]["id"], 2)["process"]
    assert stack.client.post(f"/jobs/{jobs['launcher']['id']}/cancel").status_code == 202
    wait_until(
        lambda: "attempt 2: asked child to cancel" in stack.log_tail("worker", 400), 30, "cancel"
    )
    gates["launcher"].touch()
    done = stack.wait_for_status(jobs["launcher"]["id"], "cancelled", "failed", timeout=120)
    assert done["status"] == "cancelled" and done["attempt"] == 2, done["error"]
    # The ranks agreed at a flush, checkpointed together and stopped (nothing was killed).
    items = stack.client.get(f"/jobs/{jobs['launcher']['id']}/checkpoints").json()["items"]
    (stop,) = [c["step"] for c in items]
    assert 5 <= stop < STEPS  # at or just after the flush that carried the cancel
    retry_log = [
        x
        for x in stack.log_tail("worker", 600).splitlines()
        if f"{jobs['launcher']['id']} #2]" in x
    ]
    assert retry_log and not [x for x in retry_log if "killing" in x or "ending it" in x]
    assert not any(map(running, pids(retry)))

    done = stack.wait_for_status(hung["id"], "succeeded", "failed", timeout=240)
    assert done["status"] == "failed" and done["attempt"] == 1
    assert "1 of 2 ended without a result" in done["error"]["message"]
    assert not any(map(running, pids(started(stack, hung["id"], 1)["process"])))
    # The timeout ended it, not torchrun's 30 s grace for the hung rank: the failure came
    # soon after the last step that reached the service (timeout 5 s + our 3 s grace; the
    # issue asks for 15 s, the margin is for two busy cores).
    last_point = wait_for_points(stack, hung["id"], 20)[-1]
    failed = next(e for e in stack.events(hung["id"]) if e["type"] == "failed")
    assert failed["time"] - last_point["time"] < 20
