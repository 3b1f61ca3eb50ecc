"""/ui serves the dashboard's files from the package: the right types, cache and security
headers, nothing outside the folder, and the vendored uPlot unchanged from its npm file."""

from __future__ import annotations

import asyncio
import hashlib
import posixpath
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from amptrain.core.settings import Settings
from amptrain.server.web.app import create_app
from amptrain.server.web.routes.ui import STATIC_DIR


class Client:
    """Requests straight into the ASGI app, without its lifespan: static files need no
    services (and starlette's TestClient is deprecated)."""

    def __init__(self, app: Any) -> None:
        self.transport = httpx.ASGITransport(app=app)

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        async def send() -> httpx.Response:
            async with httpx.AsyncClient(transport=self.transport, base_url="http://ui.test") as c:
                return await c.request(method, path, **kw)

        return asyncio.run(send())

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return self.request("POST", path, **kw)


@pytest.fixture
def client(tmp_path: Path) -> Client:
    return Client(create_app(Settings(data_dir=tmp_path)))


def test_pages_modules_and_headers(client: Client) -> None:
    root = client.get("/")
    assert root.status_code == 307 and root.headers["location"] == "/ui/"
    assert client.get("/ui").headers["location"] == "/ui/"
    page = client.get("/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<link rel="icon" href="data:,">' in page.text
    assert page.headers["cache-control"] == "no-cache" and page.headers["etag"]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert "https://" not in page.text  # no CDN: everything comes from this server
    again = client.get("/ui/", headers={"If-None-Match": page.headers["etag"]})
    assert again.status_code == 304
    module = client.get("/ui/js/main.js")
    assert module.status_code == 200
    assert module.headers["content-type"].split(";")[0] in (
        "text/javascript",
        "application/javascript",
    )
    vendored = client.get("/ui/vendor/uPlot-1.6.32.iife.min.js")
    assert vendored.headers["cache-control"] == "public, max-age=31536000, immutable"


def test_every_response_forbids_sniffing_and_framing(client: Client) -> None:
    """Pages, the API's JSON and its errors alike (JSON lacked nosniff, the pages
    X-Frame-Options: older browsers ignore the CSP's frame-ancestors)."""
    too_long = client.post("/jobs", headers={"Content-Length": str(10**9)}, content=b"")
    assert too_long.status_code == 413  # answered by the body limit, before any route
    for r in (client.get("/ui/"), client.get("/openapi.json"), client.get("/nope"), too_long):
        assert r.headers["x-content-type-options"] == "nosniff", r.url
        assert r.headers["x-frame-options"] == "DENY", r.url
        assert len(r.headers.get_list("x-content-type-options")) == 1  # the files set it too


def test_every_module_the_page_imports_is_served(client: Client) -> None:
    """Follow the ES module graph from main.js: a missing or misnamed file would only show
    up in a browser otherwise."""
    seen: set[str] = set()
    todo = ["js/main.js"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        r = client.get(f"/ui/{path}")
        assert r.status_code == 200, path
        base = path.rsplit("/", 1)[0]
        for spec in re.findall(r'from "(\.{1,2}/[^"]+)"', r.text):
            todo.append(posixpath.normpath(posixpath.join(base, spec)))
    assert {"js/pages/job.js", "js/charts.js", "js/live.js"} <= seen


def test_nothing_outside_the_folder_and_errors_in_the_api_shape(client: Client) -> None:
    for path in ("/ui/nope.js", "/ui/../pyproject.toml", "/ui/%2e%2e/pyproject.toml"):
        r = client.get(path)
        assert r.status_code == 404, path
    assert client.get("/ui/nope.js").json()["error"] == "not_found"
    assert client.post("/ui/").status_code == 405


def test_vendored_uplot_is_the_npm_file_with_its_licence() -> None:
    vendored = (STATIC_DIR / "vendor" / "uPlot-1.6.32.iife.min.js").read_text()
    header, _, body = vendored.partition(" */\n")
    claimed = re.search(r"sha256 of that file[^:]*: ([0-9a-f]{64})", header)
    assert claimed and "sha512-KIMVnG68zvu5X" in header
    assert hashlib.sha256(body.encode()).hexdigest() == claimed.group(1)
    assert body.startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    assert "MIT License" in (STATIC_DIR / "vendor" / "uPlot-LICENSE.txt").read_text()


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_reference_loads_nothing_from_outside(client: Client, page: str) -> None:
    # Offline (a laptop on a train, an air-gapped cluster) the pages must still render:
    # every script, style and icon they name is served by this server.
    html = client.get(page)
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assets = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html.text)
    scripts = [a for a in assets if a.endswith(".js")]
    assert scripts, html.text
    for url in assets:
        assert url.startswith("/"), f"{page} loads {url} from elsewhere"
        got = client.get(url)
        assert got.status_code == 200 and got.content, url
    openapi = re.findall(r"""(?:url|spec-url)\s*[:=]\s*["']([^"']+)["']""", html.text)
    assert openapi and all(client.get(u).status_code == 200 for u in openapi), html.text
