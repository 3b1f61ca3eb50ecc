"""The ``image-folder`` dataset on real images: scikit-learn's digits as PNG class folders
(labels, a deterministic eval view, a short training run through the Trainer), its two
sample photos cut into JPEG crops (the JPEG path, normalisation, exactness), and a hostile
folder (paths out of the roots, symlinks, a FIFO, a huge listing, broken and bomb images,
arguments out of bounds)."""

from __future__ import annotations

import os
import pickle
import struct
import sys
import threading
import zlib
from io import BytesIO
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
import torch

from amptrain.components import registry
from amptrain.components.file_listing import list_folder
from amptrain.contract.catalog import validate_components
from amptrain.contract.errors import InvalidSpecError
from amptrain.contract.file_datasets import MAX_FILES
from amptrain.contract.limits import MAX_IMAGE_PIXELS
from amptrain.contract.spec import ComponentRef, parse_spec
from amptrain.engine import RunContext, Trainer

datasets = pytest.importorskip("sklearn.datasets")
pytest.importorskip("torchvision")
Image = pytest.importorskip("PIL.Image")


def _build(root: Path, path: str = "data", seed: int = 0, **args: Any) -> Any:
    ref = ComponentRef(name="image-folder", args={"path": path, **args})
    return registry.build_dataset(ref, seed=seed, data_roots=[str(root)])


def _encoded(pixels: np.ndarray[Any, Any], form: str = "PNG", **options: Any) -> bytes:
    """``(C, H, W)`` uint8 pixels encoded by Pillow (not the library that decodes them)."""
    out = BytesIO()
    plane = pixels[0] if len(pixels) == 1 else pixels.transpose(1, 2, 0)
    Image.fromarray(np.ascontiguousarray(plane)).save(out, format=form, **options)
    return out.getvalue()


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``digits/<label>/<index>.png``: the 1,797 real 8x8 digits, grey PNGs."""
    root = tmp_path_factory.mktemp("digits")
    digits = datasets.load_digits()
    for i, (image, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        folder = root / "digits" / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (image * 255 / 16).round().astype(np.uint8)[None]
        (folder / f"{i:04d}.png").write_bytes(_encoded(pixels))
    return root


@pytest.fixture(scope="module")
def photos_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``photos/{train,val}/{china,flower}/*.jpg``: 32x32 crops of scikit-learn's two sample
    photographs (real JPEGs), 12 training and 4 held-out crops of each."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for name, photo in zip(("china", "flower"), datasets.load_sample_images().images, strict=True):
        for i in range(16):
            y, x = rng.integers(0, photo.shape[0] - 32), rng.integers(0, photo.shape[1] - 32)
            crop = np.ascontiguousarray(photo[y : y + 32, x : x + 32].transpose(2, 0, 1))
            folder = root / "photos" / ("train" if i < 12 else "val") / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:02d}.jpg").write_bytes(_encoded(crop, "JPEG", quality=90))
    return root


# -- real data -------------------------------------------------------------------------


def test_digit_labels_are_their_folders_and_the_eval_view_is_fixed(digits_root: Path) -> None:
    data = _build(digits_root, "digits", image_size=8, channels=1, val_fraction=0.2)
    assert data.class_names == [str(d) for d in range(10)]
    assert data.info.input_shape == (1, 8, 8) and data.info.num_classes == 10
    held = data.held_out()
    assert len(held) == 359 and len(data) == 1797 - 359
    # Each file is named by its index in scikit-learn's array: its label must be the digit.
    target = datasets.load_digits().target
    indices = []
    for split in (data.train, held.split):
        found = [int(Path(f).stem) for f in split.files]
        assert split.labels.tolist() == target[found].tolist()
        indices.append(set(found))
    assert not indices[0] & indices[1] and len(indices[0] | indices[1]) == 1797
    x, y = held.batch(0, 64)
    assert x.dtype == torch.float32 and x.shape == (64, 1, 8, 8) and y.dtype == torch.int64
    assert y.tolist() == held.split.labels[:64].tolist()
    other = _build(digits_root, "digits", seed=7, image_size=8, channels=1, val_fraction=0.2)
    assert torch.equal(x, other.held_out().batch(0, 64)[0])  # the job's seed changes nothing
    assert torch.equal(x, held.batch(0, 64)[0])
    assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0  # (v - 0.5) / 0.5


def test_digits_train_through_the_trainer_well_above_chance(digits_root: Path) -> None:
    spec = parse_spec(
        {
            "model": {"name": "mlp", "args": {"width": 64, "depth": 1}},
            "dataset": {
                "name": "image-folder",
                "args": {
                    "path": "digits",
                    "image_size": 8,
                    "channels": 1,
                    "val_fraction": 0.2,
                    "min_crop_scale": 0.5,
                },
            },
            "max_steps": 40,
            "batch_size": 32,
            "precision": "fp32",
            "device": "cpu",
            "optimizer": {"name": "adamw", "lr": 0.005},
            "schedule": {"name": "constant"},
            "eval": {"batches": 12},
        }
    )
    result = Trainer(spec, RunContext(checkpoint_dir=None, data_roots=[str(digits_root)])).train()
    assert result.eval is not None
    accuracy = result.eval["accuracy"]
    # Measured 0.63 (chance: 0.10); a broken label or image path stays near chance.
    assert accuracy is not None and accuracy > 0.35


def test_jpeg_crops_decode_and_are_normalised(photos_root: Path) -> None:
    data = _build(photos_root, "photos", image_size=28)
    assert data.class_names == ["china", "flower"] and len(data) == 24
    held = data.held_out()
    assert len(held) == 8 and held.split.files[0] == "val/china/12.jpg"
    x, y = held.batch(0, 8)
    assert x.shape == (8, 3, 28, 28) and y.tolist() == [0] * 4 + [1] * 4
    # Eval view of a 32x32 image at 28: resized to round(28 / 0.875) = 32 (unchanged), the
    # centre 28x28 kept. Pillow's own decoder must agree within JPEG decoders' rounding.
    with Image.open(photos_root / "photos/val/china/12.jpg") as image:
        pixels = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
    expected = pixels[:, 2:30, 2:30].float() / 255
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    assert torch.allclose(x[0] * std + mean, expected, atol=3 / 255)
    train_x, train_y = data.batch(0, 24)
    assert train_x.shape == (24, 3, 28, 28) and sorted(train_y.tolist()) == [0] * 12 + [1] * 12
    assert float((train_x * std + mean).min()) >= 0 and float((train_x * std + mean).max()) <= 1


def test_lossless_webp_decodes_to_its_pixels(tmp_path: Path) -> None:
    photo = datasets.load_sample_images().images[1][100:132, 200:232]  # 32x32 RGB
    for name in ("a", "b"):
        (tmp_path / "data" / name).mkdir(parents=True)
        Image.fromarray(photo).save(tmp_path / "data" / name / "0.webp", lossless=True)
    x, _ = _build(tmp_path, image_size=28, val_fraction=0.5).held_out().batch(0, 1)
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    expected = torch.from_numpy(photo[2:30, 2:30].copy()).permute(2, 0, 1).float() / 255
    assert torch.allclose(x[0] * std + mean, expected, atol=1e-6)


def test_batches_are_exact_however_the_stream_is_cut(photos_root: Path) -> None:
    data = _build(photos_root, "photos", image_size=16)
    whole = data.batch(0, 8)
    halves = [data.batch(0, 4), data.batch(4, 4)]
    assert torch.equal(whole[0], torch.cat([h[0] for h in halves]))
    assert torch.equal(whole[1], torch.cat([h[1] for h in halves]))
    # fill: two threads writing disjoint halves of one batch, as the Feeder does.
    inputs, targets = torch.empty_like(whole[0]), torch.empty_like(whole[1])
    threads = [
        threading.Thread(target=data.fill, args=(a, inputs[a : a + 4], targets[a : a + 4]))
        for a in (0, 4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert torch.equal(inputs, whole[0]) and torch.equal(targets, whole[1])
    # Resumed in a fresh (unpickled: a DataLoader's spawned worker) copy, same seed.
    again = pickle.loads(pickle.dumps(_build(photos_root, "photos", image_size=16)))
    assert torch.equal(again.batch(5, 3)[0], whole[0][5:8])
    other = _build(photos_root, "photos", seed=1, image_size=16)
    assert not torch.equal(other.batch(0, 8)[0], whole[0])
    # Each epoch is a new order of all 24 files; a file met again gets another crop.
    x, y = data.batch(0, 48)
    rows = data.order.rows(0, 48).tolist()
    assert sorted(rows[:24]) == sorted(rows[24:]) == list(range(24)) and rows[:24] != rows[24:]
    later = 24 + rows[24:].index(rows[0])
    assert y[0] == y[later] and not torch.equal(x[0], x[later])


# -- hostile ---------------------------------------------------------------------------


def _folder(root: Path, classes: int = 2, files: int = 3) -> Path:
    data = root / "data"
    digits = datasets.load_digits()
    for c in range(classes):
        (data / f"c{c}").mkdir(parents=True)
        for i in range(files):
            pixels = (digits.images[c * files + i] * 255 / 16).astype(np.uint8)[None]
            (data / f"c{c}" / f"{i}.png").write_bytes(_encoded(pixels))
    return data


def test_paths_out_of_the_roots_are_refused(tmp_path: Path) -> None:
    _folder(tmp_path / "root")
    for path in ("/etc", "../elsewhere", "data/../../x", "file:///etc", "s3://bucket/x"):
        with pytest.raises(InvalidSpecError) as err:
            _build(tmp_path / "root", path)
        assert err.value.message.startswith("dataset.args.path: ")
        assert str(tmp_path) not in err.value.message
    with pytest.raises(InvalidSpecError, match="no such folder"):
        _build(tmp_path / "root", "missing")
    with pytest.raises(InvalidSpecError, match="not a folder"):
        _build(tmp_path / "root", "data/c0/0.png")


def test_symlinks_and_fifos_in_the_folder_are_never_followed_or_opened(tmp_path: Path) -> None:
    data = _folder(tmp_path / "root")
    outside = _folder(tmp_path / "outside", classes=1, files=5) / "c0"
    (data / "c1" / "link.png").symlink_to(outside / "0.png")
    (data / "c2").symlink_to(outside, target_is_directory=True)  # a class folder elsewhere
    os.mkfifo(data / "c0" / "pipe.png")  # opening it for reading would block
    built = _build(tmp_path / "root")
    assert built.class_names == ["c0", "c1"] and len(built) == 6
    assert built.ignored == ["c0/pipe.png", "c1/link.png", "c2"]
    built.batch(0, 12)  # every file read, twice: none of them is the FIFO or a link
    # A file swapped for a FIFO after the listing: refused by its kind, never opened.
    (data / "c1" / "0.png").unlink()
    os.mkfifo(data / "c1" / "0.png")
    with pytest.raises(InvalidSpecError, match=r"'data/c1/0.png': not a regular file"):
        built.batch(0, 12)
    (data / "c1" / "0.png").unlink()  # a class folder swapped for a symlink: never followed
    (data / "c1").rename(tmp_path / "c1-moved")
    (data / "c1").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidSpecError, match="a symlink or a changing path"):
        built.batch(0, 12)


def test_a_listing_stops_at_max_files(tmp_path: Path) -> None:
    data = _folder(tmp_path, classes=4, files=10)  # 4 folders + 40 files
    with pytest.raises(InvalidSpecError) as err:
        _build(tmp_path, max_files=12)
    assert err.value.message == (
        "dataset.args.path: 'data' holds more than 12 entries (files and folders); the "
        "listing stopped there: raise dataset.args.max_files or point at a smaller folder"
    )
    # Entries looked at (each one's type asked once), counted: the bound plus one, never all.
    seen = [0]

    def count(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") == "is_dir":
            seen[0] += 1

    sys.setprofile(count)
    try:
        with pytest.raises(InvalidSpecError):
            list_folder(str(data), "", max_entries=12, field_name="f", shown="data")
    finally:
        sys.setprofile(None)
    assert seen[0] == 12
    assert len(_build(tmp_path, max_files=44)) == 40


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def test_layout_mistakes_are_named(tmp_path: Path, photos_root: Path) -> None:
    with pytest.raises(InvalidSpecError, match=r"^dataset.args.val_fraction: 'photos' has a val"):
        _build(photos_root, "photos", val_fraction=0.2)
    data = _folder(tmp_path / "split")
    (data / "train").mkdir()
    for name in ("c0", "c1"):
        (data / name).rename(data / "train" / name)
    (data / "val" / "c9").mkdir(parents=True)
    (data / "val" / "c9" / "0.png").write_bytes((data / "train/c0/0.png").read_bytes())
    with pytest.raises(InvalidSpecError) as err:
        _build(tmp_path / "split")
    assert err.value.message == (
        "dataset.args.path: val class 'c9' has no training images in 'data/train'"
    )
    one = _folder(tmp_path / "one", classes=1)
    with pytest.raises(InvalidSpecError, match="found 1 class folder, 'c0'; an image folder"):
        _build(tmp_path / "one")
    (one / "c0").rename(one / "red\x1b[31m")
    (one / "c1").mkdir()
    (one / "c1" / "0.png").write_bytes((one / "red\x1b[31m" / "0.png").read_bytes())
    with pytest.raises(InvalidSpecError, match="must not contain control"):
        _build(tmp_path / "one")


def test_a_forked_loader_worker_reads_the_same_samples(photos_root: Path) -> None:
    """What the data path does: ``batch`` in a DataLoader worker forked from this process
    (the dataset's locks and skip records are made again there)."""
    data = _build(photos_root, "photos", image_size=16)
    data.batch(0, 2)  # its locks and caches used before the fork
    loader = torch.utils.data.DataLoader(
        range(4), batch_size=None, num_workers=1, collate_fn=lambda i: data.batch(2 * i, 2)
    )
    forked = torch.cat([x for x, _ in loader])
    assert torch.equal(forked, data.batch(0, 8)[0])


def _bad_images(data: Path) -> None:
    """A JPEG cut in the middle of its scan, text named .png, and a 100-byte PNG declaring
    9000x9000 pixels (243 MB once decoded as RGB), past MAX_IMAGE_PIXELS."""
    photo = datasets.load_sample_images().images[0][:128, :128].transpose(2, 0, 1)
    jpeg = _encoded(photo, "JPEG")
    (data / "c0" / "truncated.jpg").write_bytes(jpeg[: len(jpeg) // 2])
    (data / "c1" / "garbage.png").write_bytes(b"not an image at all " * 10)
    for name, side in (("huge.png", 9000), ("huger.png", 60_000)):  # Pillow refuses the 2nd
        header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)  # 8-bit grey
        bomb = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header)
        bomb += _chunk(b"IDAT", zlib.compress(b"\x00" * (side + 1))) + _chunk(b"IEND", b"")
        (data / "c1" / name).write_bytes(bomb)


def test_bad_images_fail_naming_their_path(tmp_path: Path) -> None:
    data = _folder(tmp_path)
    _bad_images(data)
    built = _build(tmp_path, image_size=8, channels=1)
    seen = set()
    for start in range(len(built)):
        try:
            built.batch(start, 1)
        except InvalidSpecError as err:
            assert str(tmp_path) not in err.message
            problem, hint = err.message.split("; ")
            assert hint == "dataset.args.on_corrupt 'skip' uses the next sample in its place"
            seen.add(problem)
    assert seen == {
        "dataset.args.path: 'data/c0/truncated.jpg': does not decode: a truncated or corrupt image",
        "dataset.args.path: 'data/c1/garbage.png': not a JPEG, PNG or WebP image, or one "
        "whose header is cut short or corrupt "
        "(UnidentifiedImageError)",
        "dataset.args.path: 'data/c1/huge.png': declares 9000x9000 pixels, more than "
        f"{MAX_IMAGE_PIXELS}",
        f"dataset.args.path: 'data/c1/huger.png': declares more than {MAX_IMAGE_PIXELS} pixels",
    }


def test_bad_images_are_skipped_deterministically_up_to_max_skipped(tmp_path: Path) -> None:
    data = _folder(tmp_path)
    _bad_images(data)
    built = _build(tmp_path, image_size=8, channels=1, on_corrupt="skip", max_skipped=4)
    x, y = built.batch(0, 2 * len(built))
    bad = {
        f"data/{f}" for f in ("c0/truncated.jpg", "c1/garbage.png", "c1/huge.png", "c1/huger.png")
    }
    assert set(built.take_skipped()) == bad and built.take_skipped() == []
    rows = built.order.rows(0, 2 * len(built)).tolist()
    is_bad = [f"data/{built.train.files[row]}" in bad for row in rows]
    assert any(is_bad[:-3])
    for p in range(len(rows) - 3):  # a bad one is the next good position's sample, bitwise
        if is_bad[p]:
            following = next(q for q in range(p + 1, len(rows)) if not is_bad[q])
            assert torch.equal(x[p], x[following]) and y[p] == y[following]
    again = _build(tmp_path, image_size=8, channels=1, on_corrupt="skip", max_skipped=4)
    assert torch.equal(again.batch(0, 2 * len(built))[0], x)
    strict = _build(tmp_path, image_size=8, channels=1, on_corrupt="skip", max_skipped=3)
    with pytest.raises(InvalidSpecError, match=r"^dataset.args.max_skipped: more than 3 bad files"):
        strict.batch(0, 2 * len(built))


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"image_size": 4}, "image_size"),
        ({"image_size": 4096}, "image_size"),
        ({"channels": 2}, "channels"),
        ({"max_files": MAX_FILES + 1}, "max_files"),
        ({"max_files": 0}, "max_files"),
        ({"min_crop_scale": 0.0}, "min_crop_scale"),
        ({"min_crop_scale": 1.5}, "min_crop_scale"),
        ({"val_fraction": 0.9}, "val_fraction"),
        ({"on_corrupt": "ignore"}, "on_corrupt"),
        ({"max_skipped": 10**9}, "max_skipped"),
        ({"path": "x" * 2000}, "path"),
    ],
)
def test_arguments_out_of_bounds_are_refused_at_submit(args: dict[str, Any], field: str) -> None:
    spec = parse_spec(
        {
            "model": {"name": "cnn"},
            "dataset": {"name": "image-folder", "args": {"path": "images", **args}},
            "max_steps": 1,
        }
    )
    assert [e["loc"] for e in validate_components(spec)] == [["dataset", "args", field]]
