"""``health.spike.action: rollback``: what the ``rollback`` event says (the exact semantics:
:mod:`~amptrain.engine.spikes`).

The guardian decides (:class:`~amptrain.engine.guardian.RollBack`, naming the newest healthy
checkpoint at or before the spike); the Trainer carries it out at the step boundary ``f``
where the flush that read the spike left it: it loads that checkpoint's components (keeping
its step, so the data position stays ``f x batch_size``), sends this event and writes a
checkpoint of the rolled-back state at ``f`` (a run killed after this resumes from it).
"""

from __future__ import annotations

from typing import Any

from amptrain.contract.layout import checkpoint_name
from amptrain.contract.spec import SpikeSpec
from amptrain.engine.guardian import RollBack
from amptrain.engine.train_state import TrainState


def rollback_event(
    verdict: RollBack, state: TrainState, rule: SpikeSpec, *, directory: bool = True
) -> dict[str, Any]:
    """The ``rollback`` event's data for ``verdict``, carried out at ``state.step`` with
    ``state.rollbacks`` taken by the job (``directory``: the run has a checkpoint directory)."""
    at, batch_size, rollbacks = state.step, state.batch_size, state.rollbacks
    spike_step, from_step = verdict.spike_step, verdict.checkpoint
    if from_step is None:
        none = "healthy checkpoint at or before it" if directory else "checkpoint directory"
        message = (
            f"{rule.metric} spike at step {spike_step}: no {none} to roll back to; its update "
            "was skipped (as with action skip) and training goes on"
        )
    else:
        message = (
            f"{rule.metric} spike at step {spike_step}: rolled back to "
            f"{checkpoint_name(from_step)} (step {from_step}); the batches of steps "
            f"{from_step + 1} to {at} (samples {from_step * batch_size} to "
            f"{at * batch_size - 1}) are skipped and training goes on from step {at + 1} "
            f"(rollback {rollbacks} of at most {rule.max_rollbacks})"
        )
    return {
        "spike_step": spike_step,
        # Its name, not where it lies: events reach the job's owner, the path is the server's.
        "name": checkpoint_name(from_step) if from_step is not None else None,
        "from_step": from_step,
        "samples_from": from_step * batch_size if from_step is not None else None,
        "samples_to": at * batch_size if from_step is not None else None,
        "rollbacks": rollbacks,
        "message": message,
    }
