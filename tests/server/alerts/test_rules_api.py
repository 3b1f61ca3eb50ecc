"""Alert rules over HTTP: owner-scoped, bounded, and firing only on their owner's jobs,
with exactly one signed delivery per firing to a real receiver on loopback."""

from __future__ import annotations

import httpx

from amptrain.store import jobs
from tests.server.alerts.conftest import started_job
from tests.support.receiver import Receiver, verify
from tests.support.stack import Stack, user_client, wait_until


def fields(response: httpx.Response) -> set[str]:
    assert response.status_code == 422, response.text
    return {p["field"] for p in response.json()["detail"]}


def test_rules_are_bounded_and_their_owners_alone(stack: Stack, receiver: Receiver) -> None:
    alice, bob = user_client(stack, "alice"), user_client(stack, "bob")
    hook = {"name": "on failure", "when": {"kind": "event", "events": ["diverged", "failed"]}}
    # A host not on the allow-list is refused at creation, naming the field.
    r = alice.post("/alerts/rules", json={**hook, "notify": {"url": "https://example.com/h"}})
    assert fields(r) == {"notify.url"}
    # NaN and infinities are refused (JSON has neither; Python's encoder writes them).
    bad = (
        '{"name": "n", "stop": true, "when": {"kind": "threshold", "series": "loss", "above": NaN}}'
    )
    r = alice.post("/alerts/rules", content=bad, headers={"Content-Type": "application/json"})
    assert fields(r) == {"when.threshold.above"}
    r = alice.post(
        "/alerts/rules",
        json={
            "name": "z",
            "stop": True,
            "when": {"kind": "deviation", "series": "loss", "window": 5000},
        },
    )
    assert fields(r) == {"when.deviation.window"}

    # A job spec's own alerts are checked the same way, naming the rule in the spec.
    spec = {
        "model": {"name": "mlp", "args": {}},
        "dataset": {"name": "synthetic-classification", "args": {}},
        "max_steps": 5,
        "alerts": [{**hook, "notify": {"url": "https://example.com/h"}}],
    }
    assert fields(alice.post("/jobs", json=spec)) == {"alerts.0.notify.url"}
    created = alice.post("/alerts/rules", json={**hook, "notify": {"url": receiver.url("/alice")}})
    assert created.status_code == 201, created.text
    rule = created.json()
    assert len(rule["secret"]) == 64
    everything = {"name": "bob's", "when": hook["when"], "notify": {"url": receiver.url("/bob")}}
    bob_rule = bob.post("/alerts/rules", json=everything).json()

    # Bob neither sees nor deletes Alice's rule, nor scopes a rule to her job.
    assert bob.get(f"/alerts/rules/{rule['id']}").status_code == 404
    assert bob.delete(f"/alerts/rules/{rule['id']}").status_code == 404
    assert bob.get(f"/alerts/rules/{rule['id']}/deliveries").status_code == 404
    assert [x["id"] for x in bob.get("/alerts/rules").json()["items"]] == [bob_rule["id"]]
    assert "secret" not in alice.get(f"/alerts/rules/{rule['id']}").json()

    on_start = {"name": "started", "when": {"kind": "event", "events": ["started"]}}
    started_rule = alice.post(
        "/alerts/rules", json={**on_start, "notify": {"url": receiver.url("/start")}}
    )
    assert started_rule.status_code == 201, started_rule.text
    job = started_job(stack, alice)
    # Where it ran is an admin's detail: a webhook of the owner's never carries it.
    job.events.publish(
        job.job_id,
        job.attempt,
        "started",
        0,
        {"worker": "amptrain-7@gpu-host", "process": {"pid": 7}},
    )
    try:
        r = bob.post("/alerts/rules", json={**everything, "scope": {"job_id": job.job_id}})
        assert fields(r) == {"scope.job_id"}
        # The job diverges: Alice's rule fires once; Bob's rule over "all jobs" never sees it.
        job.steps(1, 5)
        error = {"code": "diverged", "message": "diverged at step 5", "step": 5}
        with job.sessions.begin() as s:  # as the supervisor ends a diverged attempt
            assert jobs.finish(s, job.job_id, job.attempt, "failed", error)
        job.events.conclude(
            job.job_id, job.attempt, "failed", 5, {"error": error}, end_status="failed"
        )
        (request,) = wait_until(
            lambda: [r for r in receiver.requests if r["path"] == "/alice"], 30, "the webhook"
        )
    finally:
        job.close()
    assert verify(rule["secret"], request)
    (body,) = receiver.bodies("/alice")
    assert (
        request["headers"]["Idempotency-Key"] == body["id"] == f"amptrain-firing-{body['firing']}"
    )
    assert body["job"]["id"] == job.job_id and body["rule"]["id"] == rule["id"]
    page = wait_until(
        lambda: (
            (p := alice.get(f"/alerts/rules/{rule['id']}/deliveries").json())["items"]
            and p["items"][0]["status"] == "delivered"
            and p
        ),
        30,
        "the delivery recorded",
    )
    (delivery,) = page["items"]
    assert delivery["attempts"] == 1 and delivery["history"][0]["status_code"] == 204
    # One event, one firing, one request; nothing reached Bob.
    assert len(receiver.bodies("/alice")) == 1 and receiver.bodies("/bob") == []
    starts = wait_until(lambda: len(receiver.bodies("/start")) == 2 and receiver.requests, 30, "")
    shown = b"".join(r["body"] for r in starts if r["path"] == "/start")
    assert b"gpu-host" not in shown and b'"pid"' not in shown
    assert bob.get(f"/alerts/rules/{bob_rule['id']}/deliveries").json()["items"] == []

    # Bounded count per user (AMPTRAIN_MAX_ALERT_RULES_PER_USER=4 here).
    for i in range(2):
        assert (
            alice.post("/alerts/rules", json={**hook, "name": f"n{i}", "stop": True}).status_code
            == 201
        )
    r = alice.post("/alerts/rules", json={**hook, "stop": True})
    assert r.status_code == 429, r.text
    # A new secret, shown once, for the owner alone.
    assert bob.post(f"/alerts/rules/{rule['id']}/secret").status_code == 404
    rotated = alice.post(f"/alerts/rules/{rule['id']}/secret").json()["secret"]
    assert len(rotated) == 64 and rotated != rule["secret"]
    assert alice.delete(f"/alerts/rules/{rule['id']}").status_code == 204
    assert alice.get(f"/alerts/rules/{rule['id']}").status_code == 404
