"""Decoding one image member of a ``webdataset`` shard into a normalised training or
evaluation image (see :mod:`amptrain.components.webdataset`)."""

from __future__ import annotations

import io
import math

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as TF

from amptrain.contract.tar_shards import MAX_PIXELS

_MEAN, _STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Corrupt(Exception):
    """A member that does not decode; the message says why (never its bytes)."""


def decode(
    data: bytes, channels: int, size: int, draws: list[int] | None, min_scale: float = 0.08
) -> torch.Tensor:
    """A ``(channels, size, size)`` float32 image, normalised: random-resized crop (area
    ``min_scale``-1 of the image) + flip from ``draws`` (5 values), or resize + centre crop
    when ``draws`` is None."""
    try:
        # Pillow reads the header only (torchvision.io has no such call): a small member
        # that would inflate into gigabytes is refused before a pixel is decoded.
        with Image.open(io.BytesIO(data)) as probe:
            width, height = probe.size
        if width * height > MAX_PIXELS:
            raise Corrupt(f"declares {width}x{height} pixels; at most {MAX_PIXELS:,} are decoded")
        mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
        img = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=mode)
        if img.ndim != 3:  # an animation's frames
            raise Corrupt(f"{img.shape[0]} frames, not one image")
    except Corrupt:
        raise
    except (OSError, RuntimeError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise Corrupt(f"not a decodable image ({type(exc).__name__})") from None
    if draws is None:
        img = TF.center_crop(TF.resize(img, [size], antialias=True), [size, size])
    else:  # RandomResizedCrop's parameters, from the position's draws, not the global RNG
        h, w = img.shape[-2:]
        area = h * w * (min_scale + (1 - min_scale) * draws[0] / 2**32)
        ratio = math.exp(math.log(3 / 4) + math.log(16 / 9) * draws[1] / 2**32)
        cw = min(w, max(1, round(math.sqrt(area * ratio))))
        ch = min(h, max(1, round(math.sqrt(area / ratio))))
        top, left = (draws[2] * (h - ch + 1)) >> 32, (draws[3] * (w - cw + 1)) >> 32
        img = TF.resized_crop(img, top, left, ch, cw, [size, size], antialias=True)
        if draws[4] & 1:
            img = TF.horizontal_flip(img)
    mean = _MEAN if channels == 3 else (sum(_MEAN) / 3,)
    std = _STD if channels == 3 else (sum(_STD) / 3,)
    return TF.normalize(TF.to_dtype(img, torch.float32, scale=True), list(mean), list(std))
