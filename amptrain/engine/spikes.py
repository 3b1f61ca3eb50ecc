"""Loss-spike detection on the device (``health.spike``): a ring buffer of the last
``window`` accepted values and a z-score rule, in a handful of small kernels per step and
no host read.

Each step, before the optimizer step, :meth:`SpikeCheck.check` takes the step's value (its
loss, or its gradient norm) and returns, as 0-d device tensors, whether it is a spike and
the window's mean and standard deviation it was compared with:

    spike = count >= warmup_steps  and  value finite  and  value - mean > z * std

(``std``: the population standard deviation of the values in the window). A spike never
enters the window, so a run of spikes cannot raise the bar it is measured against; nor does
a non-finite value (fp16's overflow steps, a diverging loss: the health checks and the
scaler handle those). The three values ride in the step's values to the next telemetry
flush (:data:`SPIKE_SLOTS`), read there with the rest in its one host read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from amptrain.contract.spec import SpikeSpec

SPIKE_SLOTS: tuple[str, ...] = ("spike", "spike_mean", "spike_std")
"""What each step adds to the device values when the check is on (not metric fields): the
flag (1.0: a spike) and the window's mean and standard deviation it was checked against."""


@dataclass(frozen=True)
class SpikeFlag:
    """One step's outcome on the device (0-d float32 tensors)."""

    spike: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor

    def values(self) -> tuple[torch.Tensor, ...]:
        """In :data:`SPIKE_SLOTS` order."""
        return (self.spike, self.mean, self.std)


class SpikeCheck:
    """The window on the device; :meth:`check` once per step; checkpointed with the run."""

    def __init__(self, spec: SpikeSpec, device: torch.device) -> None:
        self.spec = spec
        self._values = torch.zeros(spec.window, dtype=torch.float32, device=device)
        self._count = torch.zeros((), dtype=torch.int64, device=device)  # accepted so far
        self._slots = torch.arange(spec.window, device=device)

    @property
    def skips(self) -> bool:
        """The step's update is withheld on a spike (``action: skip``)."""
        return self.spec.action == "skip"

    def check(self, value: torch.Tensor) -> SpikeFlag:
        """Compare ``value`` (a 0-d device tensor) with the window; accept it unless it is a
        spike or non-finite."""
        x = value.detach().float().reshape(())
        filled = self._count.clamp(max=self.spec.window)
        n = filled.clamp(min=1).float()
        held = self._slots < filled  # the slots holding values (all once the window is full)
        mean = torch.where(held, self._values, 0.0).sum() / n
        var = torch.where(held, (self._values - mean) ** 2, 0.0).sum() / n
        std = var.sqrt()
        finite = torch.isfinite(x)
        # Non-finite is no spike: an fp16 overflow is the scaler's to skip, a non-finite
        # loss the divergence check's.
        spike = (filled >= self.spec.warmup_steps) & finite & (x - mean > self.spec.z * std)
        accept = ~spike & finite
        slot = (self._count % self.spec.window).reshape(1)
        kept = torch.where(accept, x, self._values.index_select(0, slot).squeeze(0))
        self._values.index_copy_(0, slot, kept.reshape(1))
        self._count.add_(accept.long())
        return SpikeFlag(spike.float(), mean, std)

    def state_dict(self) -> dict[str, Any]:
        """The window (a checkpoint is a flush point: copying it to the host costs no extra
        wait)."""
        return {"values": self._values.cpu(), "count": int(self._count.item())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._values.copy_(state["values"])
        self._count.fill_(int(state["count"]))
