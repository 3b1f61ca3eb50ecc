"""What a person sees goes into the URL: a link opens the same view (the job list's status
filter; the job page's x mode, smoothing, zoom and log axes)."""

from __future__ import annotations

import os
import re

import pytest

try:
    from playwright.sync_api import Page, expect
except ImportError:  # outside CI a missing playwright skips, like a missing browser
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

from tests.server.web.ab_runs import spec
from tests.server.web.dashboard.conftest import sign_in
from tests.support.stack import Stack


def test_the_job_lists_status_filter_is_in_the_link(page: Page, stack: Stack) -> None:
    queued = stack.submit(spec(name="waits"))  # its queue has no worker: it stays queued
    sign_in(page, stack.token)
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
