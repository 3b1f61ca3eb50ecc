"""Real text for the token datasets' tests: the Python standard library's own source.

A deterministic subset (top-level modules by sorted name, from a fixed one on), split by
file: the training files and the held-out files never share a file."""

from __future__ import annotations

import sysconfig
from pathlib import Path


def stdlib_sources(
    train_bytes: int = 240_000, held_bytes: int = 60_000
) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts): whole files, about the sizes asked for."""
    root = Path(sysconfig.get_paths()["stdlib"])
    names = sorted(p for p in root.glob("*.py") if p.name >= "a")  # skip __future__ and co.
    train: list[str] = []
    held: list[str] = []
    for path in names:
        text = path.read_text(encoding="utf-8", errors="replace")
        if not 2_000 <= len(text) <= 60_000:
            continue
        if sum(map(len, train)) < train_bytes:
            train.append(text)
        elif sum(map(len, held)) < held_bytes:
            held.append(text)
        else:
            break
    return train, held
