"""`amptrain up` runs a `devices: N` job the machine can run without any flag: it starts
the worker of that job's shape queue when the job waits, and says why when it cannot."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from amptrain.cli.up_shapes import shape_of, why_not
from tests.support.specs import mlp_job
from tests.support.stack import wait_until
from tests.support.up import finished_job, start_up

SERVED = ("gpu", "cpu", "gpu-a100")


def test_shape_queues_of_the_served_queues() -> None:
    assert shape_of("cpu-x2", SERVED) == ("cpu", 2)
    assert shape_of("gpu-a100-x8", SERVED) == ("gpu-a100", 8)
    assert shape_of("cpu", SERVED) is None  # one device: up's own worker takes it
    assert shape_of("tpu-x2", SERVED) is None  # a queue up does not serve
    assert shape_of("cpu-x9", SERVED) is None  # beyond MAX_DEVICES
    assert shape_of("cpu-x1", SERVED) is None
    # Names no shape queue has: not a worker of a made-up queue.
    for hostile in (
        "cpu-x02",
        "-x2",
        "cpu-x2-x2",
        "cpu;rm-x2",
        "cpu-x2\n",
        "cpu-x99999999999999999999",
    ):
        assert shape_of(hostile, SERVED) is None, hostile


def test_what_the_machine_can_run() -> None:
    assert why_not("cpu", 2, cpus=2, gpus=lambda: 0) is None
    assert (
        why_not("cpu", 4, cpus=2, gpus=lambda: 0) == "4 CPU ranks need 4 cores; this machine has 2"
    )
    assert why_not("gpu", 2, cpus=64, gpus=lambda: 2) is None
    assert why_not("gpu", 2, cpus=64, gpus=lambda: 1) == "2 GPUs needed; this machine shows 1"


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two CPU ranks need two cores")
def test_up_runs_a_two_rank_cpu_job_without_flags(tmp_path: Path) -> None:
    up = start_up(tmp_path, tmp_path / "data")
    try:
        client = up.admin_client()
        # No GPU here (start_up hides them): a 2-GPU job waits, and up says why, once.
        gpu_reply = client.post("/jobs", json={**mlp_job(5), "device": "cuda", "devices": 2})
        reply = client.post("/jobs", json=mlp_job(5, devices=2, precision="fp32"))
        assert reply.status_code == gpu_reply.status_code == 201, (reply.text, gpu_reply.text)
        job, gpu_job = reply.json(), gpu_reply.json()
        # At submit no worker takes those queues yet, and the answer says so.
        assert "queue cpu-x2" in job["notice"] and "queue gpu-x2" in gpu_job["notice"]
        done = finished_job(client, job["id"], 180)
        assert done["status"] == "succeeded", up.tail()
        process = next(
            e["data"]["process"]
            for e in client.get(f"/jobs/{job['id']}/events").json()["items"]
            if e["type"] == "started" and "process" in e["data"]
        )
        assert process["devices"] == 2 and len(process["ranks"]) == 2
        text = wait_until(
            lambda: up.log.read_text() if "cannot run" in up.log.read_text() else "",
            30,
            "up to say why",
        )
        assert "starting a worker for 2-device jobs (queue cpu-x2)" in text
        assert (
            "a job waits on queue gpu-x2, which this machine cannot run: "
            "2 GPUs needed; this machine shows 0" in text
        )
        assert text.count("cannot run") == 1
        assert client.get(f"/jobs/{gpu_job['id']}").json()["status"] == "queued"
    finally:
        up.stop()
    assert "waiting for the workers: running jobs checkpoint" in up.log.read_text()
