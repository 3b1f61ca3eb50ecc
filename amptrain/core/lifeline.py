"""Tie a process's life to its parent's (Linux): the one parent-death helper.

A parent-death signal (``prctl(PR_SET_PDEATHSIG)``) makes the kernel kill a process when
the thread that started it dies, however it dies (SIGKILL, the OOM killer, a closed
terminal). It is set after the fork, so a parent that died in between is checked for by
pid: then the signal would never come and the process must not start at all.

Used by ``amptrain up`` for every process it starts, by the Celery pool processes, the
training child, the data-parallel launcher and its ranks. A rank also ends here
(:func:`leave_process_group`), past the interpreter's teardown of its process group.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import sys
from typing import NoReturn

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


def leave_process_group(status: int) -> NoReturn:
    """End a process that joined a torch process group, once everything it owes is written.

    It skips the interpreter's finalization on purpose: DDP's reducer keeps the gloo group
    alive until then, and tearing it down there can destroy gloo's worker threads while
    they are still joinable, so ``std::terminate`` turns a finished run into a SIGABRT
    ("terminate called without an active exception" after "done", once in CI; pytorch
    #190489, #179291). The group itself was destroyed by the engine and files were closed
    by their owners; exit handlers (a plugin's included) still run, logs and the standard
    streams are flushed."""
    atexit._run_exitfuncs()  # what a normal exit runs first; only the teardown is skipped
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        # A closed or broken pipe: nothing left to deliver.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


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
