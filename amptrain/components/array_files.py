"""Dataset files opened and read within bounds (the ``tensors`` dataset's files).

A file dataset is user input on a shared worker, so before anything is read:

- a local file is opened beneath its data root without following any symlink
  (:func:`~amptrain.components.beneath.open_beneath`): a symlink in the user's part of the
  path, or a directory swapped for one while it is opened, is ``invalid_spec``.
- the location must be a **regular file**: a FIFO would block ``open()`` until its
  attempt's ``max_runtime_s``, a character device would be read without end. Anything
  else is ``invalid_spec``; the file is opened with ``O_NONBLOCK`` and ``O_NOFOLLOW`` and
  checked again, so nothing can be swapped in between.
- what it will take in memory must fit what this process can still get
  (:func:`~amptrain.components.memory_budget.require_memory`, ``too_large`` otherwise):
  for a ``.npz`` the arrays its members' ``.npy`` headers declare (read before anything is
  inflated; a 0.6 MiB member that inflated to 512 MiB was read whole before), else the
  file's size (times what parsing CSV text takes); for a ``.pt`` archive its pickle (times
  what unpickling can take), and twice the file where it cannot be mapped (read whole, then
  its tensors copied). Legacy (non-zip) ``.pt`` files are refused: one stream of pickle and
  data, their cost is known only once they are loaded.
- arrays are **memory-mapped** where the file allows (uncompressed ``.npz`` members, as
  ``np.savez`` writes them, and ``.pt`` files, as ``torch.save`` writes them): their pages
  come from the file on demand and are not counted; a compressed member is inflated
  straight into an array of its declared size, never more.

Messages name the path as the user wrote it (``shown``), never the worker's directories.
"""

from __future__ import annotations

import errno
import io
import logging
import math
import os
import stat
import struct
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any, Literal

import fsspec
import numpy as np
import torch

from amptrain.components.beneath import open_beneath
from amptrain.components.memory_budget import require_memory
from amptrain.contract.data_access import Beneath
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.sizing import format_bytes
from amptrain.contract.text import quote

log = logging.getLogger(__name__)

PATH_CHARS = 120  # paths are quoted longer than other values: the file name is at the end
CSV_EXPANSION = 5
"""Memory per byte of CSV text while it is parsed: the text itself, and up to 4 more for
float64 values (a value takes at least two characters, ``0,``, and eight bytes parsed)."""
_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... name length, extra field length
_READ_CHUNK = 4 * 2**20
# What open_beneath raises for a symlink, a component that stopped being a directory,
# a file replaced while opened, or a '..': a path that changed or leads out of the root.
_NOT_BENEATH = {errno.ELOOP, errno.ENOTDIR, errno.ESTALE, errno.EINVAL, errno.EXDEV}


@dataclass
class DataFile:
    """An opened dataset file: ``field`` and ``shown`` are what messages name."""

    field: str
    shown: str
    file: IO[bytes]
    size: int | None
    fd_path: str | None
    """A local file's ``/proc/self/fd`` path (the very file opened), for memory maps."""

    def __enter__(self) -> DataFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.file.close()

    def refuse(self, problem: str) -> InvalidSpecError:
        return InvalidSpecError(f"{self.field}: {quote(self.shown, PATH_CHARS)}: {problem}")

    def require(self, needed: int, what: str) -> None:
        require_memory(needed, f"{quote(self.shown, PATH_CHARS)} ({what})")


def open_data_file(
    field: str, shown: str, candidates: Sequence[str | Beneath], roots: str = "data roots"
) -> DataFile:
    """The first of ``candidates`` (checked locations: URLs, or local files to open beneath
    their root) that exists; ``roots``: what messages call the roots."""
    for location in candidates:
        try:
            if isinstance(location, Beneath):
                return _open_local(field, shown, location)
            return _open_url(field, shown, location)
        except FileNotFoundError:
            continue
        except OSError as exc:
            log.warning("dataset file: cannot open %s: %r", location, exc)
            if exc.errno in _NOT_BENEATH:
                raise InvalidSpecError(
                    f"{field}: {quote(shown, PATH_CHARS)} could not be opened beneath the "
                    f"{roots}: a symlink or a changing path"
                ) from None
            raise InvalidSpecError(
                f"{field}: cannot read {quote(shown, PATH_CHARS)} ({type(exc).__name__})"
            ) from None
    raise InvalidSpecError(f"{field}: no such file under the {roots}: {quote(shown, PATH_CHARS)}")


def _open_local(field: str, shown: str, location: Beneath) -> DataFile:
    fd, st = open_beneath(location.root, location.relative)
    try:
        _regular(field, shown, st)  # not opened at all unless regular (fd -1)
        fd_path = f"/proc/self/fd/{fd}"
        return DataFile(
            field,
            shown,
            os.fdopen(fd, "rb"),
            st.st_size,
            # No path to fall back on: the string could name another file by now.
            fd_path if os.path.exists(fd_path) else None,
        )
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


def _regular(field: str, shown: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a file")
        raise InvalidSpecError(
            f"{field}: {quote(shown, PATH_CHARS)} is {kind}, not a regular file; only "
            "regular files are read"
        )


def _open_url(field: str, shown: str, location: str) -> DataFile:
    fs, path = fsspec.core.url_to_fs(location)
    info = fs.info(path)  # FileNotFoundError when there is none
    if info.get("type") != "file":
        raise InvalidSpecError(
            f"{field}: {quote(shown, PATH_CHARS)} is a {info.get('type') or 'thing'}, not a "
            "file; only files are read"
        )
    size = info.get("size")
    return DataFile(
        field, shown, fs.open(path, "rb"), int(size) if size is not None else None, None
    )


# -- whole files -----------------------------------------------------------------------


def read_all(f: DataFile, expansion: int = 1) -> bytes:
    """The whole file, once ``expansion`` x its size fits the memory available (a file of
    unknown size is read up to that and refused beyond)."""
    if f.size is not None:
        f.require(f.size * expansion, f"a {format_bytes(f.size)} file")
        return f.file.read(f.size + 1)
    data = bytearray()
    while chunk := f.file.read(_READ_CHUNK):
        data += chunk
        f.require(len(data) * expansion, f"more than {format_bytes(len(data))} of file")
    return bytes(data)


# -- .npz --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Member:
    info: zipfile.ZipInfo
    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype[Any]
    data_at: int
    """Offset of the array's first byte inside the member."""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def read_npz(f: DataFile, keys: Mapping[str, str]) -> dict[str, np.ndarray[Any, Any]]:
    """The arrays named by ``keys`` (``{argument: array name}``, e.g. ``{"inputs_key": "x"}``)
    of a ``.npz`` archive; members that are not asked for are never read."""
    with zipfile.ZipFile(f.file) as archive:
        names = {n.removesuffix(".npy"): n for n in archive.namelist() if n.endswith(".npy")}
        members: dict[str, _Member] = {}
        for arg, key in keys.items():
            if key not in names:
                found = ", ".join(k[:30] for k in sorted(names)[:20])
                raise InvalidSpecError(
                    f"dataset.args.{arg}: {quote(key)} not in the file; found: {found}"
                )
            members[arg] = _header(f, archive, archive.getinfo(names[key]))
        mapped = {arg: m for arg, m in members.items() if _mappable(f, m)}
        inflated = sum(m.nbytes for arg, m in members.items() if arg not in mapped)
        described = ", ".join(
            f"{quote(keys[arg])}: {m.shape} {m.dtype}" for arg, m in members.items()
        )
        f.require(inflated, f"arrays {described}")
        return {
            arg: _mapped(f, archive, m) if arg in mapped else _inflated(f, archive, m)
            for arg, m in members.items()
        }


def _header(f: DataFile, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> _Member:
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(member)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(member)
        else:
            raise f.refuse(f"unsupported .npy format version {version} in {quote(info.filename)}")
        data_at = member.tell()
    if dtype.hasobject:
        raise f.refuse(f"{quote(info.filename)} holds Python objects; only plain arrays are read")
    m = _Member(info, tuple(int(d) for d in shape), bool(fortran), dtype, data_at)
    if info.file_size < data_at + m.nbytes:  # the central directory's own size of the member
        raise f.refuse(f"{quote(info.filename)} holds fewer bytes than its header declares")
    return m


def _mappable(f: DataFile, m: _Member) -> bool:
    return f.fd_path is not None and m.info.compress_type == zipfile.ZIP_STORED and m.nbytes > 0


def _mapped(f: DataFile, archive: zipfile.ZipFile, m: _Member) -> np.ndarray[Any, Any]:
    """The member's array mapped copy-on-write from the file: no read, no inflation."""
    assert f.fd_path is not None
    f.file.seek(m.info.header_offset)
    _, name_len, extra_len = _LOCAL_HEADER.unpack(f.file.read(_LOCAL_HEADER.size))
    start = m.info.header_offset + _LOCAL_HEADER.size + name_len + extra_len + m.data_at
    order: Literal["C", "F"] = "F" if m.fortran else "C"
    return np.memmap(f.fd_path, dtype=m.dtype, mode="c", offset=start, shape=m.shape, order=order)


def _inflated(f: DataFile, archive: zipfile.ZipFile, m: _Member) -> np.ndarray[Any, Any]:
    """The member's array inflated into exactly its declared size (more is never read)."""
    flat = np.empty(math.prod(m.shape), dtype=m.dtype)
    raw = flat.view(np.uint8)
    with archive.open(m.info) as member:
        member.seek(m.data_at)
        got = 0
        while got < len(raw):
            chunk = member.read(min(_READ_CHUNK, len(raw) - got))
            if not chunk:
                raise f.refuse(f"{quote(m.info.filename)} ends before its declared size")
            raw[got : got + len(chunk)] = np.frombuffer(chunk, np.uint8)
            got += len(chunk)
    return flat.reshape(m.shape, order="F" if m.fortran else "C")


# -- .pt ---------------------------------------------------------------------------------


PICKLE_EXPANSION = 100
"""Memory per byte of a ``.pt`` file's pickle while it is unpickled: a one-byte opcode makes
a 56-byte list or a 64-byte dict, kept by a reference and a memo entry. A file of tensors
has a pickle of a few hundred bytes; the tensors' data are separate members."""


def read_pt(f: DataFile) -> Any:
    """A ``torch.save`` file loaded with ``weights_only=True`` (no code can run); a local
    archive memory-mapped, so its tensors take no memory until used. Archives whose members
    are compressed are refused (``torch.save`` never compresses; inflating them is unbounded),
    and so are legacy (non-zip) files: their pickle and data are one stream, read whole and
    then copied, so what unpickling them takes cannot be told before."""
    if not zipfile.is_zipfile(f.file):
        raise f.refuse(
            "not a readable PyTorch file: only the zip archives torch.save writes (PyTorch 1.6 "
            "and later) are read; load and save a legacy file again to convert it"
        )
    f.file.seek(0)
    with zipfile.ZipFile(f.file) as archive:
        members = archive.infolist()
    if any(i.compress_type != zipfile.ZIP_STORED for i in members):
        raise f.refuse("a .pt archive with compressed members (torch.save writes none)")
    pickled = sum(i.file_size for i in members if i.filename.endswith("data.pkl"))
    # Mapped, the tensors' pages come from the file; otherwise the file is read whole and
    # each tensor copied out of it: twice the file.
    whole = 0 if f.fd_path is not None else 2 * (f.size or 0)
    copied = "" if f.fd_path is not None else ", the file read whole and its tensors copied"
    f.require(pickled * PICKLE_EXPANSION + whole, f"a {format_bytes(pickled)} pickle{copied}")
    f.file.seek(0)
    if f.fd_path is not None:
        return torch.load(f.fd_path, weights_only=True, map_location="cpu", mmap=True)
    return torch.load(io.BytesIO(read_all(f, 2)), weights_only=True, map_location="cpu")
