"""``health.spike.action: rollback``: back to the newest checkpoint at or before a spike,
skipping the batches since (the exact semantics: :mod:`~amptrain.engine.spikes`).

The spike's own update was already withheld on the device (as with ``skip``); the rollback
happens on the host once a flush has read the spike, at step ``f`` >= the spike's ``k``.
"""

from __future__ import annotations

from amptrain.contract.errors import DivergedError
from amptrain.contract.layout import checkpoint_name
from amptrain.contract.records import ROLLBACK_EVENT
from amptrain.engine.checkpoint import check_resumable
from amptrain.engine.fallback import newest_healthy
from amptrain.engine.resume import Checkpointing


def roll_back(run: Checkpointing, spike_step: int) -> None:
    """Load the newest healthy checkpoint at or before ``spike_step`` into ``run`` (keeping its step,
    so the data position stays ``step x batch_size``), emit the ``rollback`` event and write
    a checkpoint of the rolled-back state at the current step (a run killed after this
    resumes from it). Without such a checkpoint the spike stays skipped, and the event says
    so. Raises DivergedError past ``max_rollbacks``."""
    rule = run.spec.health.spike
    assert rule is not None and rule.action == "rollback"
    at = run.step
    found = newest_healthy(run.store, spike_step) if run.store is not None else None
    if found is None:
        where = "checkpoint" if run.store is not None else "checkpoint directory"
        message = (
            f"loss spike at step {spike_step}: no {where} at or before it to roll back to; "
            f"its update was skipped (as with action skip) and training goes on"
        )
        _event(run, at, spike_step, None, message)
        return
    from_step, state = found
    if run.rollbacks >= rule.max_rollbacks:
        raise DivergedError(
            f"diverged at step {at}: a {rule.metric} spike at step {spike_step} after "
            f"{run.rollbacks} rollbacks (health.spike.max_rollbacks {rule.max_rollbacks}). "
            "Lower the learning rate, enable or tighten grad_clip_norm, or check the data "
            f"around step {spike_step}.",
            step=at,
        )
    check_resumable(state, run.group.world_size)
    run.load_training_state(state)
    run.rollbacks += 1
    size = run.spec.batch_size
    message = (
        f"loss spike at step {spike_step}: rolled back to {checkpoint_name(from_step)} "
        f"(step {from_step}); the batches of steps {from_step + 1} to {at} (samples "
        f"{from_step * size} to {at * size - 1}) are skipped and training goes on from step "
        f"{at + 1} (rollback {run.rollbacks} of at most {rule.max_rollbacks})"
    )
    _event(run, at, spike_step, from_step, message)
    run.save_checkpoint()


def _event(
    run: Checkpointing, at: int, spike_step: int, from_step: int | None, message: str
) -> None:
    size = run.spec.batch_size
    run.telemetry.event(
        ROLLBACK_EVENT,
        at,
        spike_step=spike_step,
        # Its name, not where it lies: events reach the job's owner, the path is the server's.
        name=checkpoint_name(from_step) if from_step is not None else None,
        from_step=from_step,
        samples_from=from_step * size if from_step is not None else None,
        samples_to=at * size if from_step is not None else None,
        rollbacks=run.rollbacks,
        message=message,
    )
