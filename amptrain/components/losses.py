"""Losses per task, computed in an fp32 island.

On CPU, autocast leaves ``cross_entropy``/``log_softmax`` in the low-precision
dtype (on CUDA it upcasts them); a bf16 log-softmax over a large vocabulary is
visibly wrong. So the loss always runs with autocast off on fp32 logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from amptrain.components.base import DataInfo

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def classification_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    with torch.autocast(logits.device.type, enabled=False):
        return F.cross_entropy(logits.float(), targets)


def language_model_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position of every sequence."""
    with torch.autocast(logits.device.type, enabled=False):
        return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


def loss_for(info: DataInfo) -> LossFn:
    """The loss for the dataset's task: ``(logits, targets) -> mean loss`` (fp32 scalar)."""
    return language_model_loss if info.task == "language_model" else classification_loss
