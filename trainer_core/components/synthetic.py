"""Synthetic datasets with learnable structure: offline, deterministic, any size.

``data_seed`` fixes the task (the teacher network, the class patterns, the
Markov chain); the job's ``seed`` fixes which samples come in which order. Each
``batch(start, size)`` is a pure function of both and the sample indices.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from trainer_core.components.base import DataInfo
from trainer_core.components.sampling import EpochOrder, generator


class PoolDataset:
    """A fixed pool of samples served in a fresh seeded order every epoch."""

    def __init__(self, info: DataInfo, inputs: torch.Tensor, targets: torch.Tensor, seed: int):
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
        self.info = info
        self.inputs = inputs
        self.targets = targets
        self.order = EpochOrder(len(inputs), seed)

    def __len__(self) -> int:
        return len(self.inputs)

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.order.rows(start, size)
        return self.inputs[rows], self.targets[rows]


def build_synthetic_classification(
    *,
    seed: int,
    data_roots: Sequence[str] = (),
    features: int = 32,
    classes: int = 10,
    num_samples: int = 8192,
    data_seed: int = 0,
) -> PoolDataset:
    """Gaussian vectors labelled by a fixed random teacher: ``argmax(tanh(x W1) W2)``."""
    g = generator(data_seed, 0xC1A5)
    hidden = 2 * features
    w1 = torch.randn(features, hidden, generator=g) / features**0.5
    w2 = torch.randn(hidden, classes, generator=g) / hidden**0.5
    x = torch.randn(num_samples, features, generator=g)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return PoolDataset(DataInfo("classification", (features,), classes), x, y, seed)


class SyntheticImages:
    """Every sample made from its index: a class pattern, shifted at random, plus noise.

    The patterns are smooth random fields (low-resolution noise upsampled), one per
    class, so a CNN must recognise local texture wherever the shift put it.
    """

    def __init__(
        self,
        *,
        seed: int,
        channels: int,
        height: int,
        width: int,
        classes: int,
        noise: float,
        data_seed: int,
    ):
        self.info = DataInfo("classification", (channels, height, width), classes)
        self.seed = seed
        self.data_seed = data_seed
        self.noise = noise
        g = generator(data_seed, 0x1A6E)
        coarse = torch.randn(classes, channels, 4, 4, generator=g)
        fine = torch.randn(classes, channels, 8, 8, generator=g) * 0.5
        patterns = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
        patterns += F.interpolate(fine, size=(height, width), mode="bilinear", align_corners=False)
        mean = patterns.mean(dim=(1, 2, 3), keepdim=True)
        std = patterns.std(dim=(1, 2, 3), keepdim=True)
        self.patterns = (patterns - mean) / std
        self.max_shift = (max(1, height // 8), max(1, width // 8))

    def sample(self, index: int) -> tuple[torch.Tensor, int]:
        g = generator(self.seed, self.data_seed, index)
        label = int(torch.randint(self.info.num_classes, (1,), generator=g))
        sy, sx = (int(torch.randint(-m, m + 1, (1,), generator=g)) for m in self.max_shift)
        image = torch.roll(self.patterns[label], shifts=(sy, sx), dims=(1, 2))
        if self.noise:
            image = image + self.noise * torch.randn(image.shape, generator=g)
        return image, label

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        c, h, w = self.info.input_shape
        images = torch.empty(size, c, h, w)
        labels = torch.empty(size, dtype=torch.long)
        for j in range(size):
            images[j], labels[j] = self.sample(start + j)
        return images, labels


def build_synthetic_images(
    *,
    seed: int,
    data_roots: Sequence[str] = (),
    channels: int = 3,
    height: int = 32,
    width: int = 32,
    classes: int = 10,
    noise: float = 0.5,
    data_seed: int = 0,
) -> SyntheticImages:
    return SyntheticImages(
        seed=seed,
        channels=channels,
        height=height,
        width=width,
        classes=classes,
        noise=noise,
        data_seed=data_seed,
    )


def markov_chain(vocab_size: int, branching: int, data_seed: int) -> torch.Tensor:
    """A (vocab, vocab) transition matrix where each token has ``branching`` successors."""
    g = generator(data_seed, 0x7E47)
    k = min(branching, vocab_size)
    successors = torch.stack(
        [torch.randperm(vocab_size, generator=g)[:k] for _ in range(vocab_size)]
    )
    weights = torch.rand(vocab_size, k, generator=g) + 0.5
    probs = torch.zeros(vocab_size, vocab_size)
    probs.scatter_(1, successors, weights / weights.sum(dim=1, keepdim=True))
    return probs


def build_synthetic_text(
    *,
    seed: int,
    data_roots: Sequence[str] = (),
    vocab_size: int = 64,
    seq_len: int = 32,
    branching: int = 2,
    num_samples: int = 4096,
    data_seed: int = 0,
) -> PoolDataset:
    """Sequences walked through a fixed random Markov chain; targets are the next tokens."""
    probs = markov_chain(vocab_size, branching, data_seed)
    g = generator(data_seed, 0x5EC5)
    tokens = torch.empty(num_samples, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab_size, (num_samples,), generator=g)
    for t in range(seq_len):
        tokens[:, t + 1] = torch.multinomial(probs[tokens[:, t]], 1, generator=g).squeeze(1)
    info = DataInfo("language_model", (seq_len,), vocab_size)
    return PoolDataset(info, tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous(), seed)
