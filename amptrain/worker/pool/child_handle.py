"""The supervisor's handle on one training child process.

The child gets only the environment it needs (:func:`child_env`): the worker's
own environment holds secrets, such as the database URL with its password and
the admin token, that user-supplied training code must never see. Everything
amptrain tells the child travels in its :class:`~amptrain.worker.child.protocol.Launch`.

A child is started either cold, with its launch at once (:meth:`ChildProcess.cold`),
or as a warm spare that imports torch first and is handed its launch later
(:meth:`ChildProcess.spare`, :meth:`ChildProcess.hand`); both get the same
environment, GPU and control pipe.
"""

from __future__ import annotations

import codecs
import contextlib
import fnmatch
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from amptrain.contract.zoo_text import OFFLINE_ENV
from amptrain.worker.child.protocol import Accepted, ControlMessage, Launch, ProtocolError, decode

log = logging.getLogger(__name__)

PASSED_NAMES = frozenset(
    {"PATH", "HOME", "LANG", "TMPDIR", "PYTHONPATH", "PYTHONUNBUFFERED", "VIRTUAL_ENV", "TZ"}
)
PASSED_PREFIXES = ("LC_", "CUDA_", "NCCL_", "GLOO_", "OMP_", "MKL_", "PYTORCH_", "TORCH_")
"""Variables the child inherits: locale, paths, and what tunes CUDA, NCCL, OpenMP, MKL and
PyTorch (GLOO_SOCKET_IFNAME picks a multi-node job's network). Nothing of amptrain's own configuration (``AMPTRAIN_*``) and no other secret."""


def child_env(
    gpu: str | None, environ: Mapping[str, str] = os.environ, passthrough: Sequence[str] = ()
) -> dict[str, str]:
    """The child's environment: the allowed part of ``environ``, the operator's extra
    ``passthrough`` patterns (e.g. object-store credentials), its GPU when it has one, and
    the Hugging Face libraries' offline switches (``OFFLINE_ENV``)."""
    env = {
        k: v
        for k, v in environ.items()
        if k in PASSED_NAMES
        or k.startswith(PASSED_PREFIXES)
        or any(fnmatch.fnmatchcase(k, pattern) for pattern in passthrough)
    }
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    # Last, so no passthrough undoes it: a job's model is built from a config, never fetched.
    env.update(OFFLINE_ENV)
    return env


class ChildProcess:
    """A training process with its launch to come on stdin and a control pipe back."""

    def __init__(self, args: list[str], gpu: str | None, passthrough: Sequence[str] = ()) -> None:
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            stdin=subprocess.PIPE,
            pass_fds=(write_fd,),
            env=child_env(gpu, passthrough=passthrough),
            text=True,
        )
        os.close(write_fd)
        self._child_control_fd = write_fd  # its number in the child (pass_fds keeps it)
        self._control_fd = read_fd
        self._selector = selectors.DefaultSelector()
        self._selector.register(read_fd, selectors.EVENT_READ)
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._buffer = ""
        self._eof = False
        self._held: list[ControlMessage] = []
        self.accepted: Accepted | None = None
        """What the child said on taking its launch (pid, warm, CUDA state)."""

    @classmethod
    def cold(cls, launch: Launch, gpu: str | None, passthrough: Sequence[str] = ()) -> ChildProcess:
        """``python -m amptrain.worker.child.main``, given ``launch`` at once."""
        child = cls(["amptrain.worker.child.main"], gpu, passthrough)
        child.hand(launch)
        return child

    @classmethod
    def spare(cls, gpu: str | None, passthrough: Sequence[str] = ()) -> ChildProcess:
        """``python -m amptrain.worker.child.spare``: imports torch now, waits for :meth:`hand`."""
        return cls(["amptrain.worker.child.spare", str(os.getpid())], gpu, passthrough)

    def hand(self, launch: Launch) -> bool:
        """Give the child its launch; False when it is gone (nothing was handed)."""
        launch = launch.model_copy(update={"control_fd": self._child_control_fd})
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(launch.model_dump_json())
            self.proc.stdin.close()
        except OSError:  # BrokenPipeError: it died while it waited
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            return False
        return True

    def wait_accepted(self, timeout: float) -> bool:
        """Wait until the child says it took its launch (True), exits first (False), or
        ``timeout`` seconds pass (True if it still lives: it may still be importing)."""
        deadline = time.monotonic() + timeout
        while self.accepted is None and time.monotonic() < deadline:
            if self.finished():
                return False
            self._held += self._read(min(0.05, max(0.0, deadline - time.monotonic())))
        return self.accepted is not None or self.alive()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def messages(self, timeout: float) -> list[ControlMessage]:
        """Control messages that arrived within ``timeout`` seconds (possibly none)."""
        if self._held:  # read while waiting for Accepted
            held, self._held = self._held, []
            return held
        return self._read(timeout)

    def _read(self, timeout: float) -> list[ControlMessage]:
        if self._eof or not self._selector.select(timeout):
            if self._eof:
                time.sleep(min(timeout, 0.05))
            return []
        chunk = os.read(self._control_fd, 65536)
        if not chunk:
            self._eof = True
            return []
        self._buffer += self._utf8.decode(chunk)  # a read may end inside a character
        *lines, self._buffer = self._buffer.split("\n")
        decoded = (self._decode(line) for line in lines if line.strip())
        got = [m for m in decoded if m is not None]
        for m in got:
            if isinstance(m, Accepted):
                self.accepted = m
        return got

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

    def abort(self) -> None:
        """SIGKILL, now (a lost lease: no final checkpoint)."""
        self.proc.kill()

    def kill(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):  # a spare never handed a launch: it exits
                self.proc.stdin.close()
        self._selector.close()
        os.close(self._control_fd)
