"""torchvision and timm image classifiers, built untrained for a dataset's images.

Declared (names, arguments, sizes, the image shapes each takes) in
``amptrain.contract.zoo_vision``; the registry checks a spec against that declaration
(``Registration.fits`` included) before it calls a builder here. Never pretrained:
workers have no network, and a spec names no weights here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from amptrain.components.base import DataInfo
from amptrain.contract.zoo_vision import TORCHVISION_ARCHS, vit_patch


def build_torchvision(info: DataInfo, *, arch: str) -> nn.Module:
    """``torchvision.models.get_model(arch)`` with ``info``'s classes (ViTs: its image side)."""
    import torchvision  # only on workers that train one (an optional dependency)

    extra: dict[str, Any] = {"image_size": info.input_shape[1]} if vit_patch(arch) else {}

    def make() -> nn.Module:
        model: nn.Module = torchvision.models.get_model(
            arch, weights=None, num_classes=info.num_classes, **extra
        )
        return model

    if arch.startswith("regnet_") and torch.get_default_device().type == "meta":
        # RegNet computes its stage widths with tensors and reads them back, which the meta
        # device (the engine's memory estimate, the size tests) cannot: build it on the CPU
        # (a few million parameters) and move it.
        with torch.device("cpu"):
            return make().to("meta")
    return make()


class _TorchvisionBuilders:
    """``torchvision_models.resnet18``: the builder of one curated architecture, so each
    catalog entry names its builder as a lazy ``module:attribute`` string."""

    def __getattr__(self, arch: str) -> Callable[..., nn.Module]:
        if arch not in TORCHVISION_ARCHS:
            raise AttributeError(arch)

        def build(info: DataInfo) -> nn.Module:  # the signature the catalog declares: no args
            return build_torchvision(info, arch=arch)

        return build


torchvision_models = _TorchvisionBuilders()


def build_timm(
    info: DataInfo, arch: str = "resnet18", drop_rate: float = 0.0, drop_path_rate: float = 0.0
) -> nn.Module:
    """``timm.create_model(arch)`` for ``info``'s channels and classes (ViTs: its image size)."""
    import timm  # only on workers that train one (an optional dependency)

    channels, height, width = info.input_shape
    extra: dict[str, Any] = {"img_size": (height, width)} if vit_patch(arch) else {}
    model: nn.Module = timm.create_model(
        arch,
        pretrained=False,
        num_classes=info.num_classes,
        in_chans=channels,
        drop_rate=drop_rate,
        drop_path_rate=drop_path_rate,
        **extra,
    )
    return model
