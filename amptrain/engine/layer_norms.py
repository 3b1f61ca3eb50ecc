"""Per-layer gradient norms every ``telemetry.layer_grad_norms_every`` steps.

A layer's norm is the norm of its parameters' gradient norms, grouped on the device from
the step's one fused per-parameter norm call (:meth:`~amptrain.engine.amp_step.AmpStep.
apply`): one ``index_add_`` of the squared norms by a layer index built once, then a
``sqrt``. No host read: the vector rides with the step's other device values to the next
flush's one read (:class:`~amptrain.engine.telemetry.StepTelemetry`). On the other steps,
and when the option is off, nothing runs. Layers are named by
:func:`~amptrain.contract.layers.layer_paths`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from amptrain.contract.layers import layer_paths
from amptrain.contract.records import layer_norms
from amptrain.engine.amp_step import Overflow

if TYPE_CHECKING:
    from amptrain.engine.step_records import Pending


@dataclass(frozen=True)
class LayerValues:
    """One step's per-layer gradient norms, on the device."""

    norms: torch.Tensor
    """1-D float32, one per name."""
    names: tuple[str, ...]


@dataclass(frozen=True)
class _Grouping:
    index: torch.Tensor  # per parameter, its layer's position (len(names): left out)
    names: tuple[str, ...]


class LayerNorms:
    """Groups a due step's per-parameter norms into per-layer norms."""

    def __init__(self, every: int | None) -> None:
        self.every = every
        # By the parameters that had gradients: the same tuple object step after step.
        self._groupings: dict[tuple[str, ...], _Grouping] = {}

    def due(self, step: int, params: Overflow | None) -> LayerValues | None:
        """Step ``step``'s per-layer norms when it is due (None otherwise, and without
        gradients)."""
        if self.every is None or step % self.every or params is None:
            return None
        grouping = self._grouping(params)
        width = len(grouping.names)
        norms = params.norms.float()
        squares = torch.zeros(width + 1, dtype=torch.float32, device=norms.device)
        squares.index_add_(0, grouping.index, norms * norms)
        return LayerValues(squares[:width].sqrt(), grouping.names)

    def _grouping(self, params: Overflow) -> _Grouping:
        grouping = self._groupings.get(params.names)
        if grouping is None:
            paths = layer_paths(params.names)
            names = tuple(dict.fromkeys(p for p in paths if p))
            position = {name: i for i, name in enumerate(names)}
            index = torch.tensor([position.get(p, len(names)) for p in paths])
            device = params.norms.device
            if device.type == "cuda":  # from pinned memory: a copy the host does not wait for
                index = index.pin_memory().to(device, non_blocking=True)
            grouping = _Grouping(index.to(device), names)
            self._groupings[params.names] = grouping
        return grouping


def vectors(pending: list[Pending]) -> list[torch.Tensor]:
    """The due steps' layer norms among ``pending``, in step order: read after the window's
    step values, in the same transfer."""
    return [p.layers.norms for p in pending if p.layers is not None]


def layer_records(
    pending: list[Pending], values: list[float], width: int, records: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The ``layer_grad_norm`` records of a window's due steps: ``values`` holds the
    window's step values (``width`` a step), then the due steps' layer norms in step order;
    ``records`` the window's metric records (for each step's time). A norm that is not
    finite (an overflowing fp16 step) is null."""
    out: list[dict[str, Any]] = []
    at = len(pending) * width
    for p, record in zip(pending, records, strict=True):
        if p.layers is None:
            continue
        names = p.layers.names
        norms = values[at : at + len(names)]
        at += len(names)
        shown = {n: (v if math.isfinite(v) else None) for n, v in zip(names, norms, strict=True)}
        out.append(layer_norms(p.step, record["time"], shown))
    return out
