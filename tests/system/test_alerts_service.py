"""Alert rules end to end with a real worker: a diverging fp16 job's signed webhook, an
early stop that ends the job ``succeeded`` at the expected evaluation, and a stop rule
that cancels with a checkpoint, its event naming the rule. One stack for the three."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from tests.server.alerts.conftest import WEBHOOK_ENV
from tests.support.receiver import Receiver, verify
from tests.support.specs import service_job
from tests.support.stack import Stack, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(database_url: str, redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(tmp_path, database_url, redis_server)
    s.env.update(WEBHOOK_ENV)
    s.start_api()
    s.start_worker()
    yield s
    s.close()


def _ended_with(stack: Stack, job_id: str, status: str) -> list[dict]:  # type: ignore[type-arg]
    """The job's events once its final event is recorded."""
    return wait_until(
        lambda: (ev := stack.events(job_id)) and any(e["type"] == status for e in ev) and ev,
        60,
        f"the {status} event",
    )


def test_alert_rules_with_a_real_worker(stack: Stack) -> None:
    receiver = Receiver()
    try:
        _diverging_fp16_job_is_signed_once(stack, receiver)
    finally:
        receiver.close()
    _early_stop_ends_succeeded_at_the_expected_evaluation(stack)
    _stop_rule_cancels_with_a_checkpoint(stack)


def _diverging_fp16_job_is_signed_once(stack: Stack, receiver: Receiver) -> None:
    rule = stack.client.post(
        "/alerts/rules",
        json={
            "name": "diverged",
            "when": {"kind": "event", "events": ["diverged"]},
            "notify": {"url": receiver.url()},
        },
    ).json()
    spec = service_job(
        "fp16",
        30,
        # 1e6 is inf in fp16: every step's loss is non-finite, and with no fallback the
        # guardian ends the run as diverged after 3 skipped steps.
        dataset={"name": "synthetic-classification", "args": {"feature_scale": 1e6}},
        health={"fallback": "none", "max_consecutive_skips": 3},
        max_attempts=1,
    )
    job = stack.submit(spec)
    done = stack.wait_for_status(job["id"], "failed", "succeeded", timeout=120)
    assert done["error"]["code"] == "diverged", done
    _ended_with(stack, job["id"], "failed")
    (request,) = wait_until(lambda: receiver.requests, 30, "the webhook")
    body = receiver.bodies()[0]
    assert verify(rule["secret"], request)
    assert body["job"]["id"] == job["id"] and body["data"]["event"] == "diverged"
    assert body["step"] == done["error"]["step"]
    wait_until(
        lambda: (
            stack.client.get(f"/alerts/rules/{rule['id']}/deliveries").json()["items"][0]["status"]
            == "delivered"
        ),
        30,
        "the delivery recorded",
    )
    assert len(receiver.requests) == 1  # one firing, one delivery


def _early_stop_ends_succeeded_at_the_expected_evaluation(stack: Stack) -> None:
    # eval_loss is far below 1e6 at the first evaluation (step 5): the target stops there.
    spec = service_job(
        max_steps=100_000,
        max_runtime_s=120,
        eval={"every_steps": 5, "batches": 1},
        alerts=[
            {
                "name": "good enough",
                "when": {"kind": "early_stop", "series": "eval_loss", "target": 1e6},
            }
        ],
    )
    job = stack.submit(spec)
    done = stack.wait_for_status(job["id"], "succeeded", "failed", "cancelled", timeout=60)
    assert done["status"] == "succeeded" and done["step"] < 100_000, done
    events = _ended_with(stack, job["id"], "succeeded")
    (early,) = [e for e in events if e["type"] == "early_stopped"]
    assert early["step"] == 5 and early["data"]["reason"] == "target"
    assert early["data"]["rule"]["name"] == "good enough" and early["data"]["series"] == "eval_loss"
    (succeeded,) = [e for e in events if e["type"] == "succeeded"]
    assert succeeded["data"]["stopped_by"]["rule"]["name"] == "good enough"
    _has_checkpoint_at(stack, job["id"], succeeded["step"])


def _stop_rule_cancels_with_a_checkpoint(stack: Stack) -> None:
    rule = stack.client.post(
        "/alerts/rules",
        json={
            "name": "loss guard",
            "scope": {"name": "guarded-*"},
            "when": {"kind": "threshold", "series": "loss", "below": 1e9},
            "stop": True,
        },
    ).json()
    job = stack.submit(service_job(max_steps=100_000, max_runtime_s=120, name="guarded-1"))
    done = stack.wait_for_status(job["id"], "cancelled", "failed", "succeeded", timeout=60)
    assert done["status"] == "cancelled", done
    events = _ended_with(stack, job["id"], "cancelled")
    (fired,) = [e for e in events if e["type"] == "alert_stop"]
    assert fired["data"]["rule"] == {"id": rule["id"], "name": "loss guard"}
    (cancelled,) = [e for e in events if e["type"] == "cancelled"]
    assert cancelled["data"]["stopped_by"]["rule"]["id"] == rule["id"]
    _has_checkpoint_at(stack, job["id"], cancelled["step"])


def _has_checkpoint_at(stack: Stack, job_id: str, step: int) -> None:
    listed = stack.client.get(f"/jobs/{job_id}/checkpoints").json()
    steps = [c["step"] for c in listed["items"]]
    assert step in steps, (step, listed)
