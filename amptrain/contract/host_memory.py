"""How much memory a process on this machine can still get, and how much it could have.

Torch-free and standard library only: the worker's main process publishes it, the training
process checks a dataset against it before allocating, ``amptrain train`` too (Linux:
``/proc/meminfo`` and the memory cgroups; elsewhere unknown, and nothing is refused).

- :func:`available`: the kernel's ``MemAvailable`` (free memory plus what it can reclaim
  without swapping), capped by the headroom of every memory cgroup the process is in
  (limit minus usage, page cache it can drop not counted as used), v2 and v1. On ``amptrain
  up`` the training process shares the machine with the API, Redis and the database: what
  they hold is already out of this number.
- :func:`total`: ``MemTotal`` capped by those cgroups' limits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path("/")
UNLIMITED = 2**62
"""cgroup v1 spells "no limit" as a page-rounded 2^63-1; anything this large is none."""

_Reader = Callable[[Path], "tuple[int, int] | None"]


def available(root: Path = ROOT) -> int | None:
    """Bytes a new allocation of this process can still get; None when unknown."""
    free = _meminfo(root, "MemAvailable")
    for limit, used in _cgroups(root):
        headroom = max(0, limit - used)
        free = headroom if free is None else min(free, headroom)
    return free


def total(root: Path = ROOT) -> int | None:
    """Bytes this process could have on an otherwise idle machine; None when unknown."""
    size = _meminfo(root, "MemTotal")
    for limit, _ in _cgroups(root):
        size = limit if size is None else min(size, limit)
    return size


def _meminfo(root: Path, key: str) -> int | None:
    try:
        text = (root / "proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == key:
            number, *unit = value.split()
            return int(number) * (1024 if unit == ["kB"] else 1)
    return None


def _cgroups(root: Path) -> Iterator[tuple[int, int]]:
    """``(limit, usage)`` of every memory cgroup with a limit that holds this process, from
    its own up to the hierarchy's root."""
    try:
        lines = (root / "proc/self/cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one unified hierarchy
            yield from _walk(root / "sys/fs/cgroup", path, _v2)
        elif "memory" in controllers.split(","):
            yield from _walk(root / "sys/fs/cgroup/memory", path, _v1)


def _walk(mount: Path, path: str, read: _Reader) -> Iterator[tuple[int, int]]:
    here = mount / path.lstrip("/")
    if not here.is_dir():  # a container sees its own cgroup at the mount's root
        here = mount
    while True:
        found = read(here)
        if found is not None:
            yield found
        if here == mount or mount not in here.parents:
            return
        here = here.parent


def _v2(d: Path) -> tuple[int, int] | None:
    limit = _number(d / "memory.max")
    if limit is None or limit >= UNLIMITED:
        return None
    return limit, _used(_number(d / "memory.current"), _stat(d / "memory.stat", "inactive_file"))


def _v1(d: Path) -> tuple[int, int] | None:
    limit = _number(d / "memory.limit_in_bytes")
    if limit is None or limit >= UNLIMITED:
        return None
    usage = _number(d / "memory.usage_in_bytes")
    return limit, _used(usage, _stat(d / "memory.stat", "total_inactive_file"))


def _used(usage: int | None, reclaimable: int | None) -> int:
    return max(0, (usage or 0) - (reclaimable or 0))


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _stat(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return None
