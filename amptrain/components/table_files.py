"""Tables on disk for the ``parquet`` dataset, memory-mapped and read a piece at a time.

Three layouts, told apart by the path: ``.parquet``/``.pq`` a Parquet file (a piece is a
row group, decoded when read); ``.arrow``/``.feather``/``.ipc`` an Arrow IPC file or
stream (a piece is a record batch, zero-copy from the map); anything else a folder
written by Hugging Face ``datasets``' ``save_to_disk``: its ``state.json`` names the
``.arrow`` data files, Arrow IPC *streams*, each mapped like a single one.

Every file is opened beneath its data root (``open_data_file``: regular files, no
symlink), and mapped from that descriptor: never opened again by a path string. Local
files only. What a file declares is checked before it is used: its row count, pieces,
a row group's size; Arrow data are validated in full (offsets within their buffers), so a
lying file is an ``InvalidSpecError`` naming the path, never a crash or a huge allocation.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import posixpath
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from amptrain.components.array_files import PATH_CHARS, DataFile, open_data_file
from amptrain.components.tensors_dataset import check_under_roots
from amptrain.contract.data_access import Beneath
from amptrain.contract.errors import InvalidSpecError, TrainingError
from amptrain.contract.file_datasets import MAX_FILES
from amptrain.contract.sizing import format_bytes
from amptrain.contract.text import quote

log = logging.getLogger(__name__)

MAX_ROWS = 1_000_000_000
MAX_PIECES = 1_000_000
"""Row groups or record batches of one table (each is an entry of the dataset's index)."""
MAX_PIECE_BYTES = 512 * 2**20
"""Largest row group (uncompressed, as its metadata declares) decoded at once."""
MAX_STATE_BYTES = 2**20
"""A ``save_to_disk`` folder's ``state.json``."""
PARQUET = (".parquet", ".pq")
ARROW = (".arrow", ".feather", ".ipc", ".arrows")


def _mapped(f: DataFile) -> pa.Buffer:
    """The whole opened file as an Arrow buffer over a read-only map of its descriptor."""
    if f.fd_path is None or f.size is None:
        raise f.refuse("only local files are read (they are memory-mapped)")
    if f.size == 0:
        raise f.refuse("the file is empty")
    return pa.py_buffer(mmap.mmap(f.file.fileno(), 0, access=mmap.ACCESS_READ))


class Table:
    """The rows of one table file or folder: ``pieces`` of ``piece_rows`` rows each."""

    def __init__(self, field: str, shown: str, candidates: Sequence[str | Beneath]) -> None:
        self.field = field
        self.shown = shown
        self.candidates = list(candidates)
        suffix = posixpath.splitext(str(self.candidates[0]))[1].lower()
        self.layout = "parquet" if suffix in PARQUET else "arrow" if suffix in ARROW else "folder"
        self._pid = -1
        self._open()

    def __getstate__(self) -> dict[str, Any]:
        """Picklable without maps or readers: a spawned process opens the files again."""
        return {k: self.__dict__[k] for k in ("field", "shown", "candidates", "layout")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = -1

    def refuse(self, problem: str) -> InvalidSpecError:
        return InvalidSpecError(f"{self.field}: {quote(self.shown, PATH_CHARS)}: {problem}")

    def _open(self) -> None:
        self._pid = os.getpid()
        self._parquet: pq.ParquetFile | None = None
        self._batches: list[pa.RecordBatch] = []
        try:
            if self.layout == "parquet":
                with open_data_file(self.field, self.shown, self.candidates) as f:
                    self._buffer = _mapped(f)
                self._open_parquet()
            elif self.layout == "arrow":
                with open_data_file(self.field, self.shown, self.candidates) as f:
                    self._batches = self._arrow(_mapped(f))
                self.schema = self._batches[0].schema
            else:
                self._folder()
        except TrainingError:
            raise
        except (pa.ArrowException, OSError, ValueError) as exc:  # a file that lies
            log.warning("parquet dataset: cannot read %s: %r", self.candidates, exc)
            raise self.refuse(
                f"not a readable {self.layout} table ({type(exc).__name__})"
            ) from None
        self.columns = list(self.schema.names)
        self.piece_rows = (
            [self._parquet.metadata.row_group(i).num_rows for i in range(self.pieces)]
            if self._parquet is not None
            else [b.num_rows for b in self._batches]
        )
        if sum(self.piece_rows) > MAX_ROWS or min(self.piece_rows, default=0) < 0:
            raise self.refuse(f"declares {sum(self.piece_rows)} rows; at most {MAX_ROWS} are read")
        meta = self._parquet.metadata if self._parquet is not None else None
        self.piece_bytes = (  # a Parquet piece is decoded into memory; Arrow ones are mapped
            max(meta.row_group(i).total_byte_size for i in range(self.pieces)) if meta else 0
        )
        if not sum(self.piece_rows):
            raise self.refuse("the table has no rows")

    def _open_parquet(self) -> None:
        self._parquet = pq.ParquetFile(pa.BufferReader(self._buffer), pre_buffer=False)
        meta = self._parquet.metadata
        if meta.num_row_groups > MAX_PIECES:
            raise self.refuse(f"{meta.num_row_groups} row groups; at most {MAX_PIECES}")
        for i in range(meta.num_row_groups):
            size = meta.row_group(i).total_byte_size
            if not 0 <= size <= MAX_PIECE_BYTES:
                raise self.refuse(
                    f"row group {i} declares {format_bytes(size)}; at most "
                    f"{format_bytes(MAX_PIECE_BYTES)} a row group is decoded (write smaller ones)"
                )
        self.schema = self._parquet.schema_arrow

    def _arrow(self, buffer: pa.Buffer) -> list[pa.RecordBatch]:
        """The record batches of an IPC file or stream, zero-copy and validated in full."""
        if buffer.size >= 6 and buffer.slice(0, 6).to_pybytes() == b"ARROW1":
            reader = pa.ipc.open_file(buffer)
            count = reader.num_record_batches
            if count > MAX_PIECES:
                raise self.refuse(f"{count} record batches; at most {MAX_PIECES}")
            batches = [reader.get_batch(i) for i in range(count)]
        else:
            batches = []
            for batch in pa.ipc.open_stream(pa.BufferReader(buffer)):
                batches.append(batch)
                if len(batches) > MAX_PIECES:
                    raise self.refuse(f"more than {MAX_PIECES} record batches")
        for batch in batches:
            batch.validate(full=True)  # offsets inside their buffers, before a value is read
        if not batches:
            raise self.refuse("the table has no record batches")
        if any(b.schema != batches[0].schema for b in batches):
            raise self.refuse("its record batches differ in schema")
        return batches

    def _folder(self) -> None:
        """A ``datasets`` ``save_to_disk`` folder: ``state.json``, then its data files."""
        found = [c for c in self.candidates if isinstance(c, Beneath)]
        if len(found) < len(self.candidates):
            raise self.refuse("only local folders are read (their files are memory-mapped)")
        state, root = self._state(found)
        files = state.get("_data_files") if isinstance(state, dict) else None
        if not isinstance(files, list) or not files or len(files) > MAX_FILES:
            raise self.refuse("state.json lists no _data_files (not a save_to_disk folder)")
        for entry in files:
            name = entry.get("filename") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
                raise self.refuse("state.json names a data file that is not a plain file name")
            shown = f"{self.shown.rstrip('/')}/{name}"
            where = Beneath(root.root, posixpath.join(root.relative, name))
            with open_data_file(self.field, shown, [where]) as f:
                self._batches += self._arrow(_mapped(f))
            if len(self._batches) > MAX_PIECES:
                raise self.refuse(f"more than {MAX_PIECES} record batches")
        if any(b.schema != self._batches[0].schema for b in self._batches):
            raise self.refuse("its data files differ in schema")
        self.schema = self._batches[0].schema

    def _state(self, found: list[Beneath]) -> tuple[Any, Beneath]:
        shown = f"{self.shown.rstrip('/')}/state.json"
        for i, c in enumerate(found):
            where = Beneath(c.root, posixpath.join(c.relative, "state.json"))
            try:
                with open_data_file(self.field, shown, [where]) as f:
                    text = f.file.read(MAX_STATE_BYTES + 1)
            except InvalidSpecError as exc:
                if "no such file" in exc.message and i + 1 < len(found):
                    continue  # a relative folder: the next data root may hold it
                raise
            if len(text) > MAX_STATE_BYTES:
                raise self.refuse(f"state.json is over {format_bytes(MAX_STATE_BYTES)}")
            return json.loads(text), c
        raise AssertionError("unreachable: the last candidate raises")

    @property
    def pieces(self) -> int:
        return self._parquet.metadata.num_row_groups if self._parquet else len(self._batches)

    def read(self, piece: int, columns: Sequence[str]) -> pa.Table:
        """Piece ``piece`` (a row group or record batch), only ``columns`` of it."""
        if self._pid != os.getpid():
            if "schema" not in self.__dict__:  # unpickled: open the files again
                self._open()
            elif self._parquet is not None:  # forked: the map is shared, the reader is not
                self._parquet = pq.ParquetFile(pa.BufferReader(self._buffer), pre_buffer=False)
            self._pid = os.getpid()
        try:
            if self._parquet is not None:
                table = self._parquet.read_row_group(
                    piece, columns=list(columns), use_threads=False
                )
                table.validate(full=True)
                return table
            return pa.Table.from_batches([self._batches[piece]]).select(list(columns))
        except pa.ArrowException as exc:
            log.warning("parquet dataset: cannot read %s piece %d: %r", self.candidates, piece, exc)
            raise self.refuse(f"row group {piece} does not decode ({type(exc).__name__})") from None


def open_table(field: str, path: str, data_roots: Sequence[str]) -> Table:
    """The table at ``path`` (checked against the data roots)."""
    return Table(field, path, check_under_roots(path, data_roots, field))
