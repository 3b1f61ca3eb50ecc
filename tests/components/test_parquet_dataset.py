"""The parquet dataset: Parquet files, Arrow IPC files and datasets.save_to_disk folders.

Real data: the Python standard library's source (one row per file, training and held-out
files disjoint) as bytes and through a BPE tokenizer trained here; scikit-learn's two
sample photographs, cut into crops and stored as PNG bytes."""

from __future__ import annotations

import io
import math
import os
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as tvf

from amptrain.components import images, parquet_dataset
from amptrain.components.parquet_dataset import build_parquet
from amptrain.components.sampling import generator
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.limits import MAX_IMAGE_PIXELS
from amptrain.contract.spec import parse_spec
from amptrain.engine import RunContext, Trainer
from tests.components.stdlib_corpus import stdlib_sources


@pytest.fixture(scope="module")
def texts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], list[str]]:
    root = tmp_path_factory.mktemp("tables")
    train, held = stdlib_sources()
    pq.write_table(pa.table({"text": train}), root / "train.parquet", row_group_size=4)
    pq.write_table(pa.table({"text": held}), root / "val.parquet")
    return root, train, held


def _stream(data: object) -> np.ndarray:
    return data.source.array()  # type: ignore[attr-defined]


def _bytes(data: object) -> bytes:
    ids = _stream(data)
    assert ids.dtype == np.uint16 and int(ids.max()) < 256
    return bytes(ids.astype(np.uint8))


def _lm(root: Path, **args: object) -> object:
    kw = {"path": "train.parquet", "task": "language_model", "input_column": "text", "seq_len": 64}
    return build_parquet(seed=1, data_roots=[str(root)], **{**kw, **args})  # type: ignore[arg-type]


def test_text_rows_become_one_byte_stream_that_trains(texts: tuple) -> None:
    root, train, held = texts
    data = _lm(root, val_path="val.parquet")
    assert _bytes(data) == "".join(train).encode()
    assert _bytes(data.held_out()) == "".join(held).encode()
    assert data.info.num_classes == 256
    whole = data.batch(3, 10)
    assert torch.equal(torch.cat([data.batch(3, 4)[0], data.batch(7, 6)[0]]), whole[0])
    assert torch.equal(pickle.loads(pickle.dumps(data)).batch(3, 10)[1], whole[1])
    spec = {
        "model": {"name": "transformer", "args": {"d_model": 64, "n_layers": 1, "n_heads": 2}},
        "dataset": {
            "name": "parquet",
            "args": {
                "path": "train.parquet",
                "val_path": "val.parquet",
                "task": "language_model",
                "input_column": "text",
                "seq_len": 64,
            },
        },
        "max_steps": 60,
        "batch_size": 16,
        "precision": "fp32",
        "device": "cpu",
        "optimizer": {"lr": 3e-3},
        "eval": {"batches": 4},
    }
    result = Trainer(
        parse_spec(spec), RunContext(checkpoint_dir=None, data_roots=[str(root)])
    ).train()
    perplexity = result.eval["perplexity"]
    print(f"parquet: held-out byte perplexity after 60 steps: {perplexity:.1f}")
    assert math.isfinite(perplexity) and perplexity < 40  # uniform over bytes: 256


def test_a_bpe_tokenizer_json_tokenizes_the_rows(texts: tuple) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    root, train, _ = texts
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(train, trainers.BpeTrainer(vocab_size=400, show_progress=False))
    tok.save(str(root / "tokenizer.json"))
    data = _lm(root, tokenizer_path="tokenizer.json", val_fraction=0.1)
    expected = np.concatenate([tok.encode(t, add_special_tokens=False).ids for t in train])
    assert np.array_equal(_stream(data), expected) and data.info.num_classes == tok.get_vocab_size()
    assert len(expected) < 0.6 * len("".join(train).encode())  # BPE merged something
    blocks = len(expected) // 65
    assert len(data) + len(data.held_out()) == blocks and len(data.held_out()) == round(
        0.1 * blocks
    )
    (root / "bad.json").write_text("{not json")
    with pytest.raises(
        InvalidSpecError, match=r"tokenizer_path: .bad\.json.: not a tokenizer\.json"
    ):
        _lm(root, tokenizer_path="bad.json")


def test_arrow_files_and_a_save_to_disk_folder_are_mapped(texts: tuple) -> None:
    root, train, _ = texts
    table = pa.table({"text": train})
    with (
        pa.OSFile(str(root / "train.arrow"), "wb") as sink,
        pa.ipc.new_file(sink, table.schema) as w,
    ):
        w.write_table(table, max_chunksize=5)
    with (
        pa.OSFile(str(root / "stream.arrow"), "wb") as sink,
        pa.ipc.new_stream(sink, table.schema) as w,
    ):
        w.write_table(table)
    for path in ("train.arrow", "stream.arrow"):
        assert _bytes(_lm(root, path=path)) == "".join(train).encode(), path
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": train}).save_to_disk(str(root / "hf"))
    data = _lm(root, path="hf")
    assert _bytes(data) == "".join(train).encode()
    (root / "notdata").mkdir()
    with pytest.raises(InvalidSpecError, match=r"notdata/state\.json"):
        _lm(root, path="notdata")


def _photos(root: Path, name: str, row_group_size: int = 8) -> tuple[list[bytes], list[int]]:
    from sklearn.datasets import load_sample_images

    rng = np.random.default_rng(0)
    cells, labels = [], []
    for label, photo in enumerate(load_sample_images().images):
        for _ in range(12):
            y, x = rng.integers(0, 400), rng.integers(0, 600)
            out = io.BytesIO()
            Image.fromarray(photo[y : y + 24, x : x + 32]).save(out, format="PNG")
            cells.append(out.getvalue())
            labels.append(label)
    pq.write_table(
        pa.table({"img": cells, "y": labels}), root / name, row_group_size=row_group_size
    )
    return cells, labels


def test_image_bytes_are_decoded_in_a_seeded_order_of_row_groups(tmp_path: Path) -> None:
    pytest.importorskip("sklearn")
    cells, labels = _photos(tmp_path, "photos.parquet")
    args = {"path": "photos.parquet", "input_column": "img", "label_column": "y", "image_size": 16}
    data = build_parquet(seed=5, data_roots=[str(tmp_path)], val_fraction=0.25, **args)
    assert data.info.input_shape == (3, 16, 16) and data.info.num_classes == 2
    held = data.held_out()
    assert len(data) == 18 and len(held) == 6
    x, y = data.batch(0, 18)  # one epoch: every training row once
    hx, hy = held.batch(0, 6)

    def expect(cell: bytes) -> torch.Tensor:
        # Pillow's decoding; the evaluation view: the shorter side resized to
        # round(16 / 0.875) = 18, the centre 16x16; ImageNet's mean and std.
        with Image.open(io.BytesIO(cell)) as image:
            img = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
        img = tvf.center_crop(tvf.resize(img, [18], antialias=True), [16, 16])
        return tvf.normalize(
            tvf.to_dtype(img, torch.float32, scale=True),
            [0.485, 0.456, 0.406],
            [0.229, 0.224, 0.225],
        )

    # Held-out rows: the evaluation view, as Pillow and torchvision make it.
    everything = [expect(c) for c in cells]
    held_rows = [next(i for i, e in enumerate(everything) if torch.equal(e, s)) for s in hx]
    # Training rows: the training view (crop and flip drawn from the row's position).
    decoded = [images.decode(c, 3) for c in cells]

    def train_row(p: int) -> int:
        g = [generator(5, p, parquet_dataset._AUGMENT) for _ in decoded]
        views = [images.train_view(d, gi, 16, 0.08, 3) for d, gi in zip(decoded, g, strict=True)]
        return next(i for i, v in enumerate(views) if torch.equal(v, x[p]))

    rows = [train_row(p) for p in range(18)] + held_rows
    assert (
        sorted(rows) == list(range(24)) and [labels[r] for r in rows] == torch.cat([y, hy]).tolist()
    )
    assert not any(torch.equal(x[p], everything[rows[p]]) for p in range(18))  # augmented
    # A batch reads whole row groups in turn: the first 8 positions come from one group.
    assert len({r // 8 for r in rows[:6]}) <= 2
    assert torch.equal(
        torch.cat([data.batch(10, 5)[0], data.batch(15, 9)[0]]), data.batch(10, 14)[0]
    )
    assert torch.equal(pickle.loads(pickle.dumps(data)).batch(10, 14)[0], data.batch(10, 14)[0])


def test_a_corrupt_image_fails_or_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("sklearn")
    cells, labels = _photos(tmp_path, "ok.parquet")
    cells[3] = cells[3][:40]  # truncated
    pq.write_table(
        pa.table({"img": cells, "y": labels}), tmp_path / "bad.parquet", row_group_size=8
    )
    args = {"path": "bad.parquet", "input_column": "img", "label_column": "y", "image_size": 8}
    with pytest.raises(InvalidSpecError) as err:
        build_parquet(seed=0, data_roots=[str(tmp_path)], **args).batch(0, 24)
    assert err.value.message == (
        "dataset.args.path: 'bad.parquet' row 3: not a JPEG, PNG or WebP image, or one whose "
        "header is cut short or corrupt (UnidentifiedImageError); dataset.args.on_corrupt "
        "'skip' uses the next sample in its place"
    )
    skipping = build_parquet(seed=0, data_roots=[str(tmp_path)], on_corrupt="skip", **args)
    x, _ = skipping.batch(0, 24)
    assert skipping.take_skipped() == ["'bad.parquet' row 3"] and torch.isfinite(x).all()
    monkeypatch.setattr(parquet_dataset, "MAX_CELL_BYTES", 200)  # a huge cell, cheaply
    with pytest.raises(InvalidSpecError, match=r"row \d+: a missing cell, or one over 200 B"):
        build_parquet(seed=0, data_roots=[str(tmp_path)], **{**args, "path": "ok.parquet"}).batch(
            0, 24
        )


def test_lying_and_hostile_tables_are_refused_by_name(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    pq.write_table(
        pa.table({"text": ["abc" * 50] * 10, "label": list(range(10))}), root / "ok.parquet"
    )
    good = (root / "ok.parquet").read_bytes()
    footer = struct.unpack("<I", good[-8:-4])[0]
    (root / "truncated.parquet").write_bytes(good[: len(good) // 2])
    (root / "long-footer.parquet").write_bytes(good[:-8] + struct.pack("<I", 2**31) + b"PAR1")
    meta = len(good) - 8 - footer
    (root / "bad-meta.parquet").write_bytes(
        good[:meta] + bytes(255 - b for b in good[meta:-8]) + good[-8:]
    )
    (root / "link.parquet").symlink_to(root / "ok.parquet")
    os.mkfifo(root / "fifo.parquet")
    (tmp_path / "out.parquet").write_bytes(good)
    cases = {
        "truncated.parquet": "'truncated.parquet': not a readable parquet table",
        "long-footer.parquet": "'long-footer.parquet': not a readable parquet table",
        "bad-meta.parquet": "'bad-meta.parquet': not a readable parquet table",
        "link.parquet": "a symlink or a changing path",
        "fifo.parquet": "is a FIFO, not a regular file",
        str(tmp_path / "out.parquet"): "is outside the allowed data roots",
    }
    for path, problem in cases.items():
        with pytest.raises(InvalidSpecError) as err:
            build_parquet(
                seed=0,
                data_roots=[str(root)],
                path=path,
                task="language_model",
                input_column="text",
            )
        assert problem in err.value.message and err.value.message.startswith(
            "dataset.args.path: "
        ), path
    with pytest.raises(InvalidSpecError) as err:
        build_parquet(seed=0, data_roots=[str(root)], path="ok.parquet", input_column="image")
    assert (
        err.value.message
        == "dataset.args.input_column: 'image' not in the table; found: 'text', 'label'"
    )


def test_text_classification_pads_token_sequences(texts: tuple) -> None:
    root, train, _ = texts
    labels = [int("import os" in t) for t in train]
    pq.write_table(pa.table({"text": train, "has_os": labels}), root / "cls.parquet")
    data = build_parquet(
        seed=2,
        data_roots=[str(root)],
        path="cls.parquet",
        input_column="text",
        label_column="has_os",
        num_classes=2,
        seq_len=4096,
    )
    assert data.info.kind == "sequences" and data.info.vocab_size == 256
    x, y = data.batch(0, len(train))
    expected = [torch.tensor(list(t.encode()[:4096])) for t in train]
    for ids, label in zip(x, y, strict=True):
        (row,) = [i for i, raw in enumerate(expected) if torch.equal(ids[: len(raw)], raw)]
        assert (ids[len(expected[row]) :] == 256).all()  # the padding id: one past the vocabulary
        assert int(label) == labels[row]


def test_an_image_declaring_a_huge_canvas_is_not_decoded(tmp_path: Path) -> None:
    out = io.BytesIO()
    Image.new("RGB", (4, 4)).save(out, format="PNG")
    png = bytearray(out.getvalue())
    # IHDR width and height: 400 megapixels (1.2 GB decoded), its CRC made right again.
    png[16:24] = struct.pack(">II", 20_000, 20_000)
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))
    pq.write_table(pa.table({"img": [bytes(png)], "y": [0]}), tmp_path / "bomb.parquet")
    data = build_parquet(
        seed=0,
        data_roots=[str(tmp_path)],
        path="bomb.parquet",
        input_column="img",
        label_column="y",
        num_classes=2,
        image_size=8,
    )
    with pytest.raises(
        InvalidSpecError, match=f"row 0: declares more than {MAX_IMAGE_PIXELS} pixels"
    ):
        data.batch(0, 1)


def test_declared_sizes_and_column_types_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from amptrain.components import table_files

    pq.write_table(
        pa.table({"text": ["x" * 300] * 40, "n": list(range(40))}),
        tmp_path / "t.parquet",
        row_group_size=10,
    )
    args = {"path": "t.parquet", "input_column": "text", "task": "language_model"}
    monkeypatch.setattr(table_files, "MAX_PIECE_BYTES", 1000)  # row groups of ~3 KB declared
    with pytest.raises(InvalidSpecError, match=r"'t\.parquet': row group 0 declares"):
        build_parquet(seed=0, data_roots=[str(tmp_path)], **args)
    monkeypatch.undo()
    monkeypatch.setattr(table_files, "MAX_ROWS", 39)
    with pytest.raises(InvalidSpecError, match="declares 40 rows; at most 39"):
        build_parquet(seed=0, data_roots=[str(tmp_path)], **args)
    monkeypatch.undo()
    with pytest.raises(InvalidSpecError) as err:
        build_parquet(seed=0, data_roots=[str(tmp_path)], **{**args, "input_column": "n"})
    assert err.value.message == "dataset.args.input_column: 'n' holds 'int64', not text"


class _Batches(torch.utils.data.Dataset):
    """Batches of 4 as a DataLoader's map-style dataset (what a loader process calls)."""

    def __init__(self, data: object) -> None:
        self.data = data

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data.batch(4 * i, 4)  # type: ignore[attr-defined]


def test_forked_loader_processes_read_the_same_batches(tmp_path: Path) -> None:
    """A forked worker gets a Parquet reader of its own over the shared map."""
    pytest.importorskip("sklearn")
    _photos(tmp_path, "photos.parquet", row_group_size=5)
    args = {"path": "photos.parquet", "input_column": "img", "label_column": "y", "image_size": 8}
    data = build_parquet(seed=1, data_roots=[str(tmp_path)], **args)
    data.batch(0, 4)  # the parent has read (and cached) a row group before forking
    loader = torch.utils.data.DataLoader(
        _Batches(data), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    got = list(loader)
    assert all(torch.equal(g[0], data.batch(4 * i, 4)[0]) for i, g in enumerate(got))
    assert torch.cat([g[1] for g in got]).tolist() == data.batch(0, 24)[1].tolist()
