"""Tie a process's life to its parent's (Linux): the one parent-death helper.

A parent-death signal (``prctl(PR_SET_PDEATHSIG)``) makes the kernel kill a process when
the thread that started it dies, however it dies (SIGKILL, the OOM killer, a closed
terminal). It is set after the fork, so a parent that died in between is checked for by
pid: then the signal would never come and the process must not start at all.

Used by ``amptrain up`` for every process it starts, by the Celery pool processes, the
training child, the data-parallel launcher and its ranks.
"""

from __future__ import annotations

import ctypes
import os
import signal

ORPHANED = 75
"""Exit status when the expected parent was already gone (nothing was started)."""

_PR_SET_PDEATHSIG = 1


def die_with(parent_pid: int) -> bool:
    """Get SIGKILL when the parent dies; False if ``parent_pid`` is already gone (then the
    signal was set too late to ever come). Not Linux: no death signal to rely on."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    return os.getppid() == parent_pid


class DieWithSpawner:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the new process dies with the one
    that builds this object (the death signal survives ``exec``); if that one is gone
    before the child runs, the child exits with :data:`ORPHANED` before ``exec``. Linux
    sends the signal when the spawning *thread* ends: spawn from the main thread."""

    def __init__(self) -> None:
        self.parent = os.getpid()

    def __call__(self) -> None:
        if not die_with(self.parent):
            os._exit(ORPHANED)
