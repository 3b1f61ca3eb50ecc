"""health.fallback through the service: an fp16 job whose inputs exceed fp16's range ends
its first attempt, the worker re-queues it in bf16, and it succeeds with one series, a
precision history and events that say why, without spending its retry budget."""

from __future__ import annotations

import pytest

from tests.support.specs import service_job
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

STEPS = 30


def test_an_fp16_job_beyond_fp16s_range_falls_back_to_bf16_and_succeeds(stack: Stack) -> None:
    spec = service_job(
        "fp16",
        STEPS,
        # 1e6 is finite in bf16 and fp32, inf in fp16: every fp16 step overflows.
        dataset={"name": "synthetic-classification", "args": {"feature_scale": 1e6}},
        health={"fallback": "bf16"},
        max_attempts=1,  # a fallback is no failed attempt: one is enough
    )
    job = stack.submit(spec)
    # Submitted after it, to the same queue and the one slot: it waits for the fallen-back
    # job's second attempt too (which keeps its place), not just for its first.
    after = stack.submit(service_job("fp32", 2, name="submitted-after"))
    done = stack.wait_for_status(job["id"], "succeeded", "failed", timeout=120)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempt"] == 2 and done["precision"]["effective"] == "bf16"
    assert done["precision"]["requested"] == "fp16"

    history = stack.recorded_history(job["id"], STEPS)
    assert [p["step"] for p in history] == list(range(1, STEPS + 1))  # one series
    assert {p["attempt"] for p in history} == {2}  # the fp16 steps were all re-run
    assert all(p["loss_scale"] is None for p in history)  # bf16 has no scaler

    events = stack.events(job["id"])
    (fallback,) = [e for e in events if e["type"] == "precision_fallback"]
    data = fallback["data"]
    assert data["trigger"] == "nonfinite_loss" and data["trigger_step"] == 3
    assert (data["from"], data["to"], data["resume_from"]) == ("fp16", "bf16", 0)
    assert data["param"] is not None and data["param"].endswith(("weight", "bias"))
    requeued = [e for e in events if e["type"] == "requeued"]
    assert requeued and requeued[0]["data"]["error"]["code"] == "precision_fallback"

    segments = [(h["precision"], h["from_step"], h["attempt"]) for h in done["precision_history"]]
    assert segments == [("fp16", 0, 1), ("bf16", 0, 2)]
    assert "fp16 became unhealthy at step 3" in done["precision_history"][1]["reason"]

    later = stack.wait_for_status(after["id"], "succeeded", "failed", timeout=120)
    assert later["status"] == "succeeded", later["error"]
    started = {
        (e["data"]["attempt"], j["id"]): e["time"]
        for j in (job, after)
        for e in stack.events(j["id"])
        if e["type"] == "started"
    }
    assert started[(1, job["id"])] < started[(2, job["id"])] < started[(1, after["id"])], started
