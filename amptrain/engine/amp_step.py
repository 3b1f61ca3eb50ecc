"""One optimizer step in the order the PyTorch AMP documentation prescribes.

forward + loss under ``torch.autocast`` (the loss itself in an fp32 island) ->
``scaler.scale(loss / accum).backward()`` per micro-batch (``no_sync`` on all
but the last when the model is DDP-wrapped) -> on the last micro-batch
``unscale_`` once -> clip -> ``scaler.step`` -> one ``scaler.update()``.

The GradScaler exists only for fp16. Nothing here reads a device value on the
host: the grad norm, the inf flag and the scale come back as device tensors.

Overflow attribution (fp16): the per-parameter gradient norms come from ONE fused
``torch._foreach_norm`` after ``unscale_``; the global norm (for clipping and the
``grad_norm`` metric) is the norm of those norms, so it costs nothing extra. The step
keeps the norms on the device (:class:`Overflow`), with each parameter's place in the
backward order recorded on the run's first backward
(:class:`~amptrain.engine.backward_order.BackwardOrder`); at the next flush telemetry
finds, for the whole window at once, each step's first non-finite parameter in that order
and reads it with the other values in the flush's one read; it names it only for the
skipped steps.

Loss spikes (``health.spike``): after the global norm and before the optimizer step the
step's loss or norm goes through the device-side :class:`~amptrain.engine.spikes.
SpikeCheck`. With ``action: skip`` a spike withholds the update the way GradScaler withholds
an overflow step: the fused optimizer reads ``optimizer.found_inf`` (1.0: return before
touching a parameter, and its step counts are put back). With fp16 the flag handed over is
the larger of the scaler's own inf flag and the spike flag, while ``scaler.update()`` still
reads the scaler's flag alone: a spike does not back the loss scale off (its gradients were
finite), and it counts as a clean step towards the scale's growth.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from amptrain.contract.spec import JobSpec
from amptrain.engine.backward_order import BackwardOrder
from amptrain.engine.precision import PrecisionChoice, fp32_island
from amptrain.engine.spikes import SpikeCheck, SpikeFlag

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Overflow:
    """What a step keeps for overflow attribution (fp16 only): references, no kernel.

    Telemetry turns a flush's worth of these into each step's first non-finite parameter
    in backward order, on the device, in a few kernels for the whole window
    (:func:`~amptrain.engine.attribution.first_nonfinite`).
    """

    norms: torch.Tensor
    """Each parameter's gradient norm after unscaling (1-D, on the device): the same
    tensor the global norm was computed from."""
    names: tuple[str, ...]
    """Module paths (``blocks.3.attn.proj.weight``) of the parameters, in registration
    order (``model.parameters()``)."""
    priority: torch.Tensor
    """Per parameter (as ``norms``), its priority in backward order (float32, on the
    device): the higher, the earlier backward produced its gradient."""
    ranked: tuple[str, ...]
    """Every trainable parameter's path by priority: index ``k`` is priority ``k``'s."""


@dataclass
class Applied:
    """Device-side outcome of an optimizer step."""

    grad_norm: torch.Tensor  # after unscaling, before clipping
    found_inf: torch.Tensor | None  # fp16: 1.0 when the step was skipped
    scale: torch.Tensor | None  # fp16: the scale this step used
    overflow: Overflow | None = None  # fp16: which parameter overflowed first
    spike: SpikeFlag | None = None  # health.spike: the step's spike check
    withheld: torch.Tensor | None = None
    """1.0 when the update was not applied for any reason (an overflow or a skipped spike):
    what the schedule advances by; None when nothing can withhold it."""
    norms: Overflow | None = None
    """Every precision: the per-parameter norms and names (the same references as
    ``overflow``), for the per-layer norms (:mod:`amptrain.engine.layer_norms`); None
    without gradients."""


class AmpStep:
    """Runs the micro-batches and the optimizer step of one training step."""

    def __init__(
        self,
        spec: JobSpec,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        precision: PrecisionChoice,
        device: torch.device,
        spike: SpikeCheck | None = None,
    ) -> None:
        self.model = model
        self.spike = spike
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.device = device
        self.clip_norm = spec.grad_clip_norm
        self.autocast_dtype = precision.autocast_dtype
        self.scaler: torch.amp.GradScaler | None = None
        if precision.uses_scaler:
            ls = spec.loss_scale
            self.scaler = torch.amp.GradScaler(
                device.type,
                init_scale=ls.init_scale,
                growth_factor=ls.growth_factor,
                backoff_factor=ls.backoff_factor,
                growth_interval=ls.growth_interval,
            )
        # DDP wraps the model as ``module``: name parameters as the user's model does.
        named = getattr(model, "module", model).named_parameters()
        trainable = [(n, p) for n, p in named if p.requires_grad]
        self._params = [p for _, p in trainable]
        self._names = tuple(n for n, _ in trainable)
        self._order = BackwardOrder(self._names, self._params, device)
        self._checked = False  # the spike check ran in an apply that has not returned

    def forward_backward(
        self, inputs: torch.Tensor, targets: torch.Tensor, accum: int, *, last: bool
    ) -> torch.Tensor:
        """Forward, loss and backward of one micro-batch; returns the detached (unscaled) loss."""
        no_sync = getattr(self.model, "no_sync", None)
        sync_ctx = no_sync() if (no_sync is not None and not last) else contextlib.nullcontext()
        sharded_sync = getattr(self.model, "set_requires_gradient_sync", None)
        if sharded_sync is not None:  # FSDP2's no_sync: reduce-scatter on the last only
            sharded_sync(last)
        with sync_ctx:
            with self.autocast():
                logits = self.model(inputs)
                with fp32_island():
                    loss = self.loss_fn(logits.float(), targets)
            scaled = loss / accum if accum > 1 else loss
            if self.scaler is not None:
                scaled = self.scaler.scale(scaled)
            if self._order.recording:
                self._order.backward(scaled)
            else:
                scaled.backward()
        return loss.detach()

    def autocast(self) -> torch.autocast:
        """The job's autocast context (disabled for fp32/tf32): the training forward and the
        evaluation forward both run under it, so evaluation measures the model as trained."""
        return torch.autocast(
            self.device.type,
            dtype=self.autocast_dtype or torch.get_autocast_dtype(self.device.type),
            enabled=self.autocast_dtype is not None,
        )

    def apply(self, loss: torch.Tensor) -> Applied:
        """Unscale once, clip, check for a spike, step, update; the optimizer skips the step
        on inf/NaN gradients (and, with ``spike.action: skip``, on a spike). ``loss``: the
        step's mean loss (device tensor)."""
        scaler = self.scaler
        if scaler is not None:
            scaler.unscale_(self.optimizer)
        grad_norm, norms, names = self._grad_norm()
        flag = None
        if self.spike is not None:
            flag = self.spike.check(loss if self.spike.spec.metric == "loss" else grad_norm)
            self._checked = True  # until this returns: an OOM from here on undoes the check
        held = (
            flag.spike
            if (flag is not None and self.spike is not None and self.spike.skips)
            else None
        )
        overflow = None
        if norms is not None:
            overflow = Overflow(norms, names, self._order.priority(names), self._order.ranked)
        if scaler is None:
            self._step(held)
            self._checked = False
            return Applied(grad_norm, None, None, spike=flag, withheld=held, norms=overflow)
        found_inf = _found_inf(scaler, self.optimizer)
        # update() rewrites the scale tensor in place: keep the value this step used.
        scale = scaler._scale.clone()  # type: ignore[union-attr]
        if held is None:
            scaler.step(self.optimizer)
        else:
            # What scaler.step does for a fused optimizer after unscale_ (hand it found_inf),
            # with the spike folded in; max, not sum: the kernels skip on exactly 1.0 and
            # subtract the flag from their step counts.
            held = torch.maximum(found_inf, held.to(found_inf.device))
            self._step(held)
        scaler.update()  # reads the scaler's own flags: a spike leaves the scale alone
        self._checked = False
        withheld = found_inf if held is None else held
        return Applied(grad_norm, found_inf, scale, overflow, flag, withheld, overflow)

    def _step(self, withheld: torch.Tensor | None) -> None:
        """The optimizer step; a fused one returns early on ``withheld`` 1.0 (no host read)."""
        if withheld is None:
            self.optimizer.step()
            return
        self.optimizer.found_inf = withheld  # type: ignore[attr-defined]
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf  # type: ignore[attr-defined]

    def abandon(self) -> None:
        """Forget a step that failed part-way (an OOM) so it can be run again from the start.

        The gradients go, the scaler's per-optimizer stage returns to READY (else a
        second ``unscale_`` in the retried step raises), and a spike check the failed
        ``apply`` ran is undone exactly (else the retried step's value would enter the
        window twice). Nothing else moved: an OOM in ``apply`` comes from an allocation
        (optimizer state, clipping or unscaling buffers), and all of those happen before
        the fused kernel updates a parameter.
        """
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler._per_optimizer_states.pop(id(self.optimizer), None)
        if self._checked and self.spike is not None:
            self.spike.undo()
        self._checked = False

    def _grad_norm(self) -> tuple[torch.Tensor, torch.Tensor | None, tuple[str, ...]]:
        """The global norm, each parameter's norm (one fused call) and their names.

        Everything stays on the device: clipping multiplies by a clamped coefficient
        instead of branching on the norm in Python."""
        present = [
            (n, p.grad)
            for n, p in zip(self._names, self._params, strict=True)
            if p.grad is not None
        ]
        if not present:
            return torch.zeros((), device=self.device), None, ()
        grads = [g for _, g in present]
        names = self._names if len(present) == len(self._names) else tuple(n for n, _ in present)
        norms = torch.stack(torch._foreach_norm(grads))
        whole = getattr(norms, "full_tensor", None)  # a DTensor: sharded gradients (fsdp)
        if whole is not None:
            norms = whole()  # one all-reduce of the shards' partial norms: whole gradients'
        norms = norms.float()
        # The same value get_total_norm computes (it too takes the norm of the per-tensor
        # norms), without a second pass over the gradients.
        total = torch.linalg.vector_norm(norms)
        if self.clip_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(self._params, self.clip_norm, total)
        return total, norms, names


def _found_inf(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> torch.Tensor:
    """The scaler's device-side inf/NaN flag for this step (1.0 = skipped).

    GradScaler has no public accessor; ``_per_optimizer_states`` is where
    ``unscale_`` leaves the flags and where ``update()`` reads them, so it is
    the one source that needs no host sync (``get_scale()`` would sync).
    """
    flags = list(scaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"].values())
    total = flags[0].to(scaler._scale.device)  # type: ignore[union-attr]
    for f in flags[1:]:
        total = total + f.to(total.device)
    return total
