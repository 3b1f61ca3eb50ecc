"""``amptrain up``'s documentation build (:class:`amptrain.cli.guide.GuideBuild`) on a
one-page MkDocs project: built once into the data directory, swapped in whole, rebuilt only
when its sources change; without sources ``up`` says where the docs are."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from amptrain.cli.guide import GuideBuild, built_digest, sources_digest
from tests.support.stack import wait_until

URL = "http://127.0.0.1:8000/guide/"


def project(root: Path, title: str) -> Path:
    (root / "docs").mkdir(parents=True, exist_ok=True)
    (root / "docs" / "index.md").write_text(f"# {title}\n")
    (root / "mkdocs.yml").write_text("site_name: t\nstrict: true\nuse_directory_urls: false\n")
    return root


def finish(build: GuideBuild) -> None:
    def done() -> bool:
        build.poll()
        return build.proc is None

    wait_until(done, 120, "the docs build")


def test_builds_once_and_again_only_when_the_sources_change(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path / "src", "First")
    site = tmp_path / "data" / "guide"
    site.parent.mkdir()
    build = GuideBuild(site, URL, root)
    assert "building" in build.start()
    finish(build)
    assert "docs: ready at" in capsys.readouterr().err
    assert "First" in (site / "index.html").read_text()
    assert built_digest(site) == sources_digest(root)
    # Nothing changed: served as it is, no build started.
    again = GuideBuild(site, URL, root)
    assert again.start() == f"docs: {URL}" and again.proc is None
    # A changed page: built again and swapped in whole, no staging folder left behind.
    project(root, "Second")
    changed = GuideBuild(site, URL, root)
    assert "building" in changed.start()
    finish(changed)
    assert "Second" in (site / "index.html").read_text()
    assert sorted(p.name for p in site.parent.iterdir()) == ["guide", "guide-build.log"]


def test_a_failed_build_keeps_the_site_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path / "src", "Kept")
    site = tmp_path / "guide"
    first = GuideBuild(site, URL, root)
    first.start()
    finish(first)
    (root / "docs" / "index.md").write_text("# Changed\n")
    (root / "mkdocs.yml").write_text("site_name: t\ntheme: {name: no-such-theme}\n")
    broken = GuideBuild(site, URL, root)
    broken.start()
    finish(broken)
    assert "the build failed" in capsys.readouterr().err
    assert "Kept" in (site / "index.html").read_text()


def test_without_sources_up_says_where_the_docs_are(tmp_path: Path) -> None:
    line = GuideBuild(tmp_path / "guide", URL, tmp_path).start()
    assert "no docs/ to build" in line and not (tmp_path / "guide").exists()


def test_without_mkdocs_up_says_how_to_get_the_docs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project(tmp_path / "src", "Home")
    monkeypatch.setitem(sys.modules, "mkdocs", None)  # what Python reports for "not installed"
    build = GuideBuild(tmp_path / "guide", URL, root)
    line = build.start()
    assert 'pip install -e ".[docs]"' in line and build.proc is None
    assert not (tmp_path / "guide").exists()
