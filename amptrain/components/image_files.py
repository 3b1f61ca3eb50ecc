"""One image file read, checked, decoded and transformed (the ``image-folder`` dataset's
reader).

- Read by ``os.pread`` on a descriptor :func:`~amptrain.components.beneath.open_beneath`
  returns (never a path string, never a shared file offset: safe in any thread and across
  ``fork``), regular files only, at most :data:`MAX_FILE_BYTES`.
- The declared size is read from the header by Pillow (which decodes nothing on
  ``open``) and checked against :data:`MAX_PIXELS` *before* decoding: a 100 KB PNG can
  declare 50,000 x 50,000 pixels (7.5 GB decoded).
- Decoded by ``torchvision.io.decode_image`` (libjpeg-turbo, libpng, libwebp) to RGB or
  grey; transformed by ``torchvision.transforms.v2.functional``: train, a random-resized
  crop and a horizontal flip whose parameters come from the sample position's own
  generator; eval, a resize of the shorter side to ``image_size / 0.875`` and a centre
  crop; then float32, normalised.
  (The crop's scale is ``(min_crop_scale, 1)``: ImageNet's 0.08 by default.)
- A file that fails any of this is *bad*: ``on_corrupt='fail'`` raises
  :class:`InvalidSpecError` naming its relative path and why; ``'skip'`` records it
  (:meth:`ImageReader.take_skipped`), and more than ``max_skipped`` distinct bad files in
  one process fail the job naming the last.
"""

from __future__ import annotations

import errno
import io
import logging
import math
import os
import posixpath
import threading
from typing import Any

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as F

from amptrain.components.beneath import open_beneath
from amptrain.components.file_listing import NOT_BENEATH, PATH_CHARS
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.sizing import format_bytes
from amptrain.contract.text import quote

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 64 * 2**20
"""Largest image file read (a 24-megapixel JPEG is about 10 MiB)."""
MAX_PIXELS = 50_000_000
"""Most pixels an image may declare (7,071 x 7,071): 150 MB decoded as RGB."""
EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
_FORMATS = ("JPEG", "PNG", "WEBP")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
EVAL_CROP = 0.875  # the share of the resized image the centre crop keeps (ImageNet's 224/256)


class BadImage(Exception):
    """A file that cannot be used as an image; the message says why (never its content)."""


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
        min_crop_scale: float = CROP_SCALE[0],
        on_corrupt: str,
        max_skipped: int,
    ) -> None:
        self.root = root
        self.folder = folder
        self.shown = shown
        self.image_size = image_size
        self.channels = channels
        self.scale = (min_crop_scale, CROP_SCALE[1])
        self.on_corrupt = on_corrupt
        self.max_skipped = max_skipped
        self.mean = IMAGENET_MEAN if channels == 3 else (0.5,)
        self.std = IMAGENET_STD if channels == 3 else (0.5,)
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
            if size > MAX_FILE_BYTES:
                raise BadImage(f"{format_bytes(size)}, more than {format_bytes(MAX_FILE_BYTES)}")
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
        data = self.read(relative)
        try:
            # Header only: Pillow reads the size and decodes nothing until asked.
            with Image.open(io.BytesIO(data), formats=_FORMATS) as image:
                width, height = image.size
        except Image.DecompressionBombError:
            raise BadImage(f"declares more than {MAX_PIXELS} pixels") from None
        except Exception as exc:  # Pillow raises many kinds for a broken header
            raise BadImage(
                f"not a JPEG, PNG or WebP image, or one whose header is cut short or corrupt "
                f"({type(exc).__name__})"
            ) from None
        if width * height > MAX_PIXELS:
            raise BadImage(f"declares {width}x{height} pixels, more than {MAX_PIXELS}")
        mode = ImageReadMode.RGB if self.channels == 3 else ImageReadMode.GRAY
        try:
            encoded = torch.frombuffer(data, dtype=torch.uint8)
            return decode_image(encoded, mode=mode, apply_exif_orientation=True)
        except RuntimeError:  # libjpeg/libpng/libwebp: truncated or corrupt data
            raise BadImage("does not decode: a truncated or corrupt image") from None

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
        """A random-resized crop (then ``image_size`` square) and a horizontal flip, drawn
        from ``g`` alone; float32, normalised."""
        top, left, height, width = crop_box(image.shape[-2], image.shape[-1], g, self.scale)
        size = [self.image_size, self.image_size]
        out = F.resized_crop(image, top, left, height, width, size, antialias=True)
        if bool(torch.rand((), generator=g) < 0.5):
            out = F.horizontal_flip(out)
        return self._normalised(out)

    def eval_view(self, image: torch.Tensor) -> torch.Tensor:
        """The shorter side resized to ``image_size / 0.875``, the centre ``image_size``
        square; float32, normalised."""
        resized = F.resize(image, [round(self.image_size / EVAL_CROP)], antialias=True)
        return self._normalised(F.center_crop(resized, [self.image_size, self.image_size]))

    def _normalised(self, image: torch.Tensor) -> torch.Tensor:
        scaled = F.to_dtype(image, torch.float32, scale=True)
        return F.normalize(scaled, list(self.mean), list(self.std))


def crop_box(
    height: int, width: int, g: torch.Generator, scale: tuple[float, float] = CROP_SCALE
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a random-resized crop: torchvision's
    ``RandomResizedCrop.get_params`` (area in ``scale``, log-uniform aspect ratio in
    ``CROP_RATIO``, ten tries, else the central crop of the nearest allowed ratio), its
    draws taken from ``g`` instead of the global generator, so a sample depends only on
    its own position and the data-loading threads never share random state."""
    area = height * width
    low, high = math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])
    for _ in range(10):
        target = area * float(torch.empty(()).uniform_(*scale, generator=g))
        ratio = math.exp(float(torch.empty(()).uniform_(low, high, generator=g)))
        w = round(math.sqrt(target * ratio))
        h = round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (), generator=g))
            left = int(torch.randint(0, width - w + 1, (), generator=g))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < CROP_RATIO[0]:
        w, h = width, round(width / CROP_RATIO[0])
    elif in_ratio > CROP_RATIO[1]:
        h, w = height, round(height * CROP_RATIO[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w
