"""The import contracts bite: a forbidden import added on purpose to a copy of the package
fails ``lint-imports``, naming the contract it breaks and the import that breaks it. (That
the untouched tree keeps every contract is tests/project/test_code_quality.py's.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
LAYERS = "amptrain is layered; the server, the worker and the client are independent"
API_NO_TORCH = "the API process never imports torch, the engine or the worker"
TORCH_ONLY_TRAINING = "torch is imported only by the training process"


@pytest.mark.parametrize(
    ("module", "forbidden", "broken"),
    [
        # A pool process reaching into the API process's code.
        ("amptrain/worker/pool/slot.py", "amptrain.server", {LAYERS}),
        # The API process importing torch.
        ("amptrain/server/web/app.py", "torch", {API_NO_TORCH, TORCH_ONLY_TRAINING}),
    ],
    ids=["worker-imports-server", "server-imports-torch"],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, forbidden: str, broken: set[str]
) -> None:
    assert LINT_IMPORTS is not None, "lint-imports is not installed beside this interpreter"
    shutil.copytree(
        ROOT / "amptrain", tmp_path / "amptrain", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with (tmp_path / module).open("a", encoding="utf-8") as f:
        f.write(f"\nimport {forbidden}  # forbidden, on purpose\n")

    result = subprocess.run(
        [LINT_IMPORTS, "--no-cache"],
        cwd=tmp_path,  # lint-imports puts its working directory first on the path
        env={**os.environ, "COLUMNS": "200", "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = " ".join((result.stdout + result.stderr).split())  # undo the report's line wrapping
    assert result.returncode != 0, out[-3000:]
    counts = re.search(r"Contracts: (\d+) kept, (\d+) broken\.", out)
    assert counts is not None, out[-3000:]
    assert int(counts[2]) == len(broken), out[-3000:]
    for name in broken:
        assert f"{name} BROKEN" in out, out[-3000:]
    importer = module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {forbidden}" in out, out[-3000:]
