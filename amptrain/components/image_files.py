"""One image file read and handed to :mod:`amptrain.components.images` (the ``image-folder``
dataset's reader).

- Read by ``os.pread`` on a descriptor :func:`~amptrain.components.beneath.open_beneath`
  returns (never a path string, never a shared file offset: safe in any thread and across
  ``fork``), regular files only, at most :data:`~amptrain.contract.limits.MAX_IMAGE_BYTES`.
- Decoded, checked and transformed by :mod:`amptrain.components.images` (train: a
  random-resized crop and flip from the sample position's own generator; eval: the shorter
  side resized to ``image_size / 0.875``, the centre crop).
- A file that fails any of this is *bad*: ``on_corrupt='fail'`` raises
  :class:`InvalidSpecError` naming its relative path and why; ``'skip'`` records it
  (:meth:`ImageReader.take_skipped`), and more than ``max_skipped`` distinct bad files in
  one process fail the job naming the last.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import threading
from typing import Any

import torch

from amptrain.components import images
from amptrain.components.beneath import open_beneath
from amptrain.components.file_listing import NOT_BENEATH, PATH_CHARS
from amptrain.components.images import BadImage
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.limits import MAX_IMAGE_BYTES
from amptrain.contract.sizing import format_bytes
from amptrain.contract.text import quote

log = logging.getLogger(__name__)


class ImageReader:
    """Reads images beneath ``root``/``folder`` and turns them into normalised tensors.

    Picklable: it holds only strings and numbers (the lock and the skip records are made
    again in a new process)."""

    def __init__(
        self,
        root: str,
        folder: str,
        shown: str,
        *,
        image_size: int,
        channels: int,
        min_crop_scale: float = images.CROP_SCALE[0],
        on_corrupt: str,
        max_skipped: int,
    ) -> None:
        self.root = root
        self.folder = folder
        self.shown = shown
        self.image_size = image_size
        self.channels = channels
        self.min_crop_scale = min_crop_scale
        self.on_corrupt = on_corrupt
        self.max_skipped = max_skipped
        self._fresh()

    def _fresh(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()  # fill() runs in several threads
        self._bad: set[str] = set()
        self._pending: dict[str, None] = {}  # ordered, no repeats

    def _guard(self) -> threading.Lock:
        """The lock of this process: a forked child (a DataLoader worker) starts afresh, as
        the parent's lock may have been held by another thread at the fork."""
        if self._pid != os.getpid():
            self._fresh()
        return self._lock

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_pid", "_lock", "_bad", "_pending"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fresh()  # a new process: its own count of bad files

    # -- files -------------------------------------------------------------------------

    def shown_path(self, relative: str) -> str:
        """``relative`` (inside the folder) as the user would write it."""
        return posixpath.join(self.shown, relative)

    def read(self, relative: str) -> bytearray:
        """The file's bytes, read beneath the root following no symlink."""
        path = posixpath.join(self.folder, relative) if self.folder else relative
        try:
            fd, st = open_beneath(self.root, path)
        except OSError as exc:
            if exc.errno in NOT_BENEATH:  # a symlink swapped in: never a skippable file
                raise InvalidSpecError(
                    f"dataset.args.path: {quote(self.shown_path(relative), PATH_CHARS)} could "
                    "not be opened beneath the data roots: a symlink or a changing path"
                ) from None
            if exc.errno == errno.ENOENT:
                raise BadImage("it was removed after the folder was listed") from None
            raise BadImage(f"cannot read it ({type(exc).__name__})") from None
        if fd < 0:
            raise BadImage("not a regular file any more")
        try:
            size = st.st_size
            if size > MAX_IMAGE_BYTES:  # refused before a byte is read
                raise BadImage(f"{format_bytes(size)}, more than {format_bytes(MAX_IMAGE_BYTES)}")
            data = bytearray(size)
            view = memoryview(data)
            got = 0
            while got < size:
                chunk = os.pread(fd, size - got, got)  # no shared offset: any thread, any fork
                if not chunk:
                    break
                view[got : got + len(chunk)] = chunk
                got += len(chunk)
            if got == 0:
                raise BadImage("an empty file")
            view.release()
            del data[got:]  # a file that shrank since its fstat: what is there
            return data
        finally:
            os.close(fd)

    def decode(self, relative: str) -> torch.Tensor:
        """The image as uint8 ``(channels, H, W)``; :class:`BadImage` when it is not one."""
        return images.decode(self.read(relative), self.channels)

    def load(self, relative: str) -> torch.Tensor | None:
        """The decoded image, or None for a bad file skipped by the policy."""
        with self._guard():
            known_bad = relative in self._bad
        if known_bad:
            self._skipped(relative, None)
            return None
        try:
            return self.decode(relative)
        except BadImage as exc:
            self._skipped(relative, str(exc))
            return None

    def _skipped(self, relative: str, why: str | None) -> None:
        shown = quote(self.shown_path(relative), PATH_CHARS)
        if self.on_corrupt == "fail":
            raise InvalidSpecError(
                f"dataset.args.path: {shown}: {why}; dataset.args.on_corrupt 'skip' uses the "
                "next sample in its place"
            )
        with self._guard():
            if why is not None:
                log.warning("image-folder: skipping %s: %s", shown, why)
                self._bad.add(relative)
            self._pending[relative] = None
            too_many = len(self._bad) > self.max_skipped
        if too_many:
            raise InvalidSpecError(
                f"dataset.args.max_skipped: more than {self.max_skipped} image files do not "
                f"decode; the last: {shown}: {why}"
            )

    def take_skipped(self) -> list[str]:
        """Paths (as the user would write them) skipped since the last call in this process."""
        with self._guard():
            taken = [self.shown_path(r) for r in self._pending]
            self._pending.clear()
        return taken

    # -- transforms ----------------------------------------------------------------------

    def train_view(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """:func:`images.train_view` at this folder's size, crop scale and channels."""
        return images.train_view(image, g, self.image_size, self.min_crop_scale, self.channels)

    def eval_view(self, image: torch.Tensor) -> torch.Tensor:
        """:func:`images.eval_view` at this folder's size and channels."""
        return images.eval_view(image, self.image_size, self.channels)
