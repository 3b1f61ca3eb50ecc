"""Real-browser fixtures: Debian's headless Chromium driven by Playwright, against one real
stack (uvicorn API, Celery worker, private Redis, SQLite) per test module.

No browser is downloaded (``playwright install`` is never run): the tests use the
``chromium-headless-shell`` (or ``chromium``) binary that ``.ci/run`` installs with
apt-get. Without one they skip with the reason, except under ``CI=true``, where a
missing browser is a failure: CI must run them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.shared_stack import running_stack
from tests.support.stack import Stack

if TYPE_CHECKING:
    from playwright.sync_api import Browser, ConsoleMessage, Page

VIEWPORT = {"width": 1280, "height": 800}
WIDE = {"width": 1400, "height": 900}
"""The size issue 43's dashboard views are checked and photographed at."""
BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
SCREENSHOTS = Path(
    os.environ.get("AMPTRAIN_SCREENSHOT_DIR")
    or Path(__file__).resolve().parents[4] / ".ci" / "screenshots"
)
"""Screenshots land here (``$AMPTRAIN_SCREENSHOT_DIR``, default ``.ci/screenshots/``,
ignored by git and kept by CI) as well as in pytest's tmp dir."""


def chromium_path() -> str | None:
    """``AMPTRAIN_TEST_CHROMIUM`` or the first Chromium on PATH."""
    explicit = os.environ.get("AMPTRAIN_TEST_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: the browser tests must run; .ci/run installs it)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium per test module. Not per session: Playwright's sync API keeps
    an event loop running while it is open, and later tests call asyncio.run()."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[dev]')")
    path = chromium_path()
    if path is None:
        _unavailable(
            "no Chromium found: apt-get install chromium-headless-shell fonts-dejavu-core "
            "(or set AMPTRAIN_TEST_CHROMIUM)"
        )
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=path, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API, one Celery worker (queues gpu and cpu) and a private Redis, on SQLite.
    Jobs on the ``gpu-a100`` queue are never picked up: tests drive those by hand."""
    with running_stack(tmp_path_factory.mktemp("dashboard")) as s:
        yield s


class Console:
    """Console errors and uncaught exceptions of a page. A test that provokes an HTTP error
    on purpose (a 422, a 404) names it with :meth:`expect`; anything else fails the test."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.expected: list[str] = []

    def expect(self, status: int) -> None:
        self.expected.append(f"status of {status}")

    def on_console(self, msg: ConsoleMessage) -> None:
        if msg.type == "error":
            self.errors.append(f"{msg.text} @ {msg.location.get('url', '')}")

    def on_error(self, exc: Any) -> None:
        self.errors.append(f"uncaught: {exc}")

    def unexpected(self) -> list[str]:
        return [
            e
            for e in self.errors
            if not (e.startswith("Failed to load resource") and any(x in e for x in self.expected))
        ]


@pytest.fixture
def console() -> Console:
    return Console()


@pytest.fixture
def page(browser: Browser, stack: Stack, console: Console) -> Iterator[Page]:
    """A fresh tab (own sessionStorage) at 1280x800 on the stack; fails the test on any
    unexpected console error."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport=VIEWPORT, base_url=str(stack.client.base_url))
    tab = context.new_page()
    # One bound for actions and assertions: `expect` waits 5 s by default, and under a loaded
    # CI run ReDoc took longer than that to parse the schema and draw its first heading.
    tab.set_default_timeout(15_000)
    expect.set_options(timeout=15_000)
    tab.on("console", console.on_console)
    tab.on("pageerror", console.on_error)
    yield tab
    context.close()
    assert console.unexpected() == [], console.unexpected()


def sign_in(page: Page, token: str) -> None:
    """Sign in through the form, as a person does."""
    page.goto("/ui/")
    page.fill("#token", token)
    page.click("form.signin button[type=submit]")
    page.wait_for_selector("#jobs")


def screenshot(page: Page, name: str, tmp_path: Path, *, full_page: bool = False) -> Path:
    """Save a PNG both under pytest's tmp dir and under :data:`SCREENSHOTS` (kept by CI),
    and print where."""
    target = tmp_path / f"{name}.png"
    page.screenshot(path=str(target), full_page=full_page)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    kept = SCREENSHOTS / target.name
    shutil.copy(target, kept)
    print(f"screenshot: {kept}")
    return target
