"""The job specs the README and the tutorials show are specs the service accepts: a reader
copies a block into a file and submits it, so a renamed field or a YAML value that does
not parse (``1e6``) must fail here, not in their terminal. Unit level: the spec file
loader and the spec model, no server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amptrain.contract.spec import parse_spec
from amptrain.contract.spec_file import load_spec_file

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
NEEDS_A_PLUGIN = {"docs/tutorials/plugins.md"}
"""Pages whose specs name a plugin's model, dataset or metric: valid only with that plugin
installed, which the plugin tests (tests/plugins) check with the example plugin."""


def _specs() -> list[tuple[str, str]]:
    """Every ```yaml block that is a whole job spec (it names a model and max_steps)."""
    found = []
    for page in PAGES:
        if str(page.relative_to(ROOT)) in NEEDS_A_PLUGIN:
            continue
        for i, text in enumerate(BLOCK.findall(page.read_text())):
            if re.search(r"^model:", text, re.M) and re.search(r"^max_steps:", text, re.M):
                found.append((f"{page.relative_to(ROOT)}#{i}", text))
    return found


SPECS = _specs()


def test_the_tutorials_show_specs() -> None:
    # The first job's and the fallback demo's at least: an empty list would pass below.
    pages = {name.split("#")[0] for name, _ in SPECS}
    assert {"docs/tutorials/first-job.md", "docs/tutorials/fp16-fallback.md"} <= pages


@pytest.mark.parametrize(("name", "text"), SPECS, ids=[name for name, _ in SPECS])
def test_a_spec_shown_in_the_docs_is_valid(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    parse_spec(load_spec_file(path))  # raises, naming the field, if the docs drifted


def test_the_fallback_demo_falls_back_instead_of_failing(tmp_path: Path) -> None:
    """An explicit fp16 without ``health.fallback`` fails ``diverged``: the demo must name
    one, and its ``feature_scale`` must be the number ``1e6`` that overflows fp16."""
    [text] = [t for n, t in SPECS if n.startswith("docs/tutorials/fp16-fallback.md")]
    path = tmp_path / "fallback.yaml"
    path.write_text(text)
    spec = parse_spec(load_spec_file(path))
    assert spec.precision == "fp16"
    assert spec.health.fallback in ("bf16", "fp32", "auto")
    assert spec.dataset.args["feature_scale"] == 1e6
