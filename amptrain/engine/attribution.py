"""Telemetry's side of overflow attribution (fp16).

Each step hands over its per-parameter gradient norms (:class:`~amptrain.engine.amp_step.
Overflow`: a reference, no kernel). When a flush reads the window's values,
:func:`first_nonfinite` turns the window's norms into one code per step with a handful of
kernels for the whole window (not per step), and the codes ride in the flush's one read as
the :data:`~amptrain.engine.step_records.ATTRIBUTION_SLOTS` of each step. Once read, only
the skipped steps' are kept (:class:`~amptrain.engine.step_records.Skip`), named in their
``warning`` event and counted per parameter.

Backward order is taken as the reverse of registration order (``model.parameters()``):
autograd produces the gradients of later layers first in the usual sequential model, and
an inf born in one layer's backward propagates to the layers before it, so the highest
registered position with a non-finite norm is where the overflow started. A model whose
forward runs its modules out of registration order gets the proxy's answer. Within one
layer the proxy names the parameter registered last (a Linear's bias before its weight).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import torch

from amptrain.engine.amp_step import Overflow
from amptrain.engine.step_records import ATTRIBUTION_SLOTS, Skip


def first_nonfinite(norms: list[torch.Tensor]) -> list[torch.Tensor]:
    """Per step (a 1-D tensor of its parameters' norms each), on the device: ``2 * i +
    isnan`` for the highest position ``i`` whose norm is inf/NaN, -1.0 when all are finite
    (0-d float32 tensors; exact below 2**24)."""
    if len({(n.shape, n.device) for n in norms}) == 1:
        return list(_codes(torch.stack(norms)).unbind())
    return [_codes(n.unsqueeze(0))[0] for n in norms]  # parameters without gradients varied


def _codes(norms: torch.Tensor) -> torch.Tensor:
    twice = torch.arange(norms.shape[1], device=norms.device, dtype=torch.float32) * 2
    flagged = twice + torch.isnan(norms)
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
        self._read: dict[int, Skip] = {}
        self._none: torch.Tensor | None = None

    def keep(self, overflow: Overflow | None, like: torch.Tensor) -> tuple[str, ...]:
        """Keep a step's norms until its window is read; the names its code indexes."""
        if not self.slots:
            return ()
        if overflow is None:  # a scaler but no gradients: nothing to attribute
            if self._none is None:
                self._none = torch.zeros(1, dtype=torch.float32, device=like.device)
            self._norms.append(self._none)
            return ()
        self._norms.append(overflow.norms)
        return overflow.names

    def interleave(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """The window's device values (each step's metric values in a row) with each step's
        attribution code after its own; forgets the window's norms."""
        if not self._norms:
            return values
        codes, self._norms = first_nonfinite(self._norms), []
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
