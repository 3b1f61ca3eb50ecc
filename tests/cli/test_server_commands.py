"""``amptrain db``, ``amptrain token`` and the admin token the API generates, as real processes."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.store import migrate
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def amptrain(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amptrain.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def clean_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPTRAIN_")}
    return {**env, **values}


def test_db_upgrade_token_create_and_downgrade(database_url: str, tmp_path: Path) -> None:
    env = clean_env(AMPTRAIN_DATA_DIR=str(tmp_path), AMPTRAIN_DATABASE_URL=database_url)
    up = amptrain("db", "upgrade", env=env)
    assert up.returncode == 0, up.stderr
    assert migrate.current_revision(database_url) == migrate.head_revision()

    made = amptrain("token", "create", "ci-bot", env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert len(token) > 20 and "\n" not in token
    dup = amptrain("token", "create", "ci-bot", env=env)
    assert dup.returncode != 0 and "already exists" in dup.stderr

    down = amptrain("db", "downgrade", "base", env=env)
    assert down.returncode == 0, down.stderr
    assert migrate.current_revision(database_url) is None


def test_default_database_lives_in_the_data_dir(tmp_path: Path) -> None:
    env = clean_env(AMPTRAIN_DATA_DIR=str(tmp_path / "data"))
    assert amptrain("db", "upgrade", env=env).returncode == 0
    assert (tmp_path / "data" / "amptrain.db").exists()


def test_generated_admin_token_is_saved_private_and_never_printed(
    database_url: str, redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    # The API's output ends up in container logs: it says where the token is, not what.
    stack = Stack(tmp_path, database_url, redis_server)
    del stack.env["AMPTRAIN_ADMIN_TOKEN"]
    try:
        stack.start_api()
        saved = tmp_path / "admin-token"
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600
        token = saved.read_text().strip()
        log = (tmp_path / "api.log").read_text()
        assert token not in log
        said = re.findall(r"admin token generated and saved to (\S+)", log)
        assert said == [str(saved)]
        headers = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{stack.client.base_url}/jobs", headers=headers).status_code == 200

        stack.kill("api", 15)
        stack.start_api()  # same data directory: reuses the token, says nothing new
        log = (tmp_path / "api.log").read_text()
        assert token not in log
        assert re.findall(r"admin token generated and saved to (\S+)", log) == said
        assert httpx.get(f"{stack.client.base_url}/jobs", headers=headers).status_code == 200
    finally:
        stack.close()
