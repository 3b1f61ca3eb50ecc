"""Loss-spike detection on the device (``health.spike``): a ring buffer of the last
``window`` accepted values with their running sums, and a z-score rule: a fixed couple of
dozen tiny ops per step whatever the window's size, and no host read. On a CPU device the
same rule runs in Python floats (:class:`HostSpikeCheck`: nothing to wait for there).

Each step, before the optimizer step, :meth:`SpikeCheck.check` takes the step's value (its
loss, or its gradient norm) and returns, as 0-d device tensors, whether it is a spike and
the window's mean and standard deviation it was compared with:

    spike = count >= warmup_steps  and  value finite  and  value - mean > z * std

(``std``: the population standard deviation of the values in the window). A spike never
enters the window, so a run of spikes cannot raise the bar it is measured against; nor does
a non-finite value (fp16's overflow steps, a diverging loss: the health checks and the
scaler handle those). The three values ride in the step's values to the next telemetry
flush (:data:`SPIKE_SLOTS`), read there with the rest in its one host read.

Actions. ``warn``: a ``loss_spike`` warning. ``skip``: the spike's optimizer update is
withheld on the device (``found_inf``), the step recorded as skipped. ``rollback``, exactly:

1. At the spike's step ``k`` the update is withheld on the device, as with ``skip``.
2. The flush that reads it (at step ``f >= k``: the next due one, or one flush later on a
   single GPU; every evaluation and checkpoint flushes and acts first, so none sees or saves
   the weights in between) publishes the records up to ``f``, and the guardian returns a
   :class:`~amptrain.engine.guardian.RollBack` naming the newest healthy checkpoint (written
   with no fp16 trigger building) at a step ``c <= k``. The first spike after the latest
   rollback counts; the others are only warned about (their updates were withheld too, or
   trained on weights a rollback threw away).
3. At that step boundary the Trainer loads, in-process, checkpoint ``c``'s model, optimizer,
   schedule (so the learning rate is the one after ``c``), fp16's scaler and this window. It
   keeps its :class:`~amptrain.engine.train_state.TrainState`: the step count ``f`` (no step
   is recorded twice in an attempt), the data position ``f x batch_size`` (the samples
   ``[c x batch_size, f x batch_size)`` are skipped: the data that led to the spike), its
   micro-batch and its RNG states.
4. A ``rollback`` event names ``k``, the checkpoint (``step-000000020.pt``: its name, never
   a path), ``c``, the skipped samples and the count; then a checkpoint of step ``f`` is
   written (with the count), so a run killed after the rollback resumes from there exactly
   and never rolls back again for the same spike. An evaluation due at ``f`` runs after it,
   on the rolled-back model.
5. Without a healthy checkpoint at or before ``k`` (or without a checkpoint directory)
   nothing is loaded: the spike was skipped, and the event says so (``name`` null). Past
   ``max_rollbacks`` rollbacks the job fails as ``diverged`` at step ``f``, naming ``k``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from amptrain.contract.spec import SpikeSpec

SPIKE_SLOTS: tuple[str, ...] = ("spike", "spike_mean", "spike_std")
"""What each step adds to the device values when the check is on (not metric fields): the
flag (1.0: a spike) and the window's mean and standard deviation it was checked against."""

_MAX = torch.finfo(torch.float64).max


@dataclass(frozen=True)
class SpikeFlag:
    """One step's outcome on the device, as 0-d tensors: ``spike`` float32 (1.0: a spike;
    what a fused optimizer takes as ``found_inf``), ``mean`` and ``std`` float64 as computed
    (the flush's one ``torch.stack`` promotes the step's values to float64 with them:
    a conversion per step saved, and the float32 values read back unchanged)."""

    spike: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor

    def values(self) -> tuple[torch.Tensor, ...]:
        """In :data:`SPIKE_SLOTS` order."""
        return (self.spike, self.mean, self.std)


class SpikeCheck:
    """The window on the device; :meth:`check` once per step; checkpointed with the run.

    The window is a ring of ``window`` rows ``[1, v, v*v]`` (zeros where no value is held
    yet) and their running column sums ``[n, sum, sum of squares]``: each accepted value
    replaces the row of the oldest one and the sums move by the difference, so a step
    costs the same few ops whatever the window's size, and no reduction over it. The sums
    are float64: the variance is ``E[v^2] - mean^2``, a difference of two nearly equal
    numbers when the values vary little (a loss of 2.0 +- 1e-4: float32 would keep none of
    it; float64, whose squares of float32 values are exact, keeps about 8 digits). Every
    ``window`` checks they are summed afresh from the rows, so rounding cannot accumulate
    over a long run (the sums and that count are checkpointed: a resumed run recomputes at
    the same steps and flags bitwise the same ones).

    :meth:`undo` takes the last check back, bit for bit (an out-of-memory retry of the step
    runs it again): the sums and the count are replaced, not updated in place, so the
    tensors they were before the check are kept as they were, at no extra kernel, with
    the ring row the check overwrote."""

    def __init__(self, spec: SpikeSpec, device: torch.device) -> None:
        self.spec = spec
        self._rows = torch.zeros(spec.window, 3, dtype=torch.float64, device=device)
        self._sums = torch.zeros(3, dtype=torch.float64, device=device)  # the rows' sums
        self._count = torch.zeros(1, dtype=torch.int64, device=device)  # accepted so far
        self._one = torch.ones((), dtype=torch.float64, device=device)
        self._lowest = torch.tensor(-_MAX, dtype=torch.float64, device=device)
        self._checks = 0  # host-side: when to sum the rows afresh
        # What the last check replaced: the sums, the count, the ring's slot and its row.
        self._before: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @property
    def skips(self) -> bool:
        """The step's update is withheld on a spike (``action: skip`` or ``rollback``)."""
        return self.spec.withholds

    def check(self, value: torch.Tensor) -> SpikeFlag:
        """Compare ``value`` (a 0-d device tensor) with the window; accept it unless it is a
        spike or non-finite."""
        self._checks += 1
        sums = self._sums
        if self._checks % self.spec.window == 0:
            sums = self._rows.sum(0)
        x = value.detach().double()  # exact: the values are float32 (or narrower)
        n = sums[0]
        moments = sums[1:] / n.clamp(min=1)  # the mean and the mean of the squares
        mean = moments[0]
        # Not addcmul: its fused multiply-add rounds once, the CPU's scalar rule twice (and
        # the variance's cancellation would show that ulp in the std's eighth digit).
        std = (moments[1] - mean * mean).clamp_(min=0).sqrt_()
        # The bar a value must not pass; before the warm-up, the largest double (no float32
        # value passes it; adding it to any finite bar leaves exactly it).
        bar = torch.add(mean, std, alpha=self.spec.z).add_(n < self.spec.warmup_steps, alpha=_MAX)
        accept = x.clamp(self._lowest, bar) == x  # finite and at most the bar (NaN != NaN)
        # Non-finite is no spike: an fp16 overflow is the scaler's to skip, a non-finite
        # loss the divergence check's.
        spike = x.nan_to_num(nan=-math.inf, posinf=-math.inf) > bar
        slot = self._count.remainder(self.spec.window)
        old = self._rows.index_select(0, slot)
        # x * x, not pow: a vectorized pow may miss the exact square by an ulp.
        new = torch.where(accept, torch.stack((self._one, x, x * x)), old)
        self._before = (self._sums, self._count, slot, old)
        # Out of place (one op each, as add_ was): the tensors before stay the undo state.
        self._sums = sums + (new - old).view(3)
        self._rows.index_copy_(0, slot, new)
        self._count = self._count + accept
        return SpikeFlag(spike.float(), mean, std)

    def undo(self) -> None:
        """Take the last check back exactly, as if it had never run (once)."""
        if self._before is None:
            return
        self._sums, self._count, slot, old = self._before
        self._rows.index_copy_(0, slot, old)
        self._checks -= 1
        self._before = None

    def state_dict(self) -> dict[str, Any]:
        """The window (a checkpoint is a flush point: copying it to the host costs no extra
        wait): its values oldest slot first as the ring holds them, the running sums, the
        count of accepted values and of checks."""
        return {
            "rows": self._rows.cpu(),
            "sums": self._sums.cpu(),
            "count": int(self._count.item()),
            "checks": self._checks,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._rows.copy_(state["rows"])
        self._sums.copy_(state["sums"])
        self._count.fill_(int(state["count"]))
        self._checks = int(state["checks"])
        self._before = None  # the loaded window's last check is not this one's to undo


class HostSpikeCheck(SpikeCheck):
    """The same rule for a CPU device, in Python's float64 arithmetic.

    On a CPU the device is the host: a tensor's value is there when the op that made it
    returns, so reading it waits for nothing. About twenty tensor ops a step cost ~175 us
    of a ~4 ms CPU step (+4-8%, bench/telemetry_overhead.py); the scalar rule costs a few
    microseconds. It keeps the window as Python floats and hands the parent's tensors the
    same state for a checkpoint, so checkpoints are alike, and a run's flags, means and
    window are the tensor rule's bit for bit (its std to 1e-12: torch's CPU sqrt and IEEE's
    may differ in the last bits; tested). Its :meth:`undo` puts back the values the last
    check replaced (the lists are replaced, never changed in place)."""

    def __init__(self, spec: SpikeSpec, device: torch.device) -> None:
        super().__init__(spec, device)
        self._flags = (torch.zeros(()), torch.ones(()))  # float32, as the tensor rule's flag
        self._mirror()

    def _mirror(self) -> None:
        self._ring: list[list[float]] = self._rows.tolist()
        self._total: list[float] = self._sums.tolist()
        self._accepted = int(self._count.item())
        # What the last check replaced: the sums, the count and the ring row at its slot.
        self._undo: tuple[list[float], int, list[float]] | None = None

    def check(self, value: torch.Tensor) -> SpikeFlag:
        slot = self._accepted % self.spec.window
        self._undo = (self._total, self._accepted, self._ring[slot])
        self._checks += 1
        if self._checks % self.spec.window == 0:  # summed afresh as the tensor rule does
            self._total = torch.tensor(self._ring, dtype=torch.float64).sum(0).tolist()
        x = float(value)
        n, total, squares = self._total
        mean, mean_sq = total / max(n, 1.0), squares / max(n, 1.0)
        std = math.sqrt(max(mean_sq - mean * mean, 0.0))
        bar = mean + self.spec.z * std + (_MAX if n < self.spec.warmup_steps else 0.0)
        spike = math.isfinite(x) and x > bar
        if -_MAX <= x <= bar:  # finite and at most the bar (NaN compares false)
            new = [1.0, x, x * x]
            self._total = [
                t + (a - b) for t, a, b in zip(self._total, new, self._ring[slot], strict=True)
            ]
            self._ring[slot] = new
            self._accepted += 1
        as_tensor = torch.tensor
        return SpikeFlag(
            self._flags[spike],
            as_tensor(mean, dtype=torch.float64),
            as_tensor(std, dtype=torch.float64),
        )

    def undo(self) -> None:
        if self._undo is None:
            return
        self._total, self._accepted, row = self._undo
        self._ring[self._accepted % self.spec.window] = row
        self._checks -= 1
        self._undo = None

    def state_dict(self) -> dict[str, Any]:
        self._rows.copy_(torch.tensor(self._ring, dtype=torch.float64))
        self._sums.copy_(torch.tensor(self._total, dtype=torch.float64))
        self._count.fill_(self._accepted)
        return super().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._mirror()


def spike_check(spec: SpikeSpec, device: torch.device) -> SpikeCheck:
    """The rule for ``device``: on a GPU the tensor ops (no host read), on a CPU the scalar
    ones (nothing to wait for)."""
    return HostSpikeCheck(spec, device) if device.type == "cpu" else SpikeCheck(spec, device)
