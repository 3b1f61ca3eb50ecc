"""List a folder beneath a data root without following any symlink, within a bound.

A folder a job names is user input on a shared worker: it may hold a billion entries, a
symlink to ``/etc`` dressed as a class folder, a FIFO or a device. So the walk here
opens the folder one component at a time from the root's directory descriptor (as
:func:`~amptrain.components.beneath.open_beneath` does for a file: ``O_DIRECTORY |
O_NOFOLLOW`` relative to the parent), reads each directory with ``os.scandir`` on its
descriptor, and descends into a sub-folder only through ``openat(O_NOFOLLOW)`` as well.

- **Regular files** are listed (relative to the folder, ``/``-separated, sorted).
- **Symlinks, FIFOs, devices and sockets** are never opened nor followed: they are
  *ignored*, and their relative paths come back in :attr:`Listing.ignored` for the caller
  to report (a symlinked class folder must not silently read another tree, and must not
  fail a job whose folder holds one stray link either).
- **Every entry read counts** (files, folders, ignored ones) against ``max_entries``; the
  walk stops with :class:`InvalidSpecError` as soon as the count passes it, so a folder of
  10^9 entries costs at most ``max_entries + 1`` entries read, never the whole listing.
- Depth is bounded too (:data:`MAX_DEPTH`), and names that are not UTF-8 are refused
  (they would end up in the job's published class names).
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field

from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.text import quote

MAX_DEPTH = 16
"""Folder levels walked below the listed folder (deeper ones are refused)."""
PATH_CHARS = 120
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What an open of a component raises when it is a symlink, not a directory (any more), or
# named '..': a path that changed under the walk or leads out of the root.
NOT_BENEATH = frozenset({errno.ELOOP, errno.ENOTDIR, errno.EINVAL, errno.EXDEV, errno.ESTALE})


@dataclass
class Listing:
    """A folder's regular files and what was left out, relative to the folder."""

    files: list[str] = field(default_factory=list)
    """Regular files, sorted (``class/name.jpg``)."""
    ignored: list[str] = field(default_factory=list)
    """Symlinks, FIFOs, devices and sockets: never opened, never followed (sorted)."""
    entries: int = 0
    """Entries read, folders included."""


def open_folder_beneath(root: str, relative: str) -> int:
    """A descriptor of the folder ``root/relative``, no component of ``relative`` a symlink.

    Raises ``OSError`` like ``open_beneath``: ``ENOENT`` when nothing is there, ``ELOOP`` or
    ``ENOTDIR`` for a symlink or a non-folder, ``EINVAL`` for an empty, '.' or '..' part."""
    parts = relative.split("/") if relative else []
    if any(p in ("", ".", "..") for p in parts):
        raise OSError(errno.EINVAL, "an empty, '.' or '..' component")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the operator's root
    try:
        for name in parts:
            child = os.open(name, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def list_folder(
    root: str, relative: str, *, max_entries: int, field_name: str, shown: str
) -> Listing:
    """Every regular file below ``root/relative`` (see the module's rules); ``field_name``
    and ``shown`` (the path as the user wrote it) are what errors name."""
    listing = Listing()
    fd = open_folder_beneath(root, relative)
    try:
        _walk(fd, "", 0, listing, max_entries, field_name, shown)
    finally:
        os.close(fd)
    listing.files.sort()
    listing.ignored.sort()
    return listing


def _walk(
    fd: int, prefix: str, depth: int, out: Listing, bound: int, field_name: str, shown: str
) -> None:
    folders: list[str] = []
    # scandir on a descriptor reads the entries' types from the directory itself (d_type):
    # nothing is opened or stat'ed through a name that could be a symlink.
    with os.scandir(fd) as entries:
        for entry in entries:
            out.entries += 1
            if out.entries > bound:
                raise InvalidSpecError(
                    f"{field_name}: {quote(shown, PATH_CHARS)} holds more than {bound} "
                    "entries (files and folders); the listing stopped there: raise "
                    "dataset.args.max_files or point at a smaller folder"
                )
            name = entry.name
            try:
                name.encode()
            except UnicodeEncodeError:
                raise InvalidSpecError(
                    f"{field_name}: {quote(shown, PATH_CHARS)} holds a name that is not "
                    f"UTF-8 text: {quote(prefix + name, PATH_CHARS)}"
                ) from None
            # From d_type (an lstat only where the filesystem leaves it unknown).
            if entry.is_dir(follow_symlinks=False):
                folders.append(name)
            elif entry.is_file(follow_symlinks=False):
                out.files.append(prefix + name)
            else:  # symlink, FIFO, device, socket: never opened, never followed
                out.ignored.append(prefix + name)
    for name in folders:
        if depth + 1 > MAX_DEPTH:
            raise InvalidSpecError(
                f"{field_name}: {quote(shown, PATH_CHARS)} has folders nested more than "
                f"{MAX_DEPTH} deep: {quote(prefix + name, PATH_CHARS)}"
            )
        try:
            child = os.open(name, _DIR, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                continue  # removed since it was listed
            if exc.errno in NOT_BENEATH:  # became a symlink since it was listed
                out.ignored.append(prefix + name)
                continue
            raise
        try:
            _walk(child, f"{prefix}{name}/", depth + 1, out, bound, field_name, shown)
        finally:
            os.close(child)
