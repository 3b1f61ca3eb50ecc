"""Open a user's file beneath a data root without following any symlink.

What ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` does, which Python's ``os`` does
not offer: the path is walked one component at a time from the root's directory
descriptor, each opened relative to its parent with ``O_NOFOLLOW``. Resolving a path
and then opening the string again cannot be made safe: between the two, a directory of
the path can be swapped for a symlink to anywhere (``renameat2(RENAME_EXCHANGE)`` does it
atomically), and ``O_NOFOLLOW`` on a whole path only guards its last component. Here
every component is checked as it is opened, so a swap can only make the open fail.
"""

from __future__ import annotations

import errno
import os
import stat

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO swapped in after the lstat below must not block the open.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_beneath(root: str, relative: str) -> tuple[int, os.stat_result]:
    """A descriptor of ``root/relative`` and its ``fstat``; ``root`` itself may be reached
    through symlinks (the operator's), nothing of ``relative`` may be one.

    Raises ``OSError``: ``ELOOP`` or ``ENOTDIR`` for a symlink (or a component that is
    not a directory), ``EINVAL`` for an ``..``, ``.`` or empty component, ``ENOENT``
    when nothing is there. Only a regular file is opened: for anything else the
    descriptor is ``-1`` and the ``lstat`` says what it is, for the caller to refuse by its
    kind (a device is never opened: opening one alone can act on it)."""
    parts = relative.split("/") if relative else []
    if any(p in ("", ".", "..") for p in parts):  # normalised paths have none: be sure
        raise OSError(errno.EINVAL, "an empty, '.' or '..' component")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if not parts:
            return -1, os.fstat(fd)  # the root itself: a directory
        for name in parts[:-1]:
            child = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
        before = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(before.st_mode):
            raise OSError(errno.ELOOP, "a symlink")
        if not stat.S_ISREG(before.st_mode):
            return -1, before
        opened = os.open(parts[-1], _FILE, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        after = os.fstat(opened)
        if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
            raise OSError(errno.ESTALE, "replaced while it was opened")
    except BaseException:
        os.close(opened)
        raise
    return opened, after
