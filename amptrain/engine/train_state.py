"""What the training loop carries from one step to the next, as one object.

Everything else a checkpoint holds is a component's own state (the model, the optimizer,
the schedule, fp16's scaler, the spike window, the RNG streams: see
:mod:`~amptrain.engine.checkpoint_manager`). The split follows what a spike rollback does:
it takes the components' states back from an older checkpoint and keeps this one (the step
count, the data position, the micro-batch, the precision, the rollbacks taken), so no step is
recorded twice and the batches since the checkpoint are skipped, not replayed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from amptrain.engine.guardian import Situation


@dataclass
class TrainState:
    """The loop's counters; ``state_dict``/``load_state_dict`` as a checkpoint keeps them."""

    batch_size: int
    """The spec's global batch: every optimizer step consumes exactly this many samples."""
    micro_batch: int
    """Samples per forward on this rank; an out-of-memory retry halves it."""
    grad_accum: int
    """Micro-batches per optimizer step (``batch_size / (micro_batch x devices)``)."""
    precision: str
    """The precision this run trains in (``fp16``, ``bf16``, ``tf32`` or ``fp32``)."""
    precision_reason: str = ""
    """Why: a resumed ``auto`` attempt takes the recorded precision instead of measuring anew."""
    step: int = 0
    """Optimizer steps done, skipped ones included (the data position is derived from it)."""
    rollbacks: int = 0
    """``health.spike`` rollbacks taken by the job: ``max_rollbacks`` bounds the job, not an
    attempt."""
    rolled_back_at: int | None = None
    """The step at which the latest rollback was taken: a spike at or before it trained on
    weights that rollback threw away, so it asks for no rollback of its own (on one GPU the
    flush that rolls back can read such a spike one window late)."""
    last_eval_step: int | None = None
    """The step of the latest evaluation: the final one is not run twice at one step."""
    resumed_from: int | None = None
    """The step this attempt resumed from (not checkpointed: an attempt's own fact)."""

    @property
    def samples_consumed(self) -> int:
        """The data position: samples are pure functions of their index, so resume, a
        rollback and micro-batch halving need nothing but this."""
        return self.step * self.batch_size

    def situation(self, newest_healthy: Callable[[int], int | None]) -> Situation:
        """Where the run is, as the guardian's decision needs it."""
        return Situation(self.step, self.rollbacks, self.rolled_back_at, newest_healthy)

    def state_dict(self) -> dict[str, Any]:
        """The counters as plain types, at the top level of a checkpoint."""
        return {
            "step": self.step,
            "samples_consumed": self.samples_consumed,
            "micro_batch": self.micro_batch,
            "grad_accum_steps": self.grad_accum,
            "precision": self.precision,
            "precision_reason": self.precision_reason,
            "rollbacks": self.rollbacks,
            "rolled_back_at": self.rolled_back_at,
            "last_eval_step": self.last_eval_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The counters of a checkpoint (the precision is chosen before this: see ``parts``)."""
        self.step = int(state["step"])
        self.micro_batch = int(state["micro_batch"])
        self.grad_accum = int(state["grad_accum_steps"])
        self.rollbacks = int(state["rollbacks"])
        self.rolled_back_at = _optional_int(state.get("rolled_back_at"))
        self.last_eval_step = _optional_int(state.get("last_eval_step"))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)
