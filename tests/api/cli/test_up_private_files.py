"""`amptrain up` keeps its files to its user (data directory 0700; database, Redis' append-
only file, checkpoints and admin token 0600) and its access log keeps no query strings."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.specs import service_job
from tests.support.stack import free_port, wait_until

pytestmark = pytest.mark.slow


def _loose(root: Path) -> list[str]:
    """Everything under ``root`` (itself included) that its group or others may use."""
    found = []
    for path in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode & 0o077:
            found.append(f"{path.relative_to(root.parent)} {mode:o}")
    return found


def test_up_files_are_private_and_the_access_log_has_no_query(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)  # an existing, world-readable directory is tightened too
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPTRAIN_")}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli.main", "up", "--port", str(port), "--data-dir", str(data)],
            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
            preexec_fn=lambda: os.umask(0o022),  # the usual umask: up must not rely on it
        )  # fmt: skip
    try:
        text = wait_until(lambda: "admin token" in (t := log.read_text()) and t, 60, "the banner")
        token = re.search(r"admin token .*: (\S+)", text)
        assert token, text
        client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {token[1]}"},
            timeout=30,
        )
        wait_until(lambda: _ready(client), 60, "/readyz")
        job = client.post("/jobs", json=service_job(max_steps=20)).json()
        done = wait_until(
            lambda: (
                (j := client.get(f"/jobs/{job['id']}").json())["status"] in ("succeeded", "failed")
                and j
            ),
            180,
            "the job to finish",
        )
        assert done["status"] == "succeeded", log.read_text()[-3000:]
        assert client.get(f"/jobs/{job['id']}/checkpoints").json()["items"]
        secret = "query-secret-4f1c"
        assert client.get("/jobs", params={"status": "queued", "cursor": secret}).status_code == 422
        wait_until(lambda: '"GET /jobs HTTP/1.1" 422' in log.read_text(), 10, "the access log")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert secret not in text and "status=queued" not in text
    assert list((data / "checkpoints").rglob("*.pt")), "a checkpoint was written"
    assert list((data / "redis").glob("appendonly*")), "Redis kept its append-only file"
    assert (data / "amptrain.db").exists() and (data / "admin-token").exists()
    assert _loose(data) == []


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False
