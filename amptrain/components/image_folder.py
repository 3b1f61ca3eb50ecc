"""The ``image-folder`` dataset: one folder of JPEG/PNG/WebP files per class.

Layouts (the ImageNet one, and a single pool):

- ``path/train/<class>/...`` and, optionally, ``path/val/<class>/...`` (the held-out
  split); other folders beside them (``test/``) are not read;
- ``path/<class>/...``, a seeded ``val_fraction`` of the files held out.

Files may lie in sub-folders of a class folder; files directly in ``path`` (or in
``train``) belong to no class and are not read. Labels are the class folders' names,
sorted (``class_names``: the lead publishes them in the job); a ``val`` class must also
be a training class. The folder is listed once, beneath its data root without following
any symlink (:mod:`amptrain.components.file_listing`: symlinks, FIFOs and devices are
ignored and reported in ``ignored``, the listing stops past ``max_files`` entries); each
image is then opened beneath the root again and read with ``os.pread``
(:mod:`amptrain.components.image_files`, where the bounds and the corrupt-file policy are).

The sample at stream position ``p`` is file ``EpochOrder(n, seed)`` of ``p``, cropped and
flipped by draws from ``generator(seed, p, key)`` alone, so batches are exact however the
stream is cut, and any position can be resumed. A bad file under ``on_corrupt='skip'``
is replaced by the sample of the next position that decodes.
"""

from __future__ import annotations

import errno
import logging
import os
import posixpath
import threading
from collections.abc import Sequence
from typing import Any

import torch

from amptrain.components.base import DataInfo
from amptrain.components.file_listing import NOT_BENEATH, PATH_CHARS, Listing, list_folder
from amptrain.components.image_files import ImageReader
from amptrain.components.images import EXTENSIONS
from amptrain.components.memory_budget import require_memory
from amptrain.components.sampling import EpochOrder, generator
from amptrain.components.tensors_dataset import check_under_roots, split_rows
from amptrain.contract.data_access import Beneath
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.text import control_character, quote

log = logging.getLogger(__name__)

_FIELD = "dataset.args.path"
_AUGMENT_KEY = 0x1A6E  # keys each position's crop and flip draws
_ENTRY_BYTES = 120  # a listed path held in memory: a str object and its list slot, roughly


class _Split:
    """Files (relative to the folder) and their labels."""

    def __init__(self, files: list[str], labels: list[int]) -> None:
        self.files = files
        self.labels = torch.tensor(labels, dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.files)

    def resident_bytes(self) -> int:
        return sum(len(f) for f in self.files) + len(self.files) * (_ENTRY_BYTES + 8)


class ImageFolderHeldOut:
    """The held-out split, read in a fixed order with the eval transform."""

    def __init__(self, reader: ImageReader, split: _Split, info: DataInfo) -> None:
        self.reader = reader
        self.split = split
        self.info = info

    def __len__(self) -> int:
        return len(self.split)

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if start < 0 or start + size > len(self):
            raise IndexError(f"held-out rows [{start}, {start + size}) of {len(self)}")
        inputs = torch.empty(size, *self.info.input_shape)
        targets = torch.empty(size, dtype=torch.int64)
        n = len(self)
        for i in range(size):
            for tried in range(n):  # a bad file: the next one that decodes, wrapping round
                row = (start + i + tried) % n
                image = self.reader.load(self.split.files[row])
                if image is not None:
                    inputs[i] = self.reader.eval_view(image)
                    targets[i] = self.split.labels[row]
                    break
            else:
                raise InvalidSpecError(f"{_FIELD}: no held-out image decodes")
        return inputs, targets

    def take_skipped(self) -> list[str]:
        return self.reader.take_skipped()


class ImageFolderDataset:
    """Training images in a seeded order reshuffled every epoch, augmented per position."""

    def __init__(
        self,
        reader: ImageReader,
        train: _Split,
        held: _Split | None,
        class_names: list[str],
        seed: int,
        ignored: list[str],
    ) -> None:
        self.reader = reader
        self.train = train
        self.held = held
        self.class_names = class_names
        self.seed = seed
        self.ignored = ignored
        """Symlinks, FIFOs, devices and sockets found in the folder: never read."""
        size = reader.image_size
        self.info = DataInfo("classification", (reader.channels, size, size), len(class_names))
        self.order = EpochOrder(len(train), seed)
        self._pid = os.getpid()
        self._order_lock = threading.Lock()  # EpochOrder caches permutations
        self.resident_bytes = train.resident_bytes() + (held.resident_bytes() if held else 0)
        self.resident_bytes += 4 * len(train) * 8  # the cached epoch permutations

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_order_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()
        self._order_lock = threading.Lock()

    def _rows(self, start: int, size: int) -> list[int]:
        if self._pid != os.getpid():  # forked: the parent's lock may have been held then
            self._pid, self._order_lock = os.getpid(), threading.Lock()
        with self._order_lock:
            return self.order.rows(start, size).tolist()

    def __len__(self) -> int:
        return len(self.train)

    def held_out(self) -> ImageFolderHeldOut | None:
        """The ``val`` folder or the ``val_fraction`` files, or None."""
        return ImageFolderHeldOut(self.reader, self.held, self.info) if self.held else None

    def take_skipped(self) -> list[str]:
        """Paths of bad files skipped since the last call in this process."""
        return self.reader.take_skipped()

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.empty(size, *self.info.input_shape)
        targets = torch.empty(size, dtype=torch.int64)
        self.fill(start, inputs, targets)
        return inputs, targets

    def fill(self, start: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Samples ``[start, start + len(inputs))`` written into ``inputs`` and ``targets``
        (several threads may fill disjoint parts of one batch)."""
        size = len(inputs)
        rows = self._rows(start, size)
        for i in range(size):
            inputs[i], targets[i] = self._sample(start + i, rows[i])

    def _sample(self, position: int, row: int) -> tuple[torch.Tensor, torch.Tensor]:
        n = len(self.train)
        for tried in range(n):  # a bad file: the sample of the next position that decodes
            if tried:
                (row,) = self._rows(position + tried, 1)
            image = self.reader.load(self.train.files[row])
            if image is not None:
                g = generator(self.seed, position + tried, _AUGMENT_KEY)
                return self.reader.train_view(image, g), self.train.labels[row]
        raise InvalidSpecError(f"{_FIELD}: no training image decodes")


def build_image_folder(
    *,
    seed: int,
    data_roots: Sequence[str] = (),
    path: str,
    image_size: int = 224,
    channels: int = 3,
    min_crop_scale: float = 0.08,
    val_fraction: float = 0.0,
    max_files: int = 2_000_000,
    on_corrupt: str = "fail",
    max_skipped: int = 100,
) -> ImageFolderDataset:
    """List ``path`` (see the module's layouts), label its class folders and serve their
    images; the held-out split is ``val/`` or ``val_fraction`` of the files, drawn by a
    seed fixed for the folder (every job over it evaluates on the same files)."""
    root, folder, listing = _listed(path, data_roots, max_files)
    images = [f for f in listing.files if f.lower().endswith(EXTENSIONS)]
    split_layout = any(f.startswith("train/") for f in images)
    prefix = "train/" if split_layout else ""
    train_by_class = _by_class(images, prefix)
    class_names = sorted(train_by_class)
    if len(class_names) < 2:
        found = f"1 class folder, {quote(class_names[0])}" if class_names else "no images"
        where = posixpath.join(path, "train") if split_layout else path
        raise InvalidSpecError(
            f"{_FIELD}: {quote(where, PATH_CHARS)}: found {found}; an image folder holds one "
            f"folder of {'/'.join(e[1:] for e in EXTENSIONS)} files per class (at least two)"
        )
    for name in class_names:  # published in the job: no terminal escapes, no bidi tricks
        if problem := control_character(name):
            raise InvalidSpecError(f"{_FIELD}: class folder {quote(name)}: {problem}")
    label = {name: i for i, name in enumerate(class_names)}
    train = _split(train_by_class, label)
    held: _Split | None = None
    val_by_class = _by_class(images, "val/") if split_layout else {}
    if val_by_class:
        if val_fraction:
            raise InvalidSpecError(
                f"dataset.args.val_fraction: {quote(path, PATH_CHARS)} has a val folder, "
                "which is the held-out split; give val_fraction 0"
            )
        unknown = sorted(set(val_by_class) - set(label))
        if unknown:
            raise InvalidSpecError(
                f"{_FIELD}: val class {quote(unknown[0])} has no training images in "
                f"{quote(posixpath.join(path, 'train'), PATH_CHARS)}"
            )
        held = _split(val_by_class, label)
    elif val_fraction:
        held_rows, train_rows = split_rows(len(train), val_fraction)
        held = _Split(
            [train.files[i] for i in held_rows.tolist()], train.labels[held_rows].tolist()
        )
        train = _Split(
            [train.files[i] for i in train_rows.tolist()], train.labels[train_rows].tolist()
        )
    reader = ImageReader(
        root,
        folder,
        path,
        image_size=image_size,
        channels=channels,
        min_crop_scale=min_crop_scale,
        on_corrupt=on_corrupt,
        max_skipped=max_skipped,
    )
    if listing.ignored:
        log.warning(
            "image-folder %s: %d symlinks, FIFOs, devices or sockets not read (first: %s)",
            quote(path, PATH_CHARS),
            len(listing.ignored),
            quote(listing.ignored[0], PATH_CHARS),
        )
    dataset = ImageFolderDataset(reader, train, held, class_names, seed, listing.ignored)
    require_memory(dataset.resident_bytes, f"the index of {quote(path, PATH_CHARS)}")
    return dataset


def _listed(path: str, data_roots: Sequence[str], max_files: int) -> tuple[str, str, Listing]:
    """(root, folder relative to it, its listing) of the first data root holding ``path``."""
    for location in check_under_roots(path, data_roots, _FIELD):
        if not isinstance(location, Beneath):
            raise InvalidSpecError(
                f"{_FIELD}: {quote(path, PATH_CHARS)}: image folders are read from the local "
                "data roots only, not from URLs"
            )
        folder = "" if location.relative in ("", ".") else location.relative
        try:
            listing = list_folder(
                location.root, folder, max_entries=max_files, field_name=_FIELD, shown=path
            )
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                continue
            if exc.errno in NOT_BENEATH:
                raise InvalidSpecError(
                    f"{_FIELD}: {quote(path, PATH_CHARS)} is not a folder beneath the data "
                    "roots (a file, a symlink or a changing path)"
                ) from None
            raise InvalidSpecError(
                f"{_FIELD}: cannot read {quote(path, PATH_CHARS)} ({type(exc).__name__})"
            ) from None
        return location.root, folder, listing
    raise InvalidSpecError(f"{_FIELD}: no such folder under the data roots: {quote(path)}")


def _by_class(images: list[str], prefix: str) -> dict[str, list[str]]:
    """``{class: files}`` of the images below ``prefix`` (files outside a class folder left
    out); the files stay sorted."""
    found: dict[str, list[str]] = {}
    for f in images:
        if f.startswith(prefix):
            name, sep, _ = f[len(prefix) :].partition("/")
            if sep:
                found.setdefault(name, []).append(f)
    return found


def _split(by_class: dict[str, list[str]], label: dict[str, int]) -> _Split:
    files = [f for name in sorted(by_class) for f in by_class[name]]
    labels = [label[name] for name in sorted(by_class) for _ in by_class[name]]
    return _Split(files, labels)
