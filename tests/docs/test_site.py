"""The documentation site: ``mkdocs build --strict`` (one build shared by this module), the
generated reference against the code's own lists (a field, route, command, option or
setting added without its docstring or missing from the reference fails here), and the
built pages served by the API at ``/guide/`` in headless Chromium: no request leaves the
service's origin, nothing is blocked by the page's policy, and search works offline."""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
import yaml

from amptrain.cli.main import COMMANDS
from amptrain.contract.metrics import EVAL_METRICS, STEP_METRICS
from amptrain.contract.spec import JobSpec
from amptrain.core.settings import GUIDE_DIR, Settings
from tests.support.shared_stack import running_stack
from tests.support.stack import Stack

try:
    from playwright.sync_api import Page, expect
except ImportError:  # outside CI a missing playwright skips the browser tests only
    if os.environ.get("CI", "").lower() == "true":
        raise
    Page = expect = None  # type: ignore[assignment,misc]

ROOT = Path(__file__).resolve().parents[2]


def mkdocs_build(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(out)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built once from this checkout, strictly (a broken link, a missing page or
    a warning fails the build)."""
    out = tmp_path_factory.mktemp("site") / "site"
    built = mkdocs_build(ROOT / "mkdocs.yml", out)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out


def section(html: str, anchor: str) -> str:
    """The HTML from the heading with id ``anchor`` to the next heading of any level."""
    start = html.index(f'id="{anchor}"')
    after = re.search(r"<h[1-4][ >]", html[start:])
    return html[start : start + after.start()] if after else html[start:]


def test_the_spec_reference_lists_every_field_of_every_model(site: Path) -> None:
    html = (site / "reference" / "spec.html").read_text()
    schema = JobSpec.model_json_schema()
    models = {"JobSpec": schema, **schema["$defs"]}
    assert len(models) > 10
    for name, model in models.items():
        part = section(html, name.lower())
        for field, prop in model["properties"].items():
            assert f"<td><code>{field}</code></td>" in part, f"{name}.{field}"
            assert prop.get("description"), f"{name}.{field} has no docstring"


def test_the_api_reference_lists_every_route_of_the_openapi_schema(site: Path) -> None:
    from amptrain.server.web.app import create_app

    html = (site / "reference" / "api.html").read_text()
    openapi = create_app(Settings(data_dir=site.parent / "data")).openapi()
    routes = [(m.upper(), p) for p, methods in openapi["paths"].items() for m in methods]
    assert len(routes) > 25
    for method, path in routes:
        assert f"<code>{method} {path}</code>" in html, f"{method} {path}"


def walk(path: str, command: click.Command) -> Iterator[tuple[str, click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from walk(f"{path} {name}", sub)


def test_the_cli_reference_lists_every_command_and_option(site: Path) -> None:
    html = (site / "reference" / "cli.html").read_text()
    seen = 0
    for name, lazy in COMMANDS.items():
        module, attr = lazy.target.split(":")
        for path, command in walk(
            f"amptrain {name}", getattr(importlib.import_module(module), attr)
        ):
            part = section(html, path.replace(" ", "-"))
            for param in command.params:
                if isinstance(param, click.Option) and not param.hidden:
                    assert param.help, f"{path} {param.opts[0]} has no help"
                    assert param.opts[0] in part, f"{path} {param.opts[0]}"
            seen += 1
    assert seen > len(COMMANDS)  # subcommands too


def test_the_settings_and_metrics_references_list_every_one(site: Path) -> None:
    settings = (site / "reference" / "settings.html").read_text()
    for name, field in Settings.model_fields.items():
        assert f"<code>AMPTRAIN_{name.upper()}</code>" in settings, name
        assert field.description, f"setting {name} has no docstring"
    metrics = (site / "reference" / "metrics.html").read_text()
    for metric in (*STEP_METRICS, *EVAL_METRICS):
        assert f"<code>{metric.name}</code>" in metrics, metric.name


def test_the_site_config_fails_the_build_on_a_broken_link(tmp_path: Path) -> None:
    """The checks `mkdocs.yml` turns on (strict, link and nav validation), on a one-page
    site without the reference hook: a link to a page that does not exist fails it."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    kept = {k: config[k] for k in ("site_name", "strict", "validation", "use_directory_urls")}
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the guide](guide.md).\n")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump({**kept, "nav": ["index.md"]}))
    built = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "out")
    assert built.returncode != 0
    assert "guide.md" in built.stderr + built.stdout


# ---- the built pages in a real browser, served by the API at /guide/ --------------------


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, site: Path) -> Iterator[Stack]:
    """The API alone (the pages need no worker), serving this module's build as `amptrain
    up` leaves it in the data directory."""
    with running_stack(tmp_path_factory.mktemp("guide"), workers=()) as s:
        shutil.copytree(site, s.root / GUIDE_DIR)
        yield s


PAGES = ("index.html", "tutorials/fp16-fallback.html", "reference/spec.html")


def test_the_pages_load_nothing_from_elsewhere(page: Page, stack: Stack) -> None:
    origin = str(stack.client.base_url)
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    for name in PAGES:
        response = page.goto(f"/guide/{name}")
        assert response is not None and response.status == 200, name
        assert "script-src 'self'" in (response.header_value("content-security-policy") or "")
        expect(page.locator("h1").first).to_be_visible()
    expect(page.locator("h2#jobspec")).to_be_visible()  # the last page: the generated spec
    assert requested and all(url.startswith((origin, "data:", "blob:")) for url in requested), [
        url for url in requested if not url.startswith((origin, "data:", "blob:"))
    ]
    # Fonts and scripts are the site's own (Material's Google Fonts are turned off).
    assert not [url for url in requested if "fonts.g" in url]


def test_search_works_offline(page: Page, stack: Stack) -> None:
    page.goto("/guide/index.html")
    search = page.locator("input.md-search__input")
    search.click()
    # Typed as a person types: the search worker answers each keystroke once its index
    # (fetched from the site itself) is loaded.
    search.press_sequentially("fallback", delay=50)
    result = page.locator(".md-search-result__item a").first
    expect(result).to_be_visible()
    result.click()
    expect(page.locator("h1").first).to_contain_text("fallback")


def test_the_guide_answers_404_until_it_is_built(stack: Stack) -> None:
    """Without a built site (`up --no-guide`, or MkDocs missing) /guide/ says how to get it."""
    guide = stack.root / GUIDE_DIR
    guide.rename(guide.with_name("guide.off"))
    try:
        answer = stack.client.get("/guide/")
    finally:
        guide.with_name("guide.off").rename(guide)
    assert answer.status_code == 404
    assert answer.json()["error"] == "not_found"
    assert "docs extra" in answer.json()["detail"]
    assert stack.client.get("/guide/").status_code == 200
