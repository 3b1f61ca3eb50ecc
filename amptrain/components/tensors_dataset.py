"""The ``tensors`` dataset: a team's own arrays from a .npz, .csv or .pt file.

The file must lie under one of the data roots the caller (the worker's
configuration, or ``amptrain train --data-root``) allows: a job spec is user input
and must not read arbitrary files of the machine that runs it, nor make it connect
anywhere. :mod:`amptrain.contract.data_access` checks the path as text first;
only a location inside a root is ever opened, and only a regular file, read within the
memory the training process has (:mod:`amptrain.components.array_files`: headers before
inflating, memory maps where the file allows). ``.pt`` files are loaded with
``weights_only=True`` so they cannot run code.

Errors reach the user who submitted the job, so they name the problem and the path
as the user wrote it: never the file's content (a CSV parser's message quotes the
bad cell), the roots' absolute paths or the worker's directories. The worker's log
gets the details.
"""

from __future__ import annotations

import io
import logging
import pickle
import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from amptrain.components.array_files import (
    CSV_EXPANSION,
    PATH_CHARS,
    DataFile,
    open_data_file,
    read_all,
    read_npz,
    read_pt,
)
from amptrain.components.base import DataInfo
from amptrain.components.synthetic import PoolDataset
from amptrain.contract.data_access import PathRefused, check_location
from amptrain.contract.errors import InvalidSpecError, TrainingError
from amptrain.contract.text import quote

log = logging.getLogger(__name__)

_FIELD = "dataset.args.path"
_SUFFIXES = (".npz", ".csv", ".pt")


def check_under_roots(location: str, data_roots: Sequence[str]) -> list[str]:
    """Where ``location`` may be opened, in order, after checking it against ``data_roots``
    (several candidates only for a relative path, one under each local root)."""
    try:
        return check_location(location, data_roots)
    except PathRefused as exc:
        raise InvalidSpecError(f"{_FIELD}: {quote(location, PATH_CHARS)}: {exc}") from None


def _pick(arrays: dict[str, Any], key: str, arg: str) -> Any:
    if key not in arrays:
        names = ", ".join(str(k)[:30] for k in sorted(arrays)[:20])
        raise InvalidSpecError(f"dataset.args.{arg}: {quote(key)} not in the file; found: {names}")
    return arrays[key]


def _what_is_wrong(suffix: str, exc: Exception) -> str:
    """A content-free description of why a file did not parse."""
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if suffix == ".csv":
        return "every cell must be a number (an optional first header row aside), in rows of equal length"
    if suffix == ".npz":
        return "not a NumPy .npz archive of plain arrays"
    return f"not a readable PyTorch file ({type(exc).__name__})"


def _load_arrays(
    f: DataFile, suffix: str, args: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(inputs, targets) as stored, once the copies the dataset makes of them fit too;
    targets None when the file holds only token ids."""
    inputs, targets = _read_arrays(f, suffix, args)
    if targets is None:  # token ids as int64, then inputs and targets shifted by one
        f.require(3 * inputs.numel() * 8, "its token ids as int64 inputs and targets")
    else:
        stored = inputs.dtype == torch.float32 and inputs.is_contiguous()
        copy = 0 if stored else inputs.numel() * 4
        f.require(copy + targets.numel() * 8, "its float32 inputs and int64 labels")
    return inputs, targets


def _read_arrays(
    f: DataFile, suffix: str, args: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    lm = args["task"] == "language_model"
    if suffix == ".csv":
        text = read_all(f, CSV_EXPANSION).decode()
        first = text.split("\n", 1)[0]
        try:
            [float(v) for v in first.split(",")]
            header = 0
        except ValueError:
            header = 1
        table = torch.from_numpy(
            np.loadtxt(io.StringIO(text), delimiter=",", ndmin=2, skiprows=header)
        )
        if lm:
            return table, None
        col = args["label_column"] % table.shape[1]
        keep = [c for c in range(table.shape[1]) if c != col]
        return table[:, keep], table[:, col]
    if suffix == ".npz":
        keys = {"inputs_key": args["inputs_key"]}
        if not lm:
            keys["targets_key"] = args["targets_key"]
        found = read_npz(f, keys)
        arrays: dict[str, Any] = {args[arg]: torch.from_numpy(a) for arg, a in found.items()}
    else:
        try:
            loaded = read_pt(f)
        except pickle.UnpicklingError as exc:
            if "global" not in str(exc).lower():  # "unsupported GLOBAL posix.getcwd"
                raise  # not a refused object: a broken file, described by the caller
            raise InvalidSpecError(
                f"{_FIELD}: the .pt file holds objects other than tensors and plain containers; "
                "it is loaded with weights_only=True, which refuses anything that could run code"
            ) from exc
        if isinstance(loaded, torch.Tensor):
            arrays = {args["inputs_key"]: loaded}
        elif isinstance(loaded, (tuple, list)) and len(loaded) == 2:
            arrays = {args["inputs_key"]: loaded[0], args["targets_key"]: loaded[1]}
        elif isinstance(loaded, dict):
            arrays = loaded
        else:
            raise InvalidSpecError(
                f"{_FIELD}: a .pt file must hold a tensor, an (inputs, targets) pair or a dict"
            )
    inputs = torch.as_tensor(_pick(arrays, args["inputs_key"], "inputs_key"))
    if lm:
        return inputs, None
    return inputs, torch.as_tensor(_pick(arrays, args["targets_key"], "targets_key"))


def _as_ids(values: torch.Tensor, what: str) -> torch.Tensor:
    if values.is_floating_point() and not torch.equal(values, values.round()):
        raise InvalidSpecError(f"{_FIELD}: {what} must be whole numbers")
    ids = values.long()
    if ids.numel() and int(ids.min()) < 0:
        raise InvalidSpecError(f"{_FIELD}: {what} must be >= 0")
    return ids


def _count(ids: torch.Tensor, given: int, what: str) -> int:
    largest = int(ids.max()) + 1 if ids.numel() else 1
    if given and largest > given:
        raise InvalidSpecError(
            f"dataset.args.num_classes: {given} but the file has {what} up to {largest - 1}"
        )
    return given or largest


def build_tensors(
    *,
    seed: int,
    data_roots: Sequence[str] = (),
    path: str,
    task: str = "classification",
    inputs_key: str = "x",
    targets_key: str = "y",
    label_column: int = -1,
    num_classes: int = 0,
) -> PoolDataset:
    """Load the file into memory and serve it in a seeded order, reshuffled every epoch."""
    candidates = check_under_roots(path, data_roots)
    suffix = Path(posixpath.basename(candidates[0])).suffix.lower()
    if suffix not in _SUFFIXES:
        raise InvalidSpecError(
            f"{_FIELD}: unsupported file type {quote(suffix or '(none)')}; use .npz, .csv or .pt"
        )
    args = {
        "task": task,
        "inputs_key": inputs_key,
        "targets_key": targets_key,
        "label_column": label_column,
    }
    try:
        with open_data_file(_FIELD, path, candidates) as f:
            inputs, targets = _load_arrays(f, suffix, args)
    except TrainingError:  # invalid_spec, too_large: already say what is wrong
        raise
    except Exception as exc:  # malformed files: the parser's message may quote the content
        log.warning("tensors dataset: cannot load %s as %s: %r", candidates, suffix, exc)
        raise InvalidSpecError(
            f"{_FIELD}: cannot load {quote(path, PATH_CHARS)} as {suffix}: {_what_is_wrong(suffix, exc)}"
        ) from None
    if len(inputs) == 0:
        raise InvalidSpecError(f"{_FIELD}: the file holds no samples")
    if task == "language_model":
        if inputs.dim() != 2 or inputs.shape[1] < 2:
            raise InvalidSpecError(
                f"{_FIELD}: token ids must have shape (samples, seq_len + 1); got {tuple(inputs.shape)}"
            )
        tokens = _as_ids(inputs, "token ids")
        info = DataInfo(
            "language_model", (tokens.shape[1] - 1,), _count(tokens, num_classes, "token ids")
        )
        return PoolDataset(info, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), seed)
    assert targets is not None
    if targets.dim() != 1 or len(targets) != len(inputs):
        raise InvalidSpecError(
            f"{_FIELD}: labels must be one per sample; got shape {tuple(targets.shape)} for {len(inputs)} inputs"
        )
    labels = _as_ids(targets, "labels")
    info = DataInfo(
        "classification", tuple(inputs.shape[1:]), _count(labels, num_classes, "labels")
    )
    return PoolDataset(info, inputs.float().contiguous(), labels, seed)
