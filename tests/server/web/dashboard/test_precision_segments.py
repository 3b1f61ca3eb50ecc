"""After a precision fallback the job page says which precision trained which steps: the
header lists the precisions with their steps and attempts, says why in one sentence from
the fallback's fields, and every chart tints their spans, each label whole (GET
/jobs/{id}'s precision_history, built from the attempts' events)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

try:
    from playwright.sync_api import Page, expect
except ImportError:  # outside CI a missing playwright skips, like a missing browser
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

from amptrain.contract.records import PRECISION_FALLBACK
from tests.server.web.ab_runs import spec
from tests.server.web.dashboard.conftest import WIDE, screenshot, sign_in
from tests.support.producer import Producer
from tests.support.stack import Stack, wait_until

DASH = "\N{EN DASH}"
HEALTHY = 10
"""The newest healthy checkpoint's step: the bf16 attempt resumes there."""
TRIGGER = 20
STEPS = 40


def fall_back(stack: Stack, name: str, trigger: int, healthy: int | None) -> str:
    """An fp16 job that falls back to bf16 at step ``trigger`` and goes on from the healthy
    checkpoint of step ``healthy`` (None: there is none, so from the start)."""
    job = stack.submit(spec(name=name, max_steps=STEPS, precision="fp16"))
    feed = Producer(stack.env["AMPTRAIN_REDIS_URL"], stack.env["AMPTRAIN_DATABASE_URL"], job["id"])
    try:
        feed.start("fp16")
        feed.steps(1, trigger)
        feed.engine_event(
            PRECISION_FALLBACK,
            trigger,
            trigger="loss_scale_floor",
            trigger_step=trigger,
            to="bf16",
            resume_from=healthy or 0,
            checkpoint=None,
            param="fc1.weight",
            message=f"fp16 became unhealthy at step {trigger}: the loss scale stayed below "
            "2^-14 for 1 step (fc1.weight overflowed first); falling back to bf16 from the "
            + (f"last healthy checkpoint (step {healthy})" if healthy else "start"),
        )
        feed.requeue(trigger)
        feed.start("bf16")
        if healthy:
            feed.engine_event("resumed", healthy, from_step=healthy)
        feed.steps((healthy or 0) + 1, STEPS)
        feed.finish("succeeded", STEPS)
    finally:
        feed.close()
    return str(job["id"])


def test_the_steps_of_each_precision_are_marked_after_a_fallback(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    job_id = fall_back(stack, "fallback", TRIGGER, HEALTHY)
    # The API gives the fallback as fields, and where fp16 stopped.
    history = wait_until(
        lambda: len(h := stack.job(job_id)["precision_history"]) == 2 and h,
        30,
        "the attempts' events to be recorded",
    )
    fp16, bf16 = history
    assert (fp16["from_step"], fp16["until_step"], fp16["fallback"]) == (0, TRIGGER, None)
    assert (bf16["from_step"], bf16["until_step"], bf16["attempt"]) == (HEALTHY, None, 2)
    assert bf16["fallback"] == {
        "trigger": "loss_scale_floor",
        "trigger_step": TRIGGER,
        "to": "bf16",
        "resume_from": HEALTHY,
        "param": "fc1.weight",
    }
    page.set_viewport_size(WIDE)
    sign_in(page, stack.token)
    page.goto(f"/ui/#/jobs/{job_id}")
    expect(page.locator("#precision-history")).to_have_text(
        f"fp16 steps 1{DASH}{TRIGGER} · bf16 from step {HEALTHY + 1} "
        f"(attempt 2, steps {HEALTHY + 1}{DASH}{TRIGGER} trained again)"
    )
    expect(page.locator("#precision-why")).to_have_text(
        f"fp16 fell back to bf16 at step {TRIGGER}: its loss scale stayed below the floor. "
        f"Attempt 2 went on from its checkpoint of step {HEALTHY}."
    )
    for chart in ("loss", "lr"):
        expect(page.locator(f"[data-chart={chart}]")).to_have_attribute(
            "data-precisions", f"fp16@0 bf16@{HEALTHY}"
        )
    # Each band's label drawn whole: fp16's band (steps 1-10) has room for it.
    expect(page.locator("[data-chart=loss]")).to_have_attribute(
        "data-span-labels", f"fp16@0 bf16@{HEALTHY}"
    )
    expect(page.locator("[data-chart=loss]")).to_have_attribute("data-points", str(STEPS))
    screenshot(page, "job-precision-fallback", tmp_path)


def test_a_fallback_with_no_checkpoint_reads_as_two_attempts_not_two_precisions_at_once(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    """Issue 43: a fallback at step 3 that restarts from the start read "fp16 from step 0 ·
    bf16 from step 0" (as if both ran at once), its reason one tangled sentence, and its
    fp16 label drawn over the bf16 one ("if16")."""
    job_id = fall_back(stack, "fallback-from-start", 3, None)
    page.set_viewport_size(WIDE)
    sign_in(page, stack.token)
    page.goto(f"/ui/#/jobs/{job_id}")
    expect(page.locator("#precision-history")).to_have_text(
        f"fp16 steps 1{DASH}3 · bf16 from step 1 (attempt 2, steps 1{DASH}3 trained again)"
    )
    expect(page.locator("#precision-why")).to_have_text(
        "fp16 fell back to bf16 at step 3: its loss scale stayed below the floor. "
        "Attempt 2 went on from the start (no healthy checkpoint)."
    )
    # Every step shown was trained in bf16: only its band and label are drawn.
    loss = page.locator("[data-chart=loss]")
    expect(loss).to_have_attribute("data-points", str(STEPS))
    expect(loss).to_have_attribute("data-span-labels", "bf16@0")
    screenshot(page, "job-precision-fallback-from-start", tmp_path)


def test_the_header_takes_an_attempts_precision_from_the_live_stream(
    page: Page, stack: Stack
) -> None:
    job = stack.submit(spec(name="live-head", max_steps=STEPS, precision="fp16"))
    sign_in(page, stack.token)
    page.goto(f"/ui/#/jobs/{job['id']}")
    expect(page.locator("#precision")).to_have_text("fp16 (not started)")
    expect(page.locator("#live-state")).to_have_attribute("data-state", "live")
    feed = Producer(stack.env["AMPTRAIN_REDIS_URL"], stack.env["AMPTRAIN_DATABASE_URL"], job["id"])
    try:
        # This stand-in worker never writes the precision into SQL, so only the stream's
        # ``started`` event can tell the header (which polled "not started" beside drawn steps).
        feed.start("fp16")
        feed.steps(1, 5)
        expect(page.locator("#precision")).to_have_text("fp16 (asked fp16)")
        expect(page.locator("[data-chart=loss]")).to_have_attribute("data-points", "5")
        feed.finish("succeeded", 5)
    finally:
        feed.close()
