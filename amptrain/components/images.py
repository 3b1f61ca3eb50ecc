"""One encoded image to a training or evaluation tensor: the one definition every image
dataset (``image-folder``, ``webdataset``, ``parquet``) uses.

- :func:`decode`: the declared size is read from the header by Pillow (which decodes
  nothing on ``open``) and checked against :data:`MAX_IMAGE_PIXELS` *before* decoding (a
  100-byte PNG can declare 7.5 GB of pixels); then ``torchvision.io.decode_image``
  (libjpeg-turbo, libpng, libwebp) to RGB or grey, EXIF orientation applied, one frame.
- :func:`train_view`: a random-resized crop (torchvision's ``RandomResizedCrop``, scale
  ``(min_crop_scale, 1)``) and a horizontal flip whose parameters come from the sample
  position's own generator, never a global one; :func:`eval_view`: the shorter side resized
  to ``size / 0.875`` and the centre ``size`` square (ImageNet's 256 -> 224). Both by
  ``torchvision.transforms.v2.functional``, then :func:`normalise`.
"""

from __future__ import annotations

import io
import math
import warnings

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as F

from amptrain.contract.limits import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS
from amptrain.contract.sizing import format_bytes

EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp")
"""File names an image may have (``image-folder`` lists only these)."""
FORMATS = ("JPEG", "PNG", "WEBP")
"""What Pillow's header probe accepts (and torchvision decodes)."""
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
GREY_MEAN, GREY_STD = (0.5,), (0.5,)  # to [-1, 1], as torchvision's grey examples do
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
EVAL_CROP = 0.875  # the share of the resized image the centre crop keeps (ImageNet's 224/256)
_DEPRECATED = "The image decoding and encoding capabilities of TorchVision are deprecated"


class BadImage(Exception):
    """Data that cannot be used as an image; the message says why (never its content)."""


def decode(data: bytes | bytearray, channels: int) -> torch.Tensor:
    """``data`` (an encoded JPEG, PNG or WebP) as uint8 ``(channels, H, W)``;
    :class:`BadImage` when it is not one, is animated, or is over the limits."""
    if len(data) > MAX_IMAGE_BYTES:
        raise BadImage(f"{format_bytes(len(data))}, more than {format_bytes(MAX_IMAGE_BYTES)}")
    try:
        # Header only: Pillow reads the size and decodes nothing until asked.
        with Image.open(io.BytesIO(data), formats=FORMATS) as probe:
            width, height = probe.size
            # A JPEG's MPO extras (a phone's depth map, a preview) are not an animation:
            # torchvision decodes its primary picture.
            frames = getattr(probe, "n_frames", 1) if probe.format != "MPO" else 1
    except Image.DecompressionBombError:
        raise BadImage(f"declares more than {MAX_IMAGE_PIXELS} pixels") from None
    except Exception as exc:  # Pillow raises many kinds for a broken header
        raise BadImage(
            f"not a JPEG, PNG or WebP image, or one whose header is cut short or corrupt "
            f"({type(exc).__name__})"
        ) from None
    if width * height > MAX_IMAGE_PIXELS:
        raise BadImage(f"declares {width}x{height} pixels, more than {MAX_IMAGE_PIXELS}")
    if frames != 1:
        raise BadImage(f"an animation of {frames} frames, not one image")
    mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
    encoded = torch.frombuffer(
        bytearray(data) if isinstance(data, bytes) else data, dtype=torch.uint8
    )
    try:
        with warnings.catch_warnings():
            # torchvision 0.29 deprecates its decoders for TorchCodec's on every call, but
            # torchcodec needs torch>=2.11 and amptrain supports torch>=2.9, so this stays.
            # Only that warning is silenced. catch_warnings swaps the process's filter
            # list: threads decoding at once may at worst let one such warning through or
            # leave this one filter in place, both harmless.
            warnings.filterwarnings("ignore", _DEPRECATED, DeprecationWarning)
            return decode_image(encoded, mode=mode, apply_exif_orientation=True)
    except RuntimeError:  # libjpeg/libpng/libwebp: truncated or corrupt data
        raise BadImage("does not decode: a truncated or corrupt image") from None


def crop_box(
    height: int, width: int, g: torch.Generator, scale: tuple[float, float] = CROP_SCALE
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a random-resized crop: torchvision's
    ``RandomResizedCrop.get_params`` (area in ``scale``, log-uniform aspect ratio in
    ``CROP_RATIO``, ten tries, else the central crop of the nearest allowed ratio), its
    draws taken from ``g`` instead of the global generator, so a sample depends only on
    its own position and the data-loading threads never share random state."""
    area = height * width
    low, high = math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])
    for _ in range(10):
        target = area * float(torch.empty(()).uniform_(*scale, generator=g))
        ratio = math.exp(float(torch.empty(()).uniform_(low, high, generator=g)))
        w = round(math.sqrt(target * ratio))
        h = round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (), generator=g))
            left = int(torch.randint(0, width - w + 1, (), generator=g))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < CROP_RATIO[0]:
        w, h = width, round(width / CROP_RATIO[0])
    elif in_ratio > CROP_RATIO[1]:
        h, w = height, round(height * CROP_RATIO[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def train_view(
    image: torch.Tensor, g: torch.Generator, size: int, min_crop_scale: float, channels: int
) -> torch.Tensor:
    """A random-resized crop (area ``min_crop_scale`` to 1 of the image, then ``size``
    square) and a horizontal flip, drawn from ``g`` alone; float32, normalised."""
    top, left, h, w = crop_box(image.shape[-2], image.shape[-1], g, (min_crop_scale, 1.0))
    out = F.resized_crop(image, top, left, h, w, [size, size], antialias=True)
    if bool(torch.rand((), generator=g) < 0.5):
        out = F.horizontal_flip(out)
    return normalise(out, channels)


def eval_view(image: torch.Tensor, size: int, channels: int) -> torch.Tensor:
    """The shorter side resized to ``size / 0.875``, the centre ``size`` square; float32,
    normalised."""
    resized = F.resize(image, [round(size / EVAL_CROP)], antialias=True)
    return normalise(F.center_crop(resized, [size, size]), channels)


def normalise(image: torch.Tensor, channels: int) -> torch.Tensor:
    """uint8 to float32 in [0, 1], then ImageNet's mean and std (RGB) or 0.5 and 0.5 (grey)."""
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else (GREY_MEAN, GREY_STD)
    return F.normalize(F.to_dtype(image, torch.float32, scale=True), list(mean), list(std))
