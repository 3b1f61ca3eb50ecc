"""The file-backed ``tensors`` dataset: formats, data-root confinement, clear errors."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import torch

from amptrain.components import registry
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.spec import ComponentRef


def _build(path: str | Path, roots: list[str | Path], **args: Any) -> Any:
    ref = ComponentRef(name="tensors", args={"path": str(path), **args})
    return registry.build_dataset(ref, seed=0, data_roots=[str(r) for r in roots])


@pytest.fixture
def arrays() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(20, 3)).astype(np.float32), rng.integers(0, 4, size=20)


def _same_rows(ds: Any, x: np.ndarray, y: np.ndarray) -> None:
    bx, by = ds.batch(0, len(x))
    order = np.lexsort(bx.numpy().T)
    expected = np.lexsort(x.T)
    np.testing.assert_allclose(bx.numpy()[order], x[expected], rtol=1e-6)
    np.testing.assert_array_equal(by.numpy()[order], y[expected])


def test_npz_classification(tmp_path: Path, arrays: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = arrays
    np.savez(tmp_path / "d.npz", feats=x, labels=y)
    ds = _build(tmp_path / "d.npz", [tmp_path], inputs_key="feats", targets_key="labels")
    assert ds.info.task == "classification" and ds.info.input_shape == (3,)
    assert ds.info.num_classes == int(y.max()) + 1
    _same_rows(ds, x, y)
    assert torch.equal(
        ds.batch(15, 10)[0],
        _build(tmp_path / "d.npz", [tmp_path], inputs_key="feats", targets_key="labels").batch(
            15, 10
        )[0],
    )


def test_csv_with_and_without_header(tmp_path: Path, arrays: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = arrays
    table = np.column_stack([y, x])  # label first
    np.savetxt(tmp_path / "h.csv", table, delimiter=",", header="label,a,b,c", comments="")
    np.savetxt(tmp_path / "n.csv", table, delimiter=",")
    for name in ("h.csv", "n.csv"):
        ds = _build(tmp_path / name, [tmp_path], label_column=0, num_classes=7)
        assert ds.info.num_classes == 7 and ds.info.input_shape == (3,)
        _same_rows(ds, x, y)


def test_pt_dict_pair_and_token_ids(tmp_path: Path, arrays: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = (torch.from_numpy(a) for a in arrays)
    torch.save({"x": x, "y": y}, tmp_path / "dict.pt")
    torch.save((x, y), tmp_path / "pair.pt")
    for name in ("dict.pt", "pair.pt"):
        _same_rows(_build(tmp_path / name, [tmp_path]), x.numpy(), y.numpy())
    tokens = torch.randint(50, (6, 9))
    torch.save(tokens, tmp_path / "tokens.pt")
    ds = _build(tmp_path / "tokens.pt", [tmp_path], task="language_model", num_classes=50)
    assert (
        ds.info.task == "language_model"
        and ds.info.input_shape == (8,)
        and ds.info.num_classes == 50
    )
    inputs, targets = ds.batch(0, 6)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    np.savez(tmp_path / "tokens.npz", x=tokens.numpy())
    assert (
        _build(tmp_path / "tokens.npz", [tmp_path], task="language_model").info.num_classes
        == int(tokens.max()) + 1
    )


def test_pt_files_cannot_run_code(tmp_path: Path) -> None:
    torch.save(
        {"x": torch.zeros(2, 2), "y": torch.zeros(2), "evil": os.getcwd}, tmp_path / "evil.pt"
    )
    with pytest.raises(InvalidSpecError, match=r"^dataset.args.path: .* weights_only=True"):
        _build(tmp_path / "evil.pt", [tmp_path])


def test_files_outside_the_data_roots_are_refused(
    tmp_path: Path, arrays: tuple[np.ndarray, np.ndarray]
) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    np.savez(outside / "d.npz", x=arrays[0], y=arrays[1])
    (root / "link.npz").symlink_to(outside / "d.npz")
    for path in (
        outside / "d.npz",
        root / ".." / "outside" / "d.npz",
        "/etc/passwd",
    ):
        with pytest.raises(
            InvalidSpecError, match=r"^dataset.args.path: .* is outside the allowed data roots"
        ):
            _build(path, [root])
    with pytest.raises(InvalidSpecError, match=r"a symlink or a changing path$"):
        _build(root / "link.npz", [root])  # a symlink under a root is never followed
    with pytest.raises(InvalidSpecError, match="no data roots are configured"):
        _build(outside / "d.npz", [])
    assert _build(outside / "d.npz", [root, outside]).info.num_classes >= 1


def test_fsspec_urls_are_confined_too(
    tmp_path: Path, arrays: tuple[np.ndarray, np.ndarray]
) -> None:
    fs = fsspec.filesystem("memory")
    with fs.open("/team/data/d.npz", "wb") as f:
        np.savez(f, x=arrays[0], y=arrays[1])
    with fs.open("/other/d.npz", "wb") as f:
        np.savez(f, x=arrays[0], y=arrays[1])
    _same_rows(_build("memory://team/data/d.npz", ["memory://team"]), *arrays)
    for path, roots in [
        ("memory://other/d.npz", ["memory://team"]),
        ("memory://team/../other/d.npz", ["memory://team"]),
        ("memory://teamster/d.npz", ["memory://team"]),
    ]:
        with pytest.raises(InvalidSpecError, match="outside the allowed data roots"):
            _build(path, roots)
    with pytest.raises(InvalidSpecError, match="protocol 'memory' is not allowed here"):
        _build("memory://team/data/d.npz", [str(tmp_path)])  # no root of that protocol
    np.savez(tmp_path / "d.npz", x=arrays[0], y=arrays[1])
    assert _build(f"file://{tmp_path}/d.npz", [str(tmp_path)]).info.input_shape == (3,)


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (
            "npz",
            {"inputs_key": "feats"},
            "dataset.args.inputs_key: 'feats' not in the file; found: x, y",
        ),
        ("txt", {}, "dataset.args.path: unsupported file type '.txt'"),
        ("missing", {}, "dataset.args.path: no such file"),
        ("npz", {"num_classes": 2}, "dataset.args.num_classes: 2 but the file has labels up to"),
        ("floatlabels", {}, "dataset.args.path: labels must be whole numbers"),
    ],
)
def test_bad_files_name_the_field(
    tmp_path: Path, setup: str, args: dict[str, Any], message: str
) -> None:
    x = np.zeros((4, 2), np.float32)
    if setup == "npz":
        np.savez(tmp_path / "f.npz", x=x, y=np.array([0, 1, 2, 3]))
        path = tmp_path / "f.npz"
    elif setup == "floatlabels":
        np.savez(tmp_path / "f.npz", x=x, y=np.array([0.5, 1, 2, 3]))
        path = tmp_path / "f.npz"
    elif setup == "txt":
        path = tmp_path / "f.txt"
        path.write_text("1,2\n")
    else:
        path = tmp_path / "absent.npz"
    with pytest.raises(InvalidSpecError) as err:
        _build(path, [tmp_path], **args)
    assert err.value.message.startswith(message)


def test_sequence_classification_keeps_token_ids_and_counts_the_vocabulary(
    tmp_path: Path,
) -> None:
    tokens = np.random.default_rng(1).integers(0, 40, size=(30, 12))
    labels = np.arange(30) % 3
    np.savez(tmp_path / "seq.npz", x=tokens, y=labels)
    held = tokens[:5].copy()
    held[0, 0] = 90  # an id only the held-out file has still fits the token table
    np.savez(tmp_path / "val.npz", x=held, y=labels[:5])
    task = {"task": "sequence_classification"}
    ds = _build(tmp_path / "seq.npz", [tmp_path], val_path="val.npz", **task)
    assert ds.info.kind == "sequences" and ds.info.task == "classification"
    assert ds.info.input_shape == (12,) and ds.info.num_classes == 3 and ds.info.vocab_size == 91
    inputs, targets = ds.batch(0, 30)
    assert inputs.dtype == torch.int64 and targets.dtype == torch.int64
    assert sorted(map(tuple, inputs.tolist())) == sorted(map(tuple, tokens.tolist()))
    np.savez(tmp_path / "frac.npz", x=tokens + 0.5, y=labels)
    with pytest.raises(InvalidSpecError, match=r"^dataset.args.path: token ids must be whole"):
        _build(tmp_path / "frac.npz", [tmp_path], **task)
    np.savez(tmp_path / "flat.npz", x=tokens.reshape(30, 3, 4), y=labels)
    with pytest.raises(InvalidSpecError, match=r"shape \(samples, seq_len\); got \(30, 3, 4\)"):
        _build(tmp_path / "flat.npz", [tmp_path], **task)
