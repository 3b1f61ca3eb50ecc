"""Tar shards (the WebDataset format) listed by a brace pattern and indexed from their
headers alone, for :mod:`amptrain.components.webdataset`.

- **Patterns** are expanded by the ``braceexpand`` package, but only after counting what
  they name: ``braceexpand`` builds each brace group's names in full before the first one
  comes out (``itertools.product`` of lists), so ``{0..999999999}`` would take minutes and
  gigabytes. :func:`count_names` follows its grammar and multiplies the sizes instead.
- **Indexing** runs the standard library's ``tarfile`` over :class:`HeaderReader`, which
  reads with ``os.pread`` (no buffering, no shared offset): ``tarfile`` reads one 512-byte
  header per member (and one byte before it, to notice a file that ends early) and seeks
  over the data. Measured (``tests/components/test_webdataset.py``): 513 bytes per member,
  plus each label's few bytes, which are read here so that the classes are known and a bad
  label fails the build, not a step hours into a run. A single read of more than
  ``_MAX_READ`` (a pax or GNU long-name header claiming megabytes) is refused.
- The index keeps per sample the image member's offset (int64) and size (uint32) and the
  label (int32): 16 bytes (``INDEX_BYTES_PER_SAMPLE``), in flat NumPy arrays.
- Only regular members are data; a symlink, hard link, device, FIFO or sparse member is
  bad data (it is never followed, and nothing is ever extracted to disk).
"""

from __future__ import annotations

import os
import posixpath
import re
import tarfile
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import braceexpand as _braceexpand
import numpy as np

from amptrain.components.array_files import PATH_CHARS, DataFile, open_data_file
from amptrain.components.memory_budget import require_memory
from amptrain.components.tensors_dataset import check_under_roots
from amptrain.contract.data_access import Beneath
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.limits import MAX_IMAGE_BYTES
from amptrain.contract.sizing import format_bytes
from amptrain.contract.tar_shards import (
    INDEX_BYTES_PER_SAMPLE,
    MAX_CLASSES,
    MAX_MEMBER_NAME,
    MAX_MEMBERS,
)
from amptrain.contract.text import quote

# Its grammar's own regexes and letter ranges (the package's type stubs declare only the
# expansion function).
braceexpand: Any = _braceexpand
_MAX_DEPTH = 8
_MAX_READ = 2**20
_MAX_LABEL_BYTES = 32
_FIELD_NAME = re.compile(r"[^.]+\..+", re.DOTALL)  # key.extension
_LABEL = re.compile(rb"\s*([0-9]{1,9})\s*")
_DATA_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)
_KINDS = {
    tarfile.SYMTYPE: "a symlink",
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.GNUTYPE_SPARSE: "a sparse file",
}

# -- patterns -----------------------------------------------------------------------------


def count_names(pattern: str) -> int:
    """How many names ``braceexpand(pattern)`` yields, without making them (its grammar:
    ``{a..b[..step]}`` integer and letter ranges, ``{x,y}`` lists, nesting, ``\\`` escapes)."""
    depth = deepest = 0
    pos = 0
    while pos < len(pattern):
        if pattern[pos] == "\\":
            pos += 1
        elif pattern[pos] == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif pattern[pos] == "}":
            depth -= 1
        pos += 1
    if deepest > _MAX_DEPTH:
        raise ValueError(f"braces nested more than {_MAX_DEPTH} deep")
    return _count_pattern(pattern)


def _count_pattern(pattern: str) -> int:
    total, start, pos, depth = 1, 0, 0, 0
    while pos < len(pattern):
        char = pattern[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            if depth == 0:
                start = pos
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                total *= _count_expression(pattern[start + 1 : pos])
        pos += 1
    if depth != 0:
        raise ValueError("unbalanced braces")
    return total


def _count_expression(expr: str) -> int:
    ints = braceexpand.int_range_re.match(expr)
    if ints:
        first, last, step = int(ints[1]), int(ints[2]), int(ints[3] or 1) or 1
        if first < last:
            return len(range(first, last + 1, step))
        return len(range(first, last - 1, -step))
    letters = braceexpand.char_range_re.match(expr)
    if letters:  # at most 52 letters: made for real
        return len(braceexpand.make_char_range(*letters.groups()))
    pieces, start, pos, depth = [], 0, 0, 0
    while pos < len(expr):
        char = expr[pos]
        if char == "\\":
            pos += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
        elif char == "," and depth == 0:
            pieces.append(expr[start:pos])
            start = pos + 1
        pos += 1
    if depth != 0 or not pieces:  # not a list: the braces stay as text around the pattern
        return _count_pattern(expr)
    return sum(_count_pattern(p) for p in (*pieces, expr[start:]))


def expand(pattern: str, bound: int, field: str) -> list[str]:
    """The names ``pattern`` gives, refused (naming ``field``) when there are more than
    ``bound``, counted before a single name is made, or when a name repeats."""
    try:
        count = count_names(pattern)
    except ValueError as exc:
        raise InvalidSpecError(f"{field}: {quote(pattern, PATH_CHARS)}: {exc}") from None
    if count > bound:
        raise InvalidSpecError(
            f"{field}: {quote(pattern, PATH_CHARS)} names {count:,} shards; at most {bound:,} "
            "(dataset.args.max_shards)"
        )
    names = list(islice(braceexpand.braceexpand(pattern), bound + 1))
    if len(names) > bound:  # the count above follows braceexpand; this is the backstop
        raise InvalidSpecError(f"{field}: {quote(pattern, PATH_CHARS)} names over {bound:,} shards")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidSpecError(f"{field}: {quote(name, PATH_CHARS)} is named twice")
        seen.add(name)
    return names


# -- indexing -----------------------------------------------------------------------------


class _TooLong(Exception):
    pass


class HeaderReader:
    """The file object ``tarfile`` reads: ``os.pread`` on the shard's descriptor, every read
    bounded by ``_MAX_READ`` and counted."""

    def __init__(self, fd: int, size: int) -> None:
        self.fd, self.size, self.pos, self.bytes_read = fd, size, 0, 0

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > _MAX_READ:
            raise _TooLong()
        data = os.pread(self.fd, n, self.pos)
        self.pos += len(data)
        self.bytes_read += len(data)
        return data

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos + (self.pos if whence == 1 else self.size if whence == 2 else 0)
        return self.pos

    def tell(self) -> int:
        return self.pos


@dataclass(frozen=True)
class Identity:
    """What a shard was when it was indexed; a shard opened again must still be it."""

    device: int
    inode: int
    size: int
    mtime_ns: int

    @staticmethod
    def of(f: DataFile) -> Identity:
        st = os.fstat(f.file.fileno())
        return Identity(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def confine(field: str, names: list[str], data_roots: Sequence[str]) -> None:
    """Refuse, naming ``field``, a name outside the data roots (before any file is opened)."""
    for name in names:
        check_under_roots(name, data_roots, field)


def open_shard(field: str, name: str, data_roots: Sequence[str]) -> DataFile:
    """The shard ``name`` opened beneath the data roots: a local regular file, no symlink."""
    candidates = check_under_roots(name, data_roots, field)
    if not all(isinstance(c, Beneath) for c in candidates):
        raise InvalidSpecError(
            f"{field}: {quote(name, PATH_CHARS)}: shards are read from local files only"
        )
    return open_data_file(field, name, candidates)


@dataclass
class ShardTable:
    """The samples of a list of shards: sample ``first[s] + j`` is shard ``s``'s ``j``-th."""

    field: str
    names: list[str]
    identities: list[Identity]
    first: np.ndarray  # int64, len(names) + 1
    offsets: np.ndarray  # int64: the image member's data offset in its shard
    sizes: np.ndarray  # uint32: its size in bytes
    labels: np.ndarray  # int32
    bytes_read: int = 0
    """Bytes read from the shards to build it (headers and labels)."""

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.first)

    @property
    def nbytes(self) -> int:
        arrays = (self.first, self.offsets, self.sizes, self.labels)
        return sum(a.nbytes for a in arrays) + sum(
            200 + len(n) for n in self.names
        )  # + name, identity


Bad = Callable[[str, str], None]
"""``bad(where, why)``: raises with on_corrupt 'fail'; records ``where`` with 'skip'."""


@dataclass
class IndexRules:
    """What a sample must be: its image extensions (first found wins), label extension and
    the classes (0: any label below ``MAX_CLASSES``)."""

    image_keys: list[str]
    label_key: str
    num_classes: int


def index_shards(
    field: str, names: list[str], data_roots: Sequence[str], rules: IndexRules, bad: Bad
) -> ShardTable:
    """Index every shard of ``names``: offsets, sizes and labels of their samples."""
    offsets, sizes, labels = array("q"), array("I"), array("i")
    first = [0]
    identities = []
    bytes_read = 0
    for name in names:
        with open_shard(field, name, data_roots) as f:
            identities.append(Identity.of(f))
            bytes_read += _index_one(f, name, rules, bad, (offsets, sizes, labels))
        first.append(len(offsets))
        require_memory(
            len(offsets) * INDEX_BYTES_PER_SAMPLE * 2,  # the arrays, and their copy below
            f"the index of {len(offsets):,} samples of {quote(names[0], PATH_CHARS)}...",
        )
    return ShardTable(
        field,
        list(names),
        identities,
        np.array(first, dtype=np.int64),
        np.frombuffer(offsets, dtype=np.int64).copy(),
        np.frombuffer(sizes, dtype=np.uint32).copy(),
        np.frombuffer(labels, dtype=np.int32).copy(),
        bytes_read,
    )


def _index_one(
    f: DataFile, name: str, rules: IndexRules, bad: Bad, out: tuple[array, array, array]
) -> int:
    reader = HeaderReader(f.file.fileno(), f.size or 0)
    sample: list[tarfile.TarInfo] = []
    members = 0

    def flush() -> None:
        if sample:
            _add_sample(reader, name, sample, rules, bad, out)
            sample.clear()

    try:
        with tarfile.open(fileobj=reader, mode="r:") as tar:  # type: ignore[call-overload]
            while (member := tar.next()) is not None:
                tar.members.clear()  # tarfile keeps every member it has read: memory stays flat
                members += 1
                if members > MAX_MEMBERS:
                    raise f.refuse(f"more than {MAX_MEMBERS:,} members")
                if not _is_field(name, member, bad):
                    continue
                if sample and _key(sample[0].name) != _key(member.name):
                    flush()
                sample.append(member)
            end = tar.offset
    except _TooLong:
        bad(name, "a tar header longer than 1 MiB (corrupt or truncated)")
        return reader.bytes_read
    except tarfile.TarError as exc:
        reason = "ends early (truncated)" if "end of data" in str(exc) else "not a readable tar"
        bad(name, f"{reason} after {members} members")
        return reader.bytes_read
    # tarfile takes a header it cannot read after the first for the end of the archive; a
    # real end is zero blocks (tarfile, GNU tar and WebDataset's writers all write them).
    rest = os.pread(reader.fd, 1024, end)
    if len(rest) < 1024 or rest.strip(b"\0"):
        bad(name, f"no tar header at byte {end:,}: truncated or corrupt after {members} members")
        return reader.bytes_read  # its last sample may be cut short: left out
    flush()
    return reader.bytes_read


def _is_field(name: str, member: tarfile.TarInfo, bad: Bad) -> bool:
    """Whether ``member`` is a field of a sample (``key.extension``); WebDataset skips
    directories and names without an extension too."""
    if len(member.name) > MAX_MEMBER_NAME:
        bad(f"{name}:{member.name[:60]}...", f"a member name over {MAX_MEMBER_NAME} characters")
        return False
    return not member.isdir() and bool(_FIELD_NAME.fullmatch(posixpath.basename(member.name)))


def _key(member: str) -> str:
    """The sample a member belongs to: its path up to the first dot of its basename."""
    head, base = posixpath.split(member)
    return posixpath.join(head, base.split(".", 1)[0])


def _add_sample(
    reader: HeaderReader,
    name: str,
    members: list[tarfile.TarInfo],
    rules: IndexRules,
    bad: Bad,
    out: tuple[array, array, array],
) -> None:
    fields: dict[str, tarfile.TarInfo] = {}
    for m in members:
        if m.type not in _DATA_TYPES:
            kind = _KINDS.get(m.type, "not a regular file")
            return bad(f"{name}:{m.name}", f"{kind} member; only regular members are read")
        fields.setdefault(posixpath.basename(m.name).split(".", 1)[1].lower(), m)
    where = f"{name}:{_key(members[0].name)}"
    image = next((fields[k] for k in rules.image_keys if k in fields), None)
    label = fields.get(rules.label_key)
    if image is None or label is None:
        missing = "image (" + "/".join(rules.image_keys) + ")" if image is None else "label"
        return bad(where, f"a sample without its {missing} member")
    if not 0 < image.size <= MAX_IMAGE_BYTES:
        return bad(
            f"{name}:{image.name}",
            f"an image member of {format_bytes(image.size)}; 1 byte to "
            f"{format_bytes(MAX_IMAGE_BYTES)} are read",
        )
    if max(image.offset_data + image.size, label.offset_data + label.size) > reader.size:
        return bad(f"{name}:{image.name}", "ends past the end of the shard (truncated)")
    raw = os.pread(reader.fd, min(label.size, _MAX_LABEL_BYTES + 1), label.offset_data)
    reader.bytes_read += len(raw)
    found = _LABEL.fullmatch(raw)
    value = int(found[1]) if found else -1
    limit = rules.num_classes or MAX_CLASSES
    if not 0 <= value < limit:
        what = "num_classes" if rules.num_classes else "the largest class allowed"
        why = f"a label >= {limit:,} ({what})" if found else "a label that is not an integer"
        return bad(f"{name}:{label.name}", why)
    offsets, sizes, labels = out
    offsets.append(image.offset_data)
    sizes.append(image.size)
    labels.append(value)
    return None


def shown(where: str) -> str:
    """``shard.tar:member`` as messages quote it."""
    return quote(where, PATH_CHARS)
