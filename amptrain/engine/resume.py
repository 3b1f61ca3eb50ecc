"""The Trainer's checkpointed state: what exact resume needs, written atomically at step
boundaries and read back at the start of a resumed attempt.

A checkpoint holds the model, optimizer, schedule and scaler states, every RNG state, the
step and the data position (``samples_consumed``), the micro-batch size and accumulation
(an OOM may have halved them), the precision and the number of devices that wrote it
(:data:`~amptrain.engine.checkpoint.CHECKPOINT_FORMAT`). Telemetry goes first: a run
resumed from a checkpoint never re-runs the steps before it, so their records are with
the sink before the checkpoint exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from amptrain.contract.layout import checkpoint_name
from amptrain.contract.spec import JobSpec
from amptrain.engine.amp_step import AmpStep
from amptrain.engine.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointStore,
    capture_rng,
    check_resumable,
    restore_rng,
)
from amptrain.engine.context import RunContext
from amptrain.engine.distributed import Group
from amptrain.engine.health import HealthMonitor
from amptrain.engine.lr_schedule import DeviceSchedule
from amptrain.engine.precision import PrecisionChoice
from amptrain.engine.publisher import Publisher
from amptrain.engine.telemetry import StepTelemetry


class Checkpointing:
    """``state_dict``/``load_state_dict`` and checkpoint files, mixed into the Trainer,
    which builds every attribute below (see :class:`~amptrain.engine.parts.Parts`)."""

    spec: JobSpec
    ctx: RunContext
    device: torch.device
    group: Group
    precision: PrecisionChoice
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: DeviceSchedule
    amp: AmpStep
    store: CheckpointStore | None
    publisher: Publisher
    telemetry: StepTelemetry
    health: HealthMonitor
    drain_timeout_s: float
    step: int
    micro_batch: int
    grad_accum: int
    resumed_from: int | None
    rollbacks: int
    _last_checkpoint_step: int | None
    _healthy_step: int | None
    """The newest healthy checkpoint this run wrote or resumed from (pruning keeps it)."""
    _peeked: tuple[str | None, dict[str, Any] | None] | None

    def state_dict(self) -> dict[str, Any]:
        """Everything exact resume needs, as tensors and plain types (weights_only-loadable).

        Devices > 1: a collective (it gathers every rank's RNG states); call it on all ranks."""
        scaler = self.amp.scaler
        rngs = self.group.gather_objects(capture_rng(self._rank_cuda))
        parallel = {"rng_per_rank": rngs} if self.group.parallel else {}
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "samples_consumed": self.samples_consumed,
            "micro_batch": self.micro_batch,
            "grad_accum_steps": self.grad_accum,
            "precision": self.precision.effective,
            # Why: a resumed ``auto`` attempt takes this precision instead of measuring anew.
            "precision_reason": self.precision.reason,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            # health.spike's window: a resumed run judges the next step as the first did.
            "spike": self.amp.spike.state_dict() if self.amp.spike is not None else None,
            "rollbacks": self.rollbacks,  # health.spike.max_rollbacks bounds the job, not an attempt
            "rng": rngs[0],
            "world_size": self.group.world_size,
            "attempt": self.ctx.attempt,
            # No trigger of health.fallback building (the flush before a save checked every
            # step): a precision fallback resumes only from such a checkpoint.
            "healthy": self.health.healthy,
            **parallel,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; the run then continues exactly where it was."""
        check_resumable(state, self.group.world_size)
        self.load_training_state(state)
        self.step = int(state["step"])
        self.rollbacks = int(state["rollbacks"])
        self.micro_batch = int(state["micro_batch"])
        self.grad_accum = int(state["grad_accum_steps"])
        rng = state["rng_per_rank"][self.group.rank] if self.group.parallel else state["rng"]
        restore_rng(rng, self._rank_cuda)

    def load_training_state(self, state: dict[str, Any]) -> None:
        """What a spike rollback takes from a checkpoint (see :mod:`~amptrain.engine.
        rollback`): the model, optimizer, schedule, loss scale and spike window; not the step,
        the data position, the micro-batch or the RNG states."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        _keep_build_options(self.optimizer)
        self.schedule.load_state_dict(state["scheduler"])
        if self.amp.scaler is not None and state.get("scaler"):
            self.amp.scaler.load_state_dict(state["scaler"])
        if self.amp.spike is not None and state.get("spike"):
            self.amp.spike.load_state_dict(state["spike"])

    def save_checkpoint(self) -> str | None:
        """Write a checkpoint of the current step (if this run has a checkpoint dir)."""
        if self.store is None:
            return None
        # Telemetry first: a run resumed from this checkpoint never re-runs the steps
        # before it, so their records must be with the sink before the checkpoint exists.
        # Bounded: a stuck sink delays the checkpoint by at most drain_timeout_s.
        self.telemetry.flush()
        self.publisher.wait_delivered(self.drain_timeout_s)
        state = self.state_dict()
        if state["healthy"]:
            self._healthy_step = self.step
        keep = self._healthy_step
        path = self.store.save(self.step, state, keep) if self.group.leader else None
        self.group.barrier()  # no rank goes on (or stops) before the checkpoint exists
        self._last_checkpoint_step = self.step
        # Its name, not where it lies: events reach the job's owner, the path is the server's.
        self.telemetry.event("checkpoint", self.step, name=checkpoint_name(self.step))
        return path

    def resume(self) -> None:
        """Continue from the newest checkpoint whose lineage is recorded (see
        ``ctx.recorded``), if the run resumes and has one."""
        if not (self.ctx.resume and self.store is not None):
            return
        chosen, state = self._resumable() if self.group.leader else (None, None)
        path = self.group.leader_value(chosen)
        if path is None:
            return
        state = state if state is not None else self.store.load(path)
        self.load_state_dict(state)
        self.resumed_from = self._last_checkpoint_step = self.step
        if state.get("healthy", False):
            self._healthy_step = self.step
        self.telemetry.event(
            "resumed", self.step, from_step=self.step, name=checkpoint_name(self.step)
        )

    def _resumable(self) -> tuple[str | None, dict[str, Any] | None]:
        """The leader's choice: the newest checkpoint, or under ``ctx.recorded`` the newest
        one its writing attempt recorded through (with its state, read to learn that), the
        checkpoints after it removed: never resumed from, so never kept either."""
        assert self.store is not None
        found = self._peeked
        self._peeked = None  # build_parts found it already (to read its precision)
        if found is None:
            found = find_resumable(self.store, self.ctx.recorded, load=False)
        if self.ctx.recorded is not None:
            state = found[1]
            self.store.discard_after(int(state["step"]) if state is not None else 0)
        return found

    @property
    def samples_consumed(self) -> int:
        """Data position: every optimizer step consumes exactly ``batch_size`` samples."""
        return self.step * self.spec.batch_size

    @property
    def _rank_cuda(self) -> torch.device | None:
        """The one GPU whose RNG a data-parallel rank checkpoints (None: every initialised one)."""
        return self.device if self.group.parallel and self.device.type == "cuda" else None


def find_resumable(
    store: CheckpointStore, recorded: Mapping[int, int] | None, *, load: bool
) -> tuple[str | None, dict[str, Any] | None]:
    """The checkpoint a resume takes (removing nothing): the newest, or under ``recorded``
    (see :attr:`~amptrain.engine.context.RunContext.recorded`) the newest one its writing
    attempt recorded through; its path and state (``load`` False with ``recorded`` None:
    the path only, the state unread), or (None, None) when there is none."""
    if recorded is None:
        path = store.latest()
        return path, store.load(path) if (load and path is not None) else None
    for step in reversed(store.steps()):
        path = store.path(checkpoint_name(step))
        state = store.load(path)
        if step <= recorded.get(int(state.get("attempt", 0)), 0):
            return path, state
    return None, None


def _keep_build_options(optimizer: torch.optim.Optimizer) -> None:
    """``load_state_dict`` copies every saved group option over the built ones; keep the
    kernel choice (fused) this engine built, whatever an older checkpoint recorded."""
    for group in optimizer.param_groups:
        for key in ("fused", "foreach"):
            if key in optimizer.defaults:
                group[key] = optimizer.defaults[key]
