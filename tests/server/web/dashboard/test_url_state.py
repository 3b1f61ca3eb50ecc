"""What a person sees goes into the URL: a link opens the same view (the job list's status
filter; the job page's x mode, smoothing, zoom and log axes)."""

from __future__ import annotations

import math
import os
import re
from typing import Any

import pytest

try:
    from playwright.sync_api import Page, expect
except ImportError:  # outside CI a missing playwright skips, like a missing browser
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

from tests.server.web.ab_runs import spec
from tests.server.web.dashboard.conftest import sign_in
from tests.server.web.dashboard.test_charts import MIB, saved_run
from tests.support.stack import Stack


def test_the_job_lists_status_filter_is_in_the_link(page: Page, stack: Stack) -> None:
    queued = stack.submit(spec(name="waits"))  # its queue has no worker: it stays queued
    # Before sign-in the page offers nothing but signing in: no nav, no sign-out.
    page.goto("/ui/#/jobs")
    expect(page.locator("#token")).to_be_visible()
    expect(page.locator("#nav")).to_be_hidden()
    expect(page.locator("#signout")).to_be_hidden()
    sign_in(page, stack.token)
    expect(page.locator("#nav")).to_be_visible()
    page.goto("/ui/#/jobs")
    expect(page.locator(f"#jobs-body tr:has-text('{queued['name']}')")).to_have_count(1)
    page.select_option("#status-filter", "failed")
    expect(page).to_have_url(re.compile(r"#/jobs\?status=failed$"))
    expect(page.locator("#jobs-note")).to_have_text("No failed jobs.")
    # The link, opened afresh, shows the filtered list.
    page.goto("/ui/#/jobs?status=queued")
    page.reload()
    expect(page.locator("#status-filter")).to_have_value("queued")
    expect(page.locator(f"#jobs-body tr:has-text('{queued['name']}')")).to_have_count(1)


def test_the_job_pages_view_is_in_the_link(page: Page, stack: Stack) -> None:
    n = 400

    def point(i: int) -> tuple[Any, ...]:
        return (1.0 / math.sqrt(i), 65536.0, i % 10 == 0, 1.0, 1e-3, MIB, MIB, MIB)

    job_id = saved_run(stack, "view", n, point)
    sign_in(page, stack.token)
    # A link someone sent: zoomed on steps 270-370, smoothing 0.3, the loss on a log axis.
    page.goto(f"/ui/#/jobs/{job_id}?smooth=0.3&from=270&to=370&log=loss")
    expect(page.locator("#charts")).to_have_attribute("data-ready", "1")
    expect(page.locator("#smoothing")).to_have_value("0.3")
    expect(page.locator("[data-chart=loss] header input[type=checkbox]")).to_be_checked()
    marks = page.locator("[data-marks-for=loss_scale]")
    expect(marks).to_contain_text(re.compile(r"40 skipped steps \(\d+ in view: step 2[78]0, "))
    listed = [int(s) for s in (marks.get_attribute("data-listed") or "").split(",")]
    assert listed and all(270 <= s <= 370 for s in listed), listed
    # Changing the view rewrites the link: no log axis, wall-time x (which drops the zoom).
    page.locator("[data-chart=loss] header input[type=checkbox]").uncheck()
    expect(page).to_have_url(re.compile(r"[?&]smooth=0\.3&from=270&to=370$"))
    page.select_option("#x-mode", "time")
    expect(page).to_have_url(re.compile(rf"#/jobs/{job_id}\?smooth=0\.3&x=time$"))
    page.dblclick("[data-chart=loss] .u-over")  # reset zoom: nothing to drop
    expect(marks).to_contain_text("40 skipped steps (step 10, 20, 30, 40, 50, …)")


def test_a_hostile_link_opens_the_default_view(page: Page, stack: Stack) -> None:
    job_id = saved_run(
        stack, "hostile", 50, lambda i: (1.0 / i, 65536.0, False, 1.0, 1e-3, MIB, MIB, MIB)
    )
    sign_in(page, stack.token)
    bad = "smooth=1e9&from=abc&to=-1&x=%3Cscript%3E&log=%3Cimg%20src%3Dx%3E"
    page.goto(f"/ui/#/jobs/{job_id}?{bad}")
    expect(page.locator("#charts")).to_have_attribute("data-ready", "1")
    expect(page.locator("#smoothing")).to_have_value("0.8")  # out of range: the default
    expect(page.locator("#x-mode")).to_have_value("step")
    expect(page.locator("[data-chart=loss]")).to_have_attribute("data-points", "50")  # no zoom
    expect(page.locator("[data-chart=loss] header input[type=checkbox]")).not_to_be_checked()
    assert page.locator("img[src=x]").count() == 0  # never markup
