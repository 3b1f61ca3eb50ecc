"""The built wheel: ``pip install amptrain`` puts one top-level package, ``amptrain``, into
a user's environment (no generic ``api`` or ``migrations`` beside their own packages), with
the files the package reads at run time."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def source_tree(into: Path) -> Path:
    """The checkout as a fresh clone with this change would have it (tracked files and new
    ones git does not ignore), so no build output of an earlier run can leak into the wheel."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not copied
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


@pytest.mark.heavy
def test_the_wheel_holds_amptrain_alone_at_top_level(tmp_path: Path) -> None:
    source = source_tree(tmp_path / "source")
    # The installed setuptools (torch requires it): no index, no isolated build environment.
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*pip_wheel, "-q", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("amptrain-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    top_level = {name.split("/", 1)[0] for name in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"amptrain"}, top_level
    # What the package reads at run time travels with it.
    for data in (
        "amptrain/migrations/alembic.ini",
        "amptrain/migrations/versions/0001_initial_schema.py",
        "amptrain/server/web/static/index.html",
        "amptrain/examples/mlp.yaml",
    ):
        assert data in names, data
    assert "amptrain = amptrain.cli.main:main" in scripts
