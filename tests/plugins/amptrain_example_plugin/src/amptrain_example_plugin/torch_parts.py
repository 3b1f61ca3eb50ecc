"""The plugin's torch code: a model builder and a dataset following amptrain's contracts."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from amptrain.components.base import DataInfo
from amptrain.components.sampling import generator


def build_logreg(info: DataInfo, bias: bool = True) -> nn.Module:
    """Model builders get the dataset's DataInfo plus their declared arguments."""
    features = 1
    for size in info.input_shape:
        features *= size
    return nn.Sequential(nn.Flatten(), nn.Linear(features, info.num_classes, bias=bias))


TRAIN_KEY, HELD_OUT_KEY = 0, 1


class Blobs:
    """``batch(start, size)`` must depend only on the seed and the sample indices: here every
    sample comes from a generator keyed by (seed, index)."""

    def __init__(self, seed: int, features: int, classes: int, spread: float) -> None:
        self.info = DataInfo("classification", (features,), classes)
        self.seed = seed
        self.spread = spread
        self.centres = torch.randn(classes, features, generator=generator(1234)) * 2
        self.key = TRAIN_KEY

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        for index in range(start, start + size):
            g = generator(self.seed, index, self.key)
            label = int(torch.randint(self.info.num_classes, (1,), generator=g))
            noise = torch.randn(self.info.input_shape, generator=g)
            xs.append(self.centres[label] + self.spread * noise)
            ys.append(label)
        return torch.stack(xs), torch.tensor(ys)

    def held_out(self) -> Blobs:
        """Optional: the held-out split. Here the same blobs under another generator key,
        so no held-out sample is ever one of the training stream's."""
        held = Blobs(self.seed, self.info.input_shape[0], self.info.num_classes, self.spread)
        held.key = HELD_OUT_KEY
        return held


def build_blobs(
    *,
    seed: int,
    data_roots: Sequence[str] = (),
    features: int = 2,
    classes: int = 3,
    spread: float = 0.3,
) -> Blobs:
    """Dataset builders get the job seed and the allowed data roots plus their arguments."""
    return Blobs(seed, features, classes, spread)


def brier_score(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Metric functions get fp32 logits and the targets and return one value per sample:
    here the squared distance between the predicted distribution and the one-hot label."""
    probabilities = logits.softmax(-1)
    one_hot = nn.functional.one_hot(targets, probabilities.shape[-1]).to(probabilities.dtype)
    return (probabilities - one_hot).pow(2).sum(-1)
