"""After a precision fallback the job page says which precision trained which steps: the
header lists the precisions with the step each began at, and every chart tints their spans
(GET /jobs/{id}'s precision_history, built from the attempts' events)."""

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
from tests.server.web.dashboard.conftest import screenshot, sign_in
from tests.support.producer import Producer
from tests.support.stack import Stack

HEALTHY = 10
"""The newest healthy checkpoint's step: the bf16 attempt resumes there."""
TRIGGER = 20
STEPS = 40


def test_the_steps_of_each_precision_are_marked_after_a_fallback(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    job = stack.submit(spec(name="fallback", max_steps=STEPS, precision="fp16"))
    feed = Producer(stack.env["AMPTRAIN_REDIS_URL"], stack.env["AMPTRAIN_DATABASE_URL"], job["id"])
    try:
        feed.start("fp16")
        feed.steps(1, TRIGGER)
        feed.engine_event(
            PRECISION_FALLBACK,
            TRIGGER,
            trigger="loss_scale_floor",
            trigger_step=TRIGGER,
            to="bf16",
            resume_from=HEALTHY,
            message=f"fp16 became unhealthy at step {TRIGGER}: falling back to bf16",
        )
        feed.requeue(TRIGGER)
        feed.start("bf16")
        feed.engine_event("resumed", HEALTHY, from_step=HEALTHY)
        feed.steps(HEALTHY + 1, STEPS)
        feed.finish("succeeded", STEPS)
    finally:
        feed.close()
    sign_in(page, stack.token)
    page.goto(f"/ui/#/jobs/{job['id']}")
    expect(page.locator("#precision-history")).to_have_text(
        f"fp16 from step 0 · bf16 from step {HEALTHY}"
    )
    for chart in ("loss", "lr"):
        expect(page.locator(f"[data-chart={chart}]")).to_have_attribute(
            "data-precisions", f"fp16@0 bf16@{HEALTHY}"
        )
    expect(page.locator("[data-chart=loss]")).to_have_attribute("data-points", str(STEPS))
    screenshot(page, "job-precision-fallback", tmp_path)


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
