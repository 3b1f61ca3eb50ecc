"""The ``parquet`` dataset: named columns of a Parquet file, an Arrow IPC file or stream,
or a ``datasets.save_to_disk`` folder (:mod:`amptrain.components.table_files`).

Tasks:

- ``classification``: ``input_column`` holds encoded images (binary, or the ``{bytes,
  path}`` struct of a ``datasets`` ``Image`` feature), decoded and given the views of
  :mod:`amptrain.components.images` (training rows: a random-resized crop, scale
  ``min_crop_scale`` to 1, and a flip drawn from the row's stream position; held-out rows:
  the shorter side resized to ``image_size / 0.875`` and the centre crop; ImageNet's mean
  and std; data kind ``images``); or text (kind
  ``sequences``), tokenized, truncated to ``seq_len`` and padded with the id
  ``vocab_size``. ``label_column`` holds integer labels. Rows are read a piece (row group,
  record batch) at a time; each epoch visits the pieces in a seeded order and the rows of
  each piece in a seeded order, so a batch decodes one or two pieces, not one per sample.
  Held in memory: the two pieces last read and, with ``val_fraction``, the index of
  training rows (8 bytes a row).
- ``language_model``: the text column of every row, tokenized and concatenated into one
  token stream **held in memory** (2 bytes a token, 4 past a 65,536-token vocabulary),
  cut into blocks of ``seq_len + 1`` like ``token-file``.

Tokens: ``tokenizer_path``, an operator's ``tokenizer.json`` under the data roots (the
``tokenizers`` package, never fetched from a hub), or UTF-8 bytes (vocabulary 256).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from tokenizers import Tokenizer

from amptrain.components import images
from amptrain.components.array_files import PATH_CHARS, open_data_file
from amptrain.components.base import DataInfo
from amptrain.components.memory_budget import require_memory
from amptrain.components.sampling import generator
from amptrain.components.skips import Skips
from amptrain.components.table_files import Table, open_table
from amptrain.components.tensors_dataset import check_under_roots, split_rows
from amptrain.components.token_file import InMemoryTokens, TokenBlocks, split_blocks
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.limits import MAX_IMAGE_BYTES
from amptrain.contract.sizing import format_bytes
from amptrain.contract.text import quote

MAX_CELL_BYTES = MAX_IMAGE_BYTES
_AUGMENT = 0xA06  # keys a training row's crop and flip draws: (seed, position, _AUGMENT)
"""Bytes of one cell read: an encoded image's bound, and a text cell's too."""
MAX_TOKENIZER_BYTES = 64 * 2**20


class TextEncoder:
    """Text to token ids: a ``tokenizer.json``'s tokenizer, or UTF-8 bytes."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.vocab = tokenizer.get_vocab_size(with_added_tokens=True) if tokenizer else 256

    def encode(self, text: str) -> np.ndarray[Any, Any]:
        if self.tokenizer is None:
            return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids)


def load_encoder(tokenizer_path: str, data_roots: Sequence[str]) -> TextEncoder:
    """The operator's tokenizer (read through the data-root checks), or bytes."""
    if not tokenizer_path:
        return TextEncoder(None)
    field = "dataset.args.tokenizer_path"
    with open_data_file(
        field, tokenizer_path, check_under_roots(tokenizer_path, data_roots, field)
    ) as f:
        text = f.file.read(MAX_TOKENIZER_BYTES + 1)
        if len(text) > MAX_TOKENIZER_BYTES:
            raise f.refuse(f"over {MAX_TOKENIZER_BYTES >> 20} MiB; not a tokenizer.json")
        try:
            return TextEncoder(Tokenizer.from_str(text.decode("utf-8")))
        except Exception:  # the library's message may quote the file
            raise f.refuse("not a tokenizer.json the tokenizers library reads") from None


def _column(table: Table, arg: str, name: str) -> pa.DataType:
    if name not in table.columns:
        found = ", ".join(quote(c, 30) for c in table.columns[:20])
        more = f" and {len(table.columns) - 20} more" if len(table.columns) > 20 else ""
        raise InvalidSpecError(
            f"dataset.args.{arg}: {quote(name)} not in the table; found: {found}{more}"
        )
    dtype: pa.DataType = table.schema.field(name).type
    return dtype


def _cell_kind(table: Table, column: str, task: str) -> str:
    """``text`` or ``bytes`` (encoded images; a language model's UTF-8 text)."""
    dtype = _column(table, "input_column", column)
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return "text"
    if pa.types.is_struct(dtype) and dtype.get_field_index("bytes") >= 0:
        dtype = dtype.field("bytes").type  # a datasets Image feature: {bytes, path}
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return "bytes"
    wanted = "text" if task == "language_model" else "encoded images or text"
    raise InvalidSpecError(
        f"dataset.args.input_column: {quote(column)} holds {quote(str(dtype), 40)}, not {wanted}"
    )


def _cells(column: pa.ChunkedArray) -> pa.Array:
    """One piece's column as one array; a ``datasets`` Image struct as its bytes."""
    arr = column.combine_chunks()
    if pa.types.is_struct(arr.type):
        arr = pc.struct_field(arr, "bytes")
    return arr


class PieceOrder:
    """Stream positions to (piece, row): each epoch the pieces in a seeded order, and the
    rows kept of each piece (``rows[piece]``) in a seeded order of their own."""

    def __init__(self, rows: list[np.ndarray[Any, Any]], seed: int) -> None:
        self.rows = rows
        self.seed = seed
        self.n = sum(len(r) for r in rows)
        self._epochs: dict[int, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
        self._pieces: dict[tuple[int, int], np.ndarray[Any, Any]] = {}

    def at(self, position: int) -> tuple[int, int]:
        epoch, offset = divmod(position, self.n)
        if epoch not in self._epochs:
            if len(self._epochs) >= 2:
                self._epochs.pop(next(iter(self._epochs)))
            perm = torch.randperm(
                len(self.rows), generator=generator(self.seed, epoch, 0x9E)
            ).numpy()
            sizes = np.array([len(self.rows[p]) for p in perm], dtype=np.int64)
            self._epochs[epoch] = (perm, np.cumsum(sizes))
        perm, ends = self._epochs[epoch]
        i = int(np.searchsorted(ends, offset, side="right"))
        piece = int(perm[i])
        key = (epoch, piece)
        if key not in self._pieces:
            if len(self._pieces) >= 4:
                self._pieces.pop(next(iter(self._pieces)))
            kept = self.rows[piece]
            g = generator(self.seed, epoch, piece, 0x9F)
            self._pieces[key] = kept[torch.randperm(len(kept), generator=g).numpy()]
        within = offset - (int(ends[i]) - len(self.rows[piece]))
        return piece, int(self._pieces[key][within])


class TableSamples:
    """Classification samples of a table: images or token sequences, with labels."""

    def __init__(
        self,
        info: DataInfo,
        table: Table,
        columns: tuple[str, str],
        skips: Skips,
        encoder: TextEncoder | None,
        order: PieceOrder | None,
        held_rows: np.ndarray[Any, Any] | None = None,
        min_crop_scale: float | None = None,
    ) -> None:
        self.info = info
        self.min_crop_scale = min_crop_scale
        """Training views (random-resized crop from this scale, flip); None: the eval view."""
        self.table = table
        self.columns = columns
        self.skips = skips
        self.encoder = encoder
        self.order = order
        self.held_rows = held_rows
        self.starts = np.cumsum([0, *table.piece_rows])
        self.held: TableSamples | None = None
        self._cache: dict[int, tuple[pa.Array, np.ndarray[Any, Any], np.ndarray[Any, Any]]] = {}
        index = 0 if order is None else 8 * order.n
        self.resident_bytes = index + 8 * (0 if held_rows is None else len(held_rows))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_cache": {}}

    def __len__(self) -> int:
        return self.order.n if self.order is not None else len(self._held_rows())

    def held_out(self) -> TableSamples | None:
        return self.held

    def take_skipped(self) -> list[str]:
        return self.skips.take()

    def _held_rows(self) -> np.ndarray[Any, Any]:
        if self.held_rows is None:
            return np.arange(int(self.starts[-1]))
        return self.held_rows

    def _at(self, position: int) -> tuple[int, int]:
        if self.order is not None:
            return self.order.at(position)
        row = int(self._held_rows()[position % len(self)])
        piece = int(np.searchsorted(self.starts, row, side="right")) - 1
        return piece, row - int(self.starts[piece])

    def _piece(self, piece: int) -> tuple[pa.Array, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        if piece not in self._cache:
            if len(self._cache) >= 2:
                self._cache.pop(next(iter(self._cache)))
            read = self.table.read(piece, self.columns)
            cells = _cells(read.column(0))
            sizes = pc.fill_null(pc.binary_length(cells), -1).to_numpy(zero_copy_only=False)
            # Unsafe: a uint64 label past int64 wraps negative and is refused as a bad label.
            labels = read.column(1).combine_chunks().cast(pa.int64(), safe=False)
            labels = pc.fill_null(labels, -1)
            self._cache[piece] = (cells, sizes, labels.to_numpy(zero_copy_only=False))
        return self._cache[piece]

    def _sample(self, piece: int, row: int, position: int) -> tuple[torch.Tensor, int] | str:
        """(input, label) of the row served at stream ``position``, or why it is bad."""
        cells, sizes, labels = self._piece(piece)
        label = int(labels[row])
        if not 0 <= label < self.info.num_classes:
            return f"label missing or outside [0, {self.info.num_classes})"
        if not 0 <= sizes[row] <= MAX_CELL_BYTES:
            return f"a missing cell, or one over {format_bytes(MAX_CELL_BYTES)}"
        value = cells[row].as_py()
        if self.encoder is not None:
            ids = torch.full(self.info.input_shape, self.info.vocab_size or 0, dtype=torch.long)
            text = value if isinstance(value, str) else value.decode("utf-8", "replace")
            got = torch.from_numpy(self.encoder.encode(text)[: len(ids)].astype(np.int64))
            ids[: len(got)] = got
            return ids, label
        try:
            image = images.decode(value, 3)
        except images.BadImage as exc:
            return str(exc)
        size = self.info.input_shape[-1]
        if self.min_crop_scale is None or self.order is None:
            return images.eval_view(image, size, 3), label
        g = generator(self.order.seed, position, _AUGMENT)
        return images.train_view(image, g, size, self.min_crop_scale, 3), label

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples of positions ``[start, start + size)``."""
        if self.order is None and (start < 0 or start + size > len(self)):
            raise IndexError(f"held-out rows [{start}, {start + size}) of {len(self)}")
        dtype = torch.long if self.encoder is not None else torch.float32
        inputs = torch.empty((size, *self.info.input_shape), dtype=dtype)
        targets = torch.empty(size, dtype=torch.long)
        for i in range(size):
            for step in range(len(self) + 1):
                piece, row = self._at(start + i + step)
                got = self._sample(piece, row, start + i)
                if not isinstance(got, str):
                    inputs[i], targets[i] = got
                    break
                record = (
                    f"{quote(self.table.shown, PATH_CHARS)} row {int(self.starts[piece]) + row}"
                )
                self.skips.bad(record, got)
            else:
                raise InvalidSpecError(f"{self.skips.field}: no row of the table is usable")
        return inputs, targets


def _stream(table: Table, column: str, encoder: TextEncoder, skips: Skips) -> InMemoryTokens:
    """Every row's text tokenized into one stream (bad rows per on_corrupt)."""
    dtype = np.uint16 if encoder.vocab <= 2**16 else np.uint32
    parts: list[np.ndarray[Any, Any]] = []
    held = row = 0
    for piece in range(table.pieces):
        cells = _cells(table.read(piece, [column]).column(0))
        sizes = pc.fill_null(pc.binary_length(cells), -1).to_numpy(zero_copy_only=False)
        for i in range(len(cells)):
            if not 0 <= sizes[i] <= MAX_CELL_BYTES:
                skips.bad(
                    f"{quote(table.shown, PATH_CHARS)} row {row + i}", "a missing or huge cell"
                )
                continue
            value = cells[i].as_py()
            text = value if isinstance(value, str) else value.decode("utf-8", "replace")
            ids = encoder.encode(text).astype(dtype)
            held += ids.nbytes
            require_memory(2 * held, f"the token stream of {quote(table.shown, PATH_CHARS)}")
            parts.append(ids)
        row += len(cells)
    return InMemoryTokens(table.shown, np.concatenate(parts) if parts else np.zeros(0, dtype))


def build_parquet(
    *,
    seed: int,
    data_roots: Sequence[str] = (),
    path: str,
    task: str = "classification",
    input_column: str = "image",
    label_column: str = "label",
    num_classes: int = 0,
    image_size: int = 224,
    min_crop_scale: float = 0.08,
    seq_len: int = 256,
    tokenizer_path: str = "",
    val_path: str = "",
    val_fraction: float = 0.0,
    on_corrupt: str = "fail",
    max_skipped: int = 100,
) -> TableSamples | TokenBlocks:
    """Open the table(s) and serve ``task``'s samples (see the module's docstring)."""
    if val_path and val_fraction:
        raise InvalidSpecError("dataset.args.val_fraction: give val_path or val_fraction, not both")
    field = "dataset.args.path"
    skips = Skips(field, on_corrupt, max_skipped)
    val_skips = Skips("dataset.args.val_path", on_corrupt, max_skipped)
    table = open_table(field, path, data_roots)
    val = open_table("dataset.args.val_path", val_path, data_roots) if val_path else None
    kinds = {_cell_kind(t, input_column, task) for t in ((table, val) if val else (table,))}
    if len(kinds) > 1:
        raise InvalidSpecError(
            f"dataset.args.val_path: {quote(input_column)} holds {' and '.join(sorted(kinds))} "
            "in the two tables"
        )
    text = kinds == {"text"}
    encoder = load_encoder(tokenizer_path, data_roots) if text or task == "language_model" else None
    if task == "language_model":
        assert encoder is not None
        info = DataInfo("language_model", (seq_len,), encoder.vocab)
        held = _stream(val, input_column, encoder, val_skips) if val else None
        return split_blocks(
            info, _stream(table, input_column, encoder, skips), skips, seed, val_fraction, held
        )
    for t in (table, val) if val else (table,):
        if not pa.types.is_integer(_column(t, "label_column", label_column)):
            raise InvalidSpecError(
                f"dataset.args.label_column: {quote(label_column)} is not integers"
            )
    classes = num_classes or _classes(table, val, label_column)
    if encoder is not None:
        info = DataInfo("classification", (seq_len,), classes, vocab_size=encoder.vocab)
    else:
        info = DataInfo("classification", (3, image_size, image_size), classes)
    rows = [np.arange(n, dtype=np.int64) for n in table.piece_rows]
    held_rows = None
    if val_fraction:
        held_rows, train = split_rows(int(sum(table.piece_rows)), val_fraction)
        starts = np.cumsum([0, *table.piece_rows])
        kept = train.numpy()
        rows = [kept[(kept >= a) & (kept < b)] - a for a, b in itertools.pairwise(starts)]
    columns = (input_column, label_column)
    order = PieceOrder(rows, seed)
    data = TableSamples(info, table, columns, skips, encoder, order, None, min_crop_scale)
    if val is not None or held_rows is not None:
        source = val if val is not None else table
        held_at = None if held_rows is None else held_rows.numpy()
        held_skips = val_skips if val is not None else skips
        data.held = TableSamples(info, source, columns, held_skips, encoder, None, held_at)
    data.resident_bytes += 2 * table.piece_bytes  # the two pieces last read, decoded
    require_memory(data.resident_bytes, f"the index of {quote(path, PATH_CHARS)}")
    return data


def _classes(table: Table, val: Table | None, column: str) -> int:
    """Largest label + 1 over both splits (one column read, a piece at a time)."""
    largest = 0
    for t in (table, val) if val else (table,):
        for piece in range(t.pieces):
            labels = t.read(piece, [column]).column(0)
            top = pc.max(labels).as_py()
            largest = max(largest, top if top is not None else 0)
    if largest + 1 < 2:
        raise InvalidSpecError("dataset.args.label_column: fewer than two classes in the table")
    return int(largest + 1)
