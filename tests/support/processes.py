"""Whether processes still run, as the tests ask it: a zombie has exited (only its parent has
not reaped it yet), and a process reaped between two looks is gone, never an error."""

from __future__ import annotations

import psutil


def running(pid: int) -> bool:
    """``pid`` names a process that has not exited."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``processes`` still running (``is_running`` also notices a reused pid)."""
    left = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(p)
        except psutil.NoSuchProcess:
            pass
    return left
