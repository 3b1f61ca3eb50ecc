"""``amptrain up`` as the tests run it: a real process on a free port with its own data
directory and no AMPTRAIN_* settings from the caller, its admin client, and a job's end."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.support.stack import free_port, wait_until


@dataclass
class Up:
    proc: subprocess.Popen[bytes]
    log: Path
    port: int
    data_dir: Path

    def tail(self) -> str:
        return self.log.read_text()[-3000:]

    def admin_client(self, timeout: float = 30) -> httpx.Client:
        """Waits for the start-up banner, signs in with the admin token (printed on the first
        start, read from its file on later ones), then waits for ``/readyz``."""

        def banner() -> str:
            text = self.log.read_text()
            return text if "admin token" in text else ""

        text = wait_until(banner, 60, "the start-up banner")
        printed = re.search(r"admin token \(.*: (\S+)", text)
        token = printed[1] if printed else (self.data_dir / "admin-token").read_text().strip()
        client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )
        wait_until(lambda: ready(client), 60, "/readyz")
        return client

    def descendants(self) -> list[psutil.Process]:
        """Every process ``up`` started, and theirs, now."""
        return psutil.Process(self.proc.pid).children(recursive=True)

    def stop(self) -> None:
        """Ctrl-C, as a person stops it: it must exit 0 within 90 s."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(90) == 0, self.tail()


def start_up(
    tmp_path: Path,
    data_dir: Path,
    preexec_fn: Callable[[], Any] | None = None,
    settings: dict[str, str] | None = None,
    log_name: str = "up.log",
    args: tuple[str, ...] = (),
    guide: bool = False,
) -> Up:
    """``amptrain up --data-dir data_dir`` on a free port, CPU only, logging to
    ``tmp_path/log_name``; ``settings``: the only AMPTRAIN_* variables it gets. ``guide``:
    build and serve the documentation site too (off by default: a build is seconds of CPU
    that only the test of it needs)."""
    args = args if guide else (*args, "--no-guide")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMPTRAIN_")}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", **(settings or {}))
    log = tmp_path / log_name
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "amptrain.cli.main", "up", "--port", str(port), "--data-dir", str(data_dir), *args],
            env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, preexec_fn=preexec_fn,
        )  # fmt: skip
    return Up(proc, log, port, data_dir)


def ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def finished_job(client: httpx.Client, job_id: str, timeout: float) -> dict[str, Any]:
    """The job once it succeeded or failed (fails the test after ``timeout`` seconds)."""

    last: dict[str, Any] = {}

    def ended() -> dict[str, Any]:
        job: dict[str, Any] = client.get(f"/jobs/{job_id}").json()
        last.update(job)
        return job if job["status"] in ("succeeded", "failed") else {}

    try:
        return wait_until(ended, timeout, "the job to finish")
    except AssertionError as timed_out:
        # Where it stood says which part was slow: queued, which attempt, which step.
        seen = {k: last.get(k) for k in ("status", "attempt", "step", "error")}
        raise AssertionError(f"{timed_out}; last seen {seen}") from None
