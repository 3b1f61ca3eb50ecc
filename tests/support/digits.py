"""Real data without a download: scikit-learn's bundled handwritten digits (1,797 8x8
images, 10 classes) written as a ``tensors`` dataset file, for the engine's and the
service's accuracy tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

DIGITS_FILE = "digits.npz"


def write_digits(root: Path) -> Path:
    """Write ``root/digits.npz`` (``x``: float32 pixels scaled to 0..1, ``y``: int64 labels)
    and return ``root``; skips the test where scikit-learn is not installed."""
    datasets = pytest.importorskip("sklearn.datasets")
    digits = datasets.load_digits()
    root.mkdir(parents=True, exist_ok=True)
    x = (digits.data / 16.0).astype(np.float32)  # pixel values 0..16
    np.savez(root / DIGITS_FILE, x=x, y=digits.target.astype(np.int64))
    return root


DIGITS_FOLDER = "digits"


def write_digit_folders(root: Path, val_every: int = 0) -> Path:
    """Write the digits as 8x8 grayscale PNG files in class folders, the layout
    ``image-folder`` reads: ``root/digits/<label>/<index>.png``, or with ``val_every`` = k
    every k-th image under ``root/digits/val/<label>/`` and the others under
    ``root/digits/train/<label>/``. Returns ``root``; skips the test where scikit-learn is
    not installed."""
    datasets = pytest.importorskip("sklearn.datasets")
    from PIL import Image

    digits = datasets.load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)  # values 0..16
    for index, (image, label) in enumerate(zip(pixels, digits.target, strict=True)):
        split = ""
        if val_every:
            split = "val" if index % val_every == 0 else "train"
        folder = root / DIGITS_FOLDER / split / str(label)
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{index:04d}.png")
    return root
