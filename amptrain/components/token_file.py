"""The ``token-file`` dataset: a flat binary token stream, nanoGPT's ``train.bin``.

The file is nothing but token ids, ``uint16`` or ``uint32`` little-endian, no header. It is
memory-mapped (opened beneath a data root like every file dataset, the map made over that
very descriptor), never read into memory: a batch copies only its own blocks out of the
map. The stream is cut into non-overlapping blocks of ``seq_len + 1`` tokens (a tail
shorter than a block is never read); a sample is one block, inputs ``block[:-1]`` and
targets ``block[1:]``, both int64.

Training positions visit the blocks in a fresh seeded order each epoch (``EpochOrder``),
so the sample at position ``p`` depends only on ``(seed, p)``. The held-out split is
``val_path`` (another token file: hold out whole source files, not neighbouring text) or
the **last** ``val_fraction`` of the blocks, a contiguous tail: a randomly drawn block
would sit between training blocks, whose text runs on into it.

Every token read is checked against ``vocab_size``: an id out of range is an error naming
the file and the token's offset (``on_corrupt`` 'fail'), or its block is skipped, replaced
by the block of the next position that is whole ('skip'; a skipped record is the file and
block number, and ``max_skipped`` bounds the distinct bad blocks one process accepts).

:class:`TokenBlocks` serves any 1-D token array this way; the ``parquet`` dataset's
language-model task uses it over the stream it tokenizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

from amptrain.components.array_files import PATH_CHARS, open_data_file
from amptrain.components.base import DataInfo
from amptrain.components.memory_budget import require_memory
from amptrain.components.sampling import EpochOrder
from amptrain.components.skips import Skips
from amptrain.components.tensors_dataset import check_under_roots
from amptrain.contract.data_access import Beneath
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.file_datasets import TOKEN_WINDOW_BLOCKS as WINDOW_BLOCKS
from amptrain.contract.text import quote

ORDER_EPOCHS = 4
"""Epoch permutations ``EpochOrder`` keeps cached: 8 bytes per training block each."""


class TokenSource(Protocol):
    """A 1-D array of token ids, possibly mapped on first use."""

    shown: str

    def array(self) -> np.ndarray[Any, Any]: ...


class InMemoryTokens:
    """Token ids already in memory (the ``parquet`` dataset's tokenized text)."""

    def __init__(self, shown: str, tokens: np.ndarray[Any, Any]) -> None:
        self.shown = shown
        self.tokens = tokens

    def array(self) -> np.ndarray[Any, Any]:
        return self.tokens


class MappedTokens:
    """A token file memory-mapped over the descriptor opened beneath its data root.

    Picklable without its map (a spawned loader process maps the file again, through the
    same checks); a forked one shares the parent's read-only map."""

    def __init__(self, field: str, shown: str, candidates: Sequence[str | Beneath], dtype: str):
        self.field = field
        self.shown = shown
        self.candidates = list(candidates)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.size: int | None = None
        self._map: np.ndarray[Any, Any] | None = None
        self.array()  # refuse a bad file when the dataset is built, not at the first batch

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_map"] = None
        return state

    def array(self) -> np.ndarray[Any, Any]:
        if self._map is None:
            self._map = self._open()
        return self._map

    def _open(self) -> np.ndarray[Any, Any]:
        width = self.dtype.itemsize
        with open_data_file(self.field, self.shown, self.candidates) as f:
            if f.fd_path is None or f.size is None:
                raise f.refuse("a token file must be a local file (it is memory-mapped)")
            if self.size is not None and f.size != self.size:
                raise f.refuse(f"changed size while in use ({self.size} -> {f.size} bytes)")
            if f.size == 0:
                raise f.refuse("the file is empty")
            if f.size % width:
                raise f.refuse(
                    f"{f.size} bytes is not a whole number of {self.dtype.name} tokens "
                    f"({width} bytes each): wrong dtype, or a truncated file"
                )
            self.size = f.size
            # Mapped from the open file object: its descriptor, not the path string again.
            return np.memmap(f.file, dtype=self.dtype, mode="r", shape=(f.size // width,))


class TokenBlocks:
    """Blocks ``[first, first + n)`` of ``seq_len + 1`` tokens of a token source.

    ``seed`` None: a finite split read in order (a held-out split, ``len()`` blocks);
    else an endless stream in a seeded order, reshuffled every epoch."""

    def __init__(
        self,
        info: DataInfo,
        source: TokenSource,
        first: int,
        n: int,
        skips: Skips,
        seed: int | None,
        held: TokenBlocks | None = None,
    ) -> None:
        if n < 1:
            raise ValueError("no blocks")
        self.info = info
        self.source = source
        self.first = first
        self.n = n
        self.skips = skips
        self.block = info.input_shape[0] + 1
        self.order = EpochOrder(n, seed) if seed is not None else None
        self.held = held
        order_bytes = ORDER_EPOCHS * n * 8 if seed is not None else 0
        self.resident_bytes = order_bytes + WINDOW_BLOCKS * self.block * (
            source.array().itemsize + 3 * 8
        )

    def __getstate__(self) -> dict[str, Any]:
        """Without the cached epoch orders (8 bytes a block each): drawn again on use."""
        order = self.order
        return {**self.__dict__, "order": order and EpochOrder(order.n, order.seed)}

    def __len__(self) -> int:
        return self.n

    def held_out(self) -> TokenBlocks | None:
        """The held-out blocks (another file, or the tail of this one), or None."""
        return self.held

    def take_skipped(self) -> list[str]:
        """Records skipped since the last call in this process."""
        return self.skips.take()

    def _rows(self, start: int, size: int) -> np.ndarray[Any, Any]:
        if self.order is not None:
            return self.order.rows(start, size).numpy() + self.first
        if start < 0 or start + size > self.n:
            raise IndexError(f"held-out blocks [{start}, {start + size}) of {self.n}")
        return np.arange(start, start + size, dtype=np.int64) + self.first

    def _gather(self, rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        offsets = rows[:, None] * self.block + np.arange(self.block, dtype=np.int64)
        out: np.ndarray[Any, Any] = self.source.array()[offsets]
        return out

    def _bad(self, row: int, ids: np.ndarray[Any, Any]) -> None:
        column = int(np.argmax(ids >= self.info.num_classes))
        offset = row * self.block + column
        self.skips.bad(
            f"{quote(self.source.shown, PATH_CHARS)} block {row}",
            f"the token at offset {offset} (byte {offset * self.source.array().itemsize}) is "
            f">= vocab_size ({self.info.num_classes})",
        )

    def _replacement(self, position: int) -> np.ndarray[Any, Any]:
        """The block of the first position after ``position`` whose tokens are all in range
        (held out: wrapping round the split)."""
        for step in range(1, self.n + 1):
            p = position + step
            row = int(self._rows(p if self.order is not None else p % self.n, 1)[0])
            ids = self._gather(np.array([row]))[0]
            if int(ids.max()) < self.info.num_classes:
                return ids
            self._bad(row, ids)
        raise InvalidSpecError(f"{self.skips.field}: no block of the file is whole")

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks of positions ``[start, start + size)``: int64 (inputs, next tokens)."""
        rows = self._rows(start, size)
        ids = self._gather(rows)
        if size and int(ids.max()) >= self.info.num_classes:
            ids = np.array(ids)  # a private copy to patch (a slice of a map is read-only)
            for i in np.flatnonzero((ids >= self.info.num_classes).any(axis=1)):
                self._bad(int(rows[i]), ids[i])
                ids[i] = self._replacement(start + int(i))
        tokens = torch.from_numpy(ids.astype(np.int64))
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def split_blocks(
    info: DataInfo,
    source: TokenSource,
    skips: Skips,
    seed: int,
    val_fraction: float,
    held_source: TokenSource | None = None,
) -> TokenBlocks:
    """The training stream over ``source`` with its held-out split: all of ``held_source``,
    or the last ``val_fraction`` of the blocks (at least one, and one left to train on)."""
    field = skips.field
    block = info.input_shape[0] + 1
    n = len(source.array()) // block
    if n < 1:
        raise InvalidSpecError(
            f"{field}: {quote(source.shown, PATH_CHARS)} holds {len(source.array())} tokens, "
            f"fewer than one block of seq_len + 1 = {block}"
        )
    held: TokenBlocks | None = None
    if held_source is not None:
        held_n = len(held_source.array()) // block
        if held_n < 1:
            raise InvalidSpecError(
                f"{field.rsplit('.', 1)[0]}.val_path: {quote(held_source.shown, PATH_CHARS)} "
                f"holds fewer than one block of seq_len + 1 = {block} tokens"
            )
        # The held-out file's own errors name its field; skipped records are counted apart.
        val_skips = Skips(f"{field.rsplit('.', 1)[0]}.val_path", skips.policy, skips.limit)
        held = TokenBlocks(info, held_source, 0, held_n, val_skips, None)
    elif val_fraction:
        if n < 2:
            raise InvalidSpecError(
                f"{field.rsplit('.', 1)[0]}.val_fraction: one block only; nothing to hold out"
            )
        tail = min(n - 1, max(1, round(val_fraction * n)))
        n -= tail
        held = TokenBlocks(info, source, n, tail, skips, None)
    train = TokenBlocks(info, source, 0, n, skips, seed, held)
    require_memory(train.resident_bytes, f"the block order of {quote(source.shown, PATH_CHARS)}")
    return train


def build_token_file(
    *,
    seed: int,
    data_roots: Sequence[str] = (),
    path: str,
    dtype: str = "uint16",
    seq_len: int = 256,
    vocab_size: int,
    val_path: str = "",
    val_fraction: float = 0.0,
    on_corrupt: str = "fail",
    max_skipped: int = 100,
) -> TokenBlocks:
    """Map ``path`` (and ``val_path``) and serve its blocks in a seeded order."""
    if val_path and val_fraction:
        raise InvalidSpecError("dataset.args.val_fraction: give val_path or val_fraction, not both")
    field = "dataset.args.path"
    source = MappedTokens(field, path, check_under_roots(path, data_roots, field), dtype)
    held: MappedTokens | None = None
    if val_path:
        val_field = "dataset.args.val_path"
        held = MappedTokens(
            val_field, val_path, check_under_roots(val_path, data_roots, val_field), dtype
        )
    info = DataInfo("language_model", (seq_len,), vocab_size)
    return split_blocks(
        info, source, Skips(field, on_corrupt, max_skipped), seed, val_fraction, held
    )
