"""The probe plugin (``tests/plugins/amptrain_ddp_probe``), discoverable as pip would install it.

Its ``ddp-probe`` model is an ordinary MLP with test seams that change no numerics, among
them ``hang_rank``/``hang_at``/``hang_until``: a run held at a known step until the test
creates a file, so a test acts on a run at that step instead of racing it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tests.components.test_plugins import write_dist_info

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "tests" / "plugins" / "amptrain_ddp_probe"


def probe_paths(tmp_path: Path) -> list[Path]:
    """Make the probe plugin discoverable; the paths to import it from (before ``ROOT``)."""
    site = tmp_path / "site"
    if not site.exists():
        project = tomllib.loads((PROBE / "pyproject.toml").read_text())["project"]
        write_dist_info(site, project["name"], project["entry-points"])
    return [site, PROBE / "src"]
