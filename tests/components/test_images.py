"""The one image decoding and transform module every image dataset uses: its crop is
torchvision's own, its decoder refuses what it must (animations, oversized data) and
turns photos upright, and torchvision's deprecation warning does not reach the caller."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

from amptrain.contract.limits import MAX_IMAGE_BYTES

images = pytest.importorskip("amptrain.components.images")
T = pytest.importorskip("torchvision.transforms.v2")
Image = pytest.importorskip("PIL.Image")
datasets = pytest.importorskip("sklearn.datasets")


def _jpeg(pixels: np.ndarray, **options: object) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", **options)
    return out.getvalue()


@pytest.mark.parametrize(
    ("height", "width", "scale"),
    [(32, 48, (0.08, 1.0)), (427, 640, (0.5, 1.0)), (8, 200, (0.9, 1.0)), (200, 9, (0.6, 1.0))],
)
def test_crop_box_is_torchvisions_random_resized_crop(
    height: int, width: int, scale: tuple[float, float]
) -> None:
    """The same draws as ``RandomResizedCrop.get_params`` from a generator seeded alike
    (the last two shapes are too narrow for most draws: its central-crop fallback)."""
    image = torch.zeros(1, height, width)
    for seed in range(50):
        torch.manual_seed(seed)
        expected = T.RandomResizedCrop.get_params(image, list(scale), [3 / 4, 4 / 3])
        got = images.crop_box(height, width, torch.Generator().manual_seed(seed), scale)
        assert got == tuple(expected), seed


def test_decode_turns_photos_upright_and_refuses_animations_and_oversized_data() -> None:
    photo = datasets.load_sample_images().images[0][:24, :40]  # 24 high, 40 wide
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to view
    upright = images.decode(_jpeg(photo, exif=exif.tobytes()), 3)
    assert upright.shape == (3, 40, 24) and upright.dtype == torch.uint8
    assert images.decode(_jpeg(photo), 1).shape == (1, 24, 40)
    frames = [Image.fromarray(photo), Image.fromarray(photo[::-1].copy())]
    out = io.BytesIO()
    frames[0].save(out, format="PNG", save_all=True, append_images=frames[1:])
    with pytest.raises(images.BadImage, match="an animation of 2 frames"):
        images.decode(out.getvalue(), 3)
    with pytest.raises(images.BadImage, match=r"more than 64.0 MiB"):
        images.decode(bytes(MAX_IMAGE_BYTES + 1), 3)


def test_decoding_shows_no_deprecation_warning_and_leaves_the_filters_as_they_were() -> None:
    data = _jpeg(datasets.load_sample_images().images[1][:16, :16])
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        before = list(warnings.filters)
        images.decode(data, 3)
        assert warnings.filters == before
    assert [str(w.message) for w in seen] == []
