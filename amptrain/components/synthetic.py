"""Synthetic datasets with learnable structure: offline, deterministic, any size.

``data_seed`` fixes the task (the teacher network, the class patterns, the
Markov chain); the job's ``seed`` fixes which samples come in which order. The vector and
text pools hold a held-out split too (``held_out()``): ``held_out_size(num_samples)`` more
rows drawn from the same generator right after the training rows (so the same teacher or
chain), read in a fixed order and never served by ``batch``. Each
``batch(start, size)`` is a pure function of both and the sample indices, and so is
``fill(start, inputs, targets)``, which writes the same samples into tensors the engine
provides (reused, pinned host buffers on CUDA). Here: the vector and text datasets, served
from a fixed pool; ``synthetic-images`` makes each sample from its index
(:mod:`amptrain.components.synthetic_images`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

from amptrain.components.base import DataInfo
from amptrain.components.held_out import HeldOutPool
from amptrain.components.sampling import EpochOrder, generator
from amptrain.contract.sizing import held_out_size


class PoolDataset:
    """A fixed pool of samples served in a fresh seeded order every epoch."""

    def __init__(
        self,
        info: DataInfo,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        seed: int,
        held: HeldOutPool | None = None,
    ):
        if len(inputs) != len(targets):
            raise ValueError(f"{len(inputs)} inputs but {len(targets)} targets")
        self.info = info
        self.inputs = inputs
        self.targets = targets
        self.order = EpochOrder(len(inputs), seed)
        self._order_lock = threading.Lock()  # EpochOrder caches permutations: one user at a time
        self.held = held

    def held_out(self) -> HeldOutPool | None:
        """The held-out split (rows kept apart from the pool), or None."""
        return self.held

    def __len__(self) -> int:
        return len(self.inputs)

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.order.rows(start, size)
        return self.inputs[rows], self.targets[rows]

    def fill(self, start: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Samples ``[start, start + len(inputs))`` written into ``inputs`` and ``targets``."""
        with self._order_lock:
            rows = self.order.rows(start, len(inputs)).numpy()
        np.take(self.inputs.numpy(), rows, axis=0, out=inputs.numpy())
        np.take(self.targets.numpy(), rows, axis=0, out=targets.numpy())


def build_synthetic_classification(
    *,
    seed: int,
    data_roots: Sequence[str] = (),
    features: int = 32,
    classes: int = 10,
    num_samples: int = 8192,
    data_seed: int = 0,
    feature_scale: float = 1.0,
) -> PoolDataset:
    """Gaussian vectors labelled by a fixed random teacher: ``argmax(tanh(x W1) W2)``, the
    vectors then multiplied by ``feature_scale``."""
    g = generator(data_seed, 0xC1A5)
    hidden = 2 * features
    w1 = torch.randn(features, hidden, generator=g) / features**0.5
    w2 = torch.randn(hidden, classes, generator=g) / hidden**0.5
    x = torch.randn(num_samples, features, generator=g)
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    # Drawn after the training rows, so those stay exactly what they were before the split.
    held_x = torch.randn(held_out_size(num_samples), features, generator=g)
    held_y = (torch.tanh(held_x @ w1) @ w2).argmax(dim=1)
    info = DataInfo("classification", (features,), classes)
    x, held_x = x * feature_scale, held_x * feature_scale
    return PoolDataset(info, x, y, seed, HeldOutPool(info, held_x, held_y))


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
    tokens = _walk(probs, num_samples, seq_len, g)
    held = _walk(probs, held_out_size(num_samples), seq_len, g)  # after: training rows unchanged
    info = DataInfo("language_model", (seq_len,), vocab_size)
    return PoolDataset(
        info,
        tokens[:, :-1].contiguous(),
        tokens[:, 1:].contiguous(),
        seed,
        HeldOutPool(info, held[:, :-1].contiguous(), held[:, 1:].contiguous()),
    )


def _walk(probs: torch.Tensor, n: int, seq_len: int, g: torch.Generator) -> torch.Tensor:
    """``n`` walks of ``seq_len + 1`` tokens through the chain ``probs``."""
    tokens = torch.empty(n, seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(len(probs), (n,), generator=g)
    for t in range(seq_len):
        tokens[:, t + 1] = torch.multinomial(probs[tokens[:, t]], 1, generator=g).squeeze(1)
    return tokens
