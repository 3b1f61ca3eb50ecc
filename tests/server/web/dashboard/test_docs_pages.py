"""/docs and /redoc render under their Content-Security-Policy: a blocked script, style,
worker or fetch is a console error, which fails the test (the ``page`` fixture)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

try:
    from playwright.sync_api import Page, expect
except ImportError:  # outside CI a missing playwright skips, like a missing browser
    if os.environ.get("CI", "").lower() == "true":
        raise
    pytest.skip("playwright is not installed (pip install -e '.[dev]')", allow_module_level=True)

from tests.server.web.dashboard.conftest import Console
from tests.support.shared_stack import running_stack
from tests.support.stack import Stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API alone: the documentation pages need no worker."""
    with running_stack(tmp_path_factory.mktemp("docs"), workers=()) as s:
        yield s


def test_swagger_ui_renders_the_operations(page: Page, stack: Stack) -> None:
    response = page.goto("/docs")
    assert response is not None and response.header_value("content-security-policy")
    expect(page.locator(".opblock-summary-path").first).to_be_visible()
    expect(page.get_by_text("/jobs/{job_id}/checkpoints", exact=True).first).to_be_visible()


def test_redoc_renders_and_searches(page: Page, stack: Stack, console: Console) -> None:
    response = page.goto("/redoc")
    assert response is not None and response.header_value("content-security-policy")
    expect(page.locator("h1").first).to_contain_text("amptrain")
    page.locator("input[placeholder='Search...']").fill("checkpoint")
    expect(page.locator("[data-role='search:results'] li").first).to_be_visible()
    # ReDoc's "powered by" logo is on its CDN: the policy blocks it, as it should.
    console.errors = [e for e in console.errors if "https://cdn.redoc.ly/" not in e]
