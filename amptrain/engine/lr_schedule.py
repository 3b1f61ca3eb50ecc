"""The learning-rate schedule, kept on the training device.

Whether an fp16 step was skipped is a device flag; a host-side scheduler would have
to read it before it could advance (a host wait every step). Here the count of
*applied* steps is a device tensor, advanced by ``found_inf == 0`` after each step,
and the learning rate is ``table[applied]``: a lookup in the schedule precomputed
for every step (``amptrain.components.optim.lr_table``). The fused optimizers
read that 0-d tensor as their ``lr``, so a skipped step leaves the schedule where it
was, exactly as ``if not skipped: scheduler.step()`` would, with no host read.
"""

from __future__ import annotations

from typing import Any

import torch


class DeviceSchedule:
    """``lr`` is the learning rate of the next optimizer step; ``advance`` after each step."""

    def __init__(self, table: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        device = params[0].device if params else torch.device("cpu")
        self.table = table.to(device=device, dtype=torch.float32)
        self.optimizer = optimizer
        self.applied = torch.zeros(1, dtype=torch.int64, device=device)
        self.lr = self._look_up()

    def advance(self, found_inf: torch.Tensor | None) -> None:
        """Count the step just taken unless it was skipped (``found_inf`` > 0); set the next lr."""
        if found_inf is None:
            self.applied.add_(1)
        else:
            self.applied.add_(found_inf.reshape(1) == 0)
        self.lr = self._look_up()

    def install(self) -> None:
        """Point every parameter group at ``lr`` again (``optimizer.load_state_dict`` replaces
        the groups' values with the saved ones)."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def state_dict(self) -> dict[str, Any]:
        return {"applied_steps": int(self.applied.item())}  # a checkpoint is a flush point

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.applied.fill_(int(state["applied_steps"]))
        self.lr = self._look_up()

    def _look_up(self) -> torch.Tensor:
        lr = self.table.index_select(0, self.applied).squeeze(0)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr
