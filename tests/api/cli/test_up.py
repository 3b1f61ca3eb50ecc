"""`amptrain up`: one command runs the whole service on a bare machine, and Ctrl-C stops it all."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.stack import free_port, wait_until
from trainer_core.engine.precision import cpu_has_amx

pytestmark = pytest.mark.slow


def test_up_runs_a_job_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPTRAIN_")}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli.main", "up", "--port", str(port), "--data-dir", str(tmp_path / "data")],
            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
        )  # fmt: skip
    try:
        text = wait_until(
            lambda: "admin token" in (t := log.read_text()) and t, 60, "the start-up banner"
        )
        token = re.search(r"admin token .*: (\S+)", text)
        assert token, text
        assert (tmp_path / "data" / "admin-token").stat().st_mode & 0o777 == 0o600
        client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token[1]}"}
        )
        wait_until(lambda: _ready(client), 60, "/readyz")
        job = client.post(
            "/jobs",
            json={
                "model": {"name": "mlp"},
                "dataset": {"name": "synthetic-classification"},
                "max_steps": 5,
            },
        ).json()
        done = wait_until(
            lambda: (
                (j := client.get(f"/jobs/{job['id']}").json())["status"] in ("succeeded", "failed")
                and j
            ),
            120,
            "the job to finish",
        )
        assert done["status"] == "succeeded", log.read_text()[-3000:]
        # auto on a CPU: bf16 only where the CPU has AMX.
        assert done["precision"]["effective"] == ("bf16" if cpu_has_amx() else "fp32")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0, log.read_text()[-3000:]
    # Nothing left behind: the API, worker and Redis children are gone.
    assert not (tmp_path / "data" / "redis" / "redis.sock").exists() or _dead_socket(tmp_path)


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def _dead_socket(tmp_path: Path) -> bool:
    import redis

    try:
        redis.Redis(unix_socket_path=str(tmp_path / "data" / "redis" / "redis.sock")).ping()
    except redis.ConnectionError:
        return True
    return False
