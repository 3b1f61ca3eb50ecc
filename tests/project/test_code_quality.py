"""The checks CI enforces, as tests: lint, format, types and the architecture's import rules."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which(args[0], path=str(BIN)) or args[0]
    return subprocess.run([tool, *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.heavy  # mypy alone is a minute of CPU: scheduled first, not in the run's tail
@pytest.mark.parametrize(
    "command",
    [
        ("ruff", "check", "."),
        ("ruff", "format", "--check", "."),
        ("lint-imports",),
        ("mypy",),
    ],
    ids=["ruff-check", "ruff-format", "import-contracts", "mypy"],
)
def test_tool_passes(command: tuple[str, ...]) -> None:
    result = run(*command)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.parametrize(
    "module",
    [
        "amptrain.server.web.app",
        "amptrain.store.jobs",
        "amptrain.contract.catalog",
        "amptrain.contract.spec",
    ],
)
def test_control_plane_modules_do_not_import_torch(module: str) -> None:
    # numpy and pyarrow too: the API loads them with its first whole-run export only.
    code = (
        f"import sys, {module}; "
        "loaded = [m for m in ('torch', 'numpy', 'pyarrow') if m in sys.modules]; "
        "assert not loaded, f'{loaded} imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


TRAINING_CORE = (
    "amptrain/contract",
    "amptrain/engine",
    "amptrain/components",
    "amptrain/cli/train.py",
)


def test_the_training_core_reads_and_writes_no_environment() -> None:
    """The engine takes everything from its spec, RunContext and command-line options
    (the local runner gets torchrun's variables as click options)."""
    paths = [p for part in TRAINING_CORE for p in sorted((ROOT / part).glob("**/*.py"))]
    paths += [ROOT / part for part in TRAINING_CORE if part.endswith(".py")]
    assert len(paths) > 40, "the training core's files were not found"
    offenders = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "os"
                and node.attr in {"environ", "getenv", "putenv", "unsetenv"}
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} os.{node.attr}")
    assert not offenders, offenders


MAX_FILE_LINES = 400
MAX_CLASS_LINES = 200


def test_files_and_classes_stay_short_enough_to_read() -> None:
    """The package's and bench/'s modules stay under 400 lines and their classes under 200:
    past that a file holds more than one thing (split it by what it holds)."""
    paths = sorted([*(ROOT / "amptrain").glob("**/*.py"), *(ROOT / "bench").glob("**/*.py")])
    assert len(paths) > 150, "the package's files were not found"
    long = []
    for path in paths:
        text = path.read_text()
        name = path.relative_to(ROOT)
        if (lines := len(text.splitlines())) > MAX_FILE_LINES:
            long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if not isinstance(node, ast.ClassDef):
                continue
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if size > MAX_CLASS_LINES:
                long.append(f"{name}:{node.lineno} class {node.name}: {size} lines")
    assert not long, long
