"""The ``webdataset`` dataset: images and labels from tar shards, for data larger than the
machine. No shard is ever loaded into memory, nor any member extracted to disk.

Design: exact positions with shard-level shuffling.

- **Build**: the brace ``pattern`` is counted, then expanded (:mod:`.tar_index`), each name
  checked against the data roots like ``tensors``' path and opened beneath a root
  (regular files only, no symlink). Only the tar headers are read, ~513 bytes a member
  (measured), plus each label member's few bytes: the index holds per sample the image
  member's offset and size and the label, 16 bytes (``resident_bytes``: 16 MB for a
  million samples).
- **Order**: epoch ``e`` visits the shards in a permutation drawn from ``(seed, e)``; inside
  a shard the samples are shuffled within consecutive windows of ``shuffle_window``
  samples, each window's permutation drawn from ``(seed, e, shard, window)``: reads stay
  within a window's span of the file (the page cache and read-ahead keep working),
  batches do not repeat the order the shards were written in. Position ``p`` -> epoch
  ``p // n``, then (shard, sample) by the cumulative counts of that epoch's shard order: a
  pure function of ``(seed, p)``, so any position can be resumed and ``batch`` is exact
  whatever the batch boundaries.
- **Reading** a sample is one ``os.pread`` of its image member (no shared file offset: the
  data path calls ``batch`` in DataLoader worker processes). Shard descriptors are opened
  lazily, at most ``_OPEN_SHARDS`` at once, checked to be the very files indexed (device,
  inode, size, mtime), and left out of the pickled state (a spawned worker reopens them).
- **Images**: decoded and transformed by :mod:`amptrain.components.images` (the header
  checked before decoding); train: random-resized crop (area ``min_crop_scale``-1) and
  flip drawn from the position's own ``generator(seed, p, key)``; evaluation: the shorter
  side resized to ``image_size / 0.875``, the centre crop.
- **Held out**: ``val_pattern``'s shards in their listed order, or ``val_fraction`` of the
  shards drawn by a seed fixed for the list (never trained on).
- **Corrupt data** (a member that does not decode, a symlink/device member, a bad label,
  a truncated shard): ``on_corrupt='fail'`` names ``shard.tar:member``; ``'skip'`` serves
  the next position that decodes in its place and reports it through ``take_skipped``.
"""

from __future__ import annotations

import os
import tarfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from amptrain.components import images
from amptrain.components.array_files import DataFile
from amptrain.components.base import DataInfo
from amptrain.components.images import BadImage
from amptrain.components.sampling import generator
from amptrain.components.skips import Skips
from amptrain.components.tar_index import (
    HeaderReader,
    Identity,
    IndexRules,
    ShardTable,
    confine,
    expand,
    index_shards,
    open_shard,
    shown,
)
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.file_datasets import MAX_FILES
from amptrain.contract.tar_shards import keys_of

_FIELD = "dataset.args.pattern"
_VAL_FIELD = "dataset.args.val_pattern"
_SHARD_KEY, _WINDOW_KEY, _AUG_KEY, _SPLIT_KEY = 0x5A4D, 0x3D1D, 0xA06, 0x5E1D5
_OPEN_SHARDS = 64
_CACHED = 4  # epochs' shard orders and windows' permutations kept: a batch spans a few


class _Shards:
    """Reads members of a table's shards with ``os.pread`` on descriptors opened lazily."""

    def __init__(self, table: ShardTable, data_roots: Sequence[str]) -> None:
        self.table = table
        self.data_roots = tuple(data_roots)
        self._open: dict[int, DataFile] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": {}}  # descriptors do not travel: reopened there

    def fd(self, shard: int) -> int:
        f = self._open.pop(shard, None)
        if f is None:
            if len(self._open) >= _OPEN_SHARDS:  # the least recently used goes
                self._open.pop(next(iter(self._open))).file.close()
            name = self.table.names[shard]
            f = open_shard(self.table.field, name, self.data_roots)
            if Identity.of(f) != self.table.identities[shard]:
                f.file.close()
                raise InvalidSpecError(
                    f"{self.table.field}: {shown(name)} changed since it was indexed"
                )
        self._open[shard] = f
        return f.file.fileno()

    def read(self, shard: int, offset: int, size: int) -> bytes:
        data = os.pread(self.fd(shard), size, offset)
        if len(data) != size:
            raise BadImage("ends early (the shard was truncated after indexing)")
        return data

    def member_name(self, shard: int, offset: int) -> str:
        """The name of the member whose data start at ``offset`` (for messages: a header
        scan of one shard, made only when a member is bad)."""
        reader = HeaderReader(self.fd(shard), self.table.identities[shard].size)
        try:
            with tarfile.open(fileobj=reader, mode="r:") as tar:  # type: ignore[call-overload]
                while (member := tar.next()) is not None:
                    tar.members.clear()
                    if member.offset_data == offset:
                        return str(member.name)
        except Exception:  # only a name for a message: the offset says where too
            pass
        return f"(member at byte {offset})"


class _Samples:
    """What the training stream and the held-out split share: reading and decoding rows."""

    min_crop_scale = images.CROP_SCALE[0]  # the training stream's (evaluation never crops)

    def __init__(
        self, info: DataInfo, shards: _Shards, skips: Skips, seed: int, train: bool
    ) -> None:
        self.info = info
        self.shards = shards
        self.skips = skips
        self.seed = seed
        self.train = train
        self.table = shards.table
        self.total = int(self.table.first[-1])

    def _rows(self, start: int, size: int) -> np.ndarray:
        raise NotImplementedError

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``[start, start + size)``; a bad one replaced by the next that decodes."""
        c, s = self.info.input_shape[0], self.info.input_shape[1]
        inputs = torch.empty(size, c, s, s)
        targets = torch.empty(size, dtype=torch.int64)
        rows = self._rows(start, size).tolist()
        for i in range(size):
            got = self._decoded(rows[i], start + i)
            q = start + i
            while got is None:  # bad: the next position that decodes takes its place
                q += 1
                if q - start - i > self.total:
                    raise InvalidSpecError(f"{self.table.field}: no sample decodes")
                got = self._decoded(int(self._rows(q, 1)[0]), q)
            inputs[i], targets[i] = got
        return inputs, targets

    def _decoded(self, row: int, position: int) -> tuple[torch.Tensor, int] | None:
        """Row ``row`` decoded (a training view drawn for stream ``position``), or None when
        it is bad (recorded; raised with 'fail')."""
        shard = int(np.searchsorted(self.table.first, row, side="right")) - 1
        offset = int(self.table.offsets[row])
        c, s = self.info.input_shape[0], self.info.input_shape[1]
        try:
            image = images.decode(self.shards.read(shard, offset, int(self.table.sizes[row])), c)
        except BadImage as exc:
            where = f"{self.table.names[shard]}:{self.shards.member_name(shard, offset)}"
            self.skips.bad(where, str(exc))
            return None
        if self.train:
            g = generator(self.seed, position, _AUG_KEY)
            view = images.train_view(image, g, s, self.min_crop_scale, c)
        else:
            view = images.eval_view(image, s, c)
        return view, int(self.table.labels[row])

    def take_skipped(self) -> list[str]:
        """``shard.tar:member`` (or ``shard.tar``) of the bad data skipped since the last
        call in this process, at build included."""
        return self.skips.take()


class WebDataset(_Samples):
    """The endless training stream over the shards (see the module's docstring)."""

    def __init__(
        self,
        info: DataInfo,
        shards: _Shards,
        skips: Skips,
        seed: int,
        window: int,
        min_crop_scale: float,
        held: HeldOutShards | None,
    ) -> None:
        super().__init__(info, shards, skips, seed, train=True)
        self.window = window
        self.min_crop_scale = min_crop_scale
        self.held = held
        self.counts = self.table.counts
        # The index, and the caches of shard orders (int64 order + cumulative counts) and
        # window permutations (int64).
        caches = _CACHED * 8 * (2 * len(self.counts) + min(window, int(self.counts.max())))
        self.resident_bytes = self.table.nbytes + (held.table.nbytes if held else 0) + caches
        self._epochs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._windows: dict[tuple[int, int, int], np.ndarray] = {}

    def held_out(self) -> HeldOutShards | None:
        return self.held

    def shard_order(self, epoch: int) -> np.ndarray:
        """The shards in the order epoch ``epoch`` visits them."""
        return self._epoch(epoch)[0]

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        got = self._epochs.get(epoch)
        if got is None:
            if len(self._epochs) >= _CACHED:
                self._epochs.pop(next(iter(self._epochs)))
            g = generator(self.seed, epoch, _SHARD_KEY)
            order = torch.randperm(len(self.counts), generator=g).numpy()
            got = (order, np.cumsum(self.counts[order]))
            self._epochs[epoch] = got
        return got

    def _within(self, epoch: int, shard: int, j: int) -> int:
        """Sample ``j`` of ``shard``'s epoch order -> its stored index (window shuffle)."""
        w = self.window
        if w == 1:
            return j
        block = j // w
        perm = self._windows.get((epoch, shard, block))
        if perm is None:
            if len(self._windows) >= _CACHED:
                self._windows.pop(next(iter(self._windows)))
            length = min(w, int(self.counts[shard]) - block * w)
            g = generator(self.seed, epoch, shard, block, _WINDOW_KEY)
            perm = torch.randperm(length, generator=g).numpy()
            self._windows[(epoch, shard, block)] = perm
        return block * w + int(perm[j - block * w])

    def _rows(self, start: int, size: int) -> np.ndarray:
        rows = np.empty(size, dtype=np.int64)
        for i in range(size):
            epoch, within = divmod(start + i, self.total)
            order, ends = self._epoch(epoch)
            k = int(np.searchsorted(ends, within, side="right"))
            shard = int(order[k])
            j = within - int(ends[k] - self.counts[shard])
            rows[i] = self.table.first[shard] + self._within(epoch, shard, j)
        return rows


class HeldOutShards(_Samples):
    """The held-out shards, their samples in stored order, evaluated as they are."""

    def __len__(self) -> int:
        return self.total

    def _rows(self, start: int, size: int) -> np.ndarray:
        return np.arange(start, start + size, dtype=np.int64) % self.total


def build_webdataset(
    *,
    seed: int,
    data_roots: Sequence[str] = (),
    pattern: str,
    val_pattern: str = "",
    val_fraction: float = 0.0,
    image_key: str = "jpg;jpeg;png;webp",
    label_key: str = "cls",
    image_size: int = 224,
    channels: int = 3,
    num_classes: int = 0,
    min_crop_scale: float = 0.08,
    shuffle_window: int = 1000,
    max_shards: int = 10_000,
    on_corrupt: str = "fail",
    max_skipped: int = 100,
) -> WebDataset:
    """Index the shards ``pattern`` names (headers only) and serve their samples."""
    if val_pattern and val_fraction:
        raise InvalidSpecError("dataset.args.val_fraction: give val_pattern or val_fraction")
    bound = min(max_shards, MAX_FILES)
    names = expand(pattern, bound, _FIELD)
    val_names = expand(val_pattern, bound, _VAL_FIELD) if val_pattern else []
    both = set(names) & set(val_names)
    if both:
        raise InvalidSpecError(f"{_VAL_FIELD}: {shown(min(both))} is a training shard too")
    val_field = _VAL_FIELD
    if val_fraction:
        val_names, names = _split(names, val_fraction)
        val_field = _FIELD
    confine(_FIELD, names, data_roots)
    confine(_VAL_FIELD, val_names, data_roots)
    skips = Skips(_FIELD, on_corrupt, max_skipped, shown)
    val_skips = Skips(val_field, on_corrupt, max_skipped, shown)
    rules = IndexRules(keys_of(image_key), label_key.lower(), num_classes)
    table = index_shards(_FIELD, names, data_roots, rules, skips.bad)
    val = None
    if val_names:
        val = index_shards(val_field, val_names, data_roots, rules, val_skips.bad)
    for t in (table, val):
        if t is not None and t.first[-1] == 0:
            raise InvalidSpecError(f"{t.field}: no samples in {shown(t.names[0])}...")
    largest = max(int(t.labels.max()) for t in (table, val) if t is not None)
    info = DataInfo(
        "classification", (channels, image_size, image_size), num_classes or largest + 1
    )
    held = HeldOutShards(info, _Shards(val, data_roots), val_skips, seed, False) if val else None
    shards = _Shards(table, data_roots)
    return WebDataset(info, shards, skips, seed, shuffle_window, min_crop_scale, held)


def _split(names: list[str], fraction: float) -> tuple[list[str], list[str]]:
    """(held-out, training) shards: ``round(fraction * n)`` (at least one, and one left to
    train on), drawn by a seed fixed for the list, each part in listed order."""
    n = len(names)
    if n < 2:
        raise InvalidSpecError(
            "dataset.args.val_fraction: the pattern names one shard; nothing to hold out "
            "(give val_pattern)"
        )
    held = min(n - 1, max(1, round(fraction * n)))
    perm = torch.randperm(n, generator=generator(_SPLIT_KEY, n)).tolist()
    chosen = set(perm[:held])
    return [m for i, m in enumerate(names) if i in chosen], [
        m for i, m in enumerate(names) if i not in chosen
    ]
