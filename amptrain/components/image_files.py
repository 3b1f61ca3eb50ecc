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

import torch

from amptrain.components import images
from amptrain.components.beneath import open_beneath
from amptrain.components.file_listing import NOT_BENEATH, PATH_CHARS
from amptrain.components.images import BadImage
from amptrain.components.skips import Skips
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.limits import MAX_IMAGE_BYTES
from amptrain.contract.sizing import format_bytes
from amptrain.contract.text import quote

log = logging.getLogger(__name__)


class ImageReader:
    """Reads images beneath ``root``/``folder`` and turns them into normalised tensors.

    Picklable: it holds only strings and numbers (a new process keeps its own count of bad
    files, see :class:`~amptrain.components.skips.Skips`)."""

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
        self.skips = Skips("dataset.args.path", on_corrupt, max_skipped, _quoted)

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
        shown = self.shown_path(relative)
        if self.skips.known(shown):
            self.skips.bad(shown, "does not decode")  # counted again where it is used again
            return None
        try:
            return self.decode(relative)
        except BadImage as exc:
            self.skips.bad(shown, str(exc))
            log.warning("image-folder: skipping %s: %s", _quoted(shown), exc)
            return None

    def take_skipped(self) -> list[str]:
        """Paths (as the user would write them) skipped since the last call in this process."""
        return self.skips.take()

    # -- transforms ----------------------------------------------------------------------

    def train_view(self, image: torch.Tensor, g: torch.Generator) -> torch.Tensor:
        """:func:`images.train_view` at this folder's size, crop scale and channels."""
        return images.train_view(image, g, self.image_size, self.min_crop_scale, self.channels)

    def eval_view(self, image: torch.Tensor) -> torch.Tensor:
        """:func:`images.eval_view` at this folder's size and channels."""
        return images.eval_view(image, self.image_size, self.channels)


def _quoted(path: str) -> str:
    """A path in a message: quoted, shortened."""
    return quote(path, PATH_CHARS)
