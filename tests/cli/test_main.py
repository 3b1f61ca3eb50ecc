"""The ``amptrain`` entry point as a real process: a missing extra names what to install.

Packages are made unimportable the way a machine without them is: an import hook in
the child interpreter refuses them, so nothing of the CLI itself is mocked.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Put in front of every other finder: the named top-level packages "are not installed".
BLOCKER = """
import sys
BLOCKED = set(sys.argv.pop(1).split(","))

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Blocker())
from amptrain.cli.main import main
sys.argv[0] = "amptrain"
main()
"""

SERVER_STACK = (
    "sqlalchemy,alembic,fastapi,starlette,uvicorn,redis,celery,kombu,"
    "pydantic_settings,prometheus_client,torch,numpy"
)


def amptrain_without(blocked: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER, blocked, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("blocked", "args", "extra"),
    [
        ("fastapi", ["api"], "api"),
        ("torch", ["train", "spec.yaml"], "engine"),
        ("torch", ["worker"], "worker"),
        ("httpx", ["jobs"], "client"),
        ("sqlalchemy", ["db", "upgrade"], "api"),
    ],
)
def test_a_missing_extra_names_what_to_install(blocked: str, args: list[str], extra: str) -> None:
    result = amptrain_without(blocked, *args)
    assert result.returncode == 1, result.stderr
    assert f'pip install "amptrain[{extra}]"' in result.stderr
    assert f"{blocked} is not installed" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_client_runs_without_the_server_stack(tmp_path: Path) -> None:
    listed = amptrain_without(SERVER_STACK, "--help")
    assert listed.returncode == 0 and "submit" in listed.stdout, listed.stderr
    # A real request path: no server listens on port 9, so the client says it is unreachable.
    spec = tmp_path / "job.json"
    spec.write_text('{"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "max_steps": 1}')
    for args in (["jobs"], ["submit", str(spec)]):
        result = amptrain_without(
            SERVER_STACK, *args, "--url", "http://127.0.0.1:9", "--token", "t"
        )
        assert result.returncode == 3, result.stderr
        assert "unreachable" in result.stderr and "Traceback" not in result.stderr


def test_submit_reads_specs_with_the_shared_loader(tmp_path: Path) -> None:
    # One loader for `train` and `submit`: a suffix that is neither JSON nor YAML is refused.
    spec = tmp_path / "job.txt"
    spec.write_text('{"model": {"name": "mlp"}, "dataset": {"name": "synthetic"}, "max_steps": 1}')
    result = amptrain_without(SERVER_STACK, "submit", str(spec), "--url", "http://127.0.0.1:9")
    assert result.returncode == 2, result.stderr
    assert str(spec) in result.stderr and ".yaml" in result.stderr
