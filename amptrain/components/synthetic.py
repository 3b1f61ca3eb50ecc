"""Synthetic datasets with learnable structure: offline, deterministic, any size.

``data_seed`` fixes the task (the teacher network, the class patterns, the
Markov chain); the job's ``seed`` fixes which samples come in which order. Each
``batch(start, size)`` is a pure function of both and the sample indices.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from amptrain.components.base import DataInfo
from amptrain.components.sampling import BufferPool, EpochOrder, below, generator, index_draws


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
    class, so a CNN must recognise local texture wherever the shift put it. They are
    stored wrap-padded by the largest shift, so a shifted pattern (``torch.roll``) is a
    crop; the noise is a crop, at a random offset, of one field of a fixed bank of
    Gaussian fields. A sample's label, shift, noise field and noise offset come from
    :func:`~amptrain.components.sampling.index_draws`: a whole batch is drawn in a
    few tensor ops, and a sample is the same whatever batch it is drawn in.

    :meth:`batch` builds a batch on the host (one fused add per image into the output);
    :meth:`batch_on` builds it directly on a training device (two gathers and an add),
    so a GPU never waits for the host to make images or copy them.
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
        self.max_shift = (max(1, height // 8), max(1, width // 8))
        g = generator(data_seed, 0x1A6E)
        coarse = torch.randn(classes, channels, 4, 4, generator=g)
        fine = torch.randn(classes, channels, 8, 8, generator=g) * 0.5
        patterns = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
        patterns += F.interpolate(fine, size=(height, width), mode="bilinear", align_corners=False)
        mean = patterns.mean(dim=(1, 2, 3), keepdim=True)
        std = patterns.std(dim=(1, 2, 3), keepdim=True)
        self.padded = _wrap_pad((patterns - mean) / std, *self.max_shift)
        field = self.padded.shape[1:]
        # Many fields for small images, a few for large ones: about 16 MiB of noise.
        fields = max(8, min(256, 2**22 // math.prod(field)))
        self.bank = torch.randn(fields, *field, generator=generator(data_seed, 0xB4A7))
        self._resident: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
        self._buffers = BufferPool()

    def _draws(self, indices: torch.Tensor) -> list[torch.Tensor]:
        """Per sample: label, pattern offset (y, x), noise field, noise offset (y, x)."""
        my, mx = self.max_shift
        d = index_draws(indices, 6, self.seed, self.data_seed, 0x1A6E5)
        limits = (
            self.info.num_classes,
            2 * my + 1,
            2 * mx + 1,
            len(self.bank),
            2 * my + 1,
            2 * mx + 1,
        )
        return [below(d[:, i], n) for i, n in enumerate(limits)]

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        c, h, w = self.info.input_shape
        labels, *offsets = self._draws(torch.arange(start, start + size))
        images = self._buffers.empty(size, c, h, w)
        rows = zip(labels.tolist(), *(o.tolist() for o in offsets), strict=True)
        for j, (label, oy, ox, field, ny, nx) in enumerate(rows):
            pattern = self.padded[label, :, oy : oy + h, ox : ox + w]
            if self.noise:
                noise = self.bank[field, :, ny : ny + h, nx : nx + w]
                torch.add(pattern, noise, alpha=self.noise, out=images[j])
            else:
                images[j].copy_(pattern)
        return images, labels

    def batch_on(
        self, start: int, size: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`batch`, built on ``device`` (the patterns and the noise bank are copied
        there once)."""
        if device.type == "cpu":
            return self.batch(start, size)
        return self.gathered(start, size, device)

    def gathered(
        self, start: int, size: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The device path: the same samples as :meth:`batch`, by indexing instead of a loop."""
        padded, bank = self._on(device)
        c, h, w = self.info.input_shape
        labels, oy, ox, field, ny, nx = self._draws(
            torch.arange(start, start + size, device=device)
        )
        ch = torch.arange(c, device=device)[None, :, None, None]
        ys = torch.arange(h, device=device)[None, None, :, None]
        xs = torch.arange(w, device=device)[None, None, None, :]

        def crop(
            source: torch.Tensor, which: torch.Tensor, y: torch.Tensor, x: torch.Tensor
        ) -> torch.Tensor:
            return source[
                which[:, None, None, None],
                ch,
                y[:, None, None, None] + ys,
                x[:, None, None, None] + xs,
            ]

        images = crop(padded, labels, oy, ox)
        if self.noise:
            images.add_(crop(bank, field, ny, nx), alpha=self.noise)
        return images, labels

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in self._resident:
            self._resident[device] = (self.padded.to(device), self.bank.to(device))
        return self._resident[device]


def _wrap_pad(x: torch.Tensor, my: int, mx: int) -> torch.Tensor:
    """Pad the last two dims by wrapping around, so a crop at ``(my - sy, mx - sx)`` equals
    ``torch.roll(x, (sy, sx), dims=(-2, -1))``."""
    x = torch.cat([x[..., -my:, :], x, x[..., :my, :]], dim=-2)
    return torch.cat([x[..., -mx:], x, x[..., :mx]], dim=-1).contiguous()


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
