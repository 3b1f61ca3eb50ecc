"""Forks in a real browser against the real stack: a checkpoint row's Fork button opens a
small form (a refused value shows the field the server names), a fork opens on its own page
naming its parent, and its loss is drawn over the parent's: the parent's steps up to the
fork step as context, the fork's own from the step after."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("playwright")
from playwright.sync_api import Page, expect

from tests.server.web.dashboard.conftest import Console, screenshot, sign_in
from tests.support.specs import service_job
from tests.support.stack import Stack


def test_fork_a_checkpoint_from_the_job_page(
    page: Page, stack: Stack, console: Console, tmp_path
) -> None:
    spec = service_job(max_steps=8, name="parent", checkpoint={"every_steps": 4, "keep_last": 5})
    parent = stack.submit(spec)["id"]
    stack.wait_for_status(parent, "succeeded")
    sign_in(page, stack.token)
    page.goto(f"/ui/#/jobs/{parent}")
    row = page.locator('#checkpoints .checkpoint[data-step="4"]')
    row.locator("button.fork").click()
    form = row.locator("form.fork-form")
    expect(form.locator('input[name="lr"]')).to_have_value("0.001")

    form.locator('input[name="max_steps"]').fill("4")  # not beyond the fork step
    assert form.evaluate("f => f.checkValidity()") is False  # the browser says so first
    form.locator('input[name="max_steps"]').fill("6")
    console.expect(422)
    form.locator('input[name="lr"]').fill("0")  # the server's bound: lr > 0
    form.locator("button[type=submit]").click()
    expect(form.locator(".fork-error")).to_contain_text("overrides.optimizer.lr")

    form.locator('input[name="lr"]').fill("0.0005")
    form.locator('input[name="max_steps"]').fill("6")
    form.locator("button[type=submit]").click()
    page.wait_for_url(re.compile(r"#/jobs/(?!" + parent + r")j_[0-9a-f]{32}$"))
    child = page.url.rsplit("/", 1)[-1]
    expect(page.locator("#forked-from")).to_contain_text(f"{parent} at step 4")
    job = stack.wait_for_status(child, "succeeded")
    assert job["spec"]["optimizer"]["lr"] == 0.0005 and job["spec"]["max_steps"] == 6

    overlay = page.locator("#parent-overlay")
    expect(overlay).to_have_attribute("data-lines", "3")  # parent up to 4, after it, the fork
    expect(overlay).to_have_attribute("data-parent-last-context-step", "4")
    expect(overlay).to_have_attribute("data-fork-first-step", "5")
    expect(overlay.locator("canvas")).to_be_visible()
    screenshot(page, "fork-overlay", tmp_path)

    page.locator("#forked-from a").click()
    expect(page.locator(f'#forks a[data-fork="{child}"]')).to_be_visible()
