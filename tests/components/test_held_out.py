"""Held-out splits: deterministic, and never a sample the training stream serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from amptrain.components import registry
from amptrain.components.held_out import HELD_OUT_START, held_out_of
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.sizing import held_out_size
from amptrain.contract.spec import ComponentRef


def _build(name: str, seed: int = 0, roots: tuple[str, ...] = (), **args: Any) -> Any:
    return registry.build_dataset(
        ComponentRef(name=name, args=args), seed=seed, data_roots=list(roots)
    )


def _rows(x: torch.Tensor) -> set[bytes]:
    return {r.numpy().tobytes() for r in x.reshape(len(x), -1)}


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("synthetic-classification", {"num_samples": 256, "features": 8}),
        ("synthetic-text", {"num_samples": 256, "seq_len": 12, "vocab_size": 32}),
    ],
)
def test_synthetic_pools_hold_out_rows_after_the_training_rows(
    name: str, args: dict[str, Any]
) -> None:
    ds = _build(name, **args)
    held = held_out_of(ds)
    assert len(held) == held_out_size(256) == 32
    hx, hy = held.batch(0, len(held))
    tx, _ = ds.batch(0, 3 * len(ds))  # three epochs: everything training ever serves
    assert not _rows(hx) & _rows(tx)
    # Deterministic, whatever the job seed (the order of training samples changes with it).
    again = held_out_of(_build(name, seed=7, **args))
    assert torch.equal(again.batch(0, 32)[0], hx) and torch.equal(again.batch(0, 32)[1], hy)
    # The same task: a classification held-out set is labelled by the same teacher, so its
    # class mix matches training's (the generator continues, nothing else changes).
    if name == "synthetic-classification":
        assert set(hy.tolist()) <= set(ds.targets.tolist())
    with pytest.raises(IndexError):
        held.batch(30, 3)


def test_synthetic_images_hold_out_a_disjoint_index_range() -> None:
    ds = _build("synthetic-images", height=8, width=8, channels=1, classes=3)
    held = held_out_of(ds)
    hx = held.batch(0, 16)[0]
    assert torch.equal(hx, ds.batch(HELD_OUT_START, 16)[0])
    # Disjoint by index, not by value: a small image has finitely many (label, shift, noise
    # field, offset) combinations, so equal pixels can recur at any two indices.
    assert not torch.equal(hx, ds.batch(0, 16)[0])
    assert torch.equal(
        held_out_of(_build("synthetic-images", height=8, width=8, channels=1, classes=3)).batch(
            0, 16
        )[0],
        hx,
    )


def _npz(tmp_path: Path, name: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=n)
    np.savez(tmp_path / name, x=x, y=y)
    return x, y


def test_tensors_val_fraction_excludes_the_held_out_rows(tmp_path: Path) -> None:
    x, _ = _npz(tmp_path, "d.npz", 40, 0)
    roots = (str(tmp_path),)
    ds = _build("tensors", roots=roots, path="d.npz", val_fraction=0.25)
    held = held_out_of(ds)
    assert len(held) == 10 and len(ds) == 30
    hx = held.batch(0, 10)[0]
    train = _rows(ds.batch(0, 90)[0])
    assert not _rows(hx) & train
    assert _rows(hx) | train == _rows(torch.from_numpy(x))  # nothing lost, nothing added
    other = held_out_of(_build("tensors", seed=5, roots=roots, path="d.npz", val_fraction=0.25))
    assert torch.equal(other.batch(0, 10)[0], hx)  # the split depends on the file alone
    assert held_out_of(_build("tensors", roots=roots, path="d.npz")) is None


def test_tensors_val_path_is_checked_like_path(tmp_path: Path) -> None:
    _npz(tmp_path, "d.npz", 20, 0)
    vx, vy = _npz(tmp_path, "v.npz", 6, 1)
    roots = (str(tmp_path),)
    held = held_out_of(_build("tensors", roots=roots, path="d.npz", val_path="v.npz"))
    assert torch.equal(held.batch(0, 6)[0], torch.from_numpy(vx))
    assert torch.equal(held.batch(0, 6)[1], torch.from_numpy(vy))
    with pytest.raises(InvalidSpecError, match=r"^dataset\.args\.val_path: "):
        _build("tensors", roots=roots, path="d.npz", val_path="/etc/passwd")
    with pytest.raises(InvalidSpecError, match="val_path or val_fraction"):
        _build("tensors", roots=roots, path="d.npz", val_path="v.npz", val_fraction=0.1)
    with pytest.raises(InvalidSpecError, match="val_fraction"):
        _build("tensors", roots=roots, path="d.npz", val_fraction=0.9)
