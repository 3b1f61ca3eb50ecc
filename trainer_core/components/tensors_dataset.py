"""The ``tensors`` dataset: a team's own arrays from a .npz, .csv or .pt file.

The file may be a local path or an fsspec URL, and must lie under one of the
data roots the caller (the worker's configuration, or ``amptrain train
--data-root``) allows: a job spec is user input and must not read arbitrary
files of the machine that runs it. Local paths are resolved (``..`` and
symlinks) before the check. ``.pt`` files are loaded with ``weights_only=True``
so they cannot run code.
"""

from __future__ import annotations

import io
import pickle
import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import torch

from trainer_core.components.base import DataInfo
from trainer_core.components.synthetic import PoolDataset
from trainer_core.contract.errors import InvalidSpecError

_FIELD = "dataset.args.path"
_SUFFIXES = (".npz", ".csv", ".pt")


def _locate(location: str) -> tuple[str, str]:
    """(protocol, normalised absolute path); local files get protocol ``file``."""
    if "::" in location:
        raise InvalidSpecError(f"{_FIELD}: chained fsspec URLs are not supported: {location!r}")
    if "://" in location:
        fs, path = fsspec.core.url_to_fs(location)
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        if protocol not in ("file", "local"):
            return protocol, posixpath.normpath("/" + path.lstrip("/"))
        location = path
    return "file", str(Path(location).expanduser().resolve())


def _inside(target: tuple[str, str], root: tuple[str, str]) -> bool:
    if target[0] != root[0]:
        return False
    if target[0] == "file":
        return Path(target[1]).is_relative_to(root[1])
    base = root[1].rstrip("/")
    return target[1] == base or target[1].startswith(base + "/")


def check_under_roots(location: str, data_roots: Sequence[str]) -> str:
    """The location to open, after checking that it lies under one of ``data_roots``."""
    if not data_roots:
        raise InvalidSpecError(
            f"{_FIELD}: file datasets are disabled here (no data roots are configured)"
        )
    target = _locate(location)
    if not any(_inside(target, _locate(root)) for root in data_roots):
        raise InvalidSpecError(
            f"{_FIELD}: {location!r} is outside the allowed data roots ({', '.join(data_roots)})"
        )
    return target[1] if target[0] == "file" else location


def _read_bytes(location: str) -> bytes:
    try:
        with fsspec.open(location, "rb") as f:
            return f.read()
    except FileNotFoundError as exc:
        raise InvalidSpecError(f"{_FIELD}: no such file: {location!r}") from exc
    except OSError as exc:
        raise InvalidSpecError(f"{_FIELD}: cannot read {location!r}: {exc}") from exc


def _pick(arrays: dict[str, Any], key: str, arg: str) -> Any:
    if key not in arrays:
        raise InvalidSpecError(
            f"dataset.args.{arg}: {key!r} not in the file; found: {', '.join(sorted(arrays))}"
        )
    return arrays[key]


def _load_arrays(
    data: bytes, suffix: str, args: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(inputs, targets) as stored; targets None when the file holds only token ids."""
    lm = args["task"] == "language_model"
    if suffix == ".csv":
        text = data.decode()
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
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays: dict[str, Any] = {k: torch.from_numpy(z[k]) for k in z.files}
    else:
        try:
            loaded = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as exc:
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
    location = check_under_roots(path, data_roots)
    suffix = Path(posixpath.basename(location)).suffix.lower()
    if suffix not in _SUFFIXES:
        raise InvalidSpecError(
            f"{_FIELD}: unsupported file type {suffix or '(none)'!r}; use .npz, .csv or .pt"
        )
    args = {
        "task": task,
        "inputs_key": inputs_key,
        "targets_key": targets_key,
        "label_column": label_column,
    }
    try:
        inputs, targets = _load_arrays(_read_bytes(location), suffix, args)
    except InvalidSpecError:
        raise
    except Exception as exc:  # malformed files, pickled objects refused by weights_only, ...
        raise InvalidSpecError(f"{_FIELD}: cannot load {path!r} as {suffix}: {exc}") from exc
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
