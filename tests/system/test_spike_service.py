"""health.spike through the service: rollbacks recorded as events, no step recorded twice,
and past ``max_rollbacks`` the job fails naming the step."""

from __future__ import annotations

import pytest

from tests.support.specs import service_job
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.slow


def test_rollbacks_are_events_and_past_the_bound_the_job_fails_naming_the_step(
    stack: Stack,
) -> None:
    # A bar of the mean plus a millionth of a standard deviation: after the warm-up about
    # every other step's gradient norm is a "spike", so the bound is reached within a few.
    rule = {
        "metric": "grad_norm",
        "window": 8,
        "warmup_steps": 8,
        "z": 1e-6,
        "action": "rollback",
        "max_rollbacks": 2,
    }
    spec = service_job(max_steps=200, health={"spike": rule})
    spec["checkpoint"] = {"every_steps": 5, "keep_last": 3}
    job = stack.submit(spec)
    done = stack.wait_for_status(job["id"], "failed", "succeeded", timeout=120)
    assert done["status"] == "failed" and done["error"]["code"] == "diverged", done["error"]
    step = done["error"]["step"]
    assert f"diverged at step {step}" in done["error"]["message"]
    assert "after 2 rollbacks" in done["error"]["message"]

    def rollbacks() -> list[dict[str, object]]:
        return [e for e in stack.events(job["id"]) if e["type"] == "rollback"]

    first, second = wait_until(lambda: len(rollbacks()) == 2 and rollbacks(), 30, "rollbacks")
    for n, event in enumerate((first, second), start=1):
        data = event["data"]
        assert data["rollbacks"] == n and data["name"] is not None  # a checkpoint's name
        assert "/" not in str(data["name"])  # never a server path
        assert data["from_step"] <= data["spike_step"] <= event["step"]
    history = stack.recorded_history(job["id"], step)
    steps = [p["step"] for p in history]
    assert steps == list(range(1, step + 1))  # each step once: a rollback never re-runs one
