"""The ``tensors`` dataset: a team's own arrays from a .npz, .csv or .pt file.

The file must lie under one of the data roots the caller (the worker's
configuration, or ``amptrain train --data-root``) allows: a job spec is user input
and must not read arbitrary files of the machine that runs it, nor make it connect
anywhere. :mod:`amptrain.contract.data_access` checks the path as text first;
only a location inside a root is ever opened, and only a regular file, read within the
memory the training process has (:mod:`amptrain.components.array_files`: headers before
inflating, memory maps where the file allows). ``.pt`` files are loaded with
``weights_only=True`` so they cannot run code, and must hold tensors: never Python lists,
which unpickle as shared references and become a tensor only by building every number.

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
from amptrain.components.held_out import HeldOutPool
from amptrain.components.sampling import generator
from amptrain.components.synthetic import PoolDataset
from amptrain.contract.data_access import Beneath, PathRefused, locate
from amptrain.contract.errors import InvalidSpecError, TrainingError
from amptrain.contract.text import quote

log = logging.getLogger(__name__)

_FIELD = "dataset.args.path"
_VAL_FIELD = "dataset.args.val_path"
_SPLIT_KEY = 0x5E1D0  # keys the val_fraction draw: the split depends on the file alone
_SUFFIXES = (".npz", ".csv", ".pt")


def check_under_roots(
    location: str, data_roots: Sequence[str], field: str = _FIELD
) -> list[str | Beneath]:
    """Where ``location`` may be opened, in order, after checking it against ``data_roots``
    (several candidates only for a relative path, one under each local root); open them
    with :func:`~amptrain.components.array_files.open_data_file`, never as strings."""
    try:
        return locate(location, data_roots)
    except PathRefused as exc:
        raise InvalidSpecError(f"{field}: {quote(location, PATH_CHARS)}: {exc}") from None


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
        ids = args["task"] == "sequence_classification"
        dtype, width = (torch.int64, 8) if ids else (torch.float32, 4)
        copy = 0 if inputs.dtype == dtype and inputs.is_contiguous() else inputs.numel() * width
        what = "int64 token ids" if ids else "float32 inputs"
        f.require(copy + targets.numel() * 8, f"its {what} and int64 labels")
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
        inputs = _tensor(arrays, args, "inputs_key")
        return inputs, None if lm else _tensor(arrays, args, "targets_key")
    inputs = _pick(arrays, args["inputs_key"], "inputs_key")
    if lm:
        return inputs, None
    return inputs, _pick(arrays, args["targets_key"], "targets_key")


def _tensor(arrays: dict[str, Any], args: dict[str, Any], arg: str) -> torch.Tensor:
    """A tensor of a .pt file, never made from Python lists: a 1.5 KB pickle of lists that
    share themselves by reference (``[inner] * 8``, nine deep) stands for 134 million numbers,
    which ``torch.as_tensor`` would build before any memory check."""
    value = _pick(arrays, args[arg], arg)
    if not isinstance(value, torch.Tensor):
        raise InvalidSpecError(
            f"dataset.args.{arg}: {quote(args[arg])} in the .pt file is a "
            f"{type(value).__name__}, not a tensor; a .pt file must hold tensors (torch.save "
            "torch.tensor(values), not the values)"
        )
    return value


def _as_ids(values: torch.Tensor, what: str, field: str) -> torch.Tensor:
    if values.is_floating_point() and not torch.equal(values, values.round()):
        raise InvalidSpecError(f"{field}: {what} must be whole numbers")
    ids = values.long()
    if ids.numel() and int(ids.min()) < 0:
        raise InvalidSpecError(f"{field}: {what} must be >= 0")
    return ids


def _count(biggest: int, given: int, what: str) -> int:
    largest = biggest + 1
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
    val_path: str = "",
    val_fraction: float = 0.0,
) -> PoolDataset:
    """Load the file into memory and serve it in a seeded order, reshuffled every epoch.

    The held-out split is ``val_path`` (read like ``path``, checked against the same roots)
    or ``val_fraction`` of the file's rows, drawn by a fixed seed (so every job over the
    file evaluates on the same rows, whatever its own seed) and left out of training."""
    if val_path and val_fraction:
        raise InvalidSpecError("dataset.args.val_fraction: give val_path or val_fraction, not both")
    args = {
        "task": task,
        "inputs_key": inputs_key,
        "targets_key": targets_key,
        "label_column": label_column,
    }
    inputs, targets = _load(_FIELD, path, data_roots, args)
    held: tuple[torch.Tensor, torch.Tensor] | None = None
    if val_path:
        held = _load(_VAL_FIELD, val_path, data_roots, args)
        if held[0].shape[1:] != inputs.shape[1:]:
            raise InvalidSpecError(
                f"{_VAL_FIELD}: samples of shape {tuple(held[0].shape[1:])}, "
                f"but {tuple(inputs.shape[1:])} in path"
            )
    elif val_fraction:
        held_rows, train_rows = split_rows(len(inputs), val_fraction)
        held = (inputs[held_rows], targets[held_rows])
        inputs, targets = inputs[train_rows], targets[train_rows]
    # Both splits count towards the classes, so a label only the held-out rows have fits.
    largest = max(int(targets.max()), int(held[1].max()) if held else 0)
    if task == "language_model":
        size = _count(largest, num_classes, "token ids")
        info = DataInfo("language_model", (inputs.shape[1] - 1,), size)
        held_pool = HeldOutPool(info, *_shifted(held[0])) if held else None
        return PoolDataset(info, *_shifted(inputs), seed, held_pool)
    classes = _count(largest, num_classes, "labels")
    if task == "sequence_classification":  # token ids stay int64; the vocabulary is theirs
        vocab = 1 + max(int(inputs.max()), int(held[0].max()) if held else 0)
        info = DataInfo("classification", (inputs.shape[1],), classes, vocab_size=vocab)
        pool = HeldOutPool(info, *held) if held else None
        return PoolDataset(info, inputs, targets, seed, pool)
    info = DataInfo("classification", tuple(inputs.shape[1:]), classes)
    pool = HeldOutPool(info, held[0].float().contiguous(), held[1]) if held else None
    return PoolDataset(info, inputs.float().contiguous(), targets, seed, pool)


def split_rows(n: int, fraction: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out rows, training rows) of ``n``, both sorted: ``round(fraction * n)`` rows (at
    least one, and one left to train on) drawn by a seed fixed for the dataset."""
    held = min(n - 1, max(1, round(fraction * n)))
    if held < 1:
        raise InvalidSpecError(
            f"dataset.args.val_fraction: the file has {n} row; nothing to hold out"
        )
    perm = torch.randperm(n, generator=generator(_SPLIT_KEY, n))
    return perm[:held].sort().values, perm[held:].sort().values


def _shifted(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _load(
    field: str, path: str, data_roots: Sequence[str], args: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, labels) of one file, checked; for a language model (token ids, token ids)."""
    candidates = check_under_roots(path, data_roots, field)
    suffix = Path(posixpath.basename(str(candidates[0]))).suffix.lower()
    if suffix not in _SUFFIXES:
        raise InvalidSpecError(
            f"{field}: unsupported file type {quote(suffix or '(none)')}; use .npz, .csv or .pt"
        )
    try:
        with open_data_file(field, path, candidates) as f:
            inputs, targets = _load_arrays(f, suffix, args)
    except TrainingError:  # invalid_spec, too_large: already say what is wrong
        raise
    except Exception as exc:  # malformed files: the parser's message may quote the content
        log.warning("tensors dataset: cannot load %s as %s: %r", candidates, suffix, exc)
        raise InvalidSpecError(
            f"{field}: cannot load {quote(path, PATH_CHARS)} as {suffix}: {_what_is_wrong(suffix, exc)}"
        ) from None
    if len(inputs) == 0:
        raise InvalidSpecError(f"{field}: the file holds no samples")
    if args["task"] == "language_model":
        if inputs.dim() != 2 or inputs.shape[1] < 2:
            raise InvalidSpecError(
                f"{field}: token ids must have shape (samples, seq_len + 1); got {tuple(inputs.shape)}"
            )
        tokens = _as_ids(inputs, "token ids", field)
        return tokens, tokens
    assert targets is not None
    if targets.dim() != 1 or len(targets) != len(inputs):
        raise InvalidSpecError(
            f"{field}: labels must be one per sample; got shape {tuple(targets.shape)} for {len(inputs)} inputs"
        )
    if args["task"] == "sequence_classification":
        if inputs.dim() != 2 or inputs.shape[1] < 1:
            raise InvalidSpecError(
                f"{field}: token ids must have shape (samples, seq_len); got {tuple(inputs.shape)}"
            )
        inputs = _as_ids(inputs, "token ids", field)
    return inputs, _as_ids(targets, "labels", field)
