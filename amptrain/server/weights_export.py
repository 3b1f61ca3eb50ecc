"""A job's checkpoint exported into a weights root, for the next job's ``weights.path``.

The API copies the ``step-N.safetensors`` file the worker wrote beside the checkpoint
(torch-free: bytes only) into the first weights root (``ROOT/<user>`` with per-user roots)
under a name checked by :func:`amptrain.contract.weights.export_file_name`. The directory
is opened without following a symlink below the root, the copy is written to a temporary
name and linked into place, so the name never points at a half-written file and an
existing file is never replaced (a 409: another job may be training from it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from typing import BinaryIO

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CHUNK = 1 << 20


class ExportExists(FileExistsError):
    """A weights file of that name is there already."""


def export_into(root: str, subdir: str | None, name: str, source: BinaryIO) -> int:
    """Copy ``source`` to ``root[/subdir]/name`` (``subdir``: the user's, with per-user
    roots; created when missing); the bytes written. :class:`ExportExists` when ``name``
    is taken."""
    os.makedirs(root, exist_ok=True)  # the operator's directory: theirs to place
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if subdir is not None:
            with contextlib.suppress(FileExistsError):
                os.mkdir(subdir, 0o750, dir_fd=fd)
            child = os.open(subdir, _DIR, dir_fd=fd)  # ELOOP for a symlink: refused
            os.close(fd)
            fd = child
        return _write(fd, name, source)
    finally:
        os.close(fd)


def _write(dir_fd: int, name: str, source: BinaryIO) -> int:
    tmp = f".tmp-{uuid.uuid4().hex}"
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640, dir_fd=dir_fd)
    written = 0
    try:
        with os.fdopen(out, "wb") as f:
            while chunk := source.read(_CHUNK):
                f.write(chunk)
                written += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        try:  # link, not rename: fails rather than replace a file of that name
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise ExportExists(name) from None
            raise
        os.fsync(dir_fd)
    finally:
        os.unlink(tmp, dir_fd=dir_fd)
    return written
