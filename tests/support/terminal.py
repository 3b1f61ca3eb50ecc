"""Run a command at a real terminal of a given size (a pseudo-terminal), as a person sees
it: the program finds a tty and asks it for its width, as at a shell."""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import subprocess
import termios


def at_terminal(args: list[str], env: dict[str, str], columns: int, timeout: float = 120) -> str:
    """What ``args`` printed at a ``columns``-wide terminal (its lines, ANSI codes left in)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError as exc:  # EIO: the program exited and the terminal closed
                if exc.errno != errno.EIO:
                    raise
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
        proc.wait(timeout)
    return out.decode(errors="replace")
