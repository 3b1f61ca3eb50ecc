"""The dashboard's Alerts page in a real headless Chromium: the signed-in user's rules
(what each watches, its jobs, its actions) and each rule's deliveries with their last
outcome, never another user's rules. API only (no worker): a Producer plays the job."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    from playwright.sync_api import Page, expect
except ImportError:  # outside CI a missing playwright skips, like a missing browser
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

from tests.server.alerts.conftest import WEBHOOK_ENV, started_job
from tests.server.web.dashboard.conftest import screenshot, sign_in
from tests.support.receiver import Receiver
from tests.support.shared_stack import running_stack
from tests.support.stack import Stack, user_client, wait_until


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("alerts-page"), workers=(), env=WEBHOOK_ENV) as s:
        yield s


def test_the_alerts_page_lists_rules_and_deliveries(
    page: Page, stack: Stack, tmp_path: Path
) -> None:
    receiver = Receiver()
    try:
        rule = stack.client.post(
            "/alerts/rules",
            json={
                "name": "spikes to slack",
                "scope": {"name": "exp-*"},
                "when": {"kind": "event", "events": ["loss_spike"]},
                "notify": {"url": receiver.url(), "format": "slack"},
            },
        ).json()
        other = user_client(stack, "mallory")
        hidden = other.post(
            "/alerts/rules",
            json={
                "name": "mallory's",
                "when": {"kind": "event", "events": ["failed"]},
                "stop": True,
            },
        ).json()
        job = started_job(stack, stack.client, name="exp-1")
        try:
            job.steps(1, 2)
            job.engine_event("warning", 2, code="loss_spike", count=1)
            assert job.sink is not None and job.sink.flush()
            wait_until(lambda: receiver.requests, 30, "the webhook")
        finally:
            job.close()
        assert "text" in receiver.bodies()[0]  # the Slack-compatible body

        sign_in(page, stack.token)
        page.click("#nav a[data-page=alerts]")
        card = page.locator(f"[data-rule='{rule['id']}']")
        expect(card).to_contain_text("spikes to slack")
        expect(card).to_contain_text("on loss_spike")
        expect(card).to_contain_text("jobs exp-*")
        expect(card).to_contain_text("(slack)")
        row = card.locator("tr[data-delivery]")
        expect(row).to_contain_text(job.job_id)
        expect(row).to_contain_text("delivered")
        expect(row).to_contain_text("HTTP 204")
        screenshot(page, "alerts-page", tmp_path)

        # Mallory's tab shows her rule alone.
        page.evaluate("sessionStorage.clear()")
        token = other.headers["Authorization"].split(" ", 1)[1]
        sign_in(page, token)
        page.click("#nav a[data-page=alerts]")
        expect(page.locator(f"[data-rule='{hidden['id']}']")).to_contain_text("stop")
        expect(page.locator(f"[data-rule='{rule['id']}']")).to_have_count(0)
    finally:
        receiver.close()
