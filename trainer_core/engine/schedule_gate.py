"""Advance the LR schedule only after steps that were not skipped, without stalling the device.

Whether fp16 step t was skipped is a device flag. Reading it right after the
step would drain the CUDA queue every step. Instead the flag is copied
(non-blocking, into pinned memory) behind step t's kernels, and read at step
t+1 *after* t+1's forward and backward are queued, just before the optimizer
needs the learning rate: the host waits on an event that only covers step t,
while the device keeps working on t+1. The schedule thus advances exactly as
``if not skipped: scheduler.step()`` would, deterministically.
"""

from __future__ import annotations

import torch


class ScheduleGate:
    """Wraps an LRScheduler; ``after_step`` then ``settle`` before the next LR is needed."""

    def __init__(
        self, scheduler: torch.optim.lr_scheduler.LRScheduler, device: torch.device
    ) -> None:
        self.scheduler = scheduler
        self._cuda = device.type == "cuda"
        self._host_flag = torch.zeros((), pin_memory=self._cuda)
        self._event = torch.cuda.Event() if self._cuda else None
        self._pending: torch.Tensor | None = None

    def after_step(self, found_inf: torch.Tensor | None) -> None:
        """Record the step's skip flag (None: steps are never skipped, advance now)."""
        self.settle()
        if found_inf is None:
            self.scheduler.step()
            return
        if self._event is not None:
            self._host_flag.copy_(found_inf, non_blocking=True)
            self._event.record()
            self._pending = self._host_flag
        else:
            self._pending = found_inf  # a CPU tensor: reading it costs nothing

    def settle(self) -> None:
        """Apply the pending step's outcome to the schedule (idempotent)."""
        if self._pending is None:
            return
        if self._event is not None:
            self._event.synchronize()
        skipped = bool(self._pending.item() > 0)
        self._pending = None
        if not skipped:
            self.scheduler.step()

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses (call ``settle`` first)."""
        return float(self.scheduler.optimizer.param_groups[0]["lr"])
