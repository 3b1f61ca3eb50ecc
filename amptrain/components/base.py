"""The types every dataset and model agree on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch

Task = Literal["classification", "language_model"]


@dataclass(frozen=True)
class DataInfo:
    """What a dataset yields, so a model can size its input and output layers."""

    task: Task
    input_shape: tuple[int, ...]
    """Per-sample shape: ``(features,)``, ``(C, H, W)`` or ``(seq_len,)``."""
    num_classes: int
    """Classes, or vocabulary size for language models."""
    vocab_size: int | None = None
    """Classification of token-id sequences (kind ``sequences``): the vocabulary of the
    inputs, whose shape is then ``(seq_len,)``. None for every other dataset."""

    @property
    def kind(self) -> str:
        """The catalog's data kind: ``tokens``, ``sequences``, ``images`` or ``vectors``."""
        if self.task == "language_model":
            return "tokens"
        if self.vocab_size is not None:
            return "sequences"
        return "images" if len(self.input_shape) == 3 else "vectors"

    @property
    def token_inputs(self) -> bool:
        """Whether the inputs are token ids (int64), not values."""
        return self.kind in ("tokens", "sequences")


@runtime_checkable
class Dataset(Protocol):
    """An endless, deterministic stream of samples."""

    info: DataInfo

    def batch(self, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``[start, start + size)`` of a stream fully determined by the seed (CPU
        tensors). Position is counted in samples so exact resume and micro-batch halving work."""
        ...
