"""The ``webdataset`` dataset: tar shards of real images (scikit-learn's digits as PNG, crops
of its sample photos as JPEG) written here with the standard library's tarfile, indexed
from their headers, served at exact positions with shard-level shuffling, trained on, and
refused or skipped when hostile or corrupt."""

from __future__ import annotations

import io
import os
import pickle
import tarfile
import time
from pathlib import Path
from typing import Any

import braceexpand
import numpy as np
import pytest
import torch

from amptrain.components import registry
from amptrain.components.tar_index import count_names
from amptrain.contract import catalog
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.limits import MAX_IMAGE_BYTES
from amptrain.contract.spec import ComponentRef, parse_spec
from amptrain.engine import RunContext, Trainer

F = pytest.importorskip("torchvision.transforms.v2.functional")
Image = pytest.importorskip("PIL.Image")
datasets = pytest.importorskip("sklearn.datasets")


Member = tuple[str, bytes]


def _encoded(pixels: np.ndarray[Any, Any], form: str, **options: Any) -> bytes:
    """``(H, W)`` or ``(H, W, 3)`` uint8 pixels encoded by Pillow (not the library that
    decodes them)."""
    out = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(out, format=form, **options)
    return out.getvalue()


@pytest.fixture(scope="module")
def digits() -> list[tuple[bytes, int]]:
    """scikit-learn's 1,797 real 8x8 digits, each a PNG file's bytes, with its label."""
    d = datasets.load_digits()
    pixels = (d.images * 15).astype(np.uint8)  # 0..16 -> 0..240
    return [(_encoded(p, "PNG"), int(t)) for p, t in zip(pixels, d.target, strict=True)]


@pytest.fixture(scope="module")
def photos() -> list[tuple[bytes, int]]:
    """24 JPEG crops (40x48) of scikit-learn's two real photos, labelled by photo."""
    rng = np.random.default_rng(0)
    out = []
    for label, photo in enumerate(datasets.load_sample_images().images):
        for _ in range(12):
            y, x = rng.integers(0, 427 - 40), rng.integers(0, 640 - 48)
            out.append((_encoded(photo[y : y + 40, x : x + 48], "JPEG", quality=90), label))
    return out


def _write(path: Path, members: list[Member]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _samples(items: list[tuple[bytes, int]], first: int, ext: str = "png") -> list[Member]:
    out = []
    for i, (image, label) in enumerate(items):
        out += [(f"{first + i:06d}.{ext}", image), (f"{first + i:06d}.cls", str(label).encode())]
    return out


def _shards(root: Path, prefix: str, items: list[tuple[bytes, int]], per: int) -> int:
    """Write ``items`` as shards of ``per`` samples; the shard count."""
    n = 0
    for n, at in enumerate(range(0, len(items), per)):
        _write(root / f"{prefix}-{n}.tar", _samples(items[at : at + per], at))
    return n + 1


def _build(root: Path, **args: Any) -> Any:
    seed = args.pop("_seed", 0)
    ref = ComponentRef(name="webdataset", args=args)
    return registry.build_dataset(ref, seed=seed, data_roots=[str(root)])


def _refused(root: Path, **args: Any) -> str:
    with pytest.raises(InvalidSpecError) as err:
        _build(root, **args)
    return err.value.message


def test_real_images_are_indexed_from_headers_and_decoded(
    tmp_path: Path, digits: list[tuple[bytes, int]], photos: list[tuple[bytes, int]]
) -> None:
    _shards(tmp_path, "digits", digits[:60], 20)
    _write(tmp_path / "photos-0.tar", _samples(photos, 0, "jpg"))
    args = {"image_size": 8, "channels": 1, "num_classes": 10}
    ds = _build(tmp_path, pattern="digits-{0..1}.tar", val_pattern="digits-2.tar", **args)
    table = ds.shards.table
    assert ds.info.input_shape == (1, 8, 8) and ds.info.num_classes == 10
    assert table.nbytes < 40 * 16 + 2 * 400  # 16 bytes a sample, a name and more per shard
    assert ds.resident_bytes >= table.nbytes + ds.held_out().table.nbytes
    # Headers only: 512 bytes each, a byte before it, and the one-digit label's byte.
    assert table.bytes_read <= 40 * 2 * 516 + 1024
    held = ds.held_out()
    assert len(held) == 20
    x, y = held.batch(0, 20)
    assert y.tolist() == [label for _, label in digits[40:60]]  # stored order
    # Evaluation at the digits' own size: resized to round(8 / 0.875) = 9, the centre 8x8
    # kept, as torchvision's functional ops do it to Pillow's decoding; grey to [-1, 1].
    pixels = torch.stack(
        [torch.from_numpy(np.array(Image.open(io.BytesIO(b))))[None] for b, _ in digits[40:60]]
    )
    expected = F.center_crop(F.resize(pixels, [9], antialias=True), [8, 8])
    assert torch.allclose(x * 0.5 + 0.5, expected.float() / 255, atol=1e-6)
    rgb = _build(tmp_path, pattern="photos-0.tar", image_size=16)
    assert rgb.info.num_classes == 2 and rgb.info.input_shape == (3, 16, 16)
    images, labels = rgb.batch(0, 24)
    assert sorted(labels.tolist()) == [0] * 12 + [1] * 12 and images.std() > 0.3


def _ids(root: Path, shards: int, per: int, digits: list[tuple[bytes, int]]) -> None:
    """Shards whose labels are the samples' own numbers: what was served can be told."""
    for s in range(shards):
        items = [(digits[s * per + i][0], s * per + i) for i in range(per)]
        _write(root / f"ids-{s}.tar", _samples(items, s * per))


def test_positions_are_exact_across_batches_epochs_and_processes(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    _ids(tmp_path, 5, 6, digits)
    args = {"pattern": "ids-{0..4}.tar", "image_size": 8, "channels": 1, "shuffle_window": 4}
    ds = _build(tmp_path, **args)
    assert ds.info.num_classes == 30
    n = 30
    for start, split in ((0, 4), (n - 3, 3), (2 * n - 5, 2)):
        whole = ds.batch(start, 8)
        parts = [ds.batch(start, split), ds.batch(start + split, 8 - split)]
        assert torch.equal(whole[0], torch.cat([p[0] for p in parts]))
        assert torch.equal(whole[1], torch.cat([p[1] for p in parts]))
    again = _build(tmp_path, **args)  # a resumed run: a fresh build, any position
    assert torch.equal(again.batch(n + 7, 5)[0], ds.batch(n + 7, 5)[0])
    copy = pickle.loads(pickle.dumps(ds))  # as a spawned DataLoader worker gets it
    assert torch.equal(copy.batch(3, 6)[0], ds.batch(3, 6)[0])


def test_forked_loader_workers_read_the_same_samples(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    """DataLoader workers forked after the first reads share the parent's descriptors,
    which pread (no shared offset) makes safe."""
    _ids(tmp_path, 3, 8, digits)
    ds = _build(tmp_path, pattern="ids-{0..2}.tar", image_size=8, channels=1)
    expected = [ds.batch(4 * i, 4) for i in range(6)]
    loader = torch.utils.data.DataLoader(
        _Batches(ds), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    for got, want in zip(loader, expected, strict=True):
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


class _Batches(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, ds: Any) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        batch: tuple[torch.Tensor, torch.Tensor] = self.ds.batch(4 * i, 4)
        return batch


def test_a_shard_replaced_after_indexing_is_refused(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    _write(tmp_path / "s.tar", _samples(digits[:4], 0))
    ds = _build(tmp_path, pattern="s.tar", image_size=8, channels=1)
    _write(tmp_path / "new.tar", _samples(digits[4:8], 0))
    os.replace(tmp_path / "new.tar", tmp_path / "s.tar")  # same size, another file
    with pytest.raises(InvalidSpecError, match="changed since it was indexed"):
        ds.batch(0, 1)


def test_each_epoch_serves_every_sample_once_shard_by_shard(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    _ids(tmp_path, 5, 6, digits)
    args = {"pattern": "ids-{0..4}.tar", "image_size": 8, "channels": 1, "shuffle_window": 4}
    ds = _build(tmp_path, **args)
    orders = []
    for epoch in range(3):
        served = ds.batch(epoch * 30, 30)[1].tolist()
        assert sorted(served) == list(range(30))
        shards = [i // 6 for i in served]
        order = ds.shard_order(epoch).tolist()
        assert shards == [s for s in order for _ in range(6)]  # one shard after another
        for s in range(5):  # within a shard: windows of 4 (and the last of 2) shuffled
            mine = served[order.index(s) * 6 : order.index(s) * 6 + 6]
            assert sorted(mine[:4]) == [s * 6 + i for i in range(4)]
        orders.append(order)
    assert orders[0] != orders[1] or orders[1] != orders[2]
    other = _build(tmp_path, **args, _seed=1)
    assert [other.shard_order(e).tolist() for e in range(3)] != orders
    in_order = _build(tmp_path, **{**args, "shuffle_window": 1})
    first = in_order.shard_order(0)[0]
    assert in_order.batch(0, 6)[1].tolist() == [first * 6 + i for i in range(6)]


def test_training_on_digit_shards_beats_chance_on_held_out_shards(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    _shards(tmp_path, "train", digits[:800], 200)
    _write(tmp_path / "val-0.tar", _samples(digits[800:1000], 800))
    spec = parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 64}},
            "dataset": {
                "name": "webdataset",
                "args": {
                    "pattern": "train-{0..3}.tar",
                    "val_pattern": "val-0.tar",
                    "image_size": 8,
                    "channels": 1,
                    "num_classes": 10,
                    "min_crop_scale": 0.6,
                },
            },
            "max_steps": 60,
            "batch_size": 32,
            "precision": "fp32",
            "device": "cpu",
            "optimizer": {"lr": 1e-2},
            "eval": {"batches": 7},
        }
    )
    result = Trainer(spec, RunContext(checkpoint_dir=None, data_roots=[str(tmp_path)])).train()
    accuracy = (result.eval or {}).get("accuracy")
    assert accuracy is not None and accuracy > 0.5, result.eval  # chance: 0.1 (0.83 measured)


def test_val_fraction_holds_out_whole_shards_by_a_fixed_draw(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    _ids(tmp_path, 5, 6, digits)
    args = {"pattern": "ids-{0..4}.tar", "image_size": 8, "channels": 1, "val_fraction": 0.4}
    ds = _build(tmp_path, **args)
    held = ds.held_out()
    assert len(held.shards.table.names) == 2 and len(ds.shards.table.names) == 3
    assert not set(held.batch(0, 12)[1].tolist()) & set(ds.batch(0, 18)[1].tolist())
    assert (
        _build(tmp_path, **args, _seed=7).held_out().shards.table.names == held.shards.table.names
    )


# -- hostile patterns and files ------------------------------------------------------------


def test_patterns_are_bounded_and_confined_before_expanding(tmp_path: Path) -> None:
    for pattern in ("s-{0..999999999}.tar", "s-{0..99999}{0..99999}.tar"):
        began = time.monotonic()
        message = _refused(tmp_path, pattern=pattern)
        assert time.monotonic() - began < 1.0
        assert message.startswith("dataset.args.pattern: ") and "at most 10,000" in message
    assert "names 5 shards; at most 4" in _refused(tmp_path, pattern="s-{0..4}.tar", max_shards=4)
    assert "outside the allowed data roots" in _refused(tmp_path, pattern="/etc/{passwd,group}")
    assert "no '..'" in _refused(tmp_path, pattern="../s-{0..1}.tar")
    assert "dataset.args.val_pattern" in _refused(tmp_path, pattern="a.tar", val_pattern="../b")
    assert "unbalanced" in _refused(tmp_path, pattern="s-{0..1.tar")
    assert "named twice" in _refused(tmp_path, pattern="s-{0,0}.tar")
    assert "nested more than 8" in _refused(tmp_path, pattern="{" * 9 + "a,b" + "}" * 9)
    for pattern in ("a{1..3}{x,y{,z}}", r"p{07..10..2}\{q", "{Z..a}-{4..1}", "{a,}{,b}}{", "x"):
        assert count_names(pattern) == len(list(braceexpand.braceexpand(pattern))), pattern


def test_catalog_entry_checks_its_arguments(tmp_path: Path) -> None:
    reg = catalog.builtins("dataset")["webdataset"]
    assert reg.provides == "images"
    both = reg.arg_errors({"pattern": "a.tar", "val_pattern": "b.tar", "val_fraction": 0.1})
    assert [a for a, _ in both] == ["val_fraction"]
    assert [a for a, _ in reg.arg_errors({"pattern": "a", "image_key": "jpg;../x"})] == [
        "image_key"
    ]
    assert reg.footprint is not None
    assert reg.footprint(reg.with_defaults({"pattern": "a"})) is None  # classes from the files
    shape = reg.footprint(reg.with_defaults({"pattern": "a", "num_classes": 5, "channels": 1}))
    assert shape is not None and shape.input_shape == (1, 224, 224) and shape.classes == 5
    assert shape.resident_bytes >= MAX_IMAGE_BYTES


def test_only_regular_shard_files_beneath_the_roots_are_opened(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    _write(tmp_path / "real-0.tar", _samples(digits[:4], 0))
    (tmp_path / "link-0.tar").symlink_to(tmp_path / "real-0.tar")
    os.mkfifo(tmp_path / "fifo-0.tar")
    assert "symlink" in _refused(tmp_path, pattern="{real,link}-0.tar")
    assert "a FIFO, not a regular file" in _refused(tmp_path, pattern="fifo-0.tar")  # no hang
    assert "no such file" in _refused(tmp_path, pattern="real-{0..1}.tar")
    assert "a training shard too" in _refused(
        tmp_path, pattern="real-0.tar", val_pattern="real-0.tar"
    )


def test_a_truncated_shard_fails_or_keeps_its_whole_samples(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    path = _write(tmp_path / "cut.tar", _samples(digits[:10], 0))
    os.truncate(path, os.path.getsize(path) // 2 + 100)
    message = _refused(tmp_path, pattern="cut.tar", channels=1, image_size=8)
    assert message.startswith("dataset.args.pattern: 'cut.tar") and "truncated" in message
    ds = _build(tmp_path, pattern="cut.tar", channels=1, image_size=8, on_corrupt="skip")
    kept = int(ds.shards.table.first[-1])
    assert 0 < kept < 10
    assert sorted(ds.batch(0, kept)[1].tolist()) == sorted(t for _, t in digits[:kept])
    (skipped,) = ds.take_skipped()
    assert skipped.startswith("cut.tar") and ds.take_skipped() == []


def test_link_members_are_refused_or_skipped_never_followed(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    with tarfile.open(tmp_path / "links.tar", "w") as tar:
        for name, data in _samples(digits[:3], 0):
            info = tarfile.TarInfo(name)
            if name == "000001.png":
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            else:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    message = _refused(tmp_path, pattern="links.tar")
    assert "'links.tar:000001.png': a symlink member" in message
    ds = _build(tmp_path, pattern="links.tar", on_corrupt="skip", channels=1, image_size=8)
    assert ds.batch(0, 2)[1].sort().values.tolist() == sorted([digits[0][1], digits[2][1]])
    assert ds.take_skipped() == ["links.tar:000001.png"]


def test_a_garbage_image_fails_naming_its_member_or_is_replaced(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    members = _samples(digits[:6], 0)
    members[6] = ("000003.png", b"\x89PNG\r\n\x1a\n" + b"not a png at all" * 10)
    _write(tmp_path / "bad.tar", members)
    args = {"pattern": "bad.tar", "channels": 1, "image_size": 8, "shuffle_window": 1}
    ds = _build(tmp_path, **args)
    with pytest.raises(InvalidSpecError) as err:
        ds.batch(0, 6)
    assert err.value.message.startswith("dataset.args.pattern: 'bad.tar:000003.png': not a")
    skip = _build(tmp_path, **args, on_corrupt="skip")
    x, y = skip.batch(0, 6)
    assert y.tolist() == [t for _, t in digits[:3]] + [digits[4][1]] + [t for _, t in digits[4:6]]
    assert torch.equal(x[3], skip.batch(4, 1)[0][0])  # position 3 served position 4's sample
    assert skip.take_skipped() == ["bad.tar:000003.png"] and skip.take_skipped() == []
    strict = _build(tmp_path, **args, on_corrupt="skip", max_skipped=0)
    with pytest.raises(InvalidSpecError, match="max_skipped: more than 0 bad"):
        strict.batch(0, 6)


def test_labels_and_member_sizes_are_bounded(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    png = digits[0][0]
    _write(tmp_path / "word.tar", [("a.png", png), ("a.cls", b"seven")])
    _write(tmp_path / "big.tar", [("a.png", png), ("a.cls", b"12")])
    _write(tmp_path / "none.tar", [("a.png", png), ("a.txt", b"1")])
    assert "'word.tar:a.cls': a label that is not an integer" in _refused(
        tmp_path, pattern="word.tar"
    )
    message = _refused(tmp_path, pattern="big.tar", num_classes=10)
    assert "'big.tar:a.cls': a label >= 10 (num_classes)" in message
    assert "without its label member" in _refused(tmp_path, pattern="none.tar")
    # An image member declaring 64 MiB + 1 (a sparse file: no 64 MiB written).
    label = tarfile.TarInfo("a.cls")
    label.size = 1
    huge = tarfile.TarInfo("a.jpg")
    huge.size = MAX_IMAGE_BYTES + 1
    with open(tmp_path / "huge.tar", "wb") as f:
        f.write(label.tobuf() + b"1".ljust(512, b"\0") + huge.tobuf())
        f.truncate(f.tell() + (huge.size + 511) // 512 * 512 + 1024)
    message = _refused(tmp_path, pattern="huge.tar")
    assert "'huge.tar:a.jpg': an image member of 64.0 MiB" in message


def test_member_names_and_tar_headers_are_bounded(
    tmp_path: Path, digits: list[tuple[bytes, int]]
) -> None:
    png = digits[0][0]
    _write(tmp_path / "long.tar", [("d/" + "n" * 1100 + ".png", png), ("x.cls", b"1")])
    assert "over 1024 characters" in _refused(tmp_path, pattern="long.tar")
    with tarfile.open(tmp_path / "pax.tar", "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a.png")
        info.size = len(png)
        info.pax_headers = {"comment": "x" * (2 * 2**20)}  # read whole by tarfile: bounded
        tar.addfile(info, io.BytesIO(png))
    assert "'pax.tar': a tar header longer than 1 MiB" in _refused(tmp_path, pattern="pax.tar")
