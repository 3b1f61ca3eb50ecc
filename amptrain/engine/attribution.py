"""Telemetry's side of overflow attribution (fp16): each step's
:class:`~amptrain.engine.amp_step.Overflow` rides in the flush's one read as two extra
device values (:data:`~amptrain.engine.step_records.ATTRIBUTION_SLOTS`); once read, only
the skipped steps' are kept (:class:`~amptrain.engine.step_records.Skip`), named in their
``warning`` event and counted per parameter."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import torch

from amptrain.engine.amp_step import Overflow
from amptrain.engine.step_records import ATTRIBUTION_SLOTS, Skip


class Attribution:
    """The skipped steps read but not yet published, and the counts of those published."""

    def __init__(self, enabled: bool) -> None:
        self.slots: tuple[str, ...] = ATTRIBUTION_SLOTS if enabled else ()
        """What each step adds to the device values (nothing without a scaler)."""
        self.counts: Counter[str] = Counter()
        """Per parameter, the published skipped steps it was the first (in backward order)
        to overflow in."""
        self._read: dict[int, Skip] = {}
        self._none: Overflow | None = None

    def add(
        self, values: Mapping[str, torch.Tensor], overflow: Overflow | None
    ) -> tuple[Mapping[str, torch.Tensor], tuple[str, ...]]:
        """A step's device values with its attribution slots, and the names they index."""
        if not self.slots:
            return values, ()
        if overflow is None:  # a scaler but no gradients: nothing to attribute
            if self._none is None:
                like = values["loss"]
                minus = torch.full((), -1.0, dtype=like.dtype, device=like.device)
                self._none = Overflow(minus, minus, ())
            overflow = self._none
        slots = dict(zip(self.slots, (overflow.index, overflow.norm), strict=True))
        return {**values, **slots}, overflow.names

    def read(self, skips: list[Skip]) -> None:
        """Keep the attribution of skipped steps just read, until they are published."""
        self._read.update((s.step, s) for s in skips)

    def take(self, steps: list[int]) -> dict[int, Skip]:
        """The attribution of those of ``steps`` that were skipped (each handed out once)."""
        return {s: self._read.pop(s) for s in steps if s in self._read}

    def published(self, skips: Mapping[int, Skip]) -> None:
        self.counts.update(s.param for s in skips.values() if s.param is not None)
