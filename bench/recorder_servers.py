"""Who does the recorder's work besides its own thread, for ``bench/recorder_throughput.py``:
the CPU of the redis-server, of the PostgreSQL backends serving the bench's database and of
the server's background processes, measured from outside through ``psutil``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


class Servers:
    """CPU seconds of the redis-server, of the PostgreSQL backends serving the bench's
    database (its name is in their process title) and of the server's background processes
    (WAL writer, checkpointer, background writer, autovacuum, the postmaster): the
    database's work includes what they do for it. The server may be shared (other test
    runs on this machine): the background processes then count their work too, so the
    figure is an upper bound."""

    def __init__(self, redis_pid: int | None, url: str, poller: Any) -> None:
        import sqlalchemy as sa

        self.redis_pid = redis_pid
        self.database = sa.make_url(url).database if url.startswith("postgresql") else None
        self.before: dict[int, float] = {}
        self.poller_pid = None
        if self.database:
            with poller.connect() as conn:
                self.poller_pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()

    def _cpu(self) -> dict[int, tuple[str, float]]:
        import psutil

        found: dict[int, tuple[str, float]] = {}
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                line = " ".join(p.info["cmdline"] or [])
                if p.pid == self.poller_pid:
                    continue  # the bench's own polling, not the recorder's work
                if p.pid == self.redis_pid:
                    kind = "redis"
                elif self.database and line.startswith("postgres:") and self.database in line:
                    kind = "postgres"
                elif self.database and _postgres_background(p.info["cmdline"] or []):
                    kind = "postgres_bg"
                else:
                    continue
                found[p.pid] = (kind, sum(p.cpu_times()[:2]))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def start(self) -> None:
        """Note every process's CPU so far."""
        self.before = {pid: cpu for pid, (_, cpu) in self._cpu().items()}

    def used(self) -> dict[str, float]:
        """CPU seconds since :meth:`start` of ``redis``, ``postgres`` (the backends) and
        ``postgres_bg`` (the background processes)."""
        out = {"redis": 0.0, "postgres": 0.0, "postgres_bg": 0.0}
        for pid, (kind, cpu) in self._cpu().items():
            out[kind] += cpu - self.before.get(pid, 0.0)
        return out


_BACKGROUND = re.compile(
    r"postgres: (?:[^:]+: )?(?:checkpointer|background writer|walwriter|autovacuum|logical)"
)
"""A helper's process title; a server with a ``cluster_name`` (Debian's ``15/main``) puts
it after ``postgres:``, so a bare ``postgres: walwriter`` match missed every helper."""


def _postgres_background(cmdline: list[str]) -> bool:
    """A PostgreSQL server's own process: the postmaster or one of its helpers."""
    line = " ".join(cmdline)
    if line.startswith("postgres: "):
        return _BACKGROUND.match(line) is not None
    return bool(cmdline) and Path(cmdline[0]).name in ("postgres", "postmaster")
