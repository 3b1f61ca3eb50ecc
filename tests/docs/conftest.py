"""The documentation tests reuse the dashboard's real-browser fixtures (Debian's headless
Chromium through Playwright, never a downloaded browser)."""

from tests.server.web.dashboard.conftest import browser, console, page

__all__ = ["browser", "console", "page"]
