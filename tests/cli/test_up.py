"""`amptrain up`: one command runs the whole service on a bare machine, and Ctrl-C stops it all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.components.test_plugins import example_plugin_site
from tests.support.cpu_verdict import expected_measured
from tests.support.probe import probe_paths
from tests.support.receiver import Receiver, verify
from tests.support.specs import mlp_job
from tests.support.stack import free_port, wait_until
from tests.support.up import finished_job, start_up

pytestmark = pytest.mark.slow


# Alone it takes about 35 s; a loaded CI machine (four test processes on two cores, and this
# test's own long job busy on one of them) took 222 s, 120 s of it waiting on the fallback.
WAIT_S = 120
"""A wait for one event: a few seconds alone, ten times that beside busy processes on
two cores; the deadline only decides how long a failure takes to say so."""


@pytest.mark.timeout(600)
def test_up_runs_a_job_and_stops_cleanly(tmp_path: Path) -> None:
    metrics_port = free_port()
    args = ("--slots", "2", "--worker-metrics-port", str(metrics_port))
    # The example plugin is installed (as pip would leave it): its metric is one a team defines.
    # Any PYTHONPATH the test runs under stays after it: `up` runs the code under test.
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    # The probe plugin too: its paced model is the long job.
    plugins = [*example_plugin_site(tmp_path / "site"), *probe_paths(tmp_path / "probe")]
    plugin = os.pathsep.join([*map(str, plugins), *inherited])
    # Webhooks to the test's receiver on loopback (private addresses are refused unless allowed).
    hooks = {
        "AMPTRAIN_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
        "AMPTRAIN_WEBHOOK_ALLOW_PRIVATE": "true",
    }
    receiver = Receiver()
    up = start_up(
        tmp_path,
        tmp_path / "data",
        args=args,
        settings={"PYTHONPATH": plugin, **hooks},
        guide=True,
    )
    try:
        client = up.admin_client()
        assert (tmp_path / "data" / "admin-token").stat().st_mode & 0o777 == 0o600
        # The command line finds this `up` on its port by the data directory alone, and,
        # with nothing submitted yet, says what to do.
        listed = cli(tmp_path, "jobs")
        assert listed.returncode == 0, listed.stderr
        assert "No jobs yet" in listed.stdout and "amptrain submit" in listed.stdout
        # Two slots: a short job finishes while a long one holds the other. The long one
        # sleeps 50 ms a step: spinning, it and its points took a core from the whole suite.
        paced = {"name": "ddp-probe", "args": {"pace": 0.05}}
        long = client.post(
            "/jobs", json=mlp_job(name="long", max_steps=200_000, model=paced)
        ).json()
        wait_until(
            lambda: client.get(f"/jobs/{long['id']}").json()["step"] > 0,
            WAIT_S,
            "the long job to train",
        )
        job = client.post(
            "/jobs",
            json={
                "model": {"name": "mlp"},
                "dataset": {"name": "synthetic-classification"},
                "max_steps": 5,
                "eval": {"metrics": ["accuracy", "brier_score"]},
            },
        ).json()
        done = finished_job(client, job["id"], 120)
        assert done["status"] == "succeeded", up.tail()
        # A CPU-only machine: the job went to the cpu queue, where it trained.
        queued = client.get(f"/jobs/{job['id']}/events").json()["items"][0]
        assert (queued["type"], queued["data"]["queue"]) == ("queued", "cpu"), queued
        assert job["id"] in cli(tmp_path, "jobs").stdout
        # Evaluated once at the end on the held-out split, the plugin's metric beside accuracy.
        wait_until(
            lambda: client.get(f"/jobs/{job['id']}/evals").json()["items"],
            WAIT_S,
            "the job's final evaluation in its history",
        )
        (final,) = client.get(f"/jobs/{job['id']}/evals").json()["items"]
        assert final["step"] == 5 and set(final["values"]) == {"accuracy", "brier_score"}
        summary = client.get(f"/jobs/{job['id']}").json()["summary"]["eval"]
        assert summary["values"] == final["values"]
        # fp16 beyond its range on `up`: every step overflows, the loss scale halves each
        # time until it falls below its floor (the non-finite-loss trigger set out of reach),
        # and the guardian falls back to bf16; the job succeeds.
        fallback = mlp_job(
            name="fallback",
            max_steps=40,
            precision="fp16",
            dataset={"name": "synthetic-classification", "args": {"feature_scale": 1e6}},
            health={"fallback": "bf16", "diverge_nonfinite_steps": 1000},
            max_attempts=1,
        )
        # An alert rule on the fallback: one signed webhook, from the API process `up` runs.
        rule = client.post(
            "/alerts/rules",
            json={
                "name": "fell back",
                "when": {"kind": "event", "events": ["precision_fallback"]},
                "notify": {"url": receiver.url()},
            },
        ).json()
        # Two attempts, each in a fresh training process (the fallback ends the first), beside
        # the long job: 10 s alone, over 120 s once in a loaded CI run.
        fell = finished_job(client, client.post("/jobs", json=fallback).json()["id"], 300)
        assert fell["status"] == "succeeded", (fell["error"], up.tail())
        assert [h["precision"] for h in fell["precision_history"]] == ["fp16", "bf16"]
        events = client.get(f"/jobs/{fell['id']}/events").json()["items"]
        (why,) = [e["data"] for e in events if e["type"] == "precision_fallback"]
        assert why["trigger"] == "loss_scale_floor" and why["param"] is not None, why
        deliveries = f"/alerts/rules/{rule['id']}/deliveries"
        wait_until(
            lambda: [d["status"] for d in client.get(deliveries).json()["items"]] == ["delivered"],
            WAIT_S,
            "the fallback's webhook delivered",
        )
        (request,) = receiver.requests  # one firing, one delivery
        assert verify(rule["secret"], request)
        assert receiver.bodies()[0]["job"]["id"] == fell["id"]
        # A fork of the finished 5-step job at its last checkpoint, with another learning
        # rate: its series goes on from step 6, and it knows where it came from.
        fork = client.post(
            f"/jobs/{job['id']}/fork",
            json={"step": 5, "overrides": {"max_steps": 7, "optimizer": {"lr": 0.0005}}},
        )
        assert fork.status_code == 201, fork.text
        forked = finished_job(client, fork.json()["id"], 120)
        assert forked["status"] == "succeeded", (forked["error"], up.tail())
        assert forked["forked_from"] == {"job": job["id"], "step": 5}
        wait_until(
            lambda: (
                [p["step"] for p in client.get(f"/jobs/{forked['id']}/metrics").json()["items"]]
                == [6, 7]
            ),
            WAIT_S,
            "the fork's points, from step 6",
        )
        assert client.get(f"/jobs/{long['id']}").json()["status"] == "running"
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
        assert "amptrain_worker_busy_slots" in scraped  # on the port asked for
        assert client.post(f"/jobs/{long['id']}/cancel").status_code == 202
        # Recorded into SQL by the recorder process `up` runs beside the API.
        wait_until(
            lambda: len(client.get(f"/jobs/{job['id']}/metrics").json()["items"]) == 5,
            WAIT_S,
            "the job's 5 points in its history",
        )
        assert "recorder: started" in up.log.read_text()
        # auto measured the job's own model (bf16 against fp32 on this CPU): the verdict is
        # the one the ratio in its own reason calls for (the worker's report shows the
        # capability rule, the fallback when a model cannot be measured).
        precision = done["precision"]
        assert precision["effective"] == expected_measured(precision), precision
        assert "measured over" in precision["reason"], precision
        # Kept by the worker beyond the attempt's process: the next such job takes it as is.
        assert (tmp_path / "data" / "auto-precision.json").exists()
        # The documentation site, built beside the service from this checkout's docs/ (long
        # done by now: the jobs above took far longer), at the address `up` printed.
        assert f"docs: http://127.0.0.1:{up.port}/guide/" in up.log.read_text()
        wait_until(lambda: "docs: ready at" in up.log.read_text(), 120, "the docs built")
        guide = client.get("/guide/tutorials/first-job.html")
        assert guide.status_code == 200 and "Your first job" in guide.text
    finally:
        up.stop()
        receiver.close()
    # The terminal shows amptrain's lines: not Celery's banner, its root warning or its info
    # lines, nor uvicorn's; and the record the command line followed is gone with `up`.
    log = up.log.read_text()
    assert f"amptrain is up at http://127.0.0.1:{up.port}/ui/" in log
    # Said once its worker takes jobs, after the line that it is starting.
    assert log.index("amptrain is starting at") < log.index("amptrain is up at")
    for theirs in (
        "SecurityWarning",
        "[tasks]",
        "-------------- ",
        "celery.worker.consumer",
        "Uvicorn running",
    ):
        assert theirs not in log, (theirs, log[-3000:])  # fmt: skip
    assert not (tmp_path / "data" / "server.json").exists()
    # Nothing left behind: the API, worker and Redis children are gone.
    assert not (tmp_path / "data" / "redis" / "redis.sock").exists() or _dead_socket(tmp_path)


def cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``amptrain ARGS`` as a person beside `up` runs it: no URL or token given, the data
    directory `up` was started with."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPTRAIN_")}
    env |= {"AMPTRAIN_DATA_DIR": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "amptrain.cli.main", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def _dead_socket(tmp_path: Path) -> bool:
    import redis

    try:
        redis.Redis(unix_socket_path=str(tmp_path / "data" / "redis" / "redis.sock")).ping()
    except redis.ConnectionError:
        return True
    return False
