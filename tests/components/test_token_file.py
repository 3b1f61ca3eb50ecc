"""The token-file dataset: a flat binary token stream, memory-mapped, cut into blocks.

Real text: the Python standard library's own source as UTF-8 bytes (vocabulary 256),
training files and held-out files disjoint (held out by file)."""

from __future__ import annotations

import math
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from amptrain.components.token_file import build_token_file
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.file_datasets import FILE_DATASETS
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from tests.components.stdlib_corpus import stdlib_sources

REG = {r.name: r for r in FILE_DATASETS}["token-file"]


def _write(path: Path, texts: list[str], dtype: str = "uint16") -> np.ndarray:
    ids = np.frombuffer("".join(texts).encode("utf-8"), dtype=np.uint8).astype(dtype)
    ids.astype(np.dtype(dtype).newbyteorder("<")).tofile(path)
    return ids


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    root = tmp_path_factory.mktemp("tokens")
    train, held = stdlib_sources()
    return root, _write(root / "train.bin", train), _write(root / "val.bin", held)


def _build(root: Path, **args: object) -> object:
    kw: dict[str, object] = {"path": "train.bin", "vocab_size": 256, "seq_len": 32, **args}
    return build_token_file(seed=kw.pop("seed", 3), data_roots=[str(root)], **kw)  # type: ignore[arg-type]


def test_blocks_read_back_the_file_exactly_and_resume_anywhere(corpus: tuple) -> None:
    root, train, held = corpus
    data = _build(root, val_path="val.bin")
    blocks = torch.from_numpy(train[: len(train) // 33 * 33].astype(np.int64)).view(-1, 33)
    assert len(data) == len(blocks)
    x, y = data.batch(0, len(blocks))  # one epoch: every block once, in a seeded order
    seen = torch.cat([x, y[:, -1:]], dim=1)
    assert torch.equal(seen[seen[:, 0].argsort()].unique(dim=0), blocks.unique(dim=0))
    assert torch.equal(x[:, 1:], y[:, :-1]) and x.dtype == y.dtype == torch.int64
    assert sorted(map(tuple, seen.tolist())) == sorted(map(tuple, blocks.tolist()))
    # Bitwise the same however the stream is cut, across an epoch boundary too.
    n = len(blocks)
    whole = data.batch(n - 5, 12)
    parts = [data.batch(n - 5, 7), data.batch(n + 2, 5)]
    assert all(
        torch.equal(torch.cat(p), w) for p, w in zip(zip(*parts, strict=False), whole, strict=False)
    )
    assert torch.equal(_build(root, val_path="val.bin").batch(n - 5, 12)[0], whole[0])
    assert not torch.equal(_build(root, seed=4).batch(0, 8)[0], data.batch(0, 8)[0])
    # Picklable without the map (a spawned loader maps the file again), and small.
    copy = pickle.loads(pickle.dumps(data))
    assert len(pickle.dumps(data)) < 20_000 and torch.equal(
        copy.batch(7, 9)[0], data.batch(7, 9)[0]
    )
    # Held out by file: the other source files, read in order.
    val = data.held_out()
    hx, hy = val.batch(0, len(val))
    assert torch.equal(hx[0], torch.from_numpy(held[:32].astype(np.int64)))
    assert len(val) == len(held) // 33 and torch.equal(
        hy[-1, -1], torch.tensor(int(held[len(val) * 33 - 1]))
    )


def test_uint32_and_val_fraction_hold_out_the_tail(corpus: tuple, tmp_path: Path) -> None:
    _, train, _ = corpus
    (tmp_path / "train.bin").write_bytes(train.astype("<u4").tobytes())
    data = _build(tmp_path, dtype="uint32", val_fraction=0.1, seq_len=63)
    total = len(train) // 64
    held = data.held_out()
    assert len(held) == round(0.1 * total) and len(data) == total - len(held)
    first = held.batch(0, 1)[0][0]
    assert torch.equal(first, torch.from_numpy(train[len(data) * 64 :][:63].astype(np.int64)))
    trained = data.batch(0, len(data))[0]  # one epoch never reaches a held-out block
    assert not (trained == first).all(dim=1).any()


def test_a_byte_level_model_learns_python_source(corpus: tuple) -> None:
    root = corpus[0]
    spec = parse_spec(
        {
            "model": {"name": "transformer", "args": {"d_model": 64, "n_layers": 1, "n_heads": 2}},
            "dataset": {
                "name": "token-file",
                "args": {
                    "path": "train.bin",
                    "vocab_size": 256,
                    "seq_len": 64,
                    "val_path": "val.bin",
                },
            },
            "max_steps": 60,
            "batch_size": 16,
            "precision": "fp32",
            "device": "cpu",
            "optimizer": {"lr": 3e-3},
            "eval": {"batches": 4},
        }
    )
    result = Trainer(spec, RunContext(checkpoint_dir=None, data_roots=[str(root)])).train()
    perplexity = result.eval["perplexity"]
    print(f"held-out byte perplexity after 60 steps: {perplexity:.1f}")
    assert math.isfinite(perplexity) and perplexity < 40  # uniform over bytes: 256


def test_a_token_outside_the_vocabulary_names_the_file_and_offset(tmp_path: Path) -> None:
    ids = np.arange(330, dtype="<u2") % 200
    ids[70] = 250  # in block 2 of 33-token blocks
    ids.tofile(tmp_path / "train.bin")
    data = _build(tmp_path, vocab_size=200, seed=0)
    with pytest.raises(InvalidSpecError) as err:
        data.batch(0, 10)
    assert err.value.message == (
        "dataset.args.path: 'train.bin' block 2: the token at offset 70 (byte 140) is >= "
        "vocab_size (200); dataset.args.on_corrupt 'skip' uses the next sample in its place"
    )
    skipping = _build(tmp_path, vocab_size=200, seed=0, on_corrupt="skip")
    x, _ = skipping.batch(0, 20)  # two epochs: the bad block is replaced both times
    assert int(x.max()) < 200 and skipping.take_skipped() == ["'train.bin' block 2"]
    assert skipping.take_skipped() == [] and torch.equal(skipping.batch(0, 20)[0], x)
    strict = _build(tmp_path, vocab_size=200, seed=0, on_corrupt="skip", max_skipped=0)
    with pytest.raises(
        InvalidSpecError, match=r"^dataset\.args\.max_skipped: more than 0 bad files"
    ):
        strict.batch(0, 10)


def test_hostile_files_are_refused_by_name(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "secret.bin").write_bytes(b"\0" * 100)
    (root / "odd.bin").write_bytes(b"\0" * 99)
    (root / "empty.bin").write_bytes(b"")
    (root / "short.bin").write_bytes(b"\0" * 20)
    (root / "link.bin").symlink_to(tmp_path / "secret.bin")
    os.mkfifo(root / "fifo.bin")
    cases = {
        str(tmp_path / "secret.bin"): "is outside the allowed data roots",
        "link.bin": "a symlink or a changing path",
        "fifo.bin": "is a FIFO, not a regular file",
        "odd.bin": "99 bytes is not a whole number of uint16 tokens",
        "empty.bin": "the file is empty",
        "short.bin": "holds 10 tokens, fewer than one block of seq_len + 1 = 33",
        "missing.bin": "no such file under the data roots",
    }
    for path, problem in cases.items():
        with pytest.raises(InvalidSpecError) as err:
            _build(root, path=path)
        assert problem in err.value.message and str(tmp_path) not in err.value.message.replace(
            str(tmp_path / "secret.bin"), ""
        ), path
    (root / "good.bin").write_bytes(b"\0" * 200)
    with pytest.raises(InvalidSpecError, match=r"dataset\.args\.val_path: .fifo\.bin. is a FIFO"):
        _build(root, path="good.bin", val_path="fifo.bin")
    with pytest.raises(InvalidSpecError, match="val_path or val_fraction"):
        _build(root, val_path="a", val_fraction=0.1)


def test_arguments_are_bounded_and_the_footprint_is_a_window() -> None:
    bad = {
        "vocab_size": 1,
        "seq_len": 10**6,
        "dtype": "int8",
        "val_fraction": 0.9,
        "max_skipped": -1,
    }
    for arg, value in bad.items():
        errors = REG.arg_errors({"path": "x.bin", "vocab_size": 256, arg: value})
        assert errors and errors[0][0] == arg, arg
    assert REG.arg_errors({"path": "x.bin"})[0][0] == "vocab_size"  # required
    shape = REG.footprint(REG.with_defaults({"path": "x.bin", "vocab_size": 50_257}))
    assert shape.input_shape == (256,) and shape.classes == 50_257
    assert shape.resident_bytes == 256 * 257 * (2 + 24)  # a window of blocks, not the file
