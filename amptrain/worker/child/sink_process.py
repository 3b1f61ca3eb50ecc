"""The training child's telemetry sink in a process of its own, out of the training GIL.

Encoding records and talking to Redis (a pipelined XADD per batch, retention,
re-sending after Redis data loss) cost about 0.85 ms of CPU per 10-record batch,
taken from the training process's GIL by its publisher thread. Here the
publisher thread only pickles each batch onto a pipe (tens of microseconds);
a small ``python -m amptrain.worker.child.sink_process`` (no torch) feeds a
:class:`~amptrain.worker.child.sink.RedisSink` from it.

Nothing is lost on the way:

* ``write`` returns once the batch is in the pipe, which the sink process reads to
  its end whatever happens to the training process; so a checkpoint that waited for
  ``write`` (the engine's ``wait_delivered``) never gets ahead of its records;
* the sink process buffers through Redis outages and re-sends what a restarted Redis
  lost (the writer's guarantees), retrying on its own every ``RETRY_EVERY_S``;
* ``close`` tells it how long to keep delivering and waits for it to exit.

It dies with the training process: at the pipe's end (the kernel closes it when its
writer dies, even on SIGKILL), or when it finds itself orphaned, it makes one last
attempt to deliver what it holds and exits. It ignores SIGINT and SIGTERM, which
reach the whole process group: the training process decides when telemetry ends.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
from typing import IO, Any

from amptrain.core.stream_writer import RETRY_EVERY_S
from amptrain.worker.child.sink import RedisSink

_HEADER = 4  # little-endian length of each pickled frame
ORPHAN_CHECK_S = 1.0
"""How often an idle sink process checks that the training process still lives."""
SINK_NICE = 10
"""Niceness of the sink process: telemetry may lag, training should not."""


def _frame(message: Any) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(body).to_bytes(_HEADER, "little") + body


class ProcessSink:
    """The training process's end: the engine's ``Sink`` protocol over a pipe."""

    def __init__(self, url: str, job_id: str, attempt: int) -> None:
        self._spawn()
        self.open(url, job_id, attempt)

    @classmethod
    def ahead(cls) -> ProcessSink:
        """A sink process started before its job is known (a warm spare's), so that its
        start-up is not on the way to the job's first record; :meth:`open` names the job.
        It still serves one attempt only, and dies with the process that started it."""
        sink = cls.__new__(cls)
        sink._spawn()
        return sink

    def _spawn(self) -> None:
        self.job_id = ""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "amptrain.worker.child.sink_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,  # one line, "ready", once it can take records
        )
        assert self._proc.stdin is not None
        self._pipe: IO[bytes] = self._proc.stdin
        self._lock = threading.Lock()  # the publisher thread writes; close may come from another

    def open(self, url: str, job_id: str, attempt: int) -> ProcessSink:
        """Name the stream this sink writes (the first message; raises ``OSError`` if the
        sink process is gone)."""
        self.job_id = job_id
        self._send(("open", url, job_id, attempt))
        return self

    @property
    def pid(self) -> int:
        return self._proc.pid

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the sink process has started (imports done, sink built); False if it
        did not within ``timeout`` seconds. Optional: records written earlier wait in the pipe."""
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        return bool(ready) and self._proc.stdout.readline() == b"ready\n"

    def write(self, items: list[dict[str, Any]]) -> None:
        """Hand a batch to the sink process; raises ``OSError`` if it is gone (the
        publisher counts the batch as dropped)."""
        self._send(("write", items))

    def close(self, timeout: float = 30.0) -> None:
        """Let the sink process deliver for up to ``timeout`` seconds, then wait for it."""
        try:
            self._send(("close", timeout))
            with self._lock:
                self._pipe.close()
        except OSError:
            pass  # it is gone already; wait() below reaps it
        try:
            self._proc.wait(timeout + 10)  # its own deadline plus one Redis call's timeouts
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def _send(self, message: Any) -> None:
        data = _frame(message)
        with self._lock:
            self._pipe.write(data)
            self._pipe.flush()


class _Frames:
    """Length-prefixed frames from a file descriptor, read without blocking past a timeout."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()

    def read(self, timeout: float) -> list[Any] | None:
        """Messages that arrived within ``timeout`` seconds; None at the pipe's end."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            return None
        self.buffer += chunk
        messages = []
        while len(self.buffer) >= _HEADER:
            size = int.from_bytes(self.buffer[:_HEADER], "little")
            if len(self.buffer) < _HEADER + size:
                break
            messages.append(pickle.loads(self.buffer[_HEADER : _HEADER + size]))
            del self.buffer[: _HEADER + size]
        return messages

    def drain(self) -> list[Any]:
        """Every message still in the pipe, without waiting for more."""
        messages: list[Any] = []
        while got := self.read(0):
            messages += got
        return messages


def serve(fd: int, parent: int) -> None:
    """Feed a RedisSink from the pipe until ``close``, the pipe's end or the parent's death."""
    frames = _Frames(fd)
    messages: list[Any] = []
    while not messages:
        got = frames.read(ORPHAN_CHECK_S)
        if got is None or os.getppid() != parent:
            return
        messages = got
    _, url, job_id, attempt = messages[0]
    sink = RedisSink.from_url(url, job_id, attempt)
    _say_ready()
    got = messages[1:]
    while True:
        if os.getppid() != parent:  # orphaned; whatever it wrote is still in the pipe
            got = (got or []) + frames.drain()
        if got is None or os.getppid() != parent:
            _deliver(sink, got or [])
            sink.close(0)  # the training process is gone: one last try, then go too
            return
        if _deliver(sink, got):
            return
        if not got and sink.unsent:
            sink.flush()  # Redis was unreachable: retry without waiting for new records
        got = frames.read(RETRY_EVERY_S if sink.unsent else ORPHAN_CHECK_S)


def _say_ready() -> None:
    with contextlib.suppress(OSError):  # a parent that died already hears nothing
        os.write(sys.stdout.fileno(), b"ready\n")
    # Nothing else goes to stdout: point it at /dev/null so the parent never has to read it.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _deliver(sink: RedisSink, messages: list[Any]) -> bool:
    """Write the batches in ``messages`` as one pipeline; True once ``close`` was among them."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message[0] == "close":
            if items:
                sink.write(items)
            sink.close(message[1])
            return True
        items.extend(message[1])
    if items:
        sink.write(items)
    return False


def main() -> int:
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # priority is an optimisation only
        os.nice(SINK_NICE)
    serve(sys.stdin.fileno(), parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
