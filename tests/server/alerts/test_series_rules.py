"""Series rules fire in the recorder's transaction: thresholds on step fields, deviations
from the recent window, early stopping on an evaluation series; a stop action turns the
job ``cancelling`` with its reason, and the conclusion ends it as the rule asked."""

from __future__ import annotations

import sqlalchemy as sa

from amptrain.store import stops
from amptrain.store.models import AlertFiring, Job
from tests.server.alerts.conftest import started_job
from tests.support.receiver import Receiver, verify
from tests.support.stack import Stack, wait_until


def test_series_rules_fire_once_and_stop_as_asked(stack: Stack, receiver: Receiver) -> None:
    c = stack.client
    # A threshold on an evaluation series, read from the evaluations before the batch's.
    low = c.post(
        "/alerts/rules",
        json={
            "name": "good loss",
            "scope": {"name": "prod-*"},
            "when": {"kind": "threshold", "series": "eval_loss", "below": 0.55},
            "notify": {"url": receiver.url()},
        },
    )
    assert low.status_code == 201, low.text
    spike = c.post(
        "/alerts/rules",
        json={
            "name": "grad spike",
            "scope": {"name": "dev-*"},
            "when": {"kind": "deviation", "series": "loss", "window": 5, "z": 3},
            "stop": True,
        },
    ).json()
    # An early stop in the job's own spec: eval_loss stops improving after step 20.
    spec_rule = {
        "name": "plateau",
        "when": {"kind": "early_stop", "series": "eval_loss", "patience": 2, "min_delta": 0.01},
    }
    r = c.post(
        "/jobs",
        json={
            "model": {"name": "mlp", "args": {}},
            "dataset": {"name": "synthetic-classification", "args": {}},
            "device": "cpu",
            "max_steps": 100,
            "name": "prod-run",
            "alerts": [spec_rule],
        },
    )
    assert r.status_code == 201, r.text
    rules = c.get("/alerts/rules").json()["items"]
    assert {x["name"]: x["job_id"] for x in rules} == {
        "good loss": None,
        "grad spike": None,
        "plateau": r.json()["id"],
    }

    dev = started_job(stack, c, name="dev-1")
    from tests.support.producer import Producer

    prod = Producer(stack.redis_server.url, stack.env["AMPTRAIN_DATABASE_URL"], r.json()["id"])
    prod.start()
    try:
        # prod-run is outside the deviation rule's scope: its jump fires nothing.
        for p in (dev, prod):
            p.steps(1, 6, loss=1.0)
        prod.steps(7, 7, loss=50.0)
        dev.steps(7, 8, loss=1.0)
        dev.steps(9, 9, loss=50.0)  # more than 3 deviations from a constant window
        job = wait_until(
            lambda: (j := stack.job(dev.job_id))["status"] == "cancelling" and j, 30, "the stop"
        )
        events = wait_until(
            lambda: [e for e in stack.events(dev.job_id) if e["type"] == "alert_stop"], 30, "event"
        )
        assert events[0]["step"] == 9 and events[0]["data"]["rule"]["id"] == spike["id"]
        assert job["status"] == "cancelling"

        prod.evals(10, eval_loss=1.0)
        prod.evals(20, eval_loss=0.5)
        prod.evals(30, eval_loss=0.499)  # not better by min_delta: wait 1
        assert stack.job(prod.job_id)["status"] == "running"
        prod.evals(40, eval_loss=0.6)  # wait 2 = patience: stop here
        wait_until(lambda: stack.job(prod.job_id)["status"] == "cancelling", 30, "the early stop")
        (early,) = [e for e in stack.events(prod.job_id) if e["type"] == "early_stopped"]
        assert early["step"] == 40 and early["data"]["reason"] == "patience"
        assert early["data"]["series"] == "eval_loss" and early["data"]["rule"]["name"] == "plateau"

        # The worker's conclusion of a stopped attempt: the early stop ends succeeded,
        # the alert's stop cancelled; both fenced by the attempt.
        with prod.sessions.begin() as s:
            assert stops.finish_stopped(s, dev.job_id, dev.attempt + 1) is None  # fenced out
            ended = stops.finish_stopped(s, prod.job_id, prod.attempt)
            assert ended is not None and ended.status == "succeeded"
            assert ended.reason is not None and ended.reason["kind"] == "early_stop"
            cancelled = stops.finish_stopped(s, dev.job_id, dev.attempt)
            assert cancelled is not None and cancelled.status == "cancelled"
            firings = s.execute(sa.select(AlertFiring.job_id, AlertFiring.key)).all()
            expected = [
                (dev.job_id, "step:9"),
                (prod.job_id, "step:20"),
                (prod.job_id, "early_stop"),
            ]
            assert sorted(firings) == sorted(expected)  # 0.499 at 30: no second crossing
            assert s.get(Job, prod.job_id).stop_outcome == "succeeded"  # type: ignore[union-attr]
    finally:
        dev.close()
        prod.close()


def test_no_progress_fires_once_per_stall_and_stops(stack: Stack, receiver: Receiver) -> None:
    rule = stack.client.post(
        "/alerts/rules",
        json={
            "name": "stuck",
            "when": {"kind": "no_progress", "seconds": 5},
            "notify": {"url": receiver.url()},
            "stop": True,
        },
    ).json()
    job = started_job(stack, stack.client)
    try:
        job.steps(1, 3)
        wait_until(lambda: stack.job(job.job_id)["step"] == 3, 30, "the steps recorded")
        (request,) = wait_until(lambda: receiver.requests, 60, "the no-progress webhook")
        assert verify(rule["secret"], request)
        body = receiver.bodies()[0]
        assert body["rule"]["id"] == rule["id"] and body["step"] == 3
        assert body["data"]["stalled_s"] >= 5
        assert stack.job(job.job_id)["status"] == "cancelling"
        (stop,) = [e for e in stack.events(job.job_id) if e["type"] == "alert_stop"]
        assert stop["data"]["rule"]["name"] == "stuck"
        # Later rounds see the same stall: no second firing, no second request.
        wait_until(
            lambda: (
                stack.client.get(f"/alerts/rules/{rule['id']}/deliveries").json()["items"][0][
                    "status"
                ]
                == "delivered"
            ),
            30,
            "the delivery recorded",
        )
        assert len(receiver.requests) == 1
    finally:
        job.close()
