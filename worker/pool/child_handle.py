"""The supervisor's handle on one training child process."""

from __future__ import annotations

import codecs
import logging
import os
import selectors
import signal
import subprocess
import sys
import time

from worker.child.protocol import ControlMessage, Launch, ProtocolError, decode

log = logging.getLogger(__name__)


class ChildProcess:
    def __init__(self, launch: Launch, env: dict[str, str] | None = None) -> None:
        read_fd, write_fd = os.pipe()
        launch = launch.model_copy(update={"control_fd": write_fd})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "worker.child.main"],
            stdin=subprocess.PIPE,
            pass_fds=(write_fd,),
            env=env,
            text=True,
        )
        os.close(write_fd)
        assert self.proc.stdin is not None
        self.proc.stdin.write(launch.model_dump_json())
        self.proc.stdin.close()
        self._control = os.fdopen(read_fd, "r", encoding="utf-8")
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._control, selectors.EVENT_READ)
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._buffer = ""
        self._eof = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def messages(self, timeout: float) -> list[ControlMessage]:
        """Control messages that arrived within ``timeout`` seconds (possibly none)."""
        if self._eof or not self._selector.select(timeout):
            if self._eof:
                time.sleep(min(timeout, 0.05))
            return []
        chunk = os.read(self._control.fileno(), 65536)
        if not chunk:
            self._eof = True
            return []
        self._buffer += self._utf8.decode(chunk)  # a read may end inside a character
        *lines, self._buffer = self._buffer.split("\n")
        decoded = (self._decode(line) for line in lines if line.strip())
        return [m for m in decoded if m is not None]

    def _decode(self, line: str) -> ControlMessage | None:
        try:
            return decode(line)
        except ProtocolError as exc:  # a child of another version, or a bug: say so, go on
            log.error("training child %d: %s", self.pid, exc)
            return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def finished(self) -> bool:
        """Exited and every control message read."""
        return not self.alive() and self._eof

    def signal(self, signum: signal.Signals) -> None:
        if self.alive():
            self.proc.send_signal(signum)

    def kill(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        self._selector.close()
        self._control.close()
