"""End to end with real processes: uvicorn API, Celery worker, private Redis, SQLite/PostgreSQL."""

from __future__ import annotations

import signal
from typing import Any

import httpx
import pytest

from amptrain.contract.metrics import METRIC_FIELDS
from tests.support.specs import service_job
from tests.support.stack import Stack, user_client, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(module_stack: Stack) -> Stack:
    """One stack for this module's tests: each submits its own jobs, and the one that lists
    jobs does it as its own user; the API restart leaves a running API behind."""
    return module_stack


def wait_for_points(stack: Stack, job_id: str, count: int) -> list[dict[str, Any]]:
    """The effective series of an ended job, once the recorder has committed all of it (at
    least ``count`` points). The job's status is SQL's at once, its history follows: wait
    for the event that ends its stream, which comes after every point. (Counting points
    was not enough: while a resumed attempt's points were still arriving, an older
    attempt's stood in for them, out of cursor order.)"""
    return stack.recorded_history(job_id, count)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_job_trains_and_reports_every_step(stack: Stack, precision: str) -> None:
    job = stack.submit(service_job(precision))
    assert job["status"] == "queued"
    done = stack.wait_for_status(job["id"], "succeeded", "failed")
    assert done["status"] == "succeeded", done["error"]
    assert done["precision"] == {
        "requested": precision,
        "effective": precision,
        "reason": done["precision"]["reason"],
    }

    points = wait_for_points(stack, job["id"], 30)
    assert [p["step"] for p in points] == list(range(1, 31))
    for p in points:
        assert set(METRIC_FIELDS) | {"attempt", "cursor"} <= set(p)
        assert p["attempt"] == 1
    assert (points[0]["loss_scale"] is not None) == (precision == "fp16")

    started = [e for e in stack.events(job["id"]) if e["type"] == "started"]
    assert len(started) == 1 and started[0]["data"]["precision"]["effective"] == precision

    final = stack.job(job["id"])
    last = points[-1]
    assert final["step"] == 30
    assert final["summary"]["loss"] == pytest.approx(last["loss"])
    assert final["summary"]["loss_scale"] == last["loss_scale"]
    assert final["summary"]["skipped_steps"] == last["skipped_steps"]
    assert final["summary"]["memory_peak"] == last["memory_peak"]
    # Steady state, not the newest step's: the samples of the steps after the first 10%
    # (the warm-up) over their seconds.
    steady = points[len(points) // 10 :]
    samples = sum(p["samples_per_second"] * p["step_time_ms"] for p in steady)
    seconds = sum(p["step_time_ms"] for p in steady)
    assert final["summary"]["samples_per_second"] == pytest.approx(samples / seconds)


def test_cursor_paging_returns_every_point_once(stack: Stack) -> None:
    job = stack.submit(service_job(max_steps=40))
    stack.wait_for_status(job["id"], "succeeded")
    wait_for_points(stack, job["id"], 40)
    paged = stack.all_metrics(job["id"], limit=7)
    assert [p["step"] for p in paged] == list(range(1, 41))
    # A cursor taken from the middle returns only what came after it.
    rest = stack.client.get(
        f"/jobs/{job['id']}/metrics", params={"after": paged[19]["cursor"], "limit": 100}
    ).json()
    assert [p["step"] for p in rest["items"]] == list(range(21, 41))


def test_idempotent_resubmission_returns_the_same_job(stack: Stack) -> None:
    spec = service_job(max_steps=5)
    with user_client(stack, "idempotent") as client:  # sees only its own jobs
        first = client.post("/jobs", json=spec, headers={"Idempotency-Key": "abc"})
        again = client.post("/jobs", json=spec, headers={"Idempotency-Key": "abc"})
        other = client.post(
            "/jobs", json={**spec, "max_steps": 6}, headers={"Idempotency-Key": "abc"}
        )
        assert (first.status_code, again.status_code, other.status_code) == (201, 200, 409)
        assert again.json()["id"] == first.json()["id"]
        listed = client.get("/jobs").json()["items"]
    assert [j["id"] for j in listed] == [first.json()["id"]]


def test_cancel_stops_a_long_job(stack: Stack) -> None:
    job = stack.submit(service_job(max_steps=1_000_000))
    stack.wait_for_status(job["id"], "running")
    wait_until(lambda: stack.job(job["id"])["step"] > 0, 60, "the first recorded step")
    assert stack.client.post(f"/jobs/{job['id']}/cancel").status_code == 202
    done = stack.wait_for_status(job["id"], "cancelled", "failed", "succeeded", timeout=15)
    assert done["status"] == "cancelled"
    assert stack.client.post(f"/jobs/{job['id']}/cancel").status_code == 409
    # The status is SQL's at once; the recorder stores the cancelled event after the job's
    # last points (CI read the events before it had): wait for it in the history.
    history = stack.recorded_history(job["id"], 1)
    # One step everywhere (it read "cancelled step 0" for a job stopped at step 1815): the
    # event, the job's progress and its history's last point.
    (cancelled,) = [e for e in stack.events(job["id"]) if e["type"] == "cancelled"]
    assert cancelled["step"] > 0
    assert cancelled["step"] == stack.job(job["id"])["step"] == history[-1]["step"]


def test_requests_without_a_token_are_refused(stack: Stack) -> None:
    anonymous = httpx.get(f"{stack.client.base_url}/jobs")
    assert anonymous.status_code == 401
    assert anonymous.json()["error"] == "unauthorized"
    assert httpx.get(f"{stack.client.base_url}/healthz").status_code == 200


def test_api_restart_mid_run_loses_no_metric_or_event(stack: Stack) -> None:
    job = stack.submit(
        service_job(max_steps=400, telemetry={"flush_every_steps": 10, "flush_every_ms": 100})
    )
    wait_until(lambda: stack.job(job["id"])["step"] >= 20, 60, "some recorded steps")
    stack.kill(
        "api", signal.SIGKILL
    )  # the recorder dies mid-stream, unacknowledged entries pending
    stack.start_api()
    stack.wait_for_status(job["id"], "succeeded", timeout=180)
    points = wait_for_points(stack, job["id"], 400)
    assert [p["step"] for p in points] == list(range(1, 401))
    events = stack.events(job["id"])
    types = [e["type"] for e in events]
    assert types.count("started") == 1 and types.count("succeeded") == 1
    assert {e["step"] for e in events if e["type"] == "checkpoint"} == set(range(10, 401, 10))
