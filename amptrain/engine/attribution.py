"""Telemetry's side of overflow attribution (fp16).

Each step hands over its per-parameter gradient norms (:class:`~amptrain.engine.amp_step.
Overflow`: a reference, no kernel). When a flush reads the window's values,
:func:`first_nonfinite` turns the window's norms into one code per step with a handful of
kernels for the whole window (not per step), and the codes ride in the flush's one read as
the :data:`~amptrain.engine.step_records.ATTRIBUTION_SLOTS` of each step. Once read, only
the skipped steps' are kept (:class:`~amptrain.engine.step_records.Skip`), named in their
``warning`` event and counted per parameter.

Backward order is the order the run's first backward produced the gradients in, recorded
once by :class:`~amptrain.engine.backward_order.BackwardOrder` (not registration order: a
tied weight, a shortcut, a module registered apart from where the forward calls it). An
inf or NaN born in one layer's backward propagates to every gradient produced after it, so
the first parameter in that order with a non-finite norm is where the overflow started.
Each step hands over its parameters' priorities in that order (a tensor built once, the
first gradient produced the highest) and the names by priority; a code is the highest
priority among the non-finite norms, so it indexes its name directly, whichever parameters
had gradients that step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import torch

from amptrain.engine.amp_step import Overflow
from amptrain.engine.step_records import ATTRIBUTION_SLOTS, Skip


def first_nonfinite(
    norms: list[torch.Tensor], priorities: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Per step (a 1-D tensor of its parameters' norms each, and of their priorities in
    backward order), on the device: ``2 * p + isnan`` for the highest priority ``p`` whose
    norm is inf/NaN, -1.0 when all are finite (0-d float32 tensors; exact below 2**24)."""
    if len({(n.shape, n.device) for n in norms}) == 1:
        first = priorities[0]
        # The same tensor every step (built once per set of parameters): broadcast, not stacked.
        same = all(p is first for p in priorities)
        return list(_codes(torch.stack(norms), first if same else torch.stack(priorities)).unbind())
    # The parameters with gradients varied: step by step.
    return [_codes(n.unsqueeze(0), p)[0] for n, p in zip(norms, priorities, strict=True)]


def _codes(norms: torch.Tensor, priority: torch.Tensor) -> torch.Tensor:
    flagged = priority * 2 + torch.isnan(norms)
    return torch.where(torch.isfinite(norms), -1.0, flagged).amax(dim=1)


class Attribution:
    """The window's norms not yet read, the skipped steps read but not yet published, and
    the counts of those published."""

    def __init__(self, enabled: bool) -> None:
        self.slots: tuple[str, ...] = ATTRIBUTION_SLOTS if enabled else ()
        """What each step adds to the device values (nothing without a scaler)."""
        self.counts: Counter[str] = Counter()
        """Per parameter, the published skipped steps it was the first (in backward order)
        to overflow in."""
        self._norms: list[torch.Tensor] = []
        self._priorities: list[torch.Tensor] = []
        self._read: dict[int, Skip] = {}
        self._none: torch.Tensor | None = None

    def keep(self, overflow: Overflow | None, like: torch.Tensor) -> tuple[str, ...]:
        """Keep a step's norms and priorities until its window is read; the names its code
        indexes (by priority)."""
        if not self.slots:
            return ()
        if overflow is None:  # a scaler but no gradients: nothing to attribute
            if self._none is None:
                self._none = torch.zeros(1, dtype=torch.float32, device=like.device)
            self._norms.append(self._none)  # a finite norm, of priority 0
            self._priorities.append(self._none)
            return ()
        self._norms.append(overflow.norms)
        self._priorities.append(overflow.priority)
        return overflow.ranked

    def interleave(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """The window's device values (each step's metric values in a row) with each step's
        attribution code after its own; forgets the window's norms."""
        if not self._norms:
            return values
        codes = first_nonfinite(self._norms, self._priorities)
        self._norms, self._priorities = [], []
        width = len(values) // len(codes)
        out: list[torch.Tensor] = []
        for i, code in enumerate(codes):
            out += values[i * width : (i + 1) * width]
            out.append(code)
        return out

    def read(self, skips: list[Skip]) -> None:
        """Keep the attribution of skipped steps just read, until they are published."""
        self._read.update((s.step, s) for s in skips)

    def take(self, steps: list[int]) -> dict[int, Skip]:
        """The attribution of those of ``steps`` that were skipped (each handed out once)."""
        return {s: self._read.pop(s) for s in steps if s in self._read}

    def published(self, skips: Mapping[int, Skip]) -> None:
        self.counts.update(s.param for s in skips.values() if s.param is not None)
