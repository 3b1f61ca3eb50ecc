"""The worker's cache of ``precision: auto`` decisions, in a file (torch-free).

Every attempt trains in a fresh process (and Celery's pool processes serve one task each),
so an in-process cache would forget each measurement with its job. A small JSON file in
the worker's data directory outlives them: the next job of the same model, shapes and
device on this machine takes the decision without measuring, so the machine decides a
model alike for every job. It is a cache: an unreadable file is an empty one, and two
processes writing at once lose at most one entry (each write replaces the file whole).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

MAX_ENTRIES = 256
"""Oldest entries go beyond this: a worker sees few distinct models."""


class FileCache(MutableMapping[str, dict[str, Any]]):
    """A JSON object on disk, read on every access (each is rare: once per attempt)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict[str, dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, self.path)  # readers see the old file or the new one, whole

    def __getitem__(self, key: str) -> dict[str, Any]:
        value = self._read()[key]
        if not isinstance(value, dict):
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, value: dict[str, Any]) -> None:
        data = self._read()
        data.pop(key, None)
        data[key] = value
        while len(data) > MAX_ENTRIES:
            data.pop(next(iter(data)))
        self._write(data)

    def __delitem__(self, key: str) -> None:
        data = self._read()
        del data[key]
        self._write(data)

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())
