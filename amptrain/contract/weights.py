"""Weights an operator provides: where a spec's ``weights.path`` may read, and what a
checkpoint export may be called (torch-free: the API checks both at request time).

A weights file is a safetensors file under one of the weights roots
(``AMPTRAIN_WEIGHTS_ROOTS``), by the same rules as a local data path
(:mod:`amptrain.contract.data_access`): relative to the roots or absolute inside one,
no ``..`` out of it, per-user roots alike. Roots are local directories only: the worker
opens the file beneath a root's descriptor without following any symlink.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from amptrain.contract.data_access import Beneath, PathRefused, check_location, locate

SUFFIX = ".safetensors"
FIELD = "weights.path"
MAX_WEIGHTS_BYTES = 64 * 2**30
"""The largest weights file a worker reads (it reads the whole file into memory once)."""
MAX_HEADER_BYTES = 100 * 2**20
"""The largest safetensors header (its JSON), as the safetensors library itself allows."""
_EXPORT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_weights_path(text: str, roots: Sequence[str]) -> None:
    """Raise :class:`PathRefused` when ``text`` may not name a weights file under ``roots``
    (checked as text, as the API does; the worker checks again as it opens the file)."""
    _suffix(text)
    try:
        check_location(text, roots, ("file",), resolve=False)
    except PathRefused as exc:
        raise _renamed(exc) from None


def locate_weights(text: str, roots: Sequence[str]) -> list[Beneath]:
    """Where the worker may open ``text``, in order (several for a relative path: one under
    each root); :class:`PathRefused` as for :func:`check_weights_path`."""
    _suffix(text)
    try:
        found = locate(text, roots, ("file",))
    except PathRefused as exc:
        raise _renamed(exc) from None
    return [b for b in found if isinstance(b, Beneath)]


def export_file_name(name: str) -> str:
    """The file name a checkpoint export called ``name`` gets (``.safetensors`` added when
    missing); ValueError for a name that could be a path (letters, digits, ``. _ -``, first
    a letter or digit, at most 100 characters)."""
    if not _EXPORT_NAME.match(name):
        raise ValueError(
            "letters, digits and . _ - only, starting with a letter or digit, at most 100 "
            "characters"
        )
    return name if name.endswith(SUFFIX) else name + SUFFIX


def _suffix(text: str) -> None:
    if not text.endswith(SUFFIX):
        raise PathRefused(f"must name a {SUFFIX} file (no other format is read)")


def _renamed(exc: PathRefused) -> PathRefused:
    # data_access speaks of datasets; the same rules here are about weights roots.
    text = str(exc).replace("data roots", "weights roots").replace("file datasets", "weights")
    return PathRefused(text)
