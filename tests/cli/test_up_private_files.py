"""`amptrain up` keeps its files to its user (data directory 0700; database, Redis' append-
only file, checkpoints and admin token 0600) and its access log keeps no query strings."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.support.specs import service_job
from tests.support.stack import wait_until
from tests.support.up import finished_job, start_up

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
    # --verbose: uvicorn's access lines (info) are in up's terminal only then.
    up = start_up(tmp_path, data, preexec_fn=lambda: os.umask(0o022), args=("--verbose",))
    try:
        client = up.admin_client()
        job = client.post("/jobs", json=service_job(max_steps=20)).json()
        done = finished_job(client, job["id"], 180)
        assert done["status"] == "succeeded", up.tail()
        assert client.get(f"/jobs/{job['id']}/checkpoints").json()["items"]
        secret = "query-secret-4f1c"
        assert client.get("/jobs", params={"status": "queued", "cursor": secret}).status_code == 422
        wait_until(lambda: '"GET /jobs HTTP/1.1" 422' in up.log.read_text(), 10, "the access log")
    finally:
        up.stop()
    text = up.log.read_text()
    assert secret not in text and "status=queued" not in text
    assert list((data / "checkpoints").rglob("*.pt")), "a checkpoint was written"
    assert list((data / "redis").glob("appendonly*")), "Redis kept its append-only file"
    assert (data / "amptrain.db").exists() and (data / "admin-token").exists()
    assert _loose(data) == []
