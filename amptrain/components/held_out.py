"""Held-out splits: the samples a job evaluates on, never trained on.

A dataset offers one through its optional ``held_out()`` method (None: it has none).
Two shapes cover the built-ins:

- :class:`HeldOutPool`, a finite pool read in a fixed order (no epochs, no shuffling):
  the synthetic vector and text datasets draw its rows from the same generator right
  after their training rows, and ``tensors`` takes a second file or a seeded fraction
  of the first, which the training split then excludes.
- :class:`IndexRange`, for datasets that make each sample from its index
  (``synthetic-images``): held-out sample ``j`` is stream index ``HELD_OUT_START + j``,
  a range training never reaches (its positions are bounded far below, see
  :data:`HELD_OUT_START`), made by the same generator so the task is the same.

Either one is read through ``batch(start, size)``; a finite one also has ``len()``,
and evaluation never reads past it.
"""

from __future__ import annotations

from typing import Any

import torch

from amptrain.components.base import DataInfo

HELD_OUT_START = 1 << 62
"""First stream index of an index-made dataset's held-out range. Training reads positions
below ``max_steps * batch_size``, which the spec's bounds keep far under 2**62."""


class HeldOutPool:
    """A fixed set of samples, ``batch(start, size)`` giving rows ``[start, start + size)``."""

    def __init__(self, info: DataInfo, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        if len(inputs) != len(targets) or len(inputs) == 0:
            raise ValueError(f"{len(inputs)} held-out inputs and {len(targets)} targets")
        self.info = info
        self.inputs = inputs
        self.targets = targets

    def __len__(self) -> int:
        return len(self.inputs)

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if start < 0 or start + size > len(self):
            raise IndexError(f"held-out rows [{start}, {start + size}) of {len(self)}")
        return self.inputs[start : start + size], self.targets[start : start + size]


class IndexRange:
    """The held-out range of a dataset whose samples are pure functions of their index."""

    def __init__(self, dataset: Any, start: int = HELD_OUT_START) -> None:
        self.dataset = dataset
        self.info = dataset.info
        self.start = start

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.dataset.batch(self.start + start, size)


def held_out_of(dataset: Any) -> Any | None:
    """The dataset's held-out split, or None when it offers none (the method is optional)."""
    method = getattr(dataset, "held_out", None)
    return method() if callable(method) else None
