"""The real service for end-to-end tests: Redis, a database, uvicorn and Celery workers
as separate processes, each one killable like in production."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from amptrain.cli.embedded_redis import EmbeddedRedis
from amptrain.core.enums import FINISHED_STATUSES as FINISHED

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.1
) -> T:
    """Poll ``predicate`` until it returns something truthy (None or a falsy value: not yet)
    and return that; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def all_metrics(
    client: httpx.Client, job_id: str, limit: int = 500, **params: Any
) -> list[dict[str, Any]]:
    """Every page of ``GET /jobs/{id}/metrics`` (by default the effective series)."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {"limit": limit, **params, **({"after": cursor} if cursor else {})}
        page = client.get(f"/jobs/{job_id}/metrics", params=query).json()
        items.extend(page["items"])
        if not page["items"] or not page.get("next_cursor"):
            return items
        cursor = page["next_cursor"]


def recorded_history(client: httpx.Client, job_id: str, count: int) -> list[dict[str, Any]]:
    """The effective series of an ended job once the recorder has all of it: the event of
    its final status ends the job's stream, after every point (at least ``count``)."""
    status = client.get(f"/jobs/{job_id}").json()["status"]
    assert status in FINISHED, f"{job_id} is {status}: its history is not complete yet"

    def ended() -> bool:
        events = client.get(f"/jobs/{job_id}/events", params={"limit": 1000}).json()["items"]
        return any(e["type"] == status for e in events)

    wait_until(ended, 60, f"the {status} event of {job_id} in its history")
    points = all_metrics(client, job_id)
    assert len(points) >= count, (len(points), count)
    return points


class Stack:
    """One amptrain deployment in ``root``: call :meth:`start_api` / :meth:`start_worker`."""

    def __init__(self, root: Path, database_url: str, redis_server: EmbeddedRedis) -> None:
        self.root = root
        self.redis_server = redis_server
        self.token = secrets.token_urlsafe(24)
        self.port = free_port()
        self.env = {
            **os.environ,
            "AMPTRAIN_DATA_DIR": str(root),
            "AMPTRAIN_DATABASE_URL": database_url,
            "AMPTRAIN_REDIS_URL": redis_server.url,
            "AMPTRAIN_ADMIN_TOKEN": self.token,
            "AMPTRAIN_CHECKPOINT_URL": str(root / "checkpoints"),
            "AMPTRAIN_HEARTBEAT_SECONDS": "0.5",
            "AMPTRAIN_LEASE_SECONDS": "5",
            "AMPTRAIN_CANCEL_GRACE_SECONDS": "5",
            "AMPTRAIN_DISPATCH_INTERVAL_SECONDS": "0.5",
            "AMPTRAIN_LOG_FORMAT": "text",
            "AMPTRAIN_QUEUES": "gpu,cpu,gpu-a100",
            # Cold training processes unless a test is about the warm spare: a spare
            # re-imports torch after every job, which on two cores slows every
            # end-to-end test (tests/system/test_worker_hardening.py turns it on).
            "AMPTRAIN_WARM_SPARE": "false",
            "CUDA_VISIBLE_DEVICES": "",
            "PYTHONUNBUFFERED": "1",
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )
        self._migrate(database_url)

    def _migrate(self, database_url: str) -> None:
        from tests.support.databases import migrated

        migrated(database_url)

    def entry(self, name: str) -> list[str]:
        """What starts component ``name``, before its arguments: the ``amptrain`` command
        (a subclass may start one component differently)."""
        return [sys.executable, "-m", "amptrain.cli.main"]

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        """Start ``amptrain <args>`` as component ``name`` (a second API, a recorder) in a
        session of its own, so :meth:`kill` reaches its children; output to ``<name>.log``."""
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
        proc = subprocess.Popen(
            [*self.entry(name), *args],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[name] = proc
        return proc

    def start_api(self) -> None:
        self.spawn("api", ["api", "--host", "127.0.0.1", "--port", str(self.port)])
        wait_until(self._healthy, 30, "the API to answer /healthz")

    def _healthy(self) -> bool:
        try:
            return self.client.get("/healthz").status_code == 200
        except httpx.TransportError:
            if self.processes["api"].poll() is not None:
                raise AssertionError("the API exited:\n" + self.log_tail("api")) from None
            return False

    def start_worker(self, name: str = "worker", queues: str = "gpu,cpu", *args: str) -> None:
        """Start ``amptrain worker`` (one pool process) named ``{name}@test``; ``args`` are
        more options (``--devices-per-job 2``). Again after a kill: it waits for a new "ready."."""
        log = self.root / f"{name}.log"
        before = log.read_bytes().count(b"ready.") if log.exists() else 0
        self.spawn(
            name,
            ["worker", "--queues", queues, "--concurrency", "1", "--name", f"{name}@test", *args],
        )
        wait_until(lambda: log.read_bytes().count(b"ready.") > before, 60, f"{name} to be ready")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a component's whole process group (a worker and its training child)."""
        proc = self.processes[name]
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                proc.wait(60)

    def log_tail(self, name: str, lines: int = 60) -> str:
        """The last ``lines`` of a process's log, without the API's access lines (a
        polling test writes hundreds of them, hiding the lines that say why)."""
        path = self.root / f"{name}.log"
        if not path.exists():
            return ""
        kept = [
            ln for ln in path.read_text(errors="replace").splitlines() if "uvicorn.access" not in ln
        ]
        return "\n".join(kept[-lines:])

    # -- client helpers --------------------------------------------------------------

    def submit(self, spec: dict[str, Any], **headers: str) -> dict[str, Any]:
        r = self.client.post("/jobs", json=spec, headers=headers)
        assert r.status_code in (200, 201), r.text
        return dict(r.json())

    def job(self, job_id: str) -> dict[str, Any]:
        r = self.client.get(f"/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return dict(r.json())

    def wait_for_status(self, job_id: str, *statuses: str, timeout: float = 120) -> dict[str, Any]:
        """Wait for the job to reach one of ``statuses``. ``timeout`` bounds how long it may
        go without progress (its status, attempt or step unchanged), not the whole wait:
        on a loaded machine a long job is slow but moving, and a stuck one still fails.
        The whole wait is bounded too, at five times ``timeout``."""
        seen: list[tuple[Any, ...]] = []
        moved = time.monotonic()
        cap = moved + 5 * timeout
        while True:
            job = self.job(job_id)
            if job["status"] in statuses:
                return job
            now = time.monotonic()
            state = (job["status"], job["attempt"], job["step"])
            if not seen or state != seen[-1]:
                seen.append(state)
                moved = now
            if now - moved > timeout or now > cap:
                logs = "\n".join(f"--- {n}.log\n{self.log_tail(n)}" for n in self.processes)
                raise AssertionError(
                    f"job {job_id} is {job['status']} (attempt {job['attempt']}, step "
                    f"{job['step']}), not {statuses}; states seen {seen[-8:]}\n{logs}"
                )
            time.sleep(0.2)

    def all_metrics(self, job_id: str, limit: int = 500, **params: Any) -> list[dict[str, Any]]:
        return all_metrics(self.client, job_id, limit, **params)

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return list(self.client.get(f"/jobs/{job_id}/events").json()["items"])

    def recorded_history(self, job_id: str, count: int) -> list[dict[str, Any]]:
        """See :func:`recorded_history`."""
        return recorded_history(self.client, job_id, count)

    def close(self) -> None:
        for name, proc in reversed(list(self.processes.items())):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            del self.processes[name]
        self.client.close()


def user_token(stack: Stack, name: str, admin: bool = False) -> str:
    """A new token for ``name`` (an admin with ``admin``; else it sees only its own jobs)."""
    from amptrain.store import tokens
    from amptrain.store.db import make_engine, make_session_factory

    engine = make_engine(stack.env["AMPTRAIN_DATABASE_URL"])
    try:
        with make_session_factory(engine).begin() as s:
            return tokens.create_token(s, name, is_admin=admin)
    finally:
        engine.dispose()


def user_client(stack: Stack, name: str, admin: bool = False) -> httpx.Client:
    """A client of the stack's API signed in with a new token for ``name``."""
    return httpx.Client(
        base_url=str(stack.client.base_url),
        headers={"Authorization": f"Bearer {user_token(stack, name, admin)}"},
        timeout=30,
    )
